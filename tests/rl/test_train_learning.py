"""GRPO with the real reward environment in the loop measurably raises the mean reward.

The policy is a tiny Qwen2 whose whole completion is one token: token `A`, `B` or `C` picks one of
three known C++ `load_inline` candidates for the task (correct and fast, correct and slow, wrong);
any other token is an answer without code. The reward environment compiles and runs each candidate
for real (on the CPU backend here), and GRPO must shift probability toward the fast, correct one
within a few steps. Only three distinct candidate sources exist, so their builds are cached.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("trl")

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
dim = 65536
scale = 2.0


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [scale]
'''

_CANDIDATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor fused(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float s = static_cast<float>(scale);
    const int64_t n = xc.numel();
    for (int64_t i = 0; i < n; ++i) {
        float v = in[i] > 0.f ? in[i] : 0.f;
        BODY
    }
    return out;
}
"""

_ext = load_inline(name="NAME", cpp_sources=[_SRC], functions=["fused"], extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return _ext.fused(x, self.scale)
'''

# Correct and fast: one fused pass over memory instead of eager's three.
FAST = _CANDIDATE.replace("NAME", "opsynth_train_fast").replace("BODY", "o[i] = v * s + 1.f;")
# Correct and slow: the same value, but pushed through 64 dependent square roots per element.
SLOW = _CANDIDATE.replace("NAME", "opsynth_train_slow").replace(
    "BODY", "float w = v; for (int r = 0; r < 64; ++r) { w = std::sqrt(w * w); } o[i] = w * s + 1.f;"
)
# Wrong: forgets the relu.
WRONG = _CANDIDATE.replace("NAME", "opsynth_train_wrong").replace("BODY", "o[i] = in[i] * s + 1.f;")

CHOICES = {"A": FAST, "B": SLOW, "C": WRONG}
VOCAB = ["<pad>", "<eos>", "A", "B", "C", "go"]


def one_token_policy(seed: int = 0):
    """A tiny Qwen2 over a six-word vocabulary: its one-token completion names a candidate."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="go"))
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


def write_shards(folder, code: str, n: int = 1) -> str:
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    rows = [dict(code=code, ops=["torch.relu", "torch.mul", "torch.add"], num_ops=3, task_id=f"relu_mul_add_{i}")
            for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(folder, "data", "train-00000-of-00001.parquet"))
    return str(folder)


@pytest.mark.slow
def test_grpo_raises_mean_reward_with_real_reward_environment(tmp_path):
    pytest.importorskip("opsynth.rl.evaluate")
    from opsynth.rl.trainer import TrainSettings, train

    shards = write_shards(tmp_path / "shards", TASK, n=4)
    settings = TrainSettings(
        shards=shards,
        output_dir=str(tmp_path / "run"),
        split="all",
        reward_workers=2,
        trainer=dict(
            steps=8, learning_rate=0.05, beta=0.0, num_generations=6, per_device_train_batch_size=6,
            max_completion_length=1, temperature=1.0, save_steps=100, loss_type="grpo",
        ),
    )
    summary = train(
        settings,
        completion_to_candidate=lambda text: CHOICES.get(text.strip(), text),
        model_and_tokenizer=one_token_policy(),
        prompt_fn=lambda row: {"prompt": "go", "task_code": row["code"], "task_id": row["task_id"]},
    )
    rewards = [r for _, r in summary["reward_by_step"]]
    assert len(rewards) == 8
    # The environment really ran the candidates: every reward level the candidates can earn appears.
    with open(os.path.join(settings.output_dir, "evaluations-rank0.jsonl")) as f:
        evals = [json.loads(line) for line in f]
    assert {e["reward"] for e in evals} >= {-1.0, 1.0} and max(e["reward"] for e in evals) >= 2.0
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.75, rewards
