"""Score a policy, or a folder of candidate files, on a split: the KernelBench-style table.

The numbers are the ones kernel papers report: pass rate (correct), the rate faster than eager
PyTorch (reward >= 2) and faster than torch.compile (reward 3), geometric-mean speedups over the
correct candidates, and the reward histogram. Every candidate is judged by the reward environment,
so a score and a training reward always mean the same thing.

A policy is scored in episodes of `turns` turns (default 3), as it trains: after each program the
environment's verdict comes back and the policy revises it. The table puts single-turn (the first
program) and multi-turn results side by side, one column per turn: the program an episode holds
after t turns (an episode that reached reward 3 keeps that program).

Run: `python -m pipelines.score --shards DIR --split heldout --candidates DIR` or
`--policy PATH_OR_ID [--turns 3]`, or `python -m pipelines.evaluate mode=score ...`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
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


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def _table_rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("tasks x samples", summary["n"]),
        ("mean reward", summary["reward_mean"]),
        ("pass rate (correct)", summary["pass_rate"]),
        ("faster than eager", summary["faster_than_eager_rate"]),
        ("faster than torch.compile", summary["faster_than_compile_rate"]),
        ("geomean speedup vs eager", summary["geomean_speedup_eager"]),
        ("geomean speedup vs compile", summary["geomean_speedup_compile"]),
    ] + [(f"reward = {k}", v) for k, v in summary["reward_histogram"].items()]


def format_table(summary: dict[str, Any], title: str = "") -> str:
    """A plain-text table of a summary, one metric a row; with `by_turn` (multi-turn scoring) one
    column per turn, the first being the single-turn result."""
    by_turn = summary.get("by_turn") or []
    columns = by_turn if len(by_turn) > 1 else [summary]
    names = [k for k, _ in _table_rows(columns[0])]
    values = [[_fmt(v) for _, v in _table_rows(c)] for c in columns]
    heads = ["single-turn"] + [f"after turn {t}" for t in range(2, len(columns) + 1)] if len(columns) > 1 else [""]
    width = max(len(k) for k in names)
    col = max(8, *(len(h) for h in heads))
    lines = [title] if title else []
    if len(columns) > 1:
        lines.append(" " * width + "  " + "  ".join(f"{h:>{col}}" for h in heads))
    for i, name in enumerate(names):
        lines.append(f"{name:<{width}}  " + "  ".join(f"{vals[i]:>{col}}" for vals in values))
    if len(columns) > 1 and summary.get("improved_rate") is not None:
        lines.append(f"episodes where a later turn beat the earlier ones: {summary['improved_rate']:.3f}")
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
                                    [r["task_id"] for r, _ in have], from_completions=False,
                                    modes=[r.get("mode") for r, _ in have])
    missing = [EvalRecord(task_id=r["task_id"], reward=-1.0, correct=False, reason="missing_candidate")
               for r, c in present if c is None]
    return records + missing


def prompt_ids_for(tokenizer, rows: list[dict[str, Any]], chat: bool) -> list[list[int]]:
    """Token ids of each task's first-turn prompt (the chat template's generation prompt for chat)."""
    from opsynth.train.prompts import build_messages, build_prompt

    if chat:
        texts = [tokenizer.apply_chat_template(build_messages(r["code"]), tokenize=False, add_generation_prompt=True)
                 for r in rows]
    else:
        texts = [build_prompt(r["code"]) for r in rows]
    return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def hf_generate(model, tokenizer, max_new_tokens: int = 1024, temperature: float = 0.0, batch_size: int = 4):
    """A `GenerateFn` over `model.generate` (greedy when temperature is 0): left-padded batches,
    each sequence's new tokens up to and including its first end-of-sequence token."""
    import torch

    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos

    def generate(batch: list[list[int]]):
        model.eval()
        out: list[list[int]] = []
        for i in range(0, len(batch), batch_size):
            chunk = batch[i : i + batch_size]
            width = max(len(x) for x in chunk)
            ids = torch.tensor([[pad] * (width - len(x)) + x for x in chunk], device=device)
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in chunk], device=device)
            kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, pad_token_id=pad)
            kw.update(do_sample=True, temperature=temperature) if temperature > 0 else kw.update(do_sample=False)
            with torch.no_grad():
                seqs = model.generate(input_ids=ids, attention_mask=mask, **kw)
            for seq in seqs[:, width:].tolist():
                if eos in seq:
                    seq = seq[: seq.index(eos) + 1]
                while seq and seq[-1] == pad and pad != eos:
                    seq.pop()
                out.append(seq)
        return out, None

    return generate


def score_episodes(
    model, tokenizer, rows: list[dict[str, Any]], chat: bool, eval_cfg: Any = None, turns: int = 3,
    samples_per_task: int = 1, max_new_tokens: int = 1024, temperature: float = 0.0,
    reward: Any = None, feedback: Any = None, prompt_ids: list[list[int]] | None = None,
) -> list[list[EvalRecord]]:
    """Run the policy in episodes of up to `turns` turns (feedback after each program, as in
    training); each turn's programs are judged together. Returns each episode's records by turn.
    `reward` (a `KernelReward`), `feedback(result, attempt)` and `prompt_ids` (each row's first
    prompt, tokenised) replace the defaults (a policy with its own prompt layout, tests)."""
    from opsynth.train.episodes import EpisodeConfig, TurnCodec, run_episodes
    from opsynth.train.feedback import format_feedback
    from opsynth.train.reward_fn import KernelReward

    work = [r for r in rows for _ in range(samples_per_task)]
    reward = reward or KernelReward(eval_cfg)
    mode_of = {r["task_id"]: r.get("mode") for r in work}  # each task runs in its row's mode
    judge = reward.judge if not any(mode_of.values()) else (
        lambda codes, texts, ids: reward.judge(codes, texts, ids, modes=[mode_of.get(t) for t in ids]))
    episodes = run_episodes(
        prompt_ids or prompt_ids_for(tokenizer, work, chat), [r["code"] for r in work], [r["task_id"] for r in work],
        generate=hf_generate(model, tokenizer, max_new_tokens, temperature), judge=judge,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        codec=TurnCodec(tokenizer, chat), cfg=EpisodeConfig(turns=turns), feedback=feedback or format_feedback,
    )
    return [[t.record for t in e.turns] for e in episodes]


def summarize_episodes(episodes: list[list[EvalRecord]], turns: int) -> dict[str, Any]:
    """The table's numbers for each turn (the first is the single-turn result), and the share of
    multi-turn episodes in which a later turn beat the earlier ones. Top-level numbers: the last turn."""
    from opsynth.train.episodes import improved
    from opsynth.train.rollout import after_turn

    by_turn = [summarize([after_turn(e, t) for e in episodes]) for t in range(1, turns + 1)]
    ups = [improved([r.reward for r in e]) for e in episodes]
    ups = [u for u in ups if u is not None]
    return {**by_turn[-1], "turns": turns, "by_turn": by_turn,
            "improved_rate": sum(ups) / len(ups) if ups else None}


def score(
    shards: str, split: str = "heldout", candidates: str | None = None, policy: str | None = None,
    heldout_fraction: float = 0.1, limit: int | None = None, build_workers: int | None = None, out: str | None = None,
    eval_cfg: Any = None, samples_per_task: int = 1, max_new_tokens: int = 1024, temperature: float = 0.0,
    turns: int = 3,
) -> dict[str, Any]:
    """Score candidates or a policy on a split of the shards; print the table, optionally write JSON.

    A policy plays episodes of `turns` turns and the table shows each turn beside the single-turn
    result; candidate files are one program each (single-turn)."""
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
        episodes = score_episodes(model, tok, rows, chat, eval_cfg, turns=turns, samples_per_task=samples_per_task,
                                  max_new_tokens=max_new_tokens, temperature=temperature)
        records = [r for e in episodes for r in e]
        what = f"policy {policy}" + (f", {turns} turns" if turns > 1 else "")
    summary = summarize(records) if candidates is not None else summarize_episodes(episodes, turns)
    summary.update(split=split, shards=shards, scored=what)
    print(format_table(summary, title=f"{what} on {split} ({len(rows)} tasks)"))
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "score.json"), "w") as f:
            out_records = ([r.to_dict() for r in records] if candidates is not None else
                           [dict(r.to_dict(), episode=i, turn=t + 1) for i, e in enumerate(episodes) for t, r in enumerate(e)])
            json.dump({"summary": summary, "records": out_records}, f, indent=2)
    return summary


@dataclasses.dataclass
class ScoreSettings:
    """What `score` takes, as settings (`pipelines.evaluate mode=score score.<key>=...`, conf/evaluate.yaml)."""

    shards: str | None = None  # a folder of shards (or a Hub dataset id)
    split: str = "heldout"  # train | heldout | all
    policy: str | None = None  # a checkpoint folder (a training run's final/) or a Hub model id
    candidates: str | None = None  # or: a folder of candidate files named <task_id>.py / .txt
    heldout_fraction: float = 0.1
    limit: int | None = None
    turns: int = 3  # turns per episode for a policy (1: single-turn only)
    samples_per_task: int = 1
    max_new_tokens: int = 1024
    temperature: float = 0.0
    out: str | None = None  # write score.json here

    def check(self) -> None:
        """The mistakes a user makes, as one line each (ValueError), before anything loads."""
        if not self.shards:
            raise ValueError("shards is required: the folder of shards to score on")
        if (self.candidates is None) == (self.policy is None):
            raise ValueError("give exactly one of policy (a checkpoint folder or a Hub model id) or candidates "
                             "(a folder of candidate files named <task_id>.py)")
        if self.candidates is not None and not os.path.isdir(self.candidates):
            raise ValueError(f"candidates={self.candidates}: no such folder")
        if self.policy is not None and (os.sep in self.policy or self.policy.startswith(".")) \
                and not os.path.isdir(self.policy):
            raise ValueError(f"policy={self.policy}: no such folder (a checkpoint folder such as a "
                             "training run's final/, or a Hub model id)")
        if self.turns < 1 or self.samples_per_task < 1:
            raise ValueError("turns and samples_per_task must be >= 1")


def run_settings(s: ScoreSettings, eval_cfg: Any = None, build_workers: int | None = None) -> dict[str, Any]:
    """`score` from settings; a bad setting or shards that give no tasks raise ValueError (one line)."""
    s.check()
    return score(s.shards, s.split, s.candidates, s.policy, s.heldout_fraction, s.limit, build_workers, s.out,
                 eval_cfg=eval_cfg, samples_per_task=s.samples_per_task, max_new_tokens=s.max_new_tokens,
                 temperature=s.temperature, turns=s.turns)


if __name__ == "__main__":  # the command moved to the shared front (pipelines/), where its one-line errors live
    sys.stderr.write("error: the score command is `python -m pipelines.score` (same arguments), or "
                     "`python -m pipelines.evaluate mode=score`\n")
    sys.exit(2)
