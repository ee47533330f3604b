"""Test fixture (not library code): a GRPO run with the real-model recipe on a small randomly
initialised transformers model built from a config (no download), against a stand-in environment.

`test_train_recipe.py` calls `run` in process (LoRA, gradient checkpointing, checkpoint and
resume) and launches this file with `accelerate launch --num_processes 2 --cpu` (each rank runs
`main`, as `pipelines.train` does under accelerate). The environment is a deterministic stand-in
for `evaluate_many` (what the recipe changes is the trainer, not the judging): reward 1 for a
program of even length (`as_program` wraps each completion), -1 otherwise, so every group has episodes that differ.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WORDS = ["def", "forward", "self", "x", "return", "relu", "torch", "(", ")", ":", ",", ".", "=", "\n", " "]


def tiny_model(seed: int = 0):
    """A 2-layer Llama (a real transformers architecture with q/k/v/o and MLP projections) and a
    byte-level BPE tokenizer, both built here."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from bandit import task_source
    from opsynth.train.policy import train_smoke_tokenizer

    tok = train_smoke_tokenizer([task_source()] * 3 + [" ".join(WORDS)] * 3, 400)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               do_sample=True)
    return model, tok


def parity_env(pairs: list[tuple[str, str]], cfg: Any = None) -> list[Any]:
    """`evaluate_many` stand-in: reward 1 for an even-length candidate, else `incorrect`."""
    from opsynth.reward.eval_types import EvalResult

    out = []
    for pair in pairs:
        if len(pair[1] or "") % 2 == 0:
            out.append(EvalResult(reward=1, correct=True, reason="ok",
                                  times={"candidate_ms": 2.0, "eager_ms": 1.0, "compile_ms": 1.0}, device="cpu"))
        else:
            out.append(EvalResult.rejected("incorrect", "trial 0: output 0: max abs error 2 (atol=0.01)", device="cpu"))
    return out


def as_program(text: str) -> str:
    """A completion as a program the reward's extraction accepts (its length set by the text)."""
    return f"```python\nclass ModelNew:\n    pass  # {text!r}\n```"


def prompt_fn(row: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": f"def forward(self, x): {row['task_id']}", "task_code": row["code"], "task_id": row["task_id"]}


def settings(shards: str, out: str, steps: int, **kw: Any):
    from opsynth.train.trainer import TrainSettings

    trainer = dict(steps=steps, learning_rate=5e-3, beta=0.0, num_generations=4, per_device_train_batch_size=4,
                   max_completion_length=6, temperature=1.0, save_steps=kw.pop("save_steps", 2), loss_type="grpo",
                   bf16=False, lr_scheduler_type="constant", report_to="none")
    return TrainSettings(shards=shards, output_dir=out, split="all", turns=kw.pop("turns", 2), print_steps=False,
                         trainer=trainer, **kw)


def run(shards: str, out: str, steps: int, callbacks: list[Any] | None = None, seed: int = 0, **kw: Any) -> dict:
    from opsynth.train.trainer import train

    return train(settings(shards, out, steps, **kw), completion_to_candidate=as_program,
                 model_and_tokenizer=tiny_model(seed), prompt_fn=prompt_fn, evaluate_many_fn=parity_env,
                 callbacks=callbacks)


def main(argv: list[str] | None = None) -> None:
    """One rank of a launched run: train, then rank 0 writes what it saw to `<out>/launched.json`."""
    p = argparse.ArgumentParser()
    p.add_argument("--shards", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--lora", action="store_true")
    a = p.parse_args(argv)

    from accelerate import PartialState

    state = PartialState()
    kw: dict[str, Any] = {"lora": {"enabled": True, "r": 4, "alpha": 8}} if a.lora else {}
    summary = run(a.shards, a.out, a.steps, save_steps=10_000, turns=1, **kw)
    if state.is_main_process:
        with open(os.path.join(a.out, "launched.json"), "w") as f:
            json.dump({"num_processes": state.num_processes, "backend": str(state.backend), "summary": summary}, f)


if __name__ == "__main__":
    main()
