"""A learning check for the training loop: a one-token policy choosing among known candidates.

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


def one_token_policy(seed: int = 0):
    """(model, tokenizer): a tiny Qwen2 over a six-word vocabulary; its completion is one token."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token=PROMPT))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        padding_side="left")
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
                         tie_word_embeddings=False, eos_token_id=1, pad_token_id=0, bos_token_id=1)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=1, pad_token_id=0, do_sample=True)
    return model, tokenizer


def prompt_fn(row: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": PROMPT, "task_code": row["code"], "task_id": row["task_id"]}


def write_task_shards(folder: str, code: str, n: int = 4) -> str:
    """A shard folder (Hub layout) holding `n` copies of one task under distinct ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    rows = [dict(code=code, ops=["torch.relu", "torch.mul", "torch.add"], num_ops=3, task_id=f"bandit_{i}")
            for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(folder, "data", "train-00000-of-00001.parquet"))
    return str(folder)


def bandit_settings(shards: str, output_dir: str, steps: int = 5, num_generations: int = 8,
                    learning_rate: float = 0.2, seed: int = 0, reward_env: dict | None = None):
    """Training settings that make the bandit learn within a handful of steps."""
    from opsynth.train.trainer import TrainSettings

    return TrainSettings(
        shards=shards, output_dir=output_dir, split="all", seed=seed, reward_workers=2,
        reward_env=dict(reward_env or {}),
        trainer=dict(steps=steps, learning_rate=learning_rate, beta=0.0, num_generations=num_generations,
                     per_device_train_batch_size=num_generations, max_completion_length=1, temperature=1.0,
                     save_steps=10_000, loss_type="grpo", bf16=False, gradient_checkpointing=False),
    )


def train_bandit(shards: str, output_dir: str, device: str, **kw: Any) -> dict[str, Any]:
    """Run GRPO on the bandit; returns the training summary (reward per step included)."""
    from opsynth.train.trainer import train

    settings = bandit_settings(shards, output_dir, **kw)
    return train(settings, completion_to_candidate=choice_mapper(device),
                 model_and_tokenizer=one_token_policy(settings.seed), prompt_fn=prompt_fn)
