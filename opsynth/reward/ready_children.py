"""Measuring children that are ready before their candidate arrives (`reward.ready_children`).

A measuring child's start is the same for every candidate: a fork of the warm server, the sandbox's
confinement, torch's CPU pools and, on CUDA, a context (0.3-1.1 s on the H200 with 8 children in
flight, more under load). Here a few such children per device are forked ahead of time
(`opsynth.runtime.sandbox.ParkedChild`): each does that start-up, then waits for exactly one job.
`take` hands one to `_measure`, and a refill thread forks its replacement in the background.

Each parked child runs one candidate and ends: nothing of one candidate's process can reach the
next. While parked it is registered with `opsynth.reward.quiet` (stopped in every timing window, like
builds), so its CUDA start never shares the device with a timing; `take` unregisters it.

Keyed by what shapes a measuring child before its job: the device, the fork server's environment,
the confinement, the cache folder and thread count. A config with other settings gets its own pool.

The same for the two children a task's evaluation starts before any candidate is measured (`ROLES`):
the reference child (`reference_runner`) and the eager baseline child (`baseline_runner`). Both start
on the batch's critical path: the first measurement waits for the reference, and the first timing for
the eager child (on the H200, 2026-12-06, the reference of a GRPO-shaped batch was ready at 4.6-5.6 s,
builds at 3.6-4.0 s; a cold child's CUDA context took 2.5-3.8 s of that). Each role has its own pool of
`side_size` children, taken once per task; a compile baseline child is never parked (it reads the task's
compile cache, bound at its fork).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from pathlib import Path

# role -> (runner module, scratch prefix, outputs channel name or None: the reference and the measuring
# child hand their outputs over a channel of the parent's; the baseline child has none)
ROLES = {
    "measure": ("opsynth.reward.candidate_runner", "opsynth_cand_", "opsynth-candidate-outputs"),
    "reference": ("opsynth.reward.reference_runner", "opsynth_ref_", "opsynth-reference-outputs"),
    "baseline": ("opsynth.reward.baseline_runner", "opsynth_base_eager_", None),
}

_pools: dict[tuple, "ReadyChildren"] = {}
_pools_lock = threading.Lock()


class Parked:
    """A parked measuring child with the scratch folder and outputs channel it was forked with."""

    def __init__(self, child, channel, scratch: Path):
        self.child, self.channel, self.scratch = child, channel, scratch

    def discard(self) -> None:
        self.child.close()
        if self.channel is not None:
            self.channel.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


class ReadyChildren:
    """Up to `size` parked children of one role (`ROLES`) for one config and device, refilled in the
    background."""

    def __init__(self, cfg, device: str, size: int, role: str = "measure"):
        if role not in ROLES:
            raise ValueError(f"unknown ready-child role {role!r}; one of {sorted(ROLES)}")
        self.cfg, self.device, self.size, self.role = cfg, device, size, role
        self._ready: list[Parked] = []
        self._cond = threading.Condition()
        self._closed = False
        self.forked = self.taken = self.failed = 0
        self.last_error = ""
        self._thread = threading.Thread(target=self._refill, name=f"opsynth-ready-{role}-{device}", daemon=True)
        self._thread.start()

    def _fork_one(self) -> Parked:
        from opsynth.reward import quiet
        from opsynth.reward.eval_types import RUNNERS, device_env
        from opsynth.reward.outputs_file import OutputsChannel
        from opsynth.runtime.sandbox import ParkedChild

        cfg, device = self.cfg, self.device
        module, prefix, channel_name = ROLES[self.role]
        scratch = Path(tempfile.mkdtemp(prefix=prefix))
        channel = OutputsChannel(channel_name) if channel_name else None
        threads = cfg.resolved_cpu_threads(device)
        lock = None
        if self.role == "reference":  # the reference takes the device lock itself (its checks and timed rounds)
            from opsynth.reward.eval_types import device_lock_file

            lock = device_lock_file(cfg, device)
        try:
            child = ParkedChild(module, scratch, cfg, cpu_threads=threads, env_extra=device_env(cfg, device), warm=RUNNERS,
                                channels={"outputs": channel.fd} if channel is not None else None, build=True,
                                prewarm={"device": device, "cpu_threads": threads}, device_lock=lock)
        except BaseException:
            if channel is not None:
                channel.close()
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        quiet.register(child.pid, "parked")  # its CUDA start waits out every timing window
        return Parked(child, channel, scratch)

    def _refill(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._closed and len(self._ready) >= self.size:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                p = self._fork_one()
                failures = 0
            except Exception as e:  # noqa: BLE001 - `take` then finds none and the caller forks its own child
                self.failed += 1
                self.last_error = f"{type(e).__name__}: {e}"[:500]
                failures += 1
                with self._cond:  # back off: a fork server that cannot start is retried, not hammered
                    self._cond.wait(min(30.0, 0.5 * 2 ** failures))
                continue
            with self._cond:
                self.forked += 1
                if self._closed:
                    self._release(p)
                    return
                self._ready.append(p)
                self._cond.notify_all()

    def _release(self, p: Parked) -> None:
        from opsynth.reward import quiet

        quiet.unregister(p.child.pid)
        p.discard()

    def take(self) -> Parked | None:
        """A parked child that is still alive (unregistered from the quiet windows: it is about to be
        timed itself), or None when none is ready; the refill thread forks its replacement."""
        from opsynth.reward import quiet

        with self._cond:
            while self._ready:
                p = self._ready.pop(0)
                self._cond.notify_all()
                if p.child.alive():
                    self.taken += 1
                    quiet.unregister(p.child.pid)
                    return p
                self._release(p)
        return None

    def wait_ready(self, n: int | None = None, timeout_s: float = 60.0) -> bool:
        """Block until `n` (default: size) children are parked (tests, benchmarks)."""
        n = self.size if n is None else n
        with self._cond:
            return self._cond.wait_for(lambda: len(self._ready) >= n or self._closed, timeout_s) and len(self._ready) >= n

    def close(self) -> None:
        with self._cond:
            self._closed = True
            ready, self._ready = self._ready, []
            self._cond.notify_all()
        for p in ready:
            self._release(p)


def _key(cfg, device: str, role: str) -> tuple:
    from opsynth.runtime.device_lock import device_lock_path
    from opsynth.runtime.sandbox import server_env

    return (role, device, cfg.resolved_device_index(), cfg.isolation, getattr(cfg, "syscall_filter", True),
            str(cfg.resolved_cache_dir()), cfg.resolved_cpu_threads(device), tuple(sorted(server_env(cfg).items())),
            device_lock_path(device, cfg.resolved_device_index()))  # the lock file a reference child can open


def side_size(measure_size: int) -> int:
    """Parked reference children, and parked eager baseline children, per device: two (the first two
    tasks of a batch find theirs ready; the pool refills while the batch runs), at most the measuring
    pool's size, none when that is off. Each costs a CUDA context while it waits."""
    return min(2, measure_size)


def pool(cfg, device: str, role: str = "measure") -> ReadyChildren | None:
    """This process's ready children of `role` for `cfg` on `device` (started on first use), or None
    when `cfg.resolved_ready_children(device)` is 0."""
    size = cfg.resolved_ready_children(device)
    if role != "measure":
        size = side_size(size)
    if size <= 0:
        return None
    key = _key(cfg, device, role)
    with _pools_lock:
        p = _pools.get(key)
        if p is None or p._closed:
            p = _pools[key] = ReadyChildren(cfg, device, size, role)
        return p


def start(cfg, device: str) -> None:
    """Every role's pool for `cfg` on `device` (each forks its children in the background)."""
    for role in ROLES:
        pool(cfg, device, role)


def take(cfg, device: str, role: str = "measure") -> Parked | None:
    """A ready child of `role` for this config and device, or None (none configured or none ready yet)."""
    p = pool(cfg, device, role)
    return p.take() if p is not None else None


def shutdown() -> None:
    """Kill every parked child of this process (their scratch folders and channels go with them)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for p in pools:
        p.close()


atexit.register(shutdown)
