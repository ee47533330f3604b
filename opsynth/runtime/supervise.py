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
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass  # ended between the listing and the read
    return total


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


def stop_tree(pid: int, settle_s: float = STOP_SETTLE_S) -> list[int]:
    """SIGSTOP `pid` and everything below it, top first (a stopped process spawns nothing more), then
    once more for anything started meanwhile; returns the pids stopped (for `continue_pids`).

    SIGSTOP is delivered asynchronously: a compiler running on another core keeps running until the
    kernel gets to it. A timing that starts right after the kill can overlap it (CI saw a build still
    `running` inside a quiet window), so this returns only once each process reads stopped (or gone,
    or `settle_s` has passed: one in uninterruptible sleep stops when its I/O ends)."""
    stopped: list[int] = []
    for _ in range(2):
        for p in tree_pids(pid):
            if p not in stopped:
                try:
                    os.kill(p, signal.SIGSTOP)
                    stopped.append(p)
                except OSError:
                    pass
    wait_stopped(stopped, settle_s)
    return stopped


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
