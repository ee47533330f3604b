"""Supervision of an untrusted process from the trusted side: kill its whole group, measure its
memory, read how it ended. Shared by the verifier's pool and the reward's children.

Why the process tree: a confined process (`isolation.enter`) is the waiting outer process whose only
child does the work (PID 1 of its own PID namespace), and tasks spawn compilers; the pid the
supervisor started holds little of the memory by itself. psutil reads the tree the same way on
every Linux.
"""

from __future__ import annotations

import os
import signal
import time

import psutil


# How long stop_tree waits for its SIGSTOPs to take effect (normally microseconds).
STOP_SETTLE_S = 1.0


def kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads (it was started in a new session), or the process itself
    when the group is gone or not ours; what it spawned, confined or not, dies with it."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and all its descendants (0 when it is gone)."""
    return trees_rss_bytes([pid])[pid]


def trees_rss_bytes(tops) -> dict[int, int]:
    """Resident memory of each of `tops` with its descendants ({top: 0} for one that is gone), from one
    listing of /proc for all of them. A listing per tree (psutil's `children(recursive=True)`, as the
    pool read its workers before) took 3 ms with 140 processes and 32 ms with 330 on a 2-core CPU; a
    pool that watched each of its 16 workers that way 4 times a second spent more than a core of its
    one GIL on it (`RssWatch`)."""
    tops = list(tops)
    if not tops:
        return {}
    page = os.sysconf("SC_PAGE_SIZE")
    out = {}
    for top, members in _trees(tops, _ppid_map()).items():
        total = 0
        for pid in members:
            try:
                with open(f"/proc/{pid}/statm", "rb") as f:
                    total += int(f.read().split()[1]) * page  # size, resident, ... in pages
            except (OSError, ValueError, IndexError):
                pass  # ended between the listing and the read
        out[top] = total
    return out


class RssWatch:
    """One thread that reads the tree memory of every watched pid every `period_s` (one /proc listing
    for all of them, `trees_rss_bytes`), for supervisors that each wait on one process: they read the
    latest reading instead of listing /proc themselves. A reading older than what the caller asks
    for (`since`) is not given, so memory held before a request is never charged to it."""

    def __init__(self, period_s: float = 0.25):
        import threading

        self.period_s = period_s
        self._pids: set[int] = set()
        self._readings: dict[int, tuple[float, int]] = {}  # pid -> (monotonic time read, bytes)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="opsynth-rss-watch", daemon=True)
        self._thread.start()

    def watch(self, pid: int) -> None:
        with self._lock:
            self._pids.add(pid)

    def unwatch(self, pid: int) -> None:
        with self._lock:
            self._pids.discard(pid)
            self._readings.pop(pid, None)

    def rss(self, pid: int, since: float) -> int | None:
        """The latest reading of `pid`'s tree if it was taken at or after `since` (monotonic)."""
        with self._lock:
            got = self._readings.get(pid)
        return got[1] if got is not None and got[0] >= since else None

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                pids = list(self._pids)
            if pids:
                t = time.monotonic()
                readings = trees_rss_bytes(pids)
                with self._lock:
                    for pid, rss in readings.items():
                        if pid in self._pids:
                            self._readings[pid] = (t, rss)
            self._stop.wait(self.period_s)


def exit_signal(returncode: int | None, confined: bool) -> int | None:
    """The signal that ended a process, from its return code: negative for a process we started
    directly; 128 + n for a confined one, whose waiting outer process exits with that code when the
    inner one is killed by signal n (`isolation.enter`)."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if confined and 128 < returncode < 128 + signal.NSIG:
        return returncode - 128
    return None


def tree_pids(pid: int) -> list[int]:
    """`pid` and all its descendants, whatever their session or PID namespace ([] when it is gone)."""
    try:
        top = psutil.Process(pid)
        return [pid, *(p.pid for p in top.children(recursive=True))]
    except psutil.Error:
        return []


def _ppid_map() -> dict[int, int]:
    """{pid: parent pid} of every process now: one pass over /proc/*/stat. Read here rather than
    with `psutil.process_iter(["ppid"])`, which builds a Process object per entry and took 3x as long
    (6.6 ms against 2.2 ms with 81 processes); psutil's own fast map is private."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            out[int(name)] = int(stat[stat.rfind(b")") + 2 :].split(None, 2)[1])  # after the name: state, ppid
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return out


def _trees(tops, ppids: dict[int, int]) -> dict[int, list[int]]:
    """Each of `tops` with its descendants, top first ([] for one that is gone), from one ppid map."""
    below: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        if pid != ppid:
            below.setdefault(ppid, []).append(pid)
    out: dict[int, list[int]] = {}
    for top in tops:
        if top not in ppids:
            out[top] = []
            continue
        order, queue, seen = [], [top], {top}
        while queue:
            p = queue.pop(0)
            order.append(p)
            for c in below.get(p, ()):
                if c not in seen:
                    seen.add(c)
                    queue.append(c)
        out[top] = order
    return out


def stop_trees(pids, settle_s: float = STOP_SETTLE_S, known: dict[int, list[int]] | None = None) -> dict[int, list[int]]:
    """SIGSTOP each of `pids` and everything below it, top first (a stopped process spawns nothing
    more), then once more for anything started meanwhile; returns {pid: the pids of its tree that
    were stopped} (for `continue_pids`).

    One listing of /proc per pass for all the trees, not one per tree: the reward's quiet window stops
    every build, baseline child and parked child at each timing, and a listing per tree cost about 2 ms
    each here (81 processes) and more under gVisor, where the window's opening read 0.05-0.25 s of each
    0.2-0.5 s timing section on the H200 (2026-12-06; `benchmarks/quiet_window_cost.py`).

    `known`: {pid: its tree when it was last stopped} (a candidate paused before each baseline block,
    a baseline child stopped again after its block). Those are stopped first, so one listing usually
    settles it: a member no longer in the tree (ended, its pid reused) is continued again at once, and
    only a pass that found a new member is followed by another.

    SIGSTOP is delivered asynchronously: a compiler running on another core keeps running until the
    kernel gets to it. A timing that starts right after the kill can overlap it (CI saw a build still
    `running` inside a quiet window), so this returns only once each process reads stopped (or gone,
    or `settle_s` has passed: one in uninterruptible sleep stops when its I/O ends)."""
    tops = list(dict.fromkeys(pids))
    stopped: dict[int, list[int]] = {top: [] for top in tops}
    done: set[int] = set()

    def stop(top: int, p: int) -> bool:
        try:
            os.kill(p, signal.SIGSTOP)
        except OSError:
            return False
        stopped[top].append(p)
        done.add(p)
        return True

    for top in tops:
        for p in (known or {}).get(top, ()):
            if p not in done:
                stop(top, p)
    look_again = not any(stopped.values())  # nothing known: the first listing finds the trees, a second checks
    for _ in range(3):
        trees = _trees(tops, _ppid_map())
        for top, members in trees.items():
            inside = set(members)
            strays = [p for p in stopped[top] if p not in inside]
            if strays:  # stopped from `known` but no longer of this tree: let it go again
                continue_pids(strays)
                stopped[top] = [p for p in stopped[top] if p in inside]
                done.difference_update(strays)
        grew = any([stop(top, p) for top, members in trees.items() for p in members if p not in done])
        if not grew and not look_again:
            break  # this listing found nothing the earlier stops had missed
        look_again = False
    wait_stopped([p for ps in stopped.values() for p in ps], settle_s)
    return stopped


def stop_tree(pid: int, settle_s: float = STOP_SETTLE_S) -> list[int]:
    """`stop_trees` for one tree: the pids stopped, top first."""
    return stop_trees([pid], settle_s)[pid]


def process_state(pid: int) -> str | None:
    """The one-letter state of `pid` from /proc (R, S, D, T, t, Z, ...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    tail = stat[stat.rfind(b")") + 2 :]  # the command name may hold spaces and parentheses
    return tail[:1].decode() or None


_STOPPED_STATES = {None, "T", "t", "Z", "X", "x"}


def wait_stopped(pids, settle_s: float) -> bool:
    """Wait until every one of `pids` is stopped or gone (True), or `settle_s` passed (False)."""
    deadline = time.monotonic() + settle_s
    pending = list(pids)
    while True:
        pending = [p for p in pending if process_state(p) not in _STOPPED_STATES]
        if not pending:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0005)


def continue_pids(pids) -> None:
    """SIGCONT each of `pids` (those gone are skipped)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGCONT)
        except OSError:
            pass
