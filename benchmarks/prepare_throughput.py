"""The generate driver's threads preparing candidates (sample, size, render, the KernelBench check)
themselves, against handing them to preparing processes (`opsynth.generate.prepare`): candidates
prepared a minute and the CPU the asking process spends on each (its one GIL).

`--threads` threads stand for a Dask worker's candidates in flight; each prepares a candidate, then
sleeps `--verify-s` (the wait for its verifier, no GIL). GPU sizes and an H200's 16-way memory
budget, on meta tensors: no GPU needed. Prints a table and writes JSON.

    python benchmarks/prepare_throughput.py --processes 0,2 --json benchmarks/results/prepare_throughput_cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", default="0,2", help="preparing processes per run (0: the threads prepare)")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--verify-s", type=float, default=0.0, help="sleep after each candidate (the verifier's wait)")
    ap.add_argument("--kb", default=None, help="KernelBench parquet (default: the dedup config's local copy)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from opsynth.dedup import DedupConfig, KernelBenchIndex
    from opsynth.generate import candidate as c
    from opsynth.generate.prepare import Preparers, SizingPool
    from opsynth.graph import SamplerConfig
    from opsynth.verify import VerifyConfig

    sampler = dataclasses.asdict(SamplerConfig())
    verify = dataclasses.asdict(VerifyConfig(device="cuda"))
    dedup = dataclasses.asdict(DedupConfig(**({"kb_path": args.kb} if args.kb else {})))
    budget = VerifyConfig(device="cuda").task_memory_budget_mb("cuda", 140 * 1024, 16)
    with c._CTX_LOCK:
        c._ensure_sampler(sampler, verify)
    here = {"sampler": c._CTX["sampler"], "catalog": c._CTX["catalog"], "verify_cfg": VerifyConfig(**verify),
            "kb": KernelBenchIndex.from_config(dedup), "pool": SizingPool("cuda", budget)}
    for seed in range(5):  # warm this process's caches as a running worker's are
        c.prepare(here, c.Candidate(index=seed, seed=seed))

    runs = []
    for n in [int(x) for x in args.processes.split(",")]:
        prep = Preparers(n, sampler, verify, dedup, True, "cuda", c.PREPARED) if n else None
        if prep is not None:  # wait until every process answers (start-up is not what is measured)
            for i in range(n):
                prep._ask(i, {"index": -1, "seed": 1, "budgets_mb": {"*": budget}})
        counter = iter(range(10**9))
        done, lock, stop = [0], threading.Lock(), threading.Event()

        def loop() -> None:
            while not stop.is_set():
                k = next(counter)
                cand = c.Candidate(index=k, seed=9_000_000 + k)
                prep.prepare(cand, {"*": budget}, lambda: c.prepare(here, cand)) if prep is not None else c.prepare(here, cand)
                with lock:
                    done[0] += 1
                if args.verify_s:
                    time.sleep(args.verify_s)

        threads = [threading.Thread(target=loop) for _ in range(args.threads)]
        t0, c0 = time.perf_counter(), time.process_time()
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if prep is not None:
            prep.close()
        runs.append({"processes": n, "candidates": done[0], "per_min": 60 * done[0] / wall,
                     "asking_cpu_ms_per_candidate": 1e3 * cpu / max(1, done[0]), "asking_cpu_per_s": cpu / wall})
    print(f"{args.threads} threads, {args.seconds:g} s each, GPU sizes (H200 budget {budget:.0f} MB)")
    print(f"{'processes':>10}{'candidates/min':>16}{'asking CPU ms/cand':>20}{'asking CPU s/s':>16}")
    for r in runs:
        print(f"{r['processes']:>10}{r['per_min']:>16.0f}{r['asking_cpu_ms_per_candidate']:>20.2f}{r['asking_cpu_per_s']:>16.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "seconds": args.seconds, "budget_mb": budget,
                                               "runs": runs, "machine": "2-core CPU (no GPU)"}, indent=1) + "\n")


if __name__ == "__main__":
    main()
