"""The baseline child's wait for an idle device before each block (timing.wait_quiet): a stopped
candidate launches nothing, but kernels it queued before it was stopped run on beside the baseline.
A probe reads (host ms, device ms): another context's long time slices show on the host, short ones
(the probe switched out mid-kernel) in the kernel's own stretch."""

from __future__ import annotations

import math

import pytest

from opsynth.runtime import timing
from opsynth.runtime.timing import QUIET_CAP_MS, QuietDevice, device_threshold, quiet_threshold, wait_quiet


class _Clock:
    """A fake clock each probe advances by the probe's own time (and each sleep by its length)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _probes(clock: _Clock, readings):
    """Probe readings, each (host ms, device ms) or a host ms alone (device 0.03 ms, undisturbed)."""
    it = iter(readings)

    def probe():
        r = next(it)
        host, dev = r if isinstance(r, tuple) else (r, 0.03)
        clock.t += host / 1e3
        return host, dev

    return probe


def _wait(readings, fastest=None, **kw):
    clock = _Clock()
    fastest = fastest if fastest is not None else [math.inf, math.inf]
    return wait_quiet(_probes(clock, readings), fastest, clock=clock, sleep=clock.sleep, **kw), fastest


def test_an_idle_device_is_quiet_after_two_probes():
    r, fastest = _wait([0.05, 0.06])
    assert r["quiet"] and r["probes"] == 2 and r["waited_ms"] < 0.2 and fastest == [0.05, 0.03]


def test_long_time_slices_of_another_context_are_waited_out_on_the_host_reading():
    # the idle floor known from earlier probes; then the candidate's kernel holds the device in long
    # slices: probes wait about a slice each, and one quick one between them does not end the wait
    readings = [1.8, 2.1, 0.06, 1.9, 2.0, 0.05, 0.07]
    r, _ = _wait(readings, [0.05, 0.03])
    assert r["quiet"] and r["probes"] == 7 and r["slowest_ms"] == 2.1
    assert r["waited_ms"] >= sum(readings[:-2])


def test_short_time_slices_show_in_the_probe_kernels_own_stretch():
    # the host reading stays low (slices shorter than the threshold) while the kernel, switched out
    # mid-run, takes twice its idle stretch: not idle until it runs whole again
    readings = [(0.12, 0.061), (0.11, 0.058), (0.12, 0.06), (0.06, 0.031), (0.05, 0.030)]
    r, _ = _wait(readings, [0.05, 0.03])
    assert r["quiet"] and r["probes"] == 5 and r["device_slowest_ms"] == 0.061
    # without the device reading (host only) the same probes would have read idle at once
    r_host, _ = _wait([h for h, _ in readings], [0.05, math.inf])
    assert r_host["probes"] == 2


def test_a_device_busy_past_the_cap_is_reported_not_quiet():
    r, _ = _wait([2.0] * 10_000, [0.05, 0.03], cap_ms=100.0)
    assert not r["quiet"] and 100.0 <= r["waited_ms"] < 110.0
    assert QUIET_CAP_MS >= 1000.0  # the default waits out what an honest neighbour's work could take


def test_with_no_time_left_an_idle_device_still_reads_quiet_a_busy_one_does_not():
    # a candidate whose earlier blocks used up the wait budget: two probes, no waiting
    assert _wait([0.05, 0.05], [0.05, 0.03], cap_ms=0.0)[0]["quiet"]
    r, _ = _wait([2.0, 2.0, 2.0], [0.05, 0.03], cap_ms=0.0)
    assert not r["quiet"] and r["probes"] == 2


def test_the_thresholds_follow_the_idle_floor_within_their_bounds():
    assert quiet_threshold(0.01) == timing.QUIET_FLOOR_MS  # a fast machine: the floor
    assert quiet_threshold(0.15) == pytest.approx(0.6)  # a slower sync (a sandboxed driver): 4x its idle probe
    assert quiet_threshold(5.0) == timing.QUIET_CEILING_MS  # never as loose as a time slice
    assert device_threshold(0.03) == pytest.approx(0.05)
    # a floor read while the device was busy is corrected by the first idle probe
    r, fastest = _wait([0.05, 0.05], [2.0, 0.09])
    assert r["quiet"] and fastest == [0.05, 0.03] and r["threshold_ms"] == timing.QUIET_FLOOR_MS


def test_on_the_cpu_backend_there_is_nothing_to_wait_for():
    assert QuietDevice("cpu").wait() is None
