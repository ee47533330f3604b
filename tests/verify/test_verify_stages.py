"""Stage accounting of one verification, from the sections its worker replies report."""

import pytest

from opsynth.verify.stages import STAGES, device_sections, gpu_sections, stage_seconds, union_seconds


def _rep(*sections, wait=0.0):
    return {"sections": [list(s) for s in sections], "lock_wait_s": wait}


def test_calibration_rounds_are_the_eager_rounds_before_the_kept_one():
    replies = [
        ("eager", _rep(("checks", 0.0, 1.0), ("timing", 1.5, 2.0), wait=0.5)),   # too fast: rescaled
        ("eager", {**_rep(("checks", 2.0, 2.5), ("timing", 2.5, 3.5)), "ready_wait_s": 0.1}),  # kept
        ("compile", _rep(("compile", 3.5, 8.5), ("timing", 9.0, 9.5), ("cleanup", 9.5, 9.75), wait=0.5)),
    ]
    s = stage_seconds(replies, elapsed_s=10.0)
    assert set(s) == set(STAGES)
    assert s["calibration"] == pytest.approx(1.5)
    assert s["eager_checks"] == pytest.approx(0.5)
    assert s["timing"] == pytest.approx(1.5)
    assert s["compile"] == pytest.approx(5.0)
    assert s["lock_wait"] == pytest.approx(1.0)
    assert s["cleanup"] == pytest.approx(0.25)
    assert s["worker_restart"] == pytest.approx(0.1)
    assert s["verify_other"] == pytest.approx(0.15)
    assert gpu_sections(replies) == [(0.0, 1.0), (1.5, 2.0), (2.0, 2.5), (2.5, 3.5), (9.0, 9.5)]
    assert device_sections(replies) == {"checks": [(0.0, 1.0), (2.0, 2.5)], "compile": [(3.5, 8.5)],
                                        "timing": [(1.5, 2.0), (2.5, 3.5), (9.0, 9.5)]}


def test_a_rejection_in_the_first_round_is_all_eager_checks():
    s = stage_seconds([("eager", _rep(("checks", 5.0, 5.25)))], elapsed_s=0.3)
    assert s["eager_checks"] == pytest.approx(0.25) and s["calibration"] == 0.0
    assert s["verify_other"] == pytest.approx(0.05)
    assert stage_seconds([], elapsed_s=2.0)["verify_other"] == 2.0  # the worker died before replying


def test_the_rest_splits_into_worker_gaps_pipes_and_the_parent():
    """A worker that reports how long it handled each request, and a parent that timed each round trip,
    split what was `verify_other` into the worker's time outside its sections, the pipes, the parent."""
    replies = [
        ("eager", {**_rep(("checks", 0.0, 1.0), ("timing", 1.5, 2.0), wait=0.5), "handle_s": 2.25,
                   "round_trip_s": 2.5}),
        ("compile", {**_rep(("compile", 3.0, 5.0), ("cleanup", 5.0, 5.5)), "handle_s": 2.75, "round_trip_s": 2.875}),
    ]
    s = stage_seconds(replies, elapsed_s=6.0)
    assert s["worker_gaps"] == pytest.approx(0.25 + 0.25)
    assert s["pipes"] == pytest.approx(0.25 + 0.125)
    assert s["verify_other"] == pytest.approx(6.0 - 5.375)
    assert sum(s.values()) == pytest.approx(6.0)


def test_union_of_overlapping_sections():
    iv = [(0, 2), (1, 3), (5, 6), (5.5, 5.7)]
    assert union_seconds(iv) == pytest.approx(4.0)
    assert union_seconds(iv, lo=1.0, hi=5.5) == pytest.approx(2.5)
    assert union_seconds([]) == 0.0


def test_timed_repeats_stop_early_only_when_asked():
    from opsynth.runtime.timing import timed_median

    def fn():
        sum(range(1000))

    n_full = timed_median(fn, "cpu", warmup=1, repeats=12, min_repeats=4, budget_ms=1e9).runs
    n_early = timed_median(fn, "cpu", warmup=1, repeats=12, min_repeats=4, budget_ms=1e9, rel_tol=10.0).runs
    assert n_full == 12 and n_early == 4  # (the stopping rule itself: tests/runtime/test_timing_repeats.py)
