"""The GRPO reward function: every completion is scored by the reward environment.

TRL calls a reward function as `f(prompts=..., completions=..., task_code=[...], **columns)` and
wants one float per completion. Each evaluation compiles and runs a candidate in a child process, so
a batch goes to the environment's `evaluate_many` in one call: builds run in parallel on the CPU
while measurements take turns on the device (set `RewardConfig.build_workers`). Per-completion outcomes are
fed to TRL's `log_metric` (which averages them across ranks and logging steps, so a 0/1 value per
completion becomes an exact rate) and appended to a JSON-lines log of every evaluation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import threading
from typing import Any, Callable

from opsynth.train.prompts import completion_text
from opsynth.train.records import EvalRecord, record_from_result

REWARD_LEVELS = (-1, 1, 2, 3)


def log_record_metrics(records: list[EvalRecord], log_metric: Callable[[str, float], None], prefix: str = "kernel/") -> None:
    """Per-completion outcome metrics through TRL's `log_metric`: one value per record, so that TRL's
    sum-and-count across ranks makes each mean an exact rate."""
    for r in records:
        log_metric(f"{prefix}pass_rate", float(r.correct))
        log_metric(f"{prefix}faster_than_eager", float(r.reward >= 2))
        log_metric(f"{prefix}faster_than_compile", float(r.reward >= 3))
        for level in REWARD_LEVELS:
            log_metric(f"{prefix}reward_frac_{level}", float(r.reward == level))
        if r.correct and r.speedup_eager and r.speedup_eager > 0:
            log_metric(f"{prefix}log_speedup_eager", math.log(r.speedup_eager))
        if r.correct and r.speedup_compile and r.speedup_compile > 0:
            log_metric(f"{prefix}log_speedup_compile", math.log(r.speedup_compile))
        if r.correct and r.eager_ratio and r.eager_ratio_lo and r.eager_ratio_hi and math.isfinite(r.eager_ratio_hi):
            # the decision's ratio to eager and how wide its interval was (log of hi / lo: 0.1 is about +-5 %)
            log_metric(f"{prefix}log_eager_ratio", math.log(r.eager_ratio))
            log_metric(f"{prefix}eager_ratio_log_width", math.log(r.eager_ratio_hi / r.eager_ratio_lo))
        if r.correct and r.near_threshold is not None:
            log_metric(f"{prefix}near_threshold", float(r.near_threshold))  # left undecided at the cap: the lower reward


def _evaluate_many(pairs: list[tuple[str, str]], eval_cfg: Any) -> list[Any]:
    # Imported lazily so the rest of the training stage imports without the reward environment.
    # evaluate_many builds candidates in parallel and measures them one at a time on the device,
    # with one reference run per distinct task in the batch.
    from opsynth.reward.evaluate import evaluate_many

    return evaluate_many(pairs, eval_cfg)


def _as_candidate(text: str) -> str | None:
    """The code of a completion, or None when it has none.

    Extracting here (rather than handing the raw text over) also means a completion is never
    mistaken for a path on disk: extracted code always ends with a newline.
    """
    from opsynth.reward.candidate import extract_candidate

    return extract_candidate(text)


@contextlib.contextmanager
def _children_on_this_rank_gpu():
    """Under `accelerate launch` with several GPUs, make the environment's child processes use this
    rank's GPU (they open `cuda`, i.e. the first visible device, and inherit our environment), so
    ranks measure on their own GPUs instead of all timing on GPU 0 at once."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = os.environ.get("LOCAL_RANK")
    if world <= 1 or local is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [d for d in (before or "").split(",") if d.strip()]
    if visible and len(visible) == 1:
        yield  # already pinned by the launcher
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[int(local)] if visible else str(int(local))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


class KernelReward:
    """A TRL reward function backed by `opsynth.reward.evaluate.evaluate`.

    `completion_to_candidate` maps a completion's text to the candidate handed to the reward
    environment (default: the text itself, from which the environment extracts the fenced code).
    Tests use it to let a one-token policy pick among known candidate programs.
    """

    __name__ = "kernel_reward"

    def __init__(
        self,
        eval_cfg: Any = None,
        completion_to_candidate: Callable[[str], str] | None = None,
        log_path: str | None = None,
        evaluate_many_fn: Callable[[list[tuple[str, str]], Any], list[Any]] | None = None,
    ):
        self.eval_cfg = eval_cfg
        self.completion_to_candidate = completion_to_candidate
        self.log_path = log_path
        self._evaluate_many = evaluate_many_fn or _evaluate_many
        self._lock = threading.Lock()
        self.history: list[EvalRecord] = []  # every evaluation this process made, in order

    def evaluate_batch(
        self,
        task_codes: list[str],
        texts: list[str],
        task_ids: list[str | None] | None = None,
        from_completions: bool = True,
        modes: list[str | None] | None = None,
    ) -> list[EvalRecord]:
        """Evaluate a batch in one reward-environment call; results come back in input order.

        `from_completions`: the texts are model completions (code is extracted first, and one with
        no code scores -1 `no_code` without a child process); otherwise they are candidate sources
        or workspace paths, handed over as they are. `modes`: each task's train/eval mode (its row's
        `mode` column); None runs every task in `task_file.DEFAULT_MODE`.
        """
        return [record for record, _ in self.judge(task_codes, texts, task_ids, from_completions, modes)]

    def judge(
        self,
        task_codes: list[str],
        texts: list[str],
        task_ids: list[str | None] | None = None,
        from_completions: bool = True,
        modes: list[str | None] | None = None,
    ) -> list[tuple[EvalRecord, Any]]:
        """As `evaluate_batch`, keeping each environment verdict (`EvalResult`: its log, times and
        details) beside its record, for the feedback turn. One `evaluate_many` call for the batch."""
        from opsynth.reward.eval_types import EvalResult

        task_ids = list(task_ids) if task_ids else [None] * len(texts)
        modes = list(modes) if modes else [None] * len(texts)
        out: list[tuple[EvalRecord, Any] | None] = [None] * len(texts)
        pairs, where = [], []
        for i, (code, text) in enumerate(zip(task_codes, texts)):
            cand = self.completion_to_candidate(text) if self.completion_to_candidate else text
            if from_completions:
                cand = _as_candidate(cand)
                if cand is None:
                    res = EvalResult.rejected("no_code", "no fenced ```python block with a program in the answer")
                    out[i] = (EvalRecord(task_id=task_ids[i], reward=-1.0, correct=False, reason="no_code"), res)
                    continue
            pairs.append((code, cand) if modes[i] is None else (code, cand, modes[i]))
            where.append(i)
        if pairs:
            # Identical completions for the same task (common once a group agrees) share one
            # evaluation: the verdict on one program for one task does not depend on who wrote it.
            unique: dict[tuple, int] = {}
            for p in pairs:
                unique.setdefault(p, len(unique))
            try:
                with _children_on_this_rank_gpu():
                    results = list(self._evaluate_many(list(unique), self.eval_cfg))
                verdicts = [(record_from_result(r), r) for r in results]
            except Exception as exc:  # the environment should never raise; if it does, each is a -1
                reason = f"reward_env_error: {exc!r}"[:300]
                verdicts = [(EvalRecord(task_id=None, reward=-1.0, correct=False, reason=reason),
                             EvalResult.rejected("reward_env_error", repr(exc)[:2000])) for _ in unique]
            for i, p in zip(where, pairs):
                record, result = verdicts[unique[p]]
                out[i] = (dataclasses.replace(record, task_id=task_ids[i]), result)
        return out  # type: ignore[return-value]

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        task_code: list[str],
        task_id: list[str] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        trainer_state: Any = None,
        mode: list[str] | None = None,
        **_: Any,
    ) -> list[float]:
        texts = [completion_text(c) for c in completions]
        records = self.evaluate_batch(list(task_code), texts, list(task_id) if task_id else None,
                                      modes=list(mode) if mode else None)
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        self.append_log(records, step)
        if log_metric is not None:
            log_record_metrics(records, log_metric)
        return [float(r.reward) for r in records]

    def append_log(self, records: list[EvalRecord], step: int, extra: list[dict[str, Any]] | None = None) -> None:
        """Append records to the JSON-lines evaluation log (with the step and, per record, `extra` keys)."""
        with self._lock:
            self.history.extend(records)
            if not self.log_path:
                return
            os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
            with open(self.log_path, "a") as f:
                for k, r in enumerate(records):
                    f.write(json.dumps({"step": step, **(extra[k] if extra else {}), **r.to_dict()}) + "\n")
