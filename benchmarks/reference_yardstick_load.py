"""Does CPU load beside the reference's timed rounds widen the wall-clock yardstick candidates are held to?

The reference child's timed rounds measure the harness's own overhead around the call
(`rounds.reference_call_overhead`), which the claims' floor on the parent's clock subtracts
(`rounds.call_floor`): a larger figure lets a forged report hide more. On CUDA, build children (which
run each candidate's module top level) and measuring children started on the reference's early data
run beside those rounds, so a candidate whose import starts CPU-burning threads could try to inflate
it for its siblings. This runs the reference of the chain task (CPU backend) with N busy processes
(`while 1: pass`) beside it, alternating quiet and loaded, and prints per load the reference's median
overhead around the call, over the whole round, and its median claim (ms).

    python benchmarks/reference_yardstick_load.py --loads 0,2,8 --repeats 3 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAIN = ROOT / "tests" / "reward" / "candidates" / "tasks" / "chain.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="0,2,8", help="busy processes beside the reference, in turn (then again)")
    ap.add_argument("--repeats", type=int, default=3, help="references per load and turn")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from opsynth.reward import RewardConfig
    from opsynth.reward.evaluate import _prepare_reference
    from opsynth.reward.rounds import reference_call_overhead

    task = CHAIN.read_text()
    cfg = RewardConfig(device="cpu", cache_dir=tempfile.mkdtemp(prefix="opsynth_yardstick_"), compile_baseline=False,
                       warmup=5, repeats=21, cpu_threads=1, prebuild=False)
    loads = [int(x) for x in args.loads.split(",")]
    rows = []
    print(f"{'busy':>4} {'call overhead ms':>17} {'round overhead ms':>18} {'claim ms':>9}")
    for load in loads + loads:  # twice, so drift over the run shows
        spin = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(load)]
        time.sleep(0.3)
        try:
            for _ in range(args.repeats):
                ref = _prepare_reference(task, cfg, "cpu")
                if not ref.ok:
                    raise SystemExit(f"the reference failed: {ref.reason}\n{ref.log[-2000:]}")
                row = {"busy": load, "call_overhead_ms": round(reference_call_overhead(ref.rounds), 3),
                       "round_overhead_ms": round(statistics.median(ref.rounds.overheads()), 3),
                       "claim_ms": round(statistics.median(ref.rounds.claims.values()), 3)}
                rows.append(row)
                print(f"{load:4d} {row['call_overhead_ms']:17.3f} {row['round_overhead_ms']:18.3f} {row['claim_ms']:9.3f}", flush=True)
        finally:
            for p in spin:
                p.kill()
    summary = {}
    for load in loads:
        got = [r for r in rows if r["busy"] == load]
        summary[load] = {k: statistics.median(r[k] for r in got) for k in ("call_overhead_ms", "round_overhead_ms", "claim_ms")}
        print(f"median, {load} busy: " + ", ".join(f"{k} {v:.3f}" for k, v in summary[load].items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": "cpu", "cores": len(os.sched_getaffinity(0)),
                                              "rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
