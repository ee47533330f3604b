"""The model card of a training run: which policy, trained on which data, against which reward.

Written to the output folder with every checkpoint and to `final/` at the end, in place of TRL's
generic card (which names the base model from `config._name_or_path`, empty for a policy built in
memory, and knows nothing of the dataset or the reward).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from opsynth.reward.reasons import RULES


def _plain(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(x).items()}
    return x


def model_card(policy: str, shards: str, split: str, tasks: int, reward_env: Any, episode: Any,
               trainer: dict[str, Any] | None = None, summary: dict[str, Any] | None = None) -> str:
    """The card's Markdown (with Hub YAML front matter)."""
    env = _plain(reward_env) or {}
    ep = _plain(episode) or {}
    base = ("a tiny randomly initialised Qwen2 built locally (`policy=smoke`), warm-started on programs "
            "`opsynth.train.warm_start` writes for a few of its tasks: it demonstrates the loop, it is not a "
            "kernel writer") if policy == "smoke" else f"`{policy}`"
    dataset = shards if os.path.exists(shards) else f"[{shards}](https://huggingface.co/datasets/{shards})"
    turns = int(ep.get("turns", 1))
    episode_line = ("single-turn: one program per prompt" if turns == 1 else
                    f"up to {turns} turns: after each program the environment's verdict (build errors, the failed "
                    f"check, or the timings) comes back as a user turn and the policy revises its program; an "
                    f"episode stops at reward 3; episode reward: `{ep.get('reward')}`"
                    + (f" (discount {ep.get('discount')})" if ep.get("reward") == "discounted" else "")
                    + "; feedback tokens are masked out of the loss")
    yaml_base = "" if policy == "smoke" or os.path.isdir(policy) else f"base_model: {policy}\n"
    lines = [
        "---",
        f"{yaml_base}library_name: transformers",
        "tags: [opsynth, grpo, trl, kernels]",
        "---",
        "",
        "# opsynth kernel-writing policy",
        "",
        f"- **Base policy**: {base}.",
        f"- **Dataset**: opsynth task shards {dataset}, split `{split}` ({tasks} tasks): PyTorch programs "
        "(`Model`) for which the policy writes a faster `ModelNew` with its own kernels.",
        f"- **Reward**: the opsynth reward environment (`opsynth.reward`, device `{env.get('device', 'auto')}`): "
        "every program is built and run in a sandbox; " + RULES["reward"][len("Reward: "):]
        + f" Correctness: {env.get('num_trials', 5)} fresh random input sets, atol = {env.get('atol', 0.01)}, "
        f"rtol = {env.get('rtol', 0.01)}; torch compute ops, fallbacks, side streams, cached or unwritten "
        "outputs and the other hacks in the prompt's rules score -1.",
        f"- **Episodes**: {episode_line}.",
        "- **Training**: GRPO (TRL) with the rollout in `opsynth.train.rollout`.",
    ]
    if trainer:
        keys = ("steps", "max_steps", "learning_rate", "num_generations", "per_device_train_batch_size",
                "max_completion_length", "temperature", "beta", "loss_type")
        shown = {k: trainer[k] for k in keys if k in trainer}
        if shown:
            lines.append("- **Trainer settings**: " + ", ".join(f"`{k}={v}`" for k, v in shown.items()) + ".")
    if summary:
        lines += ["", "## This run", "", "```json", json.dumps(
            {k: summary.get(k) for k in ("global_step", "first_reward", "last_reward", "evaluations", "train_runtime_s")},
            indent=2), "```"]
    lines += ["", "Per-step metrics: `metrics.jsonl` and `metrics.png` in the run folder; every verdict: "
              "`evaluations-rank<r>.jsonl`.", ""]
    return "\n".join(lines)


def write_model_card(folder: str, **kw: Any) -> str:
    """Write `<folder>/README.md`; returns its path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "README.md")
    with open(path, "w") as f:
        f.write(model_card(**kw))
    return path
