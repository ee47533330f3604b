"""What the training stage keeps of one evaluation (`EvalRecord`), shared by the reward function and scoring.

Its own module so that `reward_fn` and `score` both import it and neither imports the other.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

REWARD_LEVELS = (-1, 1, 2, 3)


@dataclass
class EvalRecord:
    """What scoring keeps of one evaluation: the reward, why, and the measured speedups."""

    task_id: str | None
    reward: float
    correct: bool
    reason: str = ""
    speedup_eager: float | None = None  # eager time / candidate time
    speedup_compile: float | None = None  # torch.compile time / candidate time
    # The decision's ratio to eager and its interval (opsynth.reward.confidence), and whether a
    # threshold that decides the reward was left undecided at the cap on timed calls
    eager_ratio: float | None = None
    eager_ratio_lo: float | None = None
    eager_ratio_hi: float | None = None
    near_threshold: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _time_of(times: Any, *names: str) -> float | None:
    if not isinstance(times, dict):
        times = getattr(times, "__dict__", {}) or {}
    for n in names:
        v = times.get(n)
        if isinstance(v, (int, float)) and v > 0 and math.isfinite(v):
            return float(v)
    return None


def _inverse(ratio) -> float | None:
    return 1.0 / float(ratio) if isinstance(ratio, (int, float)) and ratio > 0 and math.isfinite(ratio) else None


def record_from_result(result: Any, task_id: str | None = None) -> EvalRecord:
    """An `EvalResult` of the reward environment, reduced to an `EvalRecord`."""
    times = getattr(result, "times", None) or {}
    cand = _time_of(times, "candidate_ms", "candidate", "new_ms", "model_new_ms", "t_ms")
    eager = _time_of(times, "eager_ms", "eager", "ref_ms", "reference_ms")
    comp = _time_of(times, "compile_ms", "compile", "compiled_ms")
    correct = bool(getattr(result, "correct", False))
    decision = ((getattr(result, "details", None) or {}).get("decision") or {}) if correct else {}
    return EvalRecord(
        task_id=task_id,
        reward=float(getattr(result, "reward", -1)),
        correct=correct,
        reason=str(getattr(result, "reason", "") or ""),
        # The reward's own statistic where it has one (median over the paired, interleaved blocks):
        # eager_ms / candidate_ms can mix a main pass with the re-measure pass the decision used.
        speedup_eager=_inverse(times.get("eager_ratio")) or ((eager / cand) if (correct and cand and eager) else None) if correct else None,
        speedup_compile=_inverse(times.get("compile_ratio")) or ((comp / cand) if (correct and cand and comp) else None) if correct else None,
        eager_ratio=_time_of(times, "eager_ratio") if correct else None,
        eager_ratio_lo=_time_of(times, "eager_ratio_lo") if correct else None,
        eager_ratio_hi=_time_of(times, "eager_ratio_hi") if correct else None,
        near_threshold=bool(decision["near_threshold"]) if "near_threshold" in decision else None,
    )
