"""The parent's CPU for watching its verifier workers' memory: each waiting thread listing /proc for
its own worker (psutil's tree reading every 0.25 s, as the pool did until 2026-12-06) against one
`RssWatch` thread reading every worker's tree from one listing every 0.25 s.

Runs on any Linux: `--workers` sleeping processes stand for the verifier workers, `--others` more
for the rest of the machine (compile workers, Dask, the system), since each listing reads every
process. Prints the parent's CPU seconds per wall second (one core = 1.0; one GIL caps the parent's
Python at 1.0) and writes JSON.

    python benchmarks/memory_watch_cost.py --workers 16 --others 300 --json benchmarks/results/memory_watch_cost_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsynth.runtime import supervise  # noqa: E402


def _threads_cpu(check, pids: list[int], period: float, seconds: float) -> float:
    """This process's CPU seconds per second while a thread per pid calls `check(pid, since)` every `period`."""
    stop = threading.Event()

    def wait(pid: int) -> None:
        since = time.monotonic()
        while not stop.is_set():
            check(pid, since)
            stop.wait(period)

    threads = [threading.Thread(target=wait, args=(p,)) for p in pids]
    c = time.process_time()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return (time.process_time() - c) / seconds


def _psutil_tree_rss(pid: int) -> int:
    """The pool's reading until 2026-12-06, kept here as the benchmark's "before": psutil lists every
    process for the tree (`children(recursive=True)`), then reads each member."""
    import psutil

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
            pass
    return total


def _per_thread(pids: list[int], seconds: float) -> float:
    """Before: each waiting thread lists /proc for its own worker every 0.25 s."""
    return _threads_cpu(lambda pid, since: _psutil_tree_rss(pid), pids, 0.25, seconds)


def _one_watch(pids: list[int], seconds: float) -> float:
    """Now: one RssWatch lists /proc every 0.25 s; each thread reads its latest reading (the pool's 0.1 s poll)."""
    watch = supervise.RssWatch(0.25)
    for p in pids:
        watch.watch(p)
    try:
        return _threads_cpu(watch.rss, pids, 0.1, seconds)  # the watch's thread counts: it is this process's
    finally:
        watch.close()


def _proc_version() -> str:
    try:
        return Path("/proc/version").read_text().strip()[:200]
    except OSError:
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--others", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(args.workers + args.others)]
    try:
        workers = [p.pid for p in procs[: args.workers]]
        n_proc = sum(1 for n in Path("/proc").iterdir() if n.name.isdigit())
        per_listing = time.perf_counter()
        for _ in range(10):
            _psutil_tree_rss(workers[0])
        per_listing = (time.perf_counter() - per_listing) / 10
        old = _per_thread(workers, args.seconds)
        new = _one_watch(workers, args.seconds)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    print(f"{args.workers} workers watched, {n_proc} processes on the machine, one listing {1e3 * per_listing:.1f} ms")
    print(f"{'how':<34}{'parent CPU s / s':>18}")
    print(f"{'a listing per thread, every 0.25 s':<34}{old:>18.3f}")
    print(f"{'one RssWatch, every 0.25 s':<34}{new:>18.3f}")
    out = {"workers": args.workers, "processes": n_proc, "listing_ms": 1e3 * per_listing,
           "per_thread_cpu_per_s": old, "one_watch_cpu_per_s": new, "seconds": args.seconds,
           "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "proc_version": _proc_version()}}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
