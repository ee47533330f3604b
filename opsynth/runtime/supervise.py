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

import psutil


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


def stop_tree(pid: int) -> list[int]:
    """SIGSTOP `pid` and everything below it, top first (a stopped process spawns nothing more), then
    once more for anything started meanwhile; returns the pids stopped (for `continue_pids`)."""
    stopped: list[int] = []
    for _ in range(2):
        for p in tree_pids(pid):
            if p not in stopped:
                try:
                    os.kill(p, signal.SIGSTOP)
                    stopped.append(p)
                except OSError:
                    pass
    return stopped


def continue_pids(pids) -> None:
    """SIGCONT each of `pids` (those gone are skipped)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGCONT)
        except OSError:
            pass
