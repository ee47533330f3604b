"""Acceptance keeps a margin at the band edges: the eager median must be inside the band less
its margins (`edge_margin_low`, `edge_margin`), and a first timing near an edge is repeated, the
median deciding."""

from __future__ import annotations

import pytest

from opsynth.verify import VerifyConfig, WorkerPool
from opsynth.verify.worker import Worker

GOOD = "batch_size = 4\n"  # the pool's decision below never runs the source


def test_the_window_is_the_band_less_its_margin():
    cfg = VerifyConfig()
    assert cfg.accept_window("cuda") == pytest.approx((1.2, 90.0))  # the low edge keeps more
    assert cfg.accept_window("cpu") == pytest.approx((0.06, 90.0))
    with pytest.raises(ValueError, match="edge_margin"):
        VerifyConfig(edge_margin=0.6)


def _worker(cfg: VerifyConfig, timings: list[float]) -> Worker:
    w = Worker.__new__(Worker)  # no torch process: only the timing decision is under test
    w.cfg, w.device = cfg, "cpu"
    seq = iter(timings)
    w._time = lambda fn, since, far=None: (next(seq), 10)
    return w


@pytest.mark.parametrize("timings, want, n", [
    ([10.0], 10.0, 1),  # far from both edges: one timing
    ([1.3, 1.1, 1.4], 1.3, 3),  # near the low edge (1.2 ms): three, the median
    ([1.15, 1.3, 1.25], 1.25, 3),  # just outside at first, inside on the median
    ([85.0, 95.0, 99.0], 95.0, 3),  # near the high edge (90 ms)
])
def test_a_timing_near_an_edge_is_repeated_and_the_median_decides(timings, want, n):
    cfg = VerifyConfig(cpu_min_ms=1.0, cpu_max_ms=100.0)
    ms, _, got = _worker(cfg, timings)._time_eager(lambda: None, 0.0)
    assert ms == want and got == timings[:n]


@pytest.mark.parametrize("eager_ms, reason", [(0.99, "too_fast"), (1.15, "too_fast"), (1.25, "accepted"),
                                              (89.0, "accepted"), (95.0, "too_slow")])
def test_the_pool_accepts_only_inside_the_window(monkeypatch, eager_ms, reason):
    pool = WorkerPool(VerifyConfig(device="cpu", cpu_min_ms=1.0, cpu_max_ms=100.0, check_compile=False))
    monkeypatch.setattr(pool, "_request", lambda index, msg: {
        "ok": True, "eager_ms": eager_ms, "peak_mem_mb": 1.0, "timings": [eager_ms], "outputs": []})
    r = pool._run_checks(0, GOOD, 0.0)
    assert r.reason == reason, r.evidence
    if reason != "accepted":
        assert "acceptance window [1.2, 90]" in r.evidence["message"]


# ---- the timing itself (opsynth.runtime.timing.timed_median) inside the worker, on a fake clock ----------

class _FakeTask:
    """A task whose every call takes `ms` (times a factor from `jitter`) on a clock that moves only then."""

    def __init__(self, ms: float, jitter=lambda: 1.0):
        self.ms, self.jitter, self.now, self.calls = ms, jitter, 0.0, 0

    def clock(self) -> float:
        return self.now

    def __call__(self) -> None:
        self.calls += 1
        self.now += self.ms * self.jitter() / 1e3


def _timing_worker(cfg: VerifyConfig, monkeypatch, task: _FakeTask) -> Worker:
    from opsynth.runtime import timing

    monkeypatch.delenv(timing.NOISE_ENV, raising=False)
    monkeypatch.setattr(timing, "cpu_clock", lambda: ("fake", task.clock))
    w = Worker.__new__(Worker)  # no torch process, no lock: the real _time / _time_eager on a fake clock
    w.cfg, w.device, w.lock_file, w._lock_depth, w._share, w._compiling = cfg, "cpu", None, 0, None, False
    w.sections, w.timed, w.lock_wait_s = [], [], 0.0
    return w


BAND = dict(cpu_min_ms=1.0, cpu_max_ms=100.0, warmup=1, repeats=20, min_repeats=5, timing_budget_ms=1000.0,
            timing_rel_tol=0.02)


def test_a_far_too_slow_task_is_rejected_on_two_timed_calls_before_the_full_timing(monkeypatch):
    task = _FakeTask(300.0)  # the window is [1.2, 90] ms; beyond 135 ms (recheck zone 1.5) on both samples
    w = _timing_worker(VerifyConfig(**BAND), monkeypatch, task)
    ms, runs, timings = w._time_eager(task, 0.0)
    assert (runs, len(timings), task.calls) == (2, 1, 3)  # one warm-up, two timed, no recheck
    assert ms == pytest.approx(300.0) and timings == [ms]
    assert w.timed == [{"op": "eager", "ms": pytest.approx(300.0), "runs": 2, "warmup": 1, "stop": "far_high",
                        "spent_ms": pytest.approx(600.0)}]
    assert [k for k, _, _ in w.sections] == ["checks", "timing"]
    # the same task without the early stop: a warm-up and min_repeats (the budget caps the rest)
    task = _FakeTask(300.0)
    w = _timing_worker(VerifyConfig(**BAND, far_samples=0), monkeypatch, task)
    assert w._time_eager(task, 0.0)[1] == 5 and task.calls == 6


def test_a_far_too_fast_task_stops_after_two_and_the_audit_without_a_band_times_it_fully(monkeypatch):
    task = _FakeTask(0.3)
    w = _timing_worker(VerifyConfig(**{**BAND, "timing_rel_tol": 0.0}), monkeypatch, task)
    assert w._time_eager(task, 0.0)[1] == 2 and w.timed[0]["stop"] == "far_low"
    task = _FakeTask(0.3)
    w = _timing_worker(VerifyConfig(**{**BAND, "timing_rel_tol": 0.0}, check_band=False), monkeypatch, task)
    assert w._time_eager(task, 0.0)[1] == 20 and w.timed[0]["stop"] == "cap"


def test_a_steady_task_stops_at_min_repeats_and_a_noisy_one_runs_to_the_cap(monkeypatch):
    import random

    task = _FakeTask(20.0)
    w = _timing_worker(VerifyConfig(**BAND), monkeypatch, task)
    ms, runs, timings = w._time_eager(task, 0.0)
    assert (runs, len(timings)) == (5, 1) and ms == pytest.approx(20.0) and w.timed[0]["stop"] == "precise"
    rng = random.Random(1)
    task = _FakeTask(20.0, jitter=lambda: rng.uniform(0.8, 1.3))
    w = _timing_worker(VerifyConfig(**BAND), monkeypatch, task)
    assert w._time_eager(task, 0.0)[1] == 20 and w.timed[0]["stop"] == "cap"


def test_a_task_near_an_edge_is_still_timed_three_times_each_stopping_early(monkeypatch):
    task = _FakeTask(80.0)  # within 1.5x of the 90 ms edge: rechecked
    w = _timing_worker(VerifyConfig(**BAND), monkeypatch, task)
    ms, runs, timings = w._time_eager(task, 0.0)
    assert ms == pytest.approx(80.0) and len(timings) == 3
    assert [t["runs"] for t in w.timed] == [5, 5, 5] and task.calls == 3 * 6


def test_the_timings_reach_the_result(monkeypatch):
    pool = WorkerPool(VerifyConfig(device="cpu", cpu_min_ms=1.0, cpu_max_ms=100.0, check_compile=False))
    one = {"op": "eager", "ms": 300.0, "runs": 2, "warmup": 1, "stop": "far_high", "spent_ms": 600.0}
    monkeypatch.setattr(pool, "_request", lambda index, msg: {
        "ok": True, "eager_ms": 300.0, "peak_mem_mb": 1.0, "timings": [300.0], "outputs": [], "timed": [one]})
    r = pool._run_checks(0, GOOD, 0.0)
    assert r.reason == "too_slow" and r.timed == [one]


REAL_TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.lin = nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.lin(x))


batch_size = 32
features = 256


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
"""


def test_a_real_worker_stops_a_far_too_slow_timing_on_two_runs():
    """End to end on the CPU: a task far above a (tiny) band is rejected as too_slow on one warm-up and
    two timed runs, and the worker's reply says so (`VerifyResult.timed`)."""
    cfg = VerifyConfig(device="cpu", n_workers=1, check_compile=False, preload_compiler=False, cpu_min_ms=0.001,
                       cpu_max_ms=0.002, warmup=1, repeats=20, min_repeats=5)
    with WorkerPool(cfg) as pool:
        r = pool.verify(REAL_TASK)
    assert r.reason == "too_slow", r.evidence
    assert [(t["op"], t["runs"], t["warmup"], t["stop"]) for t in r.timed] == [("eager", 2, 1, "far_high")]
    assert r.stage_s["timing"] > 0
