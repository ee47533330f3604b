"""Test fixture (not library code; benchmarks/train_h200.py imports it by path): a learning
check for the training loop: a one-token policy choosing among known candidates.

A language model writing kernels learns far too slowly to show, in a few steps, that GRPO and the
reward environment are wired the right way round. This module shrinks the problem to a bandit that
still goes through everything real: a tiny Qwen2 whose whole completion is one token; token `A`, `B`
or `C` names one of three known `ModelNew` programs for one task (correct and fast, correct and
slow, wrong), which the reward environment compiles, runs and times for real. Training must move
probability toward `A`. The CPU test and the H200 benchmark both use it (C++ or CUDA candidates).
"""

from __future__ import annotations

import os
from typing import Any

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """torch.relu -> torch.mul -> torch.add"""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        x = torch.relu(x)
        x = torch.mul(x, self.scale)
        x = torch.add(x, 1.0)
        return x


batch_size = 16
dim = DIM
scale = 2.0


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [scale]
'''

# One extension holds all three kernels, so the three candidates share a single build (the reward
# environment caches builds by extension source); each candidate's forward calls a different one.
_CPU = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>

template <int MODE>
static torch::Tensor run(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float s = static_cast<float>(scale);
    const int64_t n = xc.numel();
    if (MODE == 0) {  // one fused, vectorisable pass on torch's CPU threads: fast
        at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) o[i] = std::max(in[i], 0.f) * s + 1.f;
        });
    } else if (MODE == 1) {  // the same value through 16 dependent square roots, one thread: slow
        for (int64_t i = 0; i < n; ++i) {
            float w = std::max(in[i], 0.f);
            for (int r = 0; r < 16; ++r) w = std::sqrt(w * w);
            o[i] = w * s + 1.f;
        }
    } else {  // forgets the relu: wrong
        for (int64_t i = 0; i < n; ++i) o[i] = in[i] * s + 1.f;
    }
    return out;
}

torch::Tensor fused_fast(torch::Tensor x, double scale) { return run<0>(x, scale); }
torch::Tensor fused_slow(torch::Tensor x, double scale) { return run<1>(x, scale); }
torch::Tensor fused_wrong(torch::Tensor x, double scale) { return run<2>(x, scale); }
"""

_ext = load_inline(name="opsynth_bandit_cpu", cpp_sources=[_SRC],
                   functions=["fused_fast", "fused_slow", "fused_wrong"], extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return _ext.FUNC(x, self.scale)
'''

_CUDA = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = """
torch::Tensor fused_fast(torch::Tensor x, double scale);
torch::Tensor fused_slow(torch::Tensor x, double scale);
torch::Tensor fused_wrong(torch::Tensor x, double scale);
"""

_CU = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

template <int MODE>
__global__ void fused_kernel(const float* __restrict__ in, float* __restrict__ o, float s, long n) {
    long start = blockIdx.x * (long)blockDim.x + threadIdx.x;
    long stride = (long)blockDim.x * gridDim.x;
    for (long i = start; i < n; i += stride) {
        float v = in[i] > 0.f ? in[i] : 0.f;
        if (MODE == 0) {
            o[i] = v * s + 1.f;
        } else if (MODE == 1) {
            float w = v;
            for (int r = 0; r < 16; ++r) w = sqrtf(w * w);
            o[i] = w * s + 1.f;
        } else {
            o[i] = in[i] * s + 1.f;
        }
    }
}

template <int MODE>
static torch::Tensor run(torch::Tensor x, double scale, int threads, long max_blocks) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    int blocks = (int)std::min((n + threads - 1) / threads, max_blocks);
    fused_kernel<MODE><<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), (float)scale, n);
    return out;
}

torch::Tensor fused_fast(torch::Tensor x, double scale) { return run<0>(x, scale, 256, 65535L); }
// One block of 32 threads walking the whole tensor: correct, badly launched, slow.
torch::Tensor fused_slow(torch::Tensor x, double scale) { return run<1>(x, scale, 32, 1L); }
torch::Tensor fused_wrong(torch::Tensor x, double scale) { return run<2>(x, scale, 256, 65535L); }
"""

_ext = load_inline(name="opsynth_bandit_cuda", cpp_sources=[_CPP], cuda_sources=[_CU],
                   functions=["fused_fast", "fused_slow", "fused_wrong"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return _ext.FUNC(x, self.scale)
'''

VOCAB = ["<pad>", "<eos>", "A", "B", "C", "go"]
PROMPT = "go"


def task_source(dim: int = 16384) -> str:
    """The bandit's task (relu -> mul -> add on a batch_size x dim input)."""
    return TASK.replace("DIM", str(dim))


def candidates(device: str) -> dict[str, str]:
    """Token -> ModelNew source: A correct and fast, B correct and slow, C wrong (C++ or CUDA)."""
    template = _CUDA if device == "cuda" else _CPU
    return {tok: template.replace("FUNC", fn) for tok, fn in
            (("A", "fused_fast"), ("B", "fused_slow"), ("C", "fused_wrong"))}


def choice_mapper(device: str):
    """completion text -> candidate source (unknown tokens pass through and score `no_code`)."""
    table = candidates(device)
    return lambda text: table.get(text.strip(), text)


def one_token_policy(seed: int = 0, vocab: list[str] | None = None, unk: str = PROMPT, max_positions: int = 16,
                     hidden_size: int = 16, layers: int = 1, drop_unknown: bool = False, heads: int = 2):
    """(model, tokenizer): a tiny Qwen2 over a word-level vocabulary (`VOCAB`: six words, any other
    word reads as `unk`, or with `drop_unknown` is not read at all); its completions are one token a turn."""
    import torch
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = vocab or VOCAB
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=unk))
    if drop_unknown:  # delete every whitespace-separated word that is not in the vocabulary
        known = "|".join(w for w in vocab if not w.startswith("<"))
        tok.normalizer = normalizers.Replace(Regex(r"(?<!\S)(?!(?:" + known + r")(?!\S))\S+"), "")
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        padding_side="left")
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=1,
                         max_position_embeddings=max_positions,
                         tie_word_embeddings=False, eos_token_id=1, pad_token_id=0, bos_token_id=1)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=1, pad_token_id=0, do_sample=True)
    return model, tokenizer


def prompt_fn(row: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": PROMPT, "task_code": row["code"], "task_id": row["task_id"]}


def write_task_shards(folder: str, code: str | list[str], n: int = 4) -> str:
    """A shard folder (Hub layout) holding `n` copies of one task under distinct ids (or, given a
    list of task codes, each of them once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    codes = list(code) if isinstance(code, list) else [code] * n
    rows = [dict(code=c, ops=["torch.relu", "torch.mul", "torch.add"], num_ops=3, task_id=f"bandit_{i}")
            for i, c in enumerate(codes)]
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(folder, "data", "train-00000-of-00001.parquet"))
    return str(folder)


def bandit_settings(shards: str, output_dir: str, steps: int = 5, num_generations: int = 8,
                    learning_rate: float = 0.2, seed: int = 0, reward_env: dict | None = None):
    """Training settings that make the bandit learn within a handful of steps (single-turn)."""
    from opsynth.train.trainer import TrainSettings

    return TrainSettings(
        shards=shards, output_dir=output_dir, split="all", seed=seed, reward_workers=2,
        reward_env=dict(reward_env or {}), turns=1, print_steps=False,
        trainer=dict(steps=steps, learning_rate=learning_rate, beta=0.0, num_generations=num_generations,
                     per_device_train_batch_size=num_generations, max_completion_length=1, temperature=1.0,
                     save_steps=10_000, loss_type="grpo", bf16=False, gradient_checkpointing=False),
    )


def correct_probability(model, tokenizer) -> float:
    """The policy's probability of answering with a correct program (A or B) to the prompt."""
    import torch

    ids = torch.tensor([tokenizer(PROMPT, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        p = torch.softmax(model(input_ids=ids).logits[0, -1].float(), -1)
    return float(sum(p[tokenizer.convert_tokens_to_ids(t)] for t in ("A", "B")))


def train_bandit(shards: str, output_dir: str, device: str, policy: Any = None, evaluate_many_fn: Any = None,
                 **kw: Any) -> dict[str, Any]:
    """Run GRPO on the bandit; returns the training summary (reward per step included). `policy`
    (model, tokenizer) is trained in place (default: a fresh `one_token_policy`)."""
    from opsynth.train.trainer import train

    settings = bandit_settings(shards, output_dir, **kw)
    return train(settings, completion_to_candidate=choice_mapper(device),
                 model_and_tokenizer=policy or one_token_policy(settings.seed), prompt_fn=prompt_fn,
                 evaluate_many_fn=evaluate_many_fn)


# ---- Multi-turn: the right answer is hidden in the task, and the feedback names it ----------------
#
# Three tasks look the same to the policy (its prompt is `go <task id>`, and the id is a word it
# cannot read: its tokenizer reads only its own eleven words and drops the rest); each accepts
# exactly one of the answers A, B, C (D is a fourth program no task accepts). No policy can make its
# first answer right more than one time in three; a wrong one comes back with the fix named at the
# end of the verdict (`fixB`), so the only way to raise the reward is to read the feedback: the
# second turn's answers go from chance (about 1 in 11 tokens) towards all correct. The verdicts come
# from `hidden_answer_env`, a deterministic stand-in for `evaluate_many` (the feedback's text is the
# real formatter's; of it, the policy reads only the fix).

MT_VOCAB = ["<pad>", "<eos>", "<unk>", "A", "B", "C", "D", "go", "fixA", "fixB", "fixC"]
ANSWERS = ("A", "B", "C")


def hidden_answer_candidates() -> dict[str, str]:
    """Token -> program: A, B, C are the bandit's three C++ programs, D a fourth (never accepted)."""
    table = candidates("cpu")
    table["D"] = table["C"].replace("class ModelNew", "# the habit: a first answer no task accepts\nclass ModelNew")
    return table


def hidden_answer_tasks() -> list[str]:
    """Task codes for answers A, B and C (the answer is a comment the policy never sees)."""
    return [task_source() + f"\n# answer: {a}\n" for a in ANSWERS]


def hidden_answer_env(pairs: list[tuple[str, str]], cfg: Any = None) -> list[Any]:
    """`evaluate_many` for the hidden-answer tasks: reward 3 for the task's answer, else `incorrect`
    with the answer in `details` (for the feedback to name)."""
    from opsynth.reward.eval_types import EvalResult

    by_source = {src: tok for tok, src in hidden_answer_candidates().items()}
    out = []
    for task, cand in pairs:
        answer = task.rsplit("# answer: ", 1)[-1].strip()
        if by_source.get(cand) == answer:
            res = EvalResult(reward=3, correct=True, reason="ok",
                             times={"candidate_ms": 1.0, "eager_ms": 2.0, "compile_ms": 2.0}, device="cpu")
        else:
            res = EvalResult.rejected("incorrect", "trial 0: output 0: max abs error 2 (atol=0.01, rtol=0.01)", device="cpu")
        res.details = {"answer": answer}
        out.append(res)
    return out


def hint_feedback(result: Any, attempt: int) -> str:
    """The real feedback text, then the fix the environment named (`fixB`)."""
    from opsynth.train.feedback import format_feedback

    answer = (getattr(result, "details", None) or {}).get("answer")
    return format_feedback(result, attempt) + (f"\nfix{answer}" if answer and not result.correct else "")


def hidden_answer_policy(seed: int = 0):
    """The multi-turn bandit's policy: a table of next-token logits per current token, as a Qwen2
    with no layers and one-hot (frozen) embeddings, over `MT_VOCAB`, reading only those words.

    What it answers after `fixB` and what it answers to the bare prompt are separate columns of one
    table, so first-turn guesses (which no policy can get right more than one time in three) do not
    bleed into how it reads a fix, and the test is deterministic enough to assert on.
    """
    import torch

    model, tok = one_token_policy(seed, vocab=MT_VOCAB, unk="<unk>", max_positions=64, hidden_size=len(MT_VOCAB),
                                  layers=0, drop_unknown=True, heads=1)
    emb = model.get_input_embeddings()
    with torch.no_grad():
        emb.weight.copy_(torch.eye(len(MT_VOCAB)))
    emb.weight.requires_grad_(False)
    return model, tok


def answer_probabilities(model, tok, context: str) -> dict[str, float]:
    """The policy's probability of each answer as the next token after `context`."""
    import torch

    ids = torch.tensor([tok(context, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        p = torch.softmax(model(input_ids=ids).logits[0, -1].float(), -1)
    return {a: float(p[tok.convert_tokens_to_ids(a)]) for a in ANSWERS + ("D",)}


def hidden_prompt_fn(row: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": f"{PROMPT} {row['task_id']}", "task_code": row["code"], "task_id": row["task_id"]}


def train_hidden_answer(shards: str, output_dir: str, steps: int = 10, num_generations: int = 8,
                        learning_rate: float = 0.3, seed: int = 0, turns: int = 2,
                        evaluate_many_fn: Any = hidden_answer_env, policy: Any = None,
                        optim: str = "adamw_torch") -> dict[str, Any]:
    """Multi-turn GRPO on the hidden-answer tasks; returns the training summary."""
    from opsynth.train.trainer import TrainSettings, train

    settings = TrainSettings(
        shards=shards, output_dir=output_dir, split="all", seed=seed, turns=turns, episode_reward="last",
        print_steps=False,
        trainer=dict(steps=steps, learning_rate=learning_rate, beta=0.0, num_generations=num_generations,
                     per_device_train_batch_size=3 * num_generations, max_completion_length=1, temperature=1.0,
                     save_steps=10_000, loss_type="grpo", bf16=False, gradient_checkpointing=False,
                     lr_scheduler_type="constant", optim=optim),
    )
    table = hidden_answer_candidates()
    return train(settings, completion_to_candidate=lambda text: table.get(text.strip(), text),
                 model_and_tokenizer=policy or hidden_answer_policy(seed), prompt_fn=hidden_prompt_fn,
                 evaluate_many_fn=evaluate_many_fn, feedback_fn=hint_feedback)
