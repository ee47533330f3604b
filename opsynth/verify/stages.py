"""Where one verification's time went, from the sections its worker replies report.

A worker reports, per request, `[kind, start, end]` sections (kinds `checks`, `compile`, `timing`, `cleanup`;
wall-clock seconds) and the seconds it waited for the device's timing lock. A task's eager request
is repeated while calibration rescales `batch_size`; only the last eager round's results are kept,
so the rounds before it are the cost of calibration. The stages:

    eager_checks   the kept eager round's load, build, forwards and checks
    calibration    every earlier eager round, checks and timing together
    compile        torch.compile, the compiled model's first calls and comparisons
    timing         the timed runs of the kept eager round and of the compiled model
    lock_wait      waiting for the device's timing lock (other workers were timing)
    cleanup        after each request: garbage collection, and on CUDA a synchronize and empty_cache
    worker_restart waiting for a replacement worker (recycled or crashed) to finish starting
    worker_gaps    the worker's time inside a request outside its sections and lock waits (from its
                   `handle_s`): loading the task before the first section, work between sections
    pipes          request and reply in transit: the parent's round trip (`round_trip_s`) less the
                   worker's `handle_s` (pickling, the pipe, the parent's thread waking to read)
    verify_other   the rest of the verification's wall time: the parent's own work between requests
                   (batch rescaling, the caller's compile decision)

`gpu_sections` lists the `checks` and `timing` sections (start, end) that ran on the device, so a
benchmark can take their union over a window as the GPU's busy share; `device_sections` gives them
by kind (with `compile`, whose first calls also run there), for the busy share of each stage.
"""

from __future__ import annotations

from typing import Any

STAGES = ("eager_checks", "calibration", "compile", "timing", "lock_wait", "cleanup", "worker_restart",
          "worker_gaps", "pipes", "verify_other")


def stage_seconds(replies: list[tuple[str, dict[str, Any]]], elapsed_s: float) -> dict[str, float]:
    """Seconds per stage for one task, from its (op, reply) pairs in the order they were asked."""
    out = dict.fromkeys(STAGES, 0.0)
    last_eager = max((i for i, (op, _) in enumerate(replies) if op == "eager"), default=-1)
    for i, (op, rep) in enumerate(replies):
        lock_wait = float(rep.get("lock_wait_s") or 0.0)
        out["lock_wait"] += lock_wait
        out["worker_restart"] += float(rep.get("ready_wait_s") or 0.0)
        sectioned = lock_wait
        for kind, start, end in rep.get("sections") or ():
            d = max(0.0, float(end) - float(start))
            sectioned += d
            if op == "eager" and i != last_eager:
                out["calibration"] += d
            elif kind == "timing":
                out["timing"] += d
            elif kind == "compile":
                out["compile"] += d
            elif kind == "cleanup":
                out["cleanup"] += d
            else:
                out["eager_checks"] += d
        handle = rep.get("handle_s")
        if handle is not None:  # replies of workers that report it (not a test's hand-made ones)
            out["worker_gaps"] += max(0.0, float(handle) - sectioned)
            if rep.get("round_trip_s") is not None:
                out["pipes"] += max(0.0, float(rep["round_trip_s"]) - float(handle))
    out["verify_other"] = max(0.0, elapsed_s - sum(out.values()))
    return {k: round(v, 4) for k, v in out.items()}


def gpu_sections(replies: list[tuple[str, dict[str, Any]]]) -> list[tuple[float, float]]:
    """The (start, end) of every checks and timing section (device work) of one task."""
    return [(float(s), float(e)) for _, rep in replies for kind, s, e in rep.get("sections") or ()
            if kind in ("checks", "timing")]


DEVICE_KINDS = ("checks", "compile", "timing")


def device_sections(replies: list[tuple[str, dict[str, Any]]]) -> dict[str, list[tuple[float, float]]]:
    """The (start, end) of every checks, compile and timing section of one task, by kind."""
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in DEVICE_KINDS}
    for _, rep in replies:
        for kind, s, e in rep.get("sections") or ():
            if kind in out:
                out[kind].append((float(s), float(e)))
    return out


def union_seconds(intervals, lo: float | None = None, hi: float | None = None) -> float:
    """Length of the union of (start, end) intervals, clipped to [lo, hi] when given."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if lo is not None:
            s = max(s, lo)
        if hi is not None:
            e = min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total
