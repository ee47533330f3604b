"""Median runtimes for the verifier and the reward, and the lock that keeps timings on one device
from overlapping (`opsynth.runtime.device_lock`, re-exported here).

On CUDA a run is timed with CUDA events after warm-up. On CPU a single-threaded worker (the
default: one torch thread per worker) is timed with its thread's CPU time (``time.thread_time``),
which other processes on a loaded machine cannot inflate by taking the core away; a worker with
several torch threads falls back to ``time.perf_counter``. The lock is an ``fcntl.flock`` on a file
named after the device, so it serialises timing across every worker of every pool on the machine
(Dask may run several pools), while compilation, which is CPU-bound, runs in parallel.

Tests of reproducibility set ``OPSYNTH_TIMING_NOISE=LO,HI`` (e.g. ``0.8,1.25``): every median the
verifier's ``timed_median`` returns is then multiplied by an independent random factor, log-uniform in
[LO, HI]. The reward environment's timed forward (``Timer``, ``time_forward``, at the end of this
module) shares the lock and lives here too, so the project has one timing module.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from typing import Callable, NamedTuple


# The device lock (its folder, its per-GPU file, the flock) lives in the runtime room; re-exported
# here, where the harness snapshot of the reward's candidate child watches this module's functions.
from opsynth.runtime.device_lock import device_lock_path, file_lock, gpu_key, lock_path  # noqa: E402,F401


NOISE_ENV = "OPSYNTH_TIMING_NOISE"
_NOISE_RNG = random.SystemRandom()  # not the global generator: task checks seed that one


def noise_factor() -> float:
    """1.0, or the random factor ``OPSYNTH_TIMING_NOISE`` asks for (see the module docstring)."""
    spec = os.environ.get(NOISE_ENV)
    if not spec:
        return 1.0
    try:
        lo, hi = (float(v) for v in spec.split(","))
    except ValueError:
        raise ValueError(f"{NOISE_ENV} must be 'LO,HI' (e.g. 0.8,1.25), got {spec!r}") from None
    return math.exp(_NOISE_RNG.uniform(math.log(lo), math.log(hi)))


def cpu_clock() -> tuple[str, Callable[[], float]]:
    """The clock for CPU timings: thread CPU time when torch runs on this one thread."""
    import torch

    if torch.get_num_threads() == 1:
        return "thread_cpu", time.thread_time
    return "wall", time.perf_counter


# Confidence of the interval that decides when the verifier's repeats are precise enough (median_ci).
CI_LEVEL = 0.95

# Why a timing stopped repeating (Timing.stop): its median is precise enough, the repeat cap or the time
# budget was reached, or its samples lie far outside the caller's band (`far`) so no median can land in it.
STOPS = ("precise", "cap", "budget", "far_low", "far_high")


class Timing(NamedTuple):
    """One timed median (`timed_median`): milliseconds (times the noise factor, see the module
    docstring), the timed runs it took, the warm-up runs before them, why the repeats stopped
    (`STOPS`) and the milliseconds the timed runs themselves summed to."""

    ms: float
    runs: int
    warmup: int
    stop: str
    spent_ms: float


def median_ci(times: list[float], level: float = CI_LEVEL) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the order statistics
    (x_(j+1), x_(n-j)) for the largest j whose coverage 1 - 2 P(Binomial(n, 1/2) <= j) is at least
    ``level``; for samples too few to reach it (five at 95 %: 94 %), the whole range."""
    q = sorted(times)
    n = len(q)
    tail, j = 0.0, 0  # tail: P(B <= k), the mass the interval of k leaves out on one side
    for k in range(n // 2):
        tail += math.comb(n, k) / 2**n
        if 1 - 2 * tail < level:
            break
        j = k
    return q[j], q[n - 1 - j]


def precise_enough(times: list[float], rel_tol: float, level: float = CI_LEVEL) -> bool:
    """The median's confidence interval (`median_ci`) reaches no further than ``rel_tol`` of the
    median on either side."""
    lo, hi = median_ci(times, level)
    med = statistics.median(times)
    return max(med - lo, hi - med) <= rel_tol * med


def sample_until(sample: Callable[[], float], repeats: int, min_repeats: int, budget_ms: float,
                 rel_tol: float = 0.0, far: tuple[float, float] | None = None, far_after: int = 2,
                 level: float = CI_LEVEL) -> tuple[list[float], str]:
    """Timed samples (``sample()`` returns one call's milliseconds) until one of, in this order:

    - ``far`` = (low, high) given and the first ``far_after`` samples all read below ``low``
      ("far_low") or all above ``high`` ("far_high"): the caller's band is out of reach, and it
      rejects on these samples without the rest (the verifier sets ``far`` a recheck zone beyond
      its acceptance window, where no task of an in-band median reads: timings read high, not low,
      and a high one is confirmed by a second);
    - ``repeats`` samples ("cap");
    - at least ``min_repeats`` samples and, with ``rel_tol`` > 0, the median's confidence half-width
      within ``rel_tol`` of it ("precise", `precise_enough`);
    - at least ``min_repeats`` samples summing to ``budget_ms`` or more ("budget": a slow or noisy
      task's timing is bounded in time, not only in count).

    The decision reads only the samples: tests drive it with a fake ``sample``."""
    times: list[float] = []
    repeats, min_repeats = max(1, repeats), max(1, min(min_repeats, repeats))
    far_after = max(1, far_after)
    while True:
        times.append(float(sample()))
        n = len(times)
        if far is not None and n == min(far_after, repeats):
            if max(times) < far[0]:
                return times, "far_low"
            if min(times) > far[1]:
                return times, "far_high"
        if n >= repeats:
            return times, "cap"
        if n < min_repeats:
            continue
        if rel_tol > 0 and precise_enough(times, rel_tol, level):
            return times, "precise"
        if sum(times) >= budget_ms:
            return times, "budget"


def timed_median(fn: Callable[[], object], device: str, warmup: int, repeats: int, min_repeats: int,
                 budget_ms: float, rel_tol: float = 0.0, far: tuple[float, float] | None = None,
                 far_after: int = 2, clock: Callable[[], float] | None = None) -> Timing:
    """The verifier's timing of ``fn()``: ``warmup`` untimed calls (at least one: the model ran in
    the checks already, this one settles the device after the lock changed hands), then timed
    calls until `sample_until` stops them. On CUDA each call is timed with a pair of events and
    synchronised on its end event; on CPU with ``clock`` (default `cpu_clock`: thread CPU time when
    torch runs on one thread). Nothing but the calls and their clock reads runs here: the caller
    builds ``fn``'s inputs before, and holds the device only around this."""
    import torch

    cuda = device.startswith("cuda")
    warmup = max(1, warmup)
    if cuda:
        torch.cuda.synchronize()
    for _ in range(warmup):
        fn()
    if cuda:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)

        def sample() -> float:
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
    else:
        tick = clock or cpu_clock()[1]

        def sample() -> float:
            t = tick()
            fn()
            return (tick() - t) * 1e3

    times, stop = sample_until(sample, repeats, min_repeats, budget_ms, rel_tol, far, far_after)
    return Timing(statistics.median(times) * noise_factor(), len(times), warmup, stop, sum(times))


# ---- the reward's timed forward ----------------------------------------------------------------------
# The baselines (reference eager and torch.compile: trusted code) are timed by time_forward, which
# copies the trial inputs into the same input buffers in rotation. Candidates are timed by
# time_rounds, where every call gets fresh inputs and its output is checked (opsynth.reward.rounds).
# On CUDA: L2 flushed before each call, CUDA events around the call, then a device-wide synchronise;
# the time taken is the larger of the event time and the host wall time up to that synchronise, so
# work left on a side stream is still paid for.

_perf_counter = time.perf_counter  # bound at import: candidates run later in the same process


def load_contents(buffers: list, contents: list) -> None:
    """Copy one trial's inputs into the persistent buffers (non-tensors are passed as they are)."""
    import torch

    for i, (b, c) in enumerate(zip(buffers, contents)):
        if isinstance(b, torch.Tensor):
            b.copy_(c)
        else:
            buffers[i] = c


class Timer:
    def __init__(self, device: str, flush_l2: bool = True):
        import torch

        self.torch = torch
        self.cuda = device == "cuda"
        self.flush = None
        # ms of the last call's settling (the flush and the sync before the start event), where device
        # work queued before the call finishes untimed; a list, so the instance's attributes keep their
        # identity (the reward's harness snapshot watches them)
        self.settled = [0.0]
        # ms of the last call on the device's own clock (the events), beside the claim, which is the
        # larger of that and the host's wall from the start event to the sync after the call; their
        # difference is host time (launch, event records, the sync's wake-up) that load can stretch
        self.device_ms = [0.0]
        if self.cuda:
            self.sync = torch.cuda.synchronize
            self.event = torch.cuda.Event
            if flush_l2:
                self.flush = torch.empty(64 * 2**20, dtype=torch.int32, device="cuda")  # 256 MiB > L2

    def time_call(self, fn, args) -> tuple[float, object]:
        """Milliseconds for one call of fn(*args), and its result."""
        if self.cuda:
            ts = _perf_counter()
            if self.flush is not None:
                self.flush.zero_()
            self.sync()
            start, end = self.event(enable_timing=True), self.event(enable_timing=True)
            t0 = _perf_counter()
            self.settled[0] = (t0 - ts) * 1e3
            start.record()
            out = fn(*args)
            end.record()
            self.sync()
            wall = (_perf_counter() - t0) * 1e3
            self.device_ms[0] = device = start.elapsed_time(end)
            return max(device, wall), out
        t0 = _perf_counter()
        out = fn(*args)
        self.device_ms[0] = ms = (_perf_counter() - t0) * 1e3
        return ms, out


# ---- a quiet device before a baseline block --------------------------------------------------------
#
# Between a candidate's rounds the reward times the task's baselines in another process, with the
# candidate stopped (SIGSTOP, `opsynth.reward.quiet`). A stopped process launches nothing, but what it
# launched before runs on: a kernel a native thread queued just after the candidate's last timed call
# is waited for by nothing of the candidate's, and kernels of different processes share the device by
# time slices, so a baseline timed beside it reads slow and the candidate's ratio to it fast. Nothing
# honest leaves work on the device after its round (each timed call ends in a device-wide sync, and its
# outputs are read back). So before each block the baseline child waits until the device reads idle.
# The probe is a short fixed kernel (PROBE_ELEMENTS, tens of microseconds) between two events and a
# sync, read two ways, each against the fastest reading this process has had (its idle floor): on the
# host, whose wait includes the time slices another context holds before ours runs (long slices); and on
# the device, the kernel's own stretch, which grows when the context is switched out mid-kernel (short
# slices). The thresholds are a first guess, to be read off what each evaluation reports
# (`baseline_probe_ms`, `baseline_quiet_wait_ms`) on the H200.
QUIET_PROBES = 2  # consecutive probes under both thresholds that make the device quiet
QUIET_FLOOR_MS = 0.3  # host: at least this, or QUIET_FACTOR x the fastest host reading, ...
QUIET_FACTOR = 4.0
QUIET_CEILING_MS = 1.0  # ... and never above this (about a time slice)
QUIET_DEVICE_FACTOR = 1.5  # device: the kernel's stretch within 1.5x its fastest (+ QUIET_DEVICE_SLACK_MS)
QUIET_DEVICE_SLACK_MS = 0.005
QUIET_CAP_MS = 3000.0  # the longest one candidate's blocks wait in all; after it a block is timed anyway and said to be disturbed
PROBE_ELEMENTS = 1 << 22  # the probe kernel's float32 elements (16 MiB written: tens of microseconds on an H200)
# Queued first, a spin of about 50 us (`torch.cuda._sleep`): the events and the probe kernel then reach
# the device before it is free, so the host's launch latency (noisy in a sandboxed driver) stays out
# of the device reading
PROBE_SPACER_CYCLES = 100_000


def quiet_threshold(fastest_ms: float) -> float:
    """The host reading at or under which the device reads idle, given the fastest one seen."""
    return min(QUIET_CEILING_MS, max(QUIET_FLOOR_MS, QUIET_FACTOR * fastest_ms))


def device_threshold(fastest_ms: float) -> float:
    """The probe kernel's device stretch at or under which it ran without being switched out."""
    return QUIET_DEVICE_FACTOR * fastest_ms + QUIET_DEVICE_SLACK_MS


def wait_quiet(probe: Callable[[], tuple], fastest: list, cap_ms: float = QUIET_CAP_MS,
               clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep) -> dict:
    """Probe (`probe()`: (host ms, device ms or None)) until QUIET_PROBES in a row read idle on both
    (`quiet_threshold`, `device_threshold`) or `cap_ms` has passed (QUIET_PROBES probes at least, so
    an idle device reads quiet with no time left to wait). `fastest` is a two-element list,
    the fastest host and device readings across calls (a process's idle floor). Returns {"quiet",
    "waited_ms", "probes", "fastest_ms", "slowest_ms", "threshold_ms", "device_fastest_ms",
    "device_slowest_ms"}."""
    t0 = clock()
    run = n = 0
    slowest = [0.0, 0.0]
    while True:
        host, dev = probe()
        n += 1
        fastest[0] = min(fastest[0], host)
        slowest[0] = max(slowest[0], host)
        idle = host <= quiet_threshold(fastest[0])
        if dev is not None:
            fastest[1] = min(fastest[1], dev)
            slowest[1] = max(slowest[1], dev)
            idle = idle and dev <= device_threshold(fastest[1])
        run = run + 1 if idle else 0
        waited = (clock() - t0) * 1e3
        if run >= QUIET_PROBES or (waited >= cap_ms and n >= QUIET_PROBES):
            return {"quiet": run >= QUIET_PROBES, "waited_ms": round(waited, 3), "probes": n,
                    "fastest_ms": round(fastest[0], 4), "slowest_ms": round(slowest[0], 4),
                    "threshold_ms": round(quiet_threshold(fastest[0]), 4),
                    "device_fastest_ms": round(fastest[1], 4) if fastest[1] < math.inf else None,
                    "device_slowest_ms": round(slowest[1], 4) if dev is not None else None}
        if run == 0:
            sleep(0.0002)


class QuietDevice:
    """`wait_quiet` on this process's CUDA device; on the CPU backend nothing to wait for (there the
    candidate's whole process tree is stopped, and nothing of it runs on)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.fastest = [math.inf, math.inf]
        if self.cuda:
            import torch

            self.torch = torch
            self.buf = torch.zeros(PROBE_ELEMENTS, device="cuda")
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.spin = getattr(torch.cuda, "_sleep", None)

    def probe(self) -> tuple[float, float]:
        """(host ms, device ms) of the probe kernel: from its launch (behind the spacer) to the sync's
        return, and between its events."""
        t0 = _perf_counter()
        if self.spin is not None:
            self.spin(PROBE_SPACER_CYCLES)
        self.start.record()
        self.buf.add_(1.0)
        self.end.record()
        self.torch.cuda.synchronize()
        host = (_perf_counter() - t0) * 1e3
        return host, self.start.elapsed_time(self.end)

    def warm(self, n: int = 3) -> None:
        """A few probes for the idle floor's first readings (the first also loads the kernel)."""
        for _ in range(n if self.cuda else 0):
            host, dev = self.probe()
            self.fastest = [min(self.fastest[0], host), min(self.fastest[1], dev)]

    def wait(self, cap_ms: float = QUIET_CAP_MS) -> dict | None:
        return wait_quiet(self.probe, self.fastest, cap_ms) if self.cuda else None


def time_forward(fn, buffers: list, contents_list: list, timer: Timer, warmup: int, repeats: int, on_output=None):
    """Median ms of fn over `repeats` calls after `warmup`, rotating input contents; and the outputs
    of the last call made for each contents index (for the caller to verify)."""
    n = len(contents_list)
    last = [None] * n
    times = []
    for it in range(warmup + repeats):
        k = it % n
        load_contents(buffers, contents_list[k])
        # Drop the previous output for this slot first: kept alive, every call would get fresh memory
        # from the allocator, and on the CPU its page faults (about 1 ms per 4 MiB) would be timed too.
        last[k] = out = None
        ms, out = timer.time_call(fn, buffers)
        if on_output is not None:
            on_output(out)
        if it >= warmup:
            times.append(ms)
        last[k] = out
        # A reused output buffer would be overwritten by the next call: keep a copy of what this call gave.
        if it >= warmup + repeats - n:
            last[k] = _snapshot(out)
    return statistics.median(times), last


def _snapshot(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out.detach().clone()
    if isinstance(out, (tuple, list)):
        return [_snapshot(o) for o in out]
    return out


def time_rounds(fn, buffers: list, timer: Timer, first: int, start_round, end_round) -> list[float]:
    """The reward's timed rounds (opsynth.reward.rounds), from round `first`: for each round j,
    `start_round(j)` puts that call's fresh inputs into `buffers` outside the timed region (False:
    the pass is over), one call of fn(*buffers) is timed, and `end_round(j, ms, out)` checks and
    reports it. Returns the milliseconds of each round."""
    times = []
    j = first
    while start_round(j):
        ms, out = timer.time_call(fn, buffers)
        end_round(j, ms, out)
        times.append(ms)
        out = None  # freed before the next call's inputs are made (see time_forward)
        j += 1
    return times
