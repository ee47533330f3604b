"""What opening a quiet window costs (`opsynth.reward.quiet.window`): every registered process tree
(builds, idle baseline children, parked measuring children) stopped before a timing, inside the
device lock. Per tree (`stop_tree` for each, one /proc listing per tree and pass) against all trees
from one listing per pass (`stop_trees`, what the window does), and with the trees known from their
last stop (`known`: what the quiet module remembers; usually one listing in all).

    python benchmarks/quiet_window_cost.py                 # about 20 s
    python benchmarks/quiet_window_cost.py --counts 1,8,16,32 --extra 200

`--extra N` starts N more idle processes that are not registered (a busy host: the listing reads every
process on it). Prints a table; writes JSON (`--out`, default benchmarks/results/quiet_window_cost_<host>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

from opsynth.runtime.supervise import continue_pids, stop_tree, stop_trees


def _median_ms(fn, pids, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        stopped = fn(pids)
        ts.append(time.perf_counter() - t)
        continue_pids([p for ps in stopped.values() for p in ps])
    return round(statistics.median(ts) * 1000, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1,4,8,16", help="registered trees to stop (comma-separated)")
    ap.add_argument("--extra", type=int, default=0, help="idle processes on the host beside them")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(max(counts) + args.extra)]
    registered = [p.pid for p in procs[: max(counts)]]
    rows = []
    try:
        for n in counts:
            pids = registered[:n]
            per_tree = _median_ms(lambda ps: {p: stop_tree(p) for p in ps}, pids, args.repeats)
            one_listing = _median_ms(stop_trees, pids, args.repeats)
            learned = stop_trees(pids)  # the trees as stopped once (what the quiet module remembers)
            continue_pids([p for ps in learned.values() for p in ps])
            known = _median_ms(lambda ps: stop_trees(ps, known=learned), pids, args.repeats)
            rows.append({"trees": n, "per_tree_ms": per_tree, "one_listing_ms": one_listing, "known_ms": known})
            print(f"{n:4d} trees: per tree {per_tree:8.2f} ms, one listing {one_listing:8.2f} ms, "
                  f"known trees {known:8.2f} ms", flush=True)
    finally:
        for p in procs:
            p.kill()
    out = {"host": platform.node(), "cpus": os.cpu_count(), "processes_on_host": len([d for d in os.listdir("/proc") if d.isdigit()]),
           "extra_idle_processes": args.extra, "rows": rows}
    path = Path(args.out or f"benchmarks/results/quiet_window_cost_{platform.node() or 'host'}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
