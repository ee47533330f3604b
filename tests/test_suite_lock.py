"""The suite's readers-writer lock (tests/conftest.py): under `make test` (two xdist workers) a test
marked `alone` must run while no other test runs, and ordinary tests must still run side by side.
A timing test that shares the machine with a build reads its baselines 2x slow (seen: 2.08 vs 1.00
ms), so the lock is what keeps those tests meaningful."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest", HERE / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hold(path: str, alone: bool, hold_s: float, start_at: float, q) -> None:
    share = _conftest()._suite_share
    time.sleep(max(0.0, start_at - time.monotonic()))  # CLOCK_MONOTONIC: one clock for all processes
    with share(path, alone):
        t0 = time.monotonic()
        time.sleep(hold_s)
        q.put((alone, t0, time.monotonic()))


def _run(path, plan):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # Each process asks at a common clock's time, not after its own start: a spawned interpreter's
    # start-up varies by more than the plan's gaps on a loaded machine (CI: the `alone` process asked
    # after the second ordinary one), and the test would then check another order than it planned.
    base = time.monotonic() + 5.0
    procs = [ctx.Process(target=_hold, args=(path, alone, hold, base + after, q)) for alone, hold, after in plan]
    for p in procs:
        p.start()
    spans = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return spans


def _overlap(a, b) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_an_alone_test_waits_for_running_tests_and_blocks_new_ones(tmp_path):
    """An ordinary test holding the lock; an `alone` test asks next, then another ordinary one: the
    `alone` one runs after the first and before the second (the gate keeps it from being starved),
    overlapping neither."""
    spans = _run(str(tmp_path / "suite.lock"), [(False, 1.0, 0.0), (True, 0.8, 0.3), (False, 0.3, 0.6)])
    alone = next(s for s in spans if s[0])
    ordinary = sorted((s for s in spans if not s[0]), key=lambda s: s[1])
    assert not any(_overlap(alone, o) for o in ordinary), spans
    assert ordinary[0][2] <= alone[1] <= ordinary[1][1], spans


def test_ordinary_tests_run_side_by_side(tmp_path):
    spans = _run(str(tmp_path / "suite.lock"), [(False, 1.0, 0.0), (False, 1.0, 0.2)])
    assert _overlap(spans[0], spans[1]), spans
