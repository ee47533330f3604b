"""The verifier's timing contract (opsynth.runtime.timing.timed_median, sample_until): repeats stop once
the median is precise, at the cap for a noisy timer, at the time budget for a slow one, and after two
samples for a task far outside the caller's band. Driven by fake samplers and a fake clock: no test
here times anything real."""

from __future__ import annotations

import itertools
import random

import pytest

from opsynth.runtime import timing
from opsynth.runtime.timing import STOPS, median_ci, precise_enough, sample_until, timed_median


def _seq(values):
    it = iter(values)
    return lambda: next(it)


def _steady(ms: float, rel: float = 0.002, seed: int = 0):
    """A low-noise timer: samples within +-rel of ms."""
    rng = random.Random(seed)
    return lambda: ms * (1 + rng.uniform(-rel, rel))


def _noisy(ms: float, seed: int = 0):
    """A noisy timer: samples spread over 0.7x to 1.5x of ms."""
    rng = random.Random(seed)
    return lambda: ms * rng.uniform(0.7, 1.5)


def test_the_median_interval_is_the_order_statistics_of_95_percent():
    assert median_ci([5, 1, 2, 3, 4]) == (1, 5)           # five: the range (94 %, the best there is)
    assert median_ci(list(range(9))) == (1, 7)           # nine: the second and the eighth (96 %)
    assert median_ci(list(range(20))) == (5, 14)         # twenty: the 6th and 15th (96 %)
    assert median_ci(list(range(20)), level=0.5) == (7, 12)  # 74 %; (8, 11) covers 49.7 %
    assert precise_enough([10.0, 10.1, 9.9, 10.0, 10.05], 0.02)
    assert not precise_enough([10.0, 10.1, 9.9, 10.0, 10.5], 0.02)  # the range reaches 5 % above


def test_a_low_noise_timer_stops_at_the_minimum():
    times, stop = sample_until(_steady(20.0), repeats=20, min_repeats=5, budget_ms=1e9, rel_tol=0.02)
    assert (len(times), stop) == (5, "precise")


def test_a_noisy_timer_runs_to_the_cap():
    times, stop = sample_until(_noisy(2.0), repeats=20, min_repeats=5, budget_ms=1e9, rel_tol=0.02)
    assert (len(times), stop) == (20, "cap")


def test_one_outlier_costs_a_few_runs_not_the_cap():
    """A high fifth sample keeps the range wide; at nine samples the interval leaves the extremes out."""
    times, stop = sample_until(_seq([10.0, 10.0, 10.0, 10.0, 13.0, 10.0, 10.0, 10.0, 10.0, 10.0]), repeats=20,
                               min_repeats=5, budget_ms=1e9, rel_tol=0.02)
    assert (len(times), stop) == (9, "precise")


def test_a_slow_noisy_timer_stops_at_the_time_budget():
    times, stop = sample_until(_noisy(80.0), repeats=20, min_repeats=5, budget_ms=1000.0, rel_tol=0.02)
    assert stop == "budget" and 1000.0 <= sum(times) < 1000.0 + 2 * 80.0 and len(times) < 20
    # slower than budget / min_repeats: min_repeats all the same
    times, stop = sample_until(_noisy(400.0), repeats=20, min_repeats=5, budget_ms=1000.0, rel_tol=0.02)
    assert (len(times), stop) == (5, "budget")


def test_without_a_tolerance_the_count_is_the_cap_or_the_budget():
    times, stop = sample_until(_steady(1.0), repeats=12, min_repeats=4, budget_ms=1e9)
    assert (len(times), stop) == (12, "cap")


@pytest.mark.parametrize("first, stop, n", [
    ([200.0, 210.0], "far_high", 2),     # both above 135 ms: the row cannot be in the band
    ([0.5, 0.6], "far_low", 2),          # both below 0.8 ms
    ([200.0, 50.0], "precise", 9),       # one high sample decides nothing: the timing goes on (to trim it)
    ([50.0, 50.0], "precise", 5),        # in the band: the precision rule decides, as without `far`
])
def test_far_out_of_band_samples_stop_after_two(first, stop, n):
    samples = itertools.chain(first, itertools.repeat(50.0))
    times, why = sample_until(lambda: next(samples), repeats=20, min_repeats=5, budget_ms=1e9, rel_tol=0.05,
                              far=(0.8, 135.0), far_after=2)
    assert (why, len(times)) == (stop, n) and why in STOPS


def test_far_never_changes_the_median_of_an_in_band_task():
    """Tasks with true medians across the acceptance window [1.2, 90] ms and timings that read up to 40 %
    high (never low): with and without the far rule, the same number of runs and the same median."""
    for m in (1.2, 1.5, 3.0, 20.0, 60.0, 89.9):
        for seed in range(20):
            a = sample_until(_upward(m, seed), 20, 5, 1000.0, 0.02, far=(1.2 / 1.5, 90.0 * 1.5))
            b = sample_until(_upward(m, seed), 20, 5, 1000.0, 0.02)
            assert a == b


def _upward(ms: float, seed: int):
    rng = random.Random(seed)
    return lambda: ms * (1 + 0.4 * rng.random() ** 4)


class _FakeClock:
    """A clock that moves only when the fake task runs: each call of `task` takes the next duration."""

    def __init__(self, durations_ms):
        self.now = 0.0
        self.calls = 0
        self._d = iter(durations_ms)

    def __call__(self) -> float:
        return self.now

    def task(self) -> None:
        self.calls += 1
        self.now += next(self._d) / 1e3


def test_timed_median_warms_up_then_times_with_the_clock(monkeypatch):
    monkeypatch.delenv(timing.NOISE_ENV, raising=False)
    clock = _FakeClock([999.0] + [20.0, 20.1, 19.9, 20.0, 20.05] + [50.0] * 20)  # the warm-up is not timed
    t = timed_median(clock.task, "cpu", warmup=1, repeats=20, min_repeats=5, budget_ms=1000.0, rel_tol=0.02,
                     clock=clock)
    assert (t.runs, t.warmup, t.stop, clock.calls) == (5, 1, "precise", 6)
    assert t.ms == pytest.approx(20.0) and t.spent_ms == pytest.approx(100.05)


def test_timed_median_far_stops_before_the_full_timing(monkeypatch):
    monkeypatch.delenv(timing.NOISE_ENV, raising=False)
    slow = _FakeClock([300.0] * 30)
    t = timed_median(slow.task, "cpu", warmup=1, repeats=20, min_repeats=5, budget_ms=1e9, rel_tol=0.0,
                     far=(0.8, 135.0), clock=slow)
    assert (t.stop, t.runs, slow.calls) == ("far_high", 2, 3)
    full = _FakeClock([300.0] * 30)
    t = timed_median(full.task, "cpu", warmup=1, repeats=20, min_repeats=5, budget_ms=1e9, rel_tol=0.0, clock=full)
    assert (t.stop, t.runs, full.calls) == ("cap", 20, 21)


def test_timed_median_times_a_real_cpu_call():
    t = timing.timed_median(lambda: sum(range(100)), "cpu", warmup=1, repeats=6, min_repeats=3, budget_ms=1e9)
    assert t.ms > 0 and t.runs == 6
