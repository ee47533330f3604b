"""Choose a task's ``batch_size`` before it is verified, from its seed and a cost model, never from a
clock, so that the same seed and settings give the same task code on every run and every machine.

Each candidate gets a target eager runtime drawn from a log-normal seeded by its sampler seed. The
graph's kernels are counted on meta tensors (:mod:`opsynth.graph.cost`) and their runtime is
predicted with a roofline at fixed *reference rates* (``VerifyConfig.rates``: settings, not
measurements); the batch size whose prediction is closest to the target, within the memory budget,
is the task's size. The verifier's timing then only accepts or rejects it.

Why reference rates rather than rates measured on the run's device: any size computed from a
measurement changes when the measurement does (a timing taken under load, another machine), and a
discrete size that depends on a noisy number flips whenever the number crosses a rounding edge. The
device's measured peaks are still recorded (state file, card) next to the reference rates, so a
reader sees how the two compare; on a device far from the reference, set the ``cost_*`` settings to
its measured rates (sizes, hence rows, then change with them, deterministically).

Memory is admitted here too, so that no candidate reaches the device that cannot fit there: a
verifier request holds much more than one forward (weights, two input sets and a clone, the
outputs its checks compare, the running forward: `GraphCost.request_bytes`), and that prediction
times ``VerifyConfig.mem_safety`` must fit the memory one request may use
(``VerifyConfig.task_memory_budget_mb``; on a GPU its share among the workers on it). The batch
size search stays within it; a candidate whose runtime target needs more, or that does not fit
even at the smallest batch size, is rejected as ``predicted_oom`` without running. Before this,
an H200 run spent GPU work on 52 of 446 candidates that then failed as ``oom``.
(``MEM_SHARE`` of the acceptance cap ``mem_cap_gb`` still bounds the first forward's peak.)

Predictions are kept inside ``[min_ms * band_margin, max_ms / band_margin]``, well within the window
the measured time must fall in (``VerifyConfig.accept_window``), so that a row's acceptance does not
hinge on the noise of one timing either; candidates whose prediction cannot get there are rejected
here, without running.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from opsynth.graph import OpGraph
from opsynth.graph.cost import AffineCost, GraphCost, predict_ms, replay_cost
from opsynth.render.task_file import PASS_COST

from .config import VerifyConfig

# Predicted peak memory may use this share of the memory cap: the estimate (inputs, weights and the
# largest kernel's operands) leaves out temporaries that the eager checks also keep alive.
MEM_SHARE = 0.5
# `mem_safety`'s default, 2.5, covers what the request model misses: on the CPU (29 sampled graphs,
# benchmarks/results/peak_memory_cpu.json) the measured request peak was 0.79x to 2.53x
# `request_bytes` (median 1.16, 90th percentile 1.93; the highest are operators that eager runs
# as several kernels with temporaries alive together: LocalResponseNorm, lp_pool, softmax), against
# 1.39x to 6.0x the first-forward `peak_bytes` (median 3.0). On the H200 (180 sampled graphs above
# 8 MB, benchmarks/results/peak_memory_h200/) it was 0.60x to 1.27x `request_bytes` (median 0.78,
# 90th percentile 0.90): the CUDA caching allocator reuses freed blocks where the CPU's malloc
# keeps arenas, so `mem_safety_cuda` is 1.5, not 2.5; 2.5 rejected about half of the candidates
# as `predicted_oom` there (793 in the 500-row audit, 127 of 255 in a 3-minute window).
# BatchNorm in training mode (the task's default) needs two rows; the sampler's floor is 2 as well.
MIN_BATCH = 2
MAX_BATCH = 1 << 24
# Tensors stay under 2**31 elements: past it some kernels need 64-bit indexing they do not have.
MAX_NUMEL = (1 << 31) - 1


@dataclass(frozen=True)
class SizeChoice:
    """The batch size chosen for a candidate, what the model predicts for it, and, when no batch
    size gives a prediction inside the target window, the rejection reason."""

    batch: int
    target_ms: float
    predicted_ms: float
    predicted_peak_mb: float
    reason: str | None = None  # None, "too_fast", "too_slow", "mem_cap", "predicted_oom", "size_error"
    message: str = ""
    predicted_request_mb: float = math.nan  # what one verifier request is predicted to hold (x steps)
    budget_mb: float | None = None  # what it may hold, over mem_safety (None: admission off)

    def evidence(self) -> dict[str, Any]:
        return {"stage": "size", "batch_size": self.batch, "target_ms": self.target_ms,
                "predicted_ms": self.predicted_ms, "predicted_peak_mb": self.predicted_peak_mb,
                "predicted_request_mb": self.predicted_request_mb, "budget_mb": self.budget_mb,
                "message": self.message}


def target_window(cfg: VerifyConfig, device: str) -> tuple[float, float]:
    """Where targets and predictions must lie: the band shrunk by ``band_margin`` on each side."""
    lim = cfg.limits(device)
    lo, hi = lim.min_ms * cfg.band_margin, lim.max_ms / cfg.band_margin
    if lo > hi:  # a band narrower than the margins: its geometric middle
        lo = hi = math.sqrt(lim.min_ms * lim.max_ms)
    return lo, hi


def draw_target_ms(seed: int, cfg: VerifyConfig, device: str) -> float:
    """Log-normal (median and 90th percentile: ``VerifyConfig.targets(device)``) from the candidate's
    seed, truncated to the target window (redrawn, not clipped: clipping would pile targets up at
    the window's edges, the places a timing error matters most)."""
    rng = random.Random(f"opsynth-size-target:{int(seed)}")
    lo, hi = target_window(cfg, device)
    for _ in range(1000):
        t = rng.lognormvariate(math.log(cfg.targets(device)[0]), cfg.target_sigma(device))
        if lo <= t <= hi:
            return t
    return min(max(t, lo), hi)  # a distribution almost entirely outside the window


class _Costs:
    """The graph's cost by batch size: from an affine fit of three replays when the counts are
    affine (almost always), else from a memoised replay per batch size (None where the replay
    raises: that batch size does not work for these operators)."""

    def __init__(self, graph: OpGraph, catalog):
        self.graph, self.catalog = graph, catalog
        self._cache: dict[int, GraphCost | None] = {}
        self.affine = AffineCost.fit(self.replay, MIN_BATCH)

    def replay(self, batch: int) -> GraphCost | None:
        if batch not in self._cache:
            try:
                self._cache[batch] = replay_cost(self.graph, self.catalog, batch)
            except Exception:  # noqa: BLE001 - an operator that refuses this shape
                self._cache[batch] = None
        return self._cache[batch]

    def __call__(self, batch: int) -> GraphCost | None:
        return self.affine.at(batch) if self.affine is not None else self.replay(batch)


def choose_batch(graph: OpGraph, catalog, seed: int, cfg: VerifyConfig, device: str,
                 budget_mb: float | None = None) -> SizeChoice:
    """The batch size for this candidate (see the module docstring). Deterministic: it reads the
    graph, the seed, the settings and ``budget_mb`` (the memory one verifier request may use: the
    pool's `task_mem_budget_mb`; None: `cfg.task_memory_budget_mb(device)`), nothing else."""
    rates = cfg.rates(device, graph.dtype)
    # A backward step costs PASS_COST forwards, in time and (saved activations, gradients) in memory.
    steps = PASS_COST[graph.task_pass]
    cap = cfg.limits(device).mem_cap_gb * 2**30 * MEM_SHARE / steps
    if budget_mb is None:
        budget_mb = cfg.task_memory_budget_mb(device)
    safety = cfg.safety(device)
    admit = budget_mb * 2**20 / safety / steps if safety > 0 else None
    target = draw_target_ms(seed, cfg, device)
    lo, hi = target_window(cfg, device)
    costs = _Costs(graph, catalog)

    def pred(b: int) -> float:
        c = costs(b)
        return math.inf if c is None else max(steps * predict_ms(c, rates), 1e-9)  # views only: nothing runs

    def under_cap(b: int) -> bool:
        c = costs(b)
        return c is not None and c.peak_bytes <= cap and c.max_numel <= MAX_NUMEL

    def admitted(b: int) -> bool:
        c = costs(b)
        return admit is None or (c is not None and c.request_bytes <= admit)

    def fits(b: int) -> bool:
        return under_cap(b) and admitted(b)

    def choice(batch: int, p: float, c, reason: str | None = None, message: str = "") -> SizeChoice:
        return SizeChoice(batch, target, p, steps * c.peak_bytes / 2**20, reason, message,
                          steps * c.request_bytes / 2**20, budget_mb if admit is not None else None)

    def over_budget(batch: int, c) -> str:
        return (f"predicted {steps * c.request_bytes / 2**20:.1f} MB per verifier request at batch_size {batch}, "
                f"x mem_safety {safety:g}, is above the {budget_mb:.0f} MB one request may use")

    # Largest batch within the memory budget (peak memory grows with the batch), by doubling then
    # bisection; runtime grows with the batch too, so the same search finds the target.
    if not fits(MIN_BATCH):
        c = costs(MIN_BATCH)
        if c is None:
            return SizeChoice(MIN_BATCH, target, math.inf, math.inf, "size_error",
                              f"the operators do not run at batch_size {MIN_BATCH} (replayed on meta tensors)")
        if not under_cap(MIN_BATCH):
            return SizeChoice(MIN_BATCH, target, pred(MIN_BATCH), c.peak_bytes / 2**20, "mem_cap",
                              f"predicted peak memory {c.peak_bytes / 2**30:.2f} GB at batch_size {MIN_BATCH} is above "
                              f"{MEM_SHARE:g} x the {cfg.limits(device).mem_cap_gb:g} GB cap")
        return choice(MIN_BATCH, pred(MIN_BATCH), c, "predicted_oom", over_budget(MIN_BATCH, c))
    top = MIN_BATCH
    while top < MAX_BATCH and pred(top) < target and fits(min(2 * top, MAX_BATCH)):
        top = min(2 * top, MAX_BATCH)
    if pred(top) < target and top < MAX_BATCH:  # memory, not runtime, stopped the doubling
        a, z = top, min(2 * top, MAX_BATCH)  # fits(a), not fits(z)
        while z - a > 1:
            m = (a + z) // 2
            a, z = (m, z) if fits(m) else (a, m)
        top = a
    # Smallest batch whose prediction reaches the target (or the largest allowed one).
    a, z = MIN_BATCH - 1, top
    if pred(top) >= target:
        while z - a > 1:
            m = (a + z) // 2
            a, z = (a, m) if pred(m) >= target else (m, z)
    batch = z
    if (batch > MIN_BATCH and pred(batch - 1) >= lo
            and abs(math.log(pred(batch - 1) / target)) < abs(math.log(pred(batch) / target))):
        batch -= 1
    final = costs.replay(batch)  # the chosen size, replayed: what is reported is what was counted
    if final is None:
        return SizeChoice(batch, target, math.inf, math.inf, "size_error",
                          f"the operators do not run at batch_size {batch} (replayed on meta tensors)")
    p = max(steps * predict_ms(final, rates), 1e-9)
    if p < lo:
        stopped = batch == top and top < MAX_BATCH
        if stopped and under_cap(top + 1) and not admitted(top + 1):  # the request budget, not the cap
            nxt = costs(top + 1)
            return choice(batch, p, final, "predicted_oom",
                          f"predicted {p:.4g} ms at batch_size {batch}, below the {lo:.4g} ms target window, and a "
                          f"larger batch_size would not fit: {over_budget(top + 1, nxt)}")
        why = "the memory budget allows no larger batch_size" if stopped else "the prediction does not grow with batch_size"
        return choice(batch, p, final, "too_fast",
                      f"predicted {p:.4g} ms at batch_size {batch}, below the {lo:.4g} ms target window: {why}")
    if p > hi:
        return choice(batch, p, final, "too_slow",
                      f"predicted {p:.4g} ms at batch_size {batch}, above the {hi:.4g} ms target window")
    return choice(batch, p, final)


__all__ = ["MEM_SHARE", "SizeChoice", "choose_batch", "draw_target_ms", "target_window"]
