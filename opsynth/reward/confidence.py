"""Reward decisions with a stated confidence: the candidate-to-baseline time ratio and its interval.

The candidate's timed calls and the baseline's come in alternating blocks over the same seconds
(`opsynth.reward.baselines.Pacer`), so what drifts between minutes (clock, a neighbour's load)
moves both samples alike and the ratio stays put. The ratio is the reward rule's own statistic,
median(candidate) / median(baseline); its interval is a percentile bootstrap of that statistic,
each sample resampled on its own, with a fixed seed (the same times always give the same interval).
Medians and a bootstrap: per-call times have heavy right tails (an interrupt, a page fault), which
a mean and a normal interval would follow.

A threshold is cleared when the whole interval lies on one side of it. The reward's thresholds are
`margin` (0.95) times eager and times torch.compile; eager itself (1.0) is reported and sampled for
too, since "faster than eager" is what the metrics count. While a threshold that decides the reward
is not cleared, the pacer takes more blocks, up to a cap; one still unclear then is not counted as
beaten (the lower reward), and the decision names it (`undecided`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

METHOD = ("median(candidate) / median(baseline) over interleaved blocks; percentile bootstrap "
          "(each sample resampled on its own, fixed seed)")
RESAMPLES = 2000
# A main pass may end before its planned rounds (`Pacer.ends_main_pass`) only when every threshold
# lies at least this far (relative) outside the interval: looking after every block is several looks,
# and a percentile bootstrap of a median from ten calls is narrower than it should be.
EARLY_MARGIN = 0.05
BELOW, ABOVE, UNCLEAR = "below", "above", "unclear"


@dataclass
class RatioInterval:
    """candidate / baseline: the ratio of medians and its bootstrap interval."""

    ratio: float
    lo: float
    hi: float
    n_candidate: int
    n_baseline: int
    confidence: float

    def to_dict(self) -> dict:
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def ratio_interval(candidate: list[float], baseline: list[float], confidence: float = 0.95,
                   resamples: int = RESAMPLES) -> RatioInterval | None:
    """The interval of median(candidate) / median(baseline); None when either sample is empty or
    not positive. One call on a side has no spread to resample: its interval is (0, inf)."""
    import numpy as np

    c = np.asarray([x for x in candidate if x > 0], dtype=np.float64)
    b = np.asarray([x for x in baseline if x > 0], dtype=np.float64)
    if not len(c) or not len(b):
        return None
    ratio = float(np.median(c) / np.median(b))
    if len(c) < 2 or len(b) < 2:
        return RatioInterval(ratio, 0.0, math.inf, len(c), len(b), confidence)
    rng = np.random.default_rng(0)
    mc = np.median(c[rng.integers(0, len(c), (resamples, len(c)))], axis=1)
    mb = np.median(b[rng.integers(0, len(b), (resamples, len(b)))], axis=1)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(mc / mb, [tail, 1.0 - tail])
    return RatioInterval(ratio, float(min(lo, ratio)), float(max(hi, ratio)), len(c), len(b), confidence)


def median_interval(sample: list[float], confidence: float = 0.95, resamples: int = RESAMPLES) -> tuple[float, float, float] | None:
    """(median, lo, hi) of one sample (its bootstrap interval): what a cached baseline is checked against."""
    iv = ratio_interval(sample, [1.0, 1.0], confidence, resamples)
    return None if iv is None else (iv.ratio, iv.lo, iv.hi)


def side(interval: RatioInterval | None, threshold: float, by: float = 0.0) -> str:
    """Where the interval lies against a ratio threshold: below it (faster), above, or across it;
    with `by`, only when it is also that far (relative) from the threshold."""
    if interval is None:
        return UNCLEAR
    if interval.hi < threshold * (1.0 - by):
        return BELOW
    if interval.lo >= threshold * (1.0 + by):
        return ABOVE
    return UNCLEAR


def open_thresholds(eager: RatioInterval | None, compile_: RatioInterval | None, margin: float,
                    compile_wanted: bool, by: float = 0.0) -> list[str]:
    """The thresholds whose interval is still across them (or, with `by`, within that relative
    distance of them): `eager x margin` and `eager x 1.0` always; `compile x margin` only once eager
    is beaten (before that it decides nothing)."""
    out = [name for name, t in ((f"eager x{margin}", margin), ("eager x1.0", 1.0)) if side(eager, t, by) == UNCLEAR]
    if compile_wanted and side(eager, margin) == BELOW and side(compile_, margin, by) == UNCLEAR:
        out.append(f"compile x{margin}")
    return out


def decide(eager: RatioInterval | None, compile_: RatioInterval | None, margin: float,
           compile_wanted: bool, capped: bool = False) -> dict:
    """The reward of a correct candidate from its intervals, and why: CUDA-Agent's rule (3 beats
    eager and compile by more than 1 - margin, 2 beats eager, else 1), where beating needs the whole
    interval below `margin`. `capped`: no more samples can be had; a threshold left unclear keeps
    the lower reward and is named in `undecided`."""
    beats_eager = side(eager, margin) == BELOW
    beats_compile = beats_eager and compile_wanted and side(compile_, margin) == BELOW
    reward = 3 if beats_compile else 2 if beats_eager else 1
    undecided = open_thresholds(eager, compile_, margin, compile_wanted)
    deciding = [u for u in undecided if u != "eager x1.0"]
    if deciding:
        note = (f"the ratio's {_level(eager, compile_)} interval is across {' and '.join(deciding)}"
                f"{' after the cap on timed calls' if capped else ''}: not counted as faster (reward {reward})")
    else:
        note = "every threshold that decides the reward is cleared"
    return {
        "reward": reward,
        "eager": None if eager is None else {**eager.to_dict(), "side": side(eager, margin), "side_vs_1": side(eager, 1.0)},
        "compile": None if compile_ is None else {**compile_.to_dict(), "side": side(compile_, margin)},
        "margin": margin,
        "undecided": undecided,
        "near_threshold": bool(deciding),
        "capped": capped,
        "note": note,
        "method": METHOD,
    }


def _level(*ivs) -> str:
    for iv in ivs:
        if iv is not None:
            return f"{iv.confidence:.0%}"
    return ""
