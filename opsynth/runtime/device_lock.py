"""The per-device lock: one lock file per physical GPU (and one for the CPU) in one folder per
machine, held (``fcntl.flock``) around every timed or checked section of the verifier's workers and
the reward environment's children, so their timings never overlap on a device while builds and
compilation run in parallel.

Two kinds of hold on a device: *checks* (correctness runs, reference outputs, profiling: any number
at once, `checks_share`) and *timing* (`timing_section`: the memory lock whole, so no checks of any
process run on the device meanwhile, then the timing lock). Only timing needs the device to itself.

The folder is `resolve_lock_dir()`: $OPSYNTH_LOCK_DIR, else the system temp folder of the trusted process
that names the lock (a confined child's own TMPDIR is its scratch, so children are handed the path
or, for the verifier's workers, the folder in their environment).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from typing import Callable, Iterator

LOCK_DIR_ENV = "OPSYNTH_LOCK_DIR"
# "0": timings are not a phase (`device_share`'s `exclusive_first` off: the writer-preferring lock alone),
# for a benchmark's side-by-side control only; every process on the device should see the same value
PHASES_ENV = "OPSYNTH_LOCK_PHASES"


def resolve_lock_dir(configured: str | None = None) -> str:
    """The folder of every device lock on this machine: `configured` (an explicit folder: tests, or
    a pool handing its resolved folder on), else $OPSYNTH_LOCK_DIR, else the system's temp folder as
    this (trusted) process sees it. The verifier's pool and the reward environment both ask here, so
    one GPU has one lock file whoever times on it."""
    return configured or os.environ.get(LOCK_DIR_ENV) or tempfile.gettempdir()


def lock_path(device_key: str, lock_dir: str | None = None) -> str:
    return os.path.join(resolve_lock_dir(lock_dir), f"opsynth-verify-timing-{device_key}.lock")


def gpu_key(index: int = 0, env: dict[str, str] | None = None) -> str:
    """The physical GPU behind visible CUDA device ``index``: its entry in ``CUDA_VISIBLE_DEVICES``
    (an index or a UUID) when that is set, else the index itself. Read without initialising CUDA,
    from ``env`` (another process's environment) or this process's."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if 0 <= index < len(entries):
            return entries[index]
    return str(index)


def device_lock_path(device: str, index: int = 0, lock_dir: str | None = None,
                     env: dict[str, str] | None = None) -> str:
    """The one lock file of a device, shared by the verifier and the reward environment: one per
    physical GPU (two GPUs never share a lock, whatever each process's CUDA_VISIBLE_DEVICES), one for
    the CPU. ``env``: the environment of the process that will lock it, when not this one."""
    key = "cpu" if device == "cpu" else f"cuda{gpu_key(index, env)}"
    return lock_path(key, lock_dir)


@contextmanager
def file_lock(path: str | None, on_wait: Callable[[], None] | None = None,
              on_acquired: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (no-op when ``path`` is None). ``on_wait`` is called
    before blocking and ``on_acquired`` after, so the parent can stop counting the wait against
    the task's timeout."""
    if path is None:
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # a sandboxed reader sees the lock on a read-only mount: flock needs no write access
        fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
            if on_acquired:
                on_acquired()
        yield
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def share_lock_paths(lock_file: str) -> tuple[str, str, str]:
    """The three files of a device's memory lock (beside its timing lock): the gate, the share, and
    the queue of exclusive holders (`device_share`)."""
    return f"{lock_file}.gate", f"{lock_file}.share", f"{lock_file}.queue"


def _open_lock(path: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # a confined worker sees the lock folder read-only: flock needs no write access
        return os.open(path, os.O_RDONLY)


def _flock(fd: int, op: int, on_wait: Callable[[], None] | None, waited: list[bool]) -> None:
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
    except BlockingIOError:
        if on_wait and not waited:
            on_wait()
        waited.append(True)
        fcntl.flock(fd, op)


@contextmanager
def device_share(lock_file: str | None, exclusive: bool, on_wait: Callable[[], None] | None = None,
                 on_acquired: Callable[[], None] | None = None, *, exclusive_first: bool | None = None) -> Iterator[None]:
    """Hold a device's memory: shared by ordinary requests, whole for one that must run alone (a
    timing section; the verifier's retry of a request that ran out of GPU memory beside the others).
    The timing lock alone does not give that: the other workers' checks go on allocating while one
    worker times.

    A writer-preferring reader/writer lock from flock files (flock has no writer preference of its
    own, so a steady stream of shared holders would starve the exclusive one): a sharer passes
    the gate, takes the share lock shared, and leaves the gate; the exclusive holder keeps the gate,
    so no new sharer enters, and takes the share lock exclusively once the sharers inside are done.

    `exclusive_first` (None: on unless $OPSYNTH_LOCK_PHASES is "0") makes the exclusive holders a phase: each one announces itself on
    the queue file (shared) before the gate and keeps it until it is done, and a sharer enters only
    once no exclusive holder is announced (it takes the queue whole for an instant). Without it, a
    sharer that wins the gate between two timings gets in, and the second timing waits for that
    sharer's whole checks: the device alternates one check, one timing, idle in between (the
    reward's measuring children: 0.71 s per result with 0.44 s of timing on the H200, 2026-12-06).
    With it, the timings that queued while the sharers drained run back to back, then every waiting
    sharer enters together (`benchmarks/lock_phases.py`). Sharers cannot starve: a timing is asked
    for only by a process that was a sharer (or holds nothing), and every queued one ends.

    Lock order is queue, gate, share, then the timing lock, for both kinds, and nobody waits on the
    queue while holding another of them, so no cycle can form."""
    if lock_file is None:
        yield
        return
    if exclusive_first is None:
        exclusive_first = os.environ.get(PHASES_ENV, "1") != "0"
    gate_path, share_path, queue_path = share_lock_paths(lock_file)
    gate, share, queue = _open_lock(gate_path), _open_lock(share_path), _open_lock(queue_path)
    waited: list[bool] = []
    try:
        if exclusive_first and exclusive:
            _flock(queue, fcntl.LOCK_SH, on_wait, waited)  # announced: no sharer enters until this one is done
        elif exclusive_first:
            _flock(queue, fcntl.LOCK_EX, on_wait, waited)  # no exclusive holder announced (waiting or inside)
            fcntl.flock(queue, fcntl.LOCK_UN)
        _flock(gate, fcntl.LOCK_EX, on_wait, waited)
        try:
            _flock(share, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, on_wait, waited)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        if waited and on_acquired:
            on_acquired()
        yield
    finally:
        try:
            fcntl.flock(share, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(queue, fcntl.LOCK_UN)
        finally:
            os.close(share)
            os.close(gate)
            os.close(queue)


def lock_files(lock_file: str | None) -> list[str]:
    """Every file of a device's locks: the timing lock and the memory lock's gate, share and queue
    (none without a lock). A confined child must be able to open each."""
    return [lock_file, *share_lock_paths(lock_file)] if lock_file else []


def create_lock_files(lock_file: str) -> None:
    """Create a device's lock files (`lock_files`), so a confined child, which sees the folder
    read-only, can open them all."""
    for path in lock_files(lock_file):
        try:
            open(path, "a").close()
        except OSError:
            pass


def checks_share(lock_file: str | None, on_wait: Callable[[], None] | None = None,
                 on_acquired: Callable[[], None] | None = None):
    """Checked (untimed) work on the device: shared with other checks, never beside a timing."""
    return device_share(lock_file, False, on_wait, on_acquired)


@contextmanager
def timing_section(lock_file: str | None, on_wait: Callable[[], None] | None = None,
                   on_acquired: Callable[[], None] | None = None) -> Iterator[None]:
    """The device to itself for timing: the memory lock whole (the checks of every process that takes
    `checks_share` or the verifier's memory share are done first, and none start meanwhile), then
    the timing lock (other timers, including those that take only the timing lock)."""
    if lock_file is None:
        yield
        return
    with device_share(lock_file, True, on_wait, on_acquired), file_lock(lock_file, on_wait, on_acquired):
        yield


class HeldShare:
    """A request's memory share that it can let go for a timing section and take again.

    The verifier's workers hold a device's memory share for a whole request (its checks allocate),
    and time inside it. Timing beside the other workers' checks reads high (the 1.38x `eager_ms`
    of issue 29), so a timed call needs `timing_section`; flock cannot upgrade a shared lock to an
    exclusive one (two sharers upgrading would deadlock), so the share is released, the section
    taken, and the share taken again after. While released, the request's tensors stay resident: an
    exclusive holder that slips in meanwhile sees them, as it sees any sharer's that were there when
    it asked. A request that holds the memory whole already owns the device: `timing()` then takes
    only the timing lock."""

    def __init__(self, lock_file: str | None, exclusive: bool = False, on_wait: Callable[[], None] | None = None,
                 on_acquired: Callable[[], None] | None = None):
        self.lock_file, self.exclusive = lock_file, exclusive
        self._events = {"on_wait": on_wait, "on_acquired": on_acquired}
        self._cm = None

    def _take(self) -> None:
        self._cm = device_share(self.lock_file, self.exclusive, **self._events)
        self._cm.__enter__()

    def _drop(self) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            cm.__exit__(None, None, None)

    @property
    def held(self) -> bool:
        return self._cm is not None

    def __enter__(self) -> "HeldShare":
        self._take()
        return self

    def __exit__(self, *exc) -> None:
        self._drop()

    def let_go(self) -> bool:
        """Let the share go now, for work that needs no device (torch.compile's code generation:
        `opsynth.verify.compile_aside`); True when it was held and is now let go, and the caller
        then calls `take_again`. False for a share held whole or not held."""
        if self.exclusive or self._cm is None:
            return False
        self._drop()
        return True

    def take_again(self) -> None:
        """The share again after `let_go` (waits like the first take: a timing section goes first)."""
        self._take()

    @contextmanager
    def released(self) -> Iterator[None]:
        """The share let go while inside (a timing section, `timing`), taken again after. No-op for
        a share held whole or not held."""
        dropped = self.let_go()
        try:
            yield
        finally:
            if dropped:
                self.take_again()

    @contextmanager
    def timing(self) -> Iterator[None]:
        if self.exclusive or self._cm is None:
            with file_lock(self.lock_file, **self._events):
                yield
            return
        with self.released(), timing_section(self.lock_file, **self._events):
            yield
