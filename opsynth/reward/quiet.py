"""Quiet windows: nothing this evaluator runs shares the device with a timing.

Builds (the build service's children, the shared PCH's compiler, a compile baseline's
torch.compile) and the idle baseline children register here. While a window is open (a
candidate's timed rounds and the baseline blocks between them, `opsynth.reward.baselines.Pacer`),
each registered process tree is stopped (SIGSTOP: compilers, their children, OpenMP threads left
spinning after a block) and continued when the last window closes. Stopping instead of waiting for
builds to drain means a timing never waits for a build: a cold first evaluation times at once and
its PCH finishes afterwards. A process registered while a window is open is stopped at once.

Scope: this process's own children. Timings of other processes are kept apart by the device lock
(`opsynth.runtime.device_lock`); builds of another evaluator on the same host are not paused.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import contextmanager

from opsynth.runtime.supervise import continue_pids, stop_trees

_lock = threading.Lock()
_procs: dict[int, str] = {}  # pid -> what it is (for reports)
_stopped: dict[int, list[int]] = {}  # pid -> the pids of its tree that the open window stopped
_depth = 0  # open windows (several devices of one process may each hold one)
_since: dict[int, float] = {}  # pid -> when the open window stopped it
_paused_s: dict[int, float] = {}  # pid -> seconds its tree spent stopped by windows (reported with builds)
# pid -> its tree when it was last stopped: stopped first next time, so one /proc listing usually
# settles it (`supervise.stop_trees`); the most recent trees only (candidates come and go)
_trees: "OrderedDict[int, list[int]]" = OrderedDict()
_TREES_KEPT = 512
_trees_lock = threading.Lock()


def _stop_all(pids) -> dict[int, list[int]]:
    """Stop the trees of `pids` (one listing for all) and remember each for its next stop."""
    pids = list(pids)
    with _trees_lock:
        known = {p: _trees[p] for p in pids if p in _trees}
    got = stop_trees(pids, known=known)
    with _trees_lock:
        for p, members in got.items():
            _trees[p] = members
            _trees.move_to_end(p)
        while len(_trees) > _TREES_KEPT:
            _trees.popitem(last=False)
    return got


def _stop(pids) -> None:
    """Stop the trees of `pids` for the open window, recording what was stopped and since when."""
    now = time.perf_counter()
    for pid, members in _stop_all(pids).items():
        _stopped[pid] = members
        _since.setdefault(pid, now)


def _continue(pid: int) -> None:
    continue_pids(_stopped.pop(pid, []))
    t = _since.pop(pid, None)
    if t is not None:
        _paused_s[pid] = _paused_s.get(pid, 0.0) + time.perf_counter() - t


def register(pid: int, what: str = "build") -> None:
    """Pause `pid`'s tree in every window (now too, when one is open)."""
    with _lock:
        _procs[pid] = what
        if _depth:
            _stop([pid])


def unregister(pid: int) -> float:
    """Stop pausing `pid`; the seconds its tree spent stopped by windows."""
    with _lock:
        _procs.pop(pid, None)
        _continue(pid)
        with _trees_lock:
            _trees.pop(pid, None)
        return round(_paused_s.pop(pid, 0.0), 3)


def registered() -> dict[int, str]:
    with _lock:
        return dict(_procs)


class _OnStart:
    """`run_child`'s on_start: registers each child; `paused_s`, once the context has left, is how
    long windows kept them stopped (a cold build's wall is its compilers' time plus this)."""

    def __init__(self, what: str):
        self.what, self.pids, self.paused_s = what, [], 0.0

    def __call__(self, pid: int) -> None:
        self.pids.append(pid)
        register(pid, self.what)


@contextmanager
def tracked(what: str = "build"):
    """An `on_start` for `run_child` that registers the child, and unregisters it on leaving."""
    on_start = _OnStart(what)
    try:
        yield on_start
    finally:
        on_start.paused_s = round(sum(unregister(p) for p in on_start.pids), 3)


@contextmanager
def window():
    """Every registered process tree stopped for the duration (windows nest)."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1 and _procs:
            _stop(_procs)  # one /proc listing for every tree
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for pid in list(_stopped):
                    _continue(pid)


@contextmanager
def running(pid: int):
    """Inside a window, let one registered tree run (a baseline child timing its block)."""
    with _lock:
        _continue(pid)
    try:
        yield
    finally:
        with _lock:
            if _depth and pid in _procs:
                _stop([pid])


@contextmanager
def paused(pid: int | None):
    """One process tree (a candidate waiting for its next round) stopped for the duration."""
    pids = _stop_all([pid])[pid] if pid else []
    try:
        yield
    finally:
        continue_pids(pids)
