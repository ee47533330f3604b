"""Can a candidate child's CUDA output tensors reach a trusted judge without a trip through host memory?

Issue 28 asks for judging on the device: the reference outputs stay on the GPU in a trusted process
and the candidate's tensors reach it through CUDA IPC handles. Whether that works where the reward
runs (gVisor's nvproxy on the H200, the child in namespaces of its own) can only be tried there, so
this probe tries it before anything is built on it:

1. plain: a spawned child allocates a CUDA tensor, fills it and sends it through a
   torch.multiprocessing queue (a CUDA IPC handle); the parent maps it and compares on the device;
2. namespaced: the same, with the child in new user and network namespaces (unshared
   before CUDA starts), as the sandbox's children are.

    python benchmarks/cuda_ipc_probe.py --out probe.json

Prints one line per case (works or the error, the times) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback

MB = 256


def _child(q, done, unshare: bool):
    """The producer: optionally unshare first (single-threaded still), then fill a tensor on the GPU."""
    info = {}
    try:
        if unshare:
            flags = os.CLONE_NEWUSER | os.CLONE_NEWNET
            os.unshare(flags)
            info["unshared"] = True
        import torch
        t0 = time.perf_counter()
        x = torch.arange(MB * (1 << 20) // 4, dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        info["alloc_s"] = time.perf_counter() - t0
        q.put(("tensor", x, info))
        done.wait(60)  # the producer must outlive the consumer's use of its memory
    except BaseException as e:  # noqa: BLE001 - the probe reports every failure
        info["error"] = f"{type(e).__name__}: {e}"
        info["trace"] = traceback.format_exc()[-800:]
        q.put(("error", None, info))


def case(unshare: bool) -> dict:
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    t0 = time.perf_counter()
    p = ctx.Process(target=_child, args=(q, done, unshare), daemon=True)
    p.start()
    out = {"namespaced": unshare}
    try:
        kind, x, info = q.get(timeout=120)
        out.update(info)
        out["received_s"] = time.perf_counter() - t0
        if kind == "tensor":
            t1 = time.perf_counter()
            ref = torch.arange(x.numel(), dtype=torch.float32, device="cuda")
            same = bool(torch.equal(x, ref))
            torch.cuda.synchronize()
            out.update(works=same, device=str(x.device), compare_s=time.perf_counter() - t1)
        else:
            out["works"] = False
    except Exception as e:  # noqa: BLE001
        out.update(works=False, error=f"{type(e).__name__}: {e}")
    finally:
        done.set()
        p.join(30)
        if p.is_alive():
            p.kill()
        out["exitcode"] = p.exitcode
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    res = {"cuda": torch.cuda.is_available(), "cases": []}
    if res["cuda"]:
        res["gpu"] = torch.cuda.get_device_name(0)
        torch.cuda.init()
        for unshare in (False, True):
            r = case(unshare)
            res["cases"].append(r)
            print(f"cuda ipc {'namespaced' if unshare else 'plain'}: works {r.get('works')} "
                  f"received {r.get('received_s', 0):.2f} s compare {r.get('compare_s', 0):.3f} s "
                  f"{r.get('error', '')}", flush=True)
    else:
        print("cuda ipc: no CUDA device here")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
