"""Device-synchronised timing shared by the reference (eager, compile) and the candidate.

Each timed call first gets fresh contents copied into the same input buffers (rotating over the
trial inputs), so a cache keyed on the input pointer returns stale outputs, which are then checked.
On CUDA: L2 flushed before each call, CUDA events around the call, then a device-wide synchronise;
the time taken is the larger of the event time and the host wall time up to that synchronise, so
work left on a side stream is still paid for.
"""

from __future__ import annotations

import statistics
import time

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
        if self.cuda:
            self.sync = torch.cuda.synchronize
            self.event = torch.cuda.Event
            if flush_l2:
                self.flush = torch.empty(64 * 2**20, dtype=torch.int32, device="cuda")  # 256 MiB > L2

    def time_call(self, fn, args) -> tuple[float, object]:
        """Milliseconds for one call of fn(*args), and its result."""
        if self.cuda:
            if self.flush is not None:
                self.flush.zero_()
            self.sync()
            start, end = self.event(enable_timing=True), self.event(enable_timing=True)
            t0 = _perf_counter()
            start.record()
            out = fn(*args)
            end.record()
            self.sync()
            wall = (_perf_counter() - t0) * 1e3
            return max(start.elapsed_time(end), wall), out
        t0 = _perf_counter()
        out = fn(*args)
        return (_perf_counter() - t0) * 1e3, out


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
