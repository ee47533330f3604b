"""Score a policy, or a folder of candidate files, on a split: the KernelBench-style table.

The numbers are the ones kernel papers report: pass rate (correct), the rate faster than eager
PyTorch (reward >= 2) and faster than torch.compile (reward 3), geometric-mean speedups over the
correct candidates, and the reward histogram. Every candidate is judged by the reward environment,
so a score and a training reward always mean the same thing.

Run: `python -m opsynth.train.score --shards DIR --split heldout --candidates DIR` or
`--policy PATH_OR_ID`, or `python -m pipelines.evaluate mode=score ...`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections import Counter
from typing import Any, Iterable

from opsynth.train.records import REWARD_LEVELS, EvalRecord, record_from_result  # noqa: F401 - re-exported


def _geomean(values: Iterable[float | None]) -> float | None:
    logs = [math.log(v) for v in values if v and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def summarize(records: list[EvalRecord]) -> dict[str, Any]:
    """The KernelBench-style numbers over a list of evaluations."""
    n = len(records)
    rewards = [r.reward for r in records]
    hist = Counter(int(r) for r in rewards)
    reasons = Counter(r.reason.split(":")[0] for r in records if not r.correct)
    return {
        "n": n,
        "reward_mean": sum(rewards) / n if n else None,
        "pass_rate": sum(r.correct for r in records) / n if n else None,
        "faster_than_eager_rate": sum(r.reward >= 2 for r in records) / n if n else None,
        "faster_than_compile_rate": sum(r.reward >= 3 for r in records) / n if n else None,
        "geomean_speedup_eager": _geomean(r.speedup_eager for r in records if r.correct),
        "geomean_speedup_compile": _geomean(r.speedup_compile for r in records if r.correct),
        "reward_histogram": {str(k): hist.get(k, 0) for k in REWARD_LEVELS},
        "failure_reasons": dict(reasons.most_common()),
    }


def format_table(summary: dict[str, Any], title: str = "") -> str:
    """A plain-text table of a summary, one metric a row."""

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v)

    rows = [
        ("tasks x samples", summary["n"]),
        ("mean reward", summary["reward_mean"]),
        ("pass rate (correct)", summary["pass_rate"]),
        ("faster than eager", summary["faster_than_eager_rate"]),
        ("faster than torch.compile", summary["faster_than_compile_rate"]),
        ("geomean speedup vs eager", summary["geomean_speedup_eager"]),
        ("geomean speedup vs compile", summary["geomean_speedup_compile"]),
    ] + [(f"reward = {k}", v) for k, v in summary["reward_histogram"].items()]
    width = max(len(k) for k, _ in rows)
    lines = ([title] if title else []) + [f"{k:<{width}}  {fmt(v):>8}" for k, v in rows]
    if summary.get("failure_reasons"):
        lines.append("failure reasons: " + ", ".join(f"{k} {v}" for k, v in summary["failure_reasons"].items()))
    return "\n".join(lines)


def find_candidate(folder: str, task_id: str) -> str | None:
    """A task's candidate in a folder: `<task_id>.py`, `<task_id>.txt` (a raw completion), or a
    CUDA-Agent workspace folder `<task_id>/` (returned as its path)."""
    for name in (f"{task_id}.py", f"{task_id}.txt", f"{task_id}.md"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path) as f:
                return f.read()
    path = os.path.join(folder, task_id)
    return path if os.path.isdir(path) else None


def score_candidates(
    rows: list[dict[str, Any]], folder: str, eval_cfg: Any = None
) -> list[EvalRecord]:
    """Evaluate the candidate files in `folder` against their tasks; a missing file scores -1."""
    from opsynth.train.reward_fn import KernelReward

    reward = KernelReward(eval_cfg)
    present = [(r, find_candidate(folder, r["task_id"])) for r in rows]
    have = [(r, c) for r, c in present if c is not None]
    records = reward.evaluate_batch([r["code"] for r, _ in have], [c for _, c in have],
                                    [r["task_id"] for r, _ in have], from_completions=False)
    missing = [EvalRecord(task_id=r["task_id"], reward=-1.0, correct=False, reason="missing_candidate")
               for r, c in present if c is None]
    return records + missing


def generate_completions(
    model, tokenizer, rows: list[dict[str, Any]], chat: bool, samples_per_task: int = 1,
    max_new_tokens: int = 1024, temperature: float = 0.0, batch_size: int = 4,
) -> list[tuple[dict[str, Any], str]]:
    """Sample completions from a policy for each task (greedy when temperature is 0)."""
    import torch

    from opsynth.train.prompts import build_messages, build_prompt

    device = next(model.parameters()).device
    model.eval()
    work = [r for r in rows for _ in range(samples_per_task)]
    out: list[tuple[dict[str, Any], str]] = []
    for i in range(0, len(work), batch_size):
        batch = work[i : i + batch_size]
        if chat:
            texts = [tokenizer.apply_chat_template(build_messages(r["code"]), tokenize=False, add_generation_prompt=True)
                     for r in batch]
        else:
            texts = [build_prompt(r["code"]) for r in batch]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        gen_kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
        gen_kwargs.update(do_sample=True, temperature=temperature) if temperature > 0 else gen_kwargs.update(do_sample=False)
        with torch.no_grad():
            ids = model.generate(**enc, **gen_kwargs)
        for r, seq in zip(batch, ids[:, enc["input_ids"].shape[1]:]):
            out.append((r, tokenizer.decode(seq, skip_special_tokens=True)))
    return out


def score_policy(
    model, tokenizer, rows: list[dict[str, Any]], chat: bool, eval_cfg: Any = None, **gen: Any
) -> list[EvalRecord]:
    """Generate with the policy, then evaluate every completion."""
    from opsynth.train.reward_fn import KernelReward

    pairs = generate_completions(model, tokenizer, rows, chat, **gen)
    reward = KernelReward(eval_cfg)
    return reward.evaluate_batch([r["code"] for r, _ in pairs], [t for _, t in pairs], [r["task_id"] for r, _ in pairs])


def score(
    shards: str, split: str = "heldout", candidates: str | None = None, policy: str | None = None,
    heldout_fraction: float = 0.1, limit: int | None = None, build_workers: int | None = None, out: str | None = None,
    eval_cfg: Any = None, samples_per_task: int = 1, max_new_tokens: int = 1024, temperature: float = 0.0,
) -> dict[str, Any]:
    """Score candidates or a policy on a split of the shards; print the table, optionally write JSON."""
    from opsynth.train.data import select_tasks

    if (candidates is None) == (policy is None):
        raise ValueError("give exactly one of candidates=DIR or policy=PATH_OR_ID")
    rows = select_tasks(shards, split=split, heldout_fraction=heldout_fraction, limit=limit)
    if eval_cfg is None:
        from opsynth.reward.eval_types import RewardConfig

        eval_cfg = RewardConfig(build_workers=build_workers)
    if candidates is not None:
        records = score_candidates(rows, candidates, eval_cfg)
        what = f"candidates {candidates}"
    else:
        from opsynth.train.policy import PolicyConfig, load_policy

        cache = os.path.join(out or ".", "policy_cache") if out else os.path.join("outputs", "score_policy_cache")
        model, tok, chat = load_policy(PolicyConfig(name_or_path=policy), cache, corpus=[r["code"] for r in rows])
        records = score_policy(model, tok, rows, chat, eval_cfg, samples_per_task=samples_per_task,
                               max_new_tokens=max_new_tokens, temperature=temperature)
        what = f"policy {policy}"
    summary = summarize(records)
    summary.update(split=split, shards=shards, scored=what)
    print(format_table(summary, title=f"{what} on {split} ({len(rows)} tasks)"))
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "score.json"), "w") as f:
            json.dump({"summary": summary, "records": [r.to_dict() for r in records]}, f, indent=2)
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", required=True)
    p.add_argument("--split", default="heldout", choices=["train", "heldout", "all"])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--candidates")
    g.add_argument("--policy")
    p.add_argument("--heldout-fraction", type=float, default=0.1)
    p.add_argument("--limit", type=int)
    p.add_argument("--build-workers", type=int, help="parallel candidate builds (default: half the cores)")
    p.add_argument("--samples-per-task", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--out")
    a = p.parse_args(argv)
    return score(a.shards, a.split, a.candidates, a.policy, a.heldout_fraction, a.limit, a.build_workers, a.out,
                 samples_per_task=a.samples_per_task, max_new_tokens=a.max_new_tokens, temperature=a.temperature)


if __name__ == "__main__":
    main()
