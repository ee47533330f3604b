"""Host copies of a call's outputs, into memory allocated before the device is locked.

The parent judges a child's outputs on the host, so the child copies them there: every checked
trial's (under the checks' share) and the kept timed rounds' (inside the timing lock, where every
millisecond is every other candidate's wait). Into fresh host memory such a copy faults its pages
in as it goes, which under gVisor made one kept round of 80 MB of outputs take about 83 ms against
a median round of 2.1 ms on an H100 (2026-12-07): half of a candidate's locked time. Here the
destinations are allocated ahead, while nothing is locked: page-locked on CUDA where the driver
allows it (the copy is then one DMA), else written once so that their pages are in.

On CUDA a copy need not reach the host inside those sections at all: `keep` clones the outputs on
the device (a fraction of a millisecond) and `land` copies the clones to the host once the timing
lock is let go, where the copy delays no other candidate, only this child's own end. Up to a budget
of device memory per child (`HOLD_BYTES`); beyond it, or when the device has no memory left for a
clone, a copy goes to the host at once.
"""

from __future__ import annotations

import os

# Where the copies go (read by the parent as it makes each child's job, `job_settings`): "pinned" (the
# default: reserved ahead, page-locked on CUDA where the driver allows), "pageable" (reserved ahead,
# pageable, its pages written once), "fresh" (new memory at each copy, as before: a control). The
# benchmark's A/B/A controls: `reward_throughput.py --fresh-copies-group`, `--pageable-copies-group`.
MODE_ENV = "OPSYNTH_HOST_COPIES"
MODES = ("pinned", "pageable", "fresh")
# "0": every copy to the host at once, inside the checks' share and the timing lock (the control,
# `reward_throughput.py --copies-in-lock-group`)
HOLD_ENV = "OPSYNTH_HOLD_OUTPUTS"
HOLD_BYTES = 1 << 30  # device memory one child's held copies may take (the benchmark's tasks: 0.64 GB of trials and kept rounds)


def job_settings() -> dict:
    """The copies' settings a child's job carries (the parent's side): {"host_copies": a mode,
    "hold_copies": whether CUDA children hold their copies on the device until the lock is let go}."""
    mode = os.environ.get(MODE_ENV, "pinned")
    if mode not in MODES:
        raise ValueError(f"${MODE_ENV}={mode!r}: one of {', '.join(MODES)}")
    return {"host_copies": mode, "hold_copies": os.environ.get(HOLD_ENV, "1") != "0"}


def for_job(torch, job: dict, cuda: bool) -> "HostCopies":
    """A child's copies as its job says (`job_settings`), on CUDA or the CPU backend (nothing to pin or hold)."""
    mode = job.get("host_copies", "pinned")
    return HostCopies(torch, pin=cuda and mode == "pinned", hold_bytes=HOLD_BYTES if cuda and job.get("hold_copies") else 0,
                      reserving=mode != "fresh")


def _layout(outs) -> tuple:
    return tuple((tuple(o.shape), str(o.dtype).replace("torch.", "")) for o in outs)


def fresh_copy(outs) -> list:
    """Host copies in new memory (the fallback, and the CPU backend's only form)."""
    return [o.detach().to("cpu", copy=True) for o in outs]


class HostCopies:
    """Sets of host tensors, one set per expected copy of a call's outputs, by layout.

    `reserve(meta, count)` allocates `count` sets for outputs shaped as `meta` ([[shape, dtype], ...],
    the reference child's `output_meta` records); `take(outs)` copies into a free set of the outputs'
    layout, or into new memory when none is left or the layout was not expected (a wrong shape is the
    parent's verdict to give, not this helper's)."""

    def __init__(self, torch, pin: bool, hold_bytes: int = 0, reserving: bool = True):
        self.torch, self.pin, self.reserving = torch, pin, reserving  # reserving False: `reserve` does nothing (a control)
        self.free: dict[tuple, list[list]] = {}
        self.pinned: bool | None = None  # whether page-locked memory was had (None: nothing reserved yet)
        self.taken = self.fallbacks = self.held = 0
        self.hold_left = hold_bytes  # device memory `keep` may still hold copies in (0: none, copies go to the host)
        # bound now, before a candidate's code runs in this process (it could rebind the methods later)
        self._clone, self._copy = torch.Tensor.clone, torch.Tensor.copy_

    def _empty(self, shape, dtype):
        torch = self.torch
        if self.pin and self.pinned is not False:
            try:
                t = torch.empty(shape, dtype=dtype, pin_memory=True)
                self.pinned = True
                return t
            except Exception:  # noqa: BLE001 - no page-locked memory here: pageable, its pages written once
                self.pinned = False
        t = torch.empty(shape, dtype=dtype)
        if t.numel():
            t.view(-1)[::max(1, 4096 // max(1, t.element_size()))] = 0  # one write a page faults each in
        if self.pinned is None:
            self.pinned = False
        return t

    def reserve(self, meta, count: int) -> None:
        if not meta or count <= 0 or not self.reserving:
            return
        layout = tuple((tuple(int(d) for d in shape), str(dtype)) for shape, dtype in meta)
        for _ in range(count):
            self.free.setdefault(layout, []).append(
                [self._empty(shape, getattr(self.torch, dtype)) for shape, dtype in layout])

    def take(self, outs) -> list:
        sets = self.free.get(_layout(outs))
        if not sets:
            self.fallbacks += 1
            return fresh_copy(outs)
        dst = sets.pop()
        for d, o in zip(dst, outs):
            self._copy(d, o.detach())
        self.taken += 1
        return dst

    def keep(self, outs, cloned: bool = False) -> list:
        """The copy of a call's outputs the parent will judge: clones on the device while the hold
        budget lasts (`land` brings them to the host later), else a host copy now (`take`).
        `cloned`: `outs` are the harness's own clones already (kept as they are)."""
        outs = list(outs)
        size = sum(o.numel() * o.element_size() for o in outs)
        if not outs or size > self.hold_left or any(o.device.type == "cpu" for o in outs):
            return self.take(outs)
        if not cloned:
            try:
                outs = [self._clone(o.detach()) for o in outs]
            except self.torch.OutOfMemoryError:  # no device memory for the clone: to the host now, as without a budget
                self.hold_left = 0
                return self.take(outs)
        self.hold_left -= size
        self.held += 1
        return outs

    def land(self, outs):
        """Held copies on the host (into reserved sets, `take`); host copies and None as they are."""
        if outs is None or all(o.device.type == "cpu" for o in outs):
            return outs
        return self.take(outs)
