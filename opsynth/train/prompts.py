"""Prompts for the kernel-writing policy: the task's code and a short brief of the rules.

The brief follows CUDA-Agent's SKILL.md in spirit: what to write (ModelNew, same constructor),
what is allowed (own CUDA kernels via `load_inline`, or Triton), what is forbidden (torch compute
ops in `forward`, falling back to the reference), and the one output format the reward environment
extracts (a single fenced python block). The rules come from the reward environment's own table
(`opsynth.reward.reasons.RULES`), the same table the feedback turns quote, so a policy is never
punished for a rule it was not told.
"""

from __future__ import annotations

from typing import Any

from opsynth.reward.reasons import RULES

# Advice that no check enforces: what makes builds (part of every evaluation) fast.
BUILD_ADVICE = (
    "Builds are part of every evaluation, so keep PyTorch headers out of CUDA code: put the kernels and a plain "
    "launcher (raw pointers and sizes) in `cuda_sources` with `#include <cuda_runtime.h>`, pass "
    "`no_implicit_headers=True`, and write the `torch::Tensor` wrapper in `cpp_sources`, starting with "
    "`#include <torch/extension.h>`. nvcc then never parses ATen, and the build is several times faster."
)


def kernel_brief(settings: dict | None = None) -> str:
    """The brief: every rule of the reward environment's table (opsynth.reward.reasons), one a line,
    with the tolerance and margin of `settings` (`RewardConfig.quoted_settings()`; None: defaults)."""
    from opsynth.train.feedback import DEFAULT_SETTINGS, with_settings

    s = {**DEFAULT_SETTINGS, **(settings or {})}
    rules = {key: with_settings(text, s) for key, text in RULES.items()}
    return _brief(rules)


def _brief(rules_by_key: dict[str, str] = RULES) -> str:
    rules = [text for key, text in rules_by_key.items() if key not in ("format", "reward")]
    return "\n".join(
        [
            "You are an expert GPU kernel engineer. Below is a PyTorch program `Model`. Write `ModelNew`, a",
            "drop-in replacement that computes the same outputs faster, using your own kernels.",
            "",
            "Rules (the environment checks each one; a program that breaks one scores -1):",
            *[f"- {r}" for r in rules],
            "",
            f"Advice: {BUILD_ADVICE}",
            "",
            rules_by_key["reward"],
            "",
            rules_by_key["format"],
        ]
    )


KERNEL_BRIEF = _brief()


def prompt_prefix(brief: str = KERNEL_BRIEF) -> str:
    """What every prompt holds before the task's code: the brief and the fence that opens the code."""
    return f"{brief}\n\nThe program to optimise:\n\n```python\n"


def build_prompt(task_code: str, brief: str = KERNEL_BRIEF) -> str:
    """The user message: the brief, the task's precision and pass when it is not float32 forward
    (`opsynth.reward.kinds.kind_brief`), then the task file verbatim. A float32 forward task's prompt
    is `prompt_prefix(brief)` + its code (the smoke tokenizer holds that prefix as whole tokens)."""
    from opsynth.reward.kinds import kind_brief

    kind = kind_brief(task_code)
    if not kind:
        return f"{prompt_prefix(brief)}{task_code.strip()}\n```\n"
    return f"{brief}\n\n{kind}\n\nThe program to optimise:\n\n```python\n{task_code.strip()}\n```\n"


def build_messages(task_code: str, brief: str = KERNEL_BRIEF) -> list[dict[str, str]]:
    """The same prompt as one chat turn, for instruction-tuned models with a chat template."""
    return [{"role": "user", "content": build_prompt(task_code, brief)}]


def prompt_record(row: dict[str, Any], chat: bool, brief: str = KERNEL_BRIEF) -> dict[str, Any]:
    """One training example in TRL's layout: `prompt`, plus the columns the reward function reads.

    TRL passes every non-prompt column to the reward function as a keyword list, so `task_code`
    reaches the reward environment alongside each completion.
    """
    prompt = build_messages(row["code"], brief) if chat else build_prompt(row["code"], brief)
    return {
        "prompt": prompt,
        "task_code": row["code"],
        "task_id": row["task_id"],
        "num_ops": int(row["num_ops"]),
        # The mode the reward runs the task in (rows made before the column, and Ops-6K's, have none).
        "mode": row.get("mode") or "eval",
    }


def completion_text(completion: Any) -> str:
    """The text of one completion, whether TRL gives a string or a list of chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content", "") or "" for m in completion if isinstance(m, dict))
    if isinstance(completion, dict):
        return completion.get("content", "") or ""
    return str(completion)
