"""The baseline child's wait for an idle device before each block (timing.wait_quiet): a stopped
candidate launches nothing, but kernels it queued before it was stopped run on beside the baseline."""

from __future__ import annotations

import math

import pytest

from opsynth.runtime import timing
from opsynth.runtime.timing import QUIET_CAP_MS, QuietDevice, quiet_threshold, wait_quiet


class _Clock:
    """A fake clock each probe advances by the probe's own time (and each sleep by its length)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _probes(clock: _Clock, readings):
    it = iter(readings)

    def probe() -> float:
        ms = next(it)
        clock.t += ms / 1e3
        return ms

    return probe


def test_an_idle_device_is_quiet_after_two_probes():
    clock, fastest = _Clock(), [math.inf]
    r = wait_quiet(_probes(clock, [0.05, 0.06]), fastest, clock=clock, sleep=clock.sleep)
    assert r["quiet"] and r["probes"] == 2 and r["waited_ms"] < 0.2 and fastest == [0.05]


def test_a_busy_device_is_waited_for_until_two_probes_in_a_row_read_idle():
    # the idle floor known from earlier probes; then a kernel of the candidate's holds time slices for
    # a while: probes wait about a slice each, one quick one between them does not end the wait
    clock, fastest = _Clock(), [0.05]
    readings = [1.8, 2.1, 0.06, 1.9, 2.0, 0.05, 0.07]
    r = wait_quiet(_probes(clock, readings), fastest, clock=clock, sleep=clock.sleep)
    assert r["quiet"] and r["probes"] == 7 and r["slowest_ms"] == 2.1
    assert r["waited_ms"] >= sum(readings[:-2])


def test_a_device_busy_past_the_cap_is_reported_not_quiet():
    clock, fastest = _Clock(), [0.05]
    r = wait_quiet(_probes(clock, [2.0] * 10_000), fastest, cap_ms=100.0, clock=clock, sleep=clock.sleep)
    assert not r["quiet"] and 100.0 <= r["waited_ms"] < 110.0
    assert QUIET_CAP_MS >= 1000.0  # the default waits out what an honest neighbour's work could take


def test_the_threshold_follows_the_idle_floor_within_its_bounds():
    assert quiet_threshold(0.01) == timing.QUIET_FLOOR_MS  # a fast machine: the floor
    assert quiet_threshold(0.15) == pytest.approx(0.6)  # a slower sync (a sandboxed driver): 4x its idle probe
    assert quiet_threshold(5.0) == timing.QUIET_CEILING_MS  # never as loose as a time slice
    # a floor measured while the device was busy is corrected by the first idle probe
    clock, fastest = _Clock(), [2.0]
    r = wait_quiet(_probes(clock, [0.05, 0.05]), fastest, clock=clock, sleep=clock.sleep)
    assert r["quiet"] and fastest == [0.05] and r["threshold_ms"] == timing.QUIET_FLOOR_MS


def test_on_the_cpu_backend_there_is_nothing_to_wait_for():
    assert QuietDevice("cpu").wait() is None
