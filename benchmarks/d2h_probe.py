"""What does copying a candidate's outputs to the host cost where the reward runs, and what makes it cheap?

A timed round whose outputs the parent keeps in full (`opsynth.reward.rounds.KEEP` of them) copied
them to fresh host memory inside the device's timing lock: on an H100 under gVisor that round took
about 83 ms against a median 2.1 ms (480 MB of outputs over a task's trials, 2026-12-07), half the
candidate's locked time. The copy's destination is the suspect (fresh pages faulted in by the
sandbox's kernel), so this probe times, per size, in a child as the reward's children run (new user
and network namespaces when asked):

- `fresh`: `x.to("cpu", copy=True)`, a new pageable tensor each time (what one copy costs now);
- `fresh_clone`: `x.cpu().clone()`, the harness's form before (two allocations, two copies);
- `pretouched`: `dst.copy_(x)` into a pageable tensor allocated and written once before;
- `pinned`: `dst.copy_(x)` into page-locked memory allocated once (`alloc_s`: what allocating it cost);
- `device_clone`: `x.clone()` on the device, synchronised.

    python benchmarks/d2h_probe.py --out d2h_probe.json

Prints one line per case and size (median and max of the repeats, in ms) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback

SIZES_MB = (30, 80)
REPEATS = 4


def _timed(fn, torch) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _child(q, unshare: bool):
    out: dict = {"namespaced": unshare, "sizes": {}}
    try:
        if unshare:
            os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)
        import torch

        torch.ones(1, device="cuda").add_(1)
        for mb in SIZES_MB:
            n = mb * (1 << 20) // 4
            x = torch.randn(n, device="cuda")
            row: dict = {}
            row["fresh"] = [_timed(lambda: x.to("cpu", copy=True), torch) for _ in range(REPEATS)]
            row["fresh_clone"] = [_timed(lambda: x.cpu().clone(), torch) for _ in range(REPEATS)]
            t0 = time.perf_counter()
            dst = torch.empty(n).fill_(0)
            row["pretouched_alloc_ms"] = (time.perf_counter() - t0) * 1e3
            row["pretouched"] = [_timed(lambda: dst.copy_(x), torch) for _ in range(REPEATS)]
            try:
                t0 = time.perf_counter()
                pin = torch.empty(n, pin_memory=True)
                row["pinned_alloc_ms"] = (time.perf_counter() - t0) * 1e3
                row["pinned"] = [_timed(lambda: pin.copy_(x), torch) for _ in range(REPEATS)]
                row["pinned_equal"] = bool(torch.equal(pin, x.cpu()))
            except Exception as e:  # noqa: BLE001 - the probe reports it
                row["pinned_error"] = f"{type(e).__name__}: {e}"
            row["device_clone"] = [_timed(lambda: x.clone(), torch) for _ in range(REPEATS)]
            out["sizes"][mb] = row
    except BaseException as e:  # noqa: BLE001 - the probe reports every failure
        out["error"] = f"{type(e).__name__}: {e}"
        out["trace"] = traceback.format_exc()[-800:]
    q.put(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import multiprocessing as mp

    import torch

    res: dict = {"cuda": torch.cuda.is_available(), "cases": []}
    if not res["cuda"]:
        print("d2h: no CUDA device here")
    else:
        res["gpu"] = torch.cuda.get_device_name(0)
        ctx = mp.get_context("spawn")
        for unshare in (False, True):
            q = ctx.Queue()
            p = ctx.Process(target=_child, args=(q, unshare), daemon=True)
            p.start()
            r = q.get(timeout=180)
            p.join(30)
            res["cases"].append(r)
            where = "namespaced" if unshare else "plain"
            if "error" in r:
                print(f"d2h {where}: {r['error']}")
            for mb, row in r.get("sizes", {}).items():
                for k in ("fresh", "fresh_clone", "pretouched", "pinned", "device_clone"):
                    if k in row:
                        print(f"d2h {where:10s} {mb:>4} MB {k:13s} median {statistics.median(row[k]):8.2f} ms  max {max(row[k]):8.2f} ms")
                print(f"d2h {where:10s} {mb:>4} MB allocs: pretouched {row.get('pretouched_alloc_ms', 0):.1f} ms, "
                      f"pinned {row.get('pinned_alloc_ms', 0):.1f} ms {row.get('pinned_error', '')}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
