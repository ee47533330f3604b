"""The GRPO reward function: every completion is scored by the reward environment.

TRL calls a reward function as `f(prompts=..., completions=..., task_code=[...], **columns)` and
wants one float per completion. Each evaluation compiles and runs a candidate in a child process, so
they run concurrently (a thread per evaluation only waits on its child). Per-completion outcomes are
fed to TRL's `log_metric` (which averages them across ranks and logging steps, so a 0/1 value per
completion becomes an exact rate) and appended to a JSON-lines log of every evaluation.
"""

from __future__ import annotations

import json
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from opsynth.rl.prompts import completion_text
from opsynth.rl.score import EvalRecord, record_from_result

REWARD_LEVELS = (-1, 1, 2, 3)


def _evaluate(task_code: str, candidate: str, eval_cfg: Any):
    # Imported lazily so the rest of the training stage imports without the reward environment.
    from opsynth.rl.evaluate import evaluate

    return evaluate(task_code, candidate, eval_cfg)


class KernelReward:
    """A TRL reward function backed by `opsynth.rl.evaluate.evaluate`.

    `completion_to_candidate` maps a completion's text to the candidate handed to the reward
    environment (default: the text itself, from which the environment extracts the fenced code).
    Tests use it to let a one-token policy pick among known candidate programs.
    """

    __name__ = "kernel_reward"

    def __init__(
        self,
        eval_cfg: Any = None,
        max_workers: int = 4,
        completion_to_candidate: Callable[[str], str] | None = None,
        log_path: str | None = None,
        evaluate_fn: Callable[[str, str, Any], Any] | None = None,
    ):
        self.eval_cfg = eval_cfg
        self.max_workers = max(1, int(max_workers))
        self.completion_to_candidate = completion_to_candidate
        self.log_path = log_path
        self._evaluate = evaluate_fn or _evaluate
        self._lock = threading.Lock()
        self.history: list[EvalRecord] = []  # every evaluation this process made, in order

    def _one(self, task_code: str, text: str, task_id: str | None) -> EvalRecord:
        candidate = self.completion_to_candidate(text) if self.completion_to_candidate else text
        try:
            result = self._evaluate(task_code, candidate, self.eval_cfg)
        except Exception as exc:  # the environment should never raise; if it does, it is a -1
            return EvalRecord(task_id=task_id, reward=-1.0, correct=False, reason=f"reward_env_error: {exc!r}"[:300])
        return record_from_result(result, task_id=task_id)

    def evaluate_batch(
        self, task_codes: list[str], texts: list[str], task_ids: list[str | None] | None = None
    ) -> list[EvalRecord]:
        """Evaluate completions concurrently; results come back in input order."""
        task_ids = task_ids or [None] * len(texts)
        if self.max_workers == 1 or len(texts) == 1:
            return [self._one(c, t, i) for c, t, i in zip(task_codes, texts, task_ids)]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(texts))) as pool:
            return list(pool.map(self._one, task_codes, texts, task_ids))

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        task_code: list[str],
        task_id: list[str] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        trainer_state: Any = None,
        **_: Any,
    ) -> list[float]:
        texts = [completion_text(c) for c in completions]
        records = self.evaluate_batch(list(task_code), texts, list(task_id) if task_id else None)
        step = int(getattr(trainer_state, "global_step", 0) or 0)
        with self._lock:
            self.history.extend(records)
            self._append_log(records, step)
        if log_metric is not None:
            self._log_metrics(records, log_metric)
        return [float(r.reward) for r in records]

    @staticmethod
    def _log_metrics(records: list[EvalRecord], log_metric: Callable[[str, float], None]) -> None:
        # One value per completion: TRL sums values and counts across ranks, so means are exact rates.
        for r in records:
            log_metric("kernel/pass_rate", float(r.correct))
            log_metric("kernel/faster_than_eager", float(r.reward >= 2))
            log_metric("kernel/faster_than_compile", float(r.reward >= 3))
            for level in REWARD_LEVELS:
                log_metric(f"kernel/reward_frac_{level}", float(r.reward == level))
            if r.correct and r.speedup_eager and r.speedup_eager > 0:
                log_metric("kernel/log_speedup_eager", math.log(r.speedup_eager))
            if r.correct and r.speedup_compile and r.speedup_compile > 0:
                log_metric("kernel/log_speedup_compile", math.log(r.speedup_compile))

    def _append_log(self, records: list[EvalRecord], step: int) -> None:
        if not self.log_path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        with open(self.log_path, "a") as f:
            for r in records:
                f.write(json.dumps({"step": step, **r.to_dict()}) + "\n")
