"""What the generate driver's own process spends per candidate before the verifier sees it.

The candidates' stages before `verify` (sample, size, render, the KernelBench check) run in the
Dask worker's threads, under one GIL. A GPU run samples many candidates per accepted row (most
are rejected at sizing: `predicted_oom`, `too_fast`), so this CPU time, times the candidates per
minute a target rate needs, says how much of one core the parent must give them. On the 2026-12-06
H100 windows, `sizing` per accepted row doubled from 14 to 16 workers (0.47 -> 0.94 s) and `pipes`
went 0.30 -> 0.69 s while the rate barely moved (192 -> 195/min): a parent out of GIL.

Runs on CPU, no GPU needed: sizing replays on meta tensors, with the CUDA reference rates and the
memory budget one request has on a GPU of `--gpu-mem-gb` shared by `--workers`.

    python benchmarks/parent_stages.py --candidates 300 --json benchmarks/results/parent_stages_cpu.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", type=int, default=300)
    ap.add_argument("--seed0", type=int, default=1_000_000)
    ap.add_argument("--gpu-mem-gb", type=float, default=140.0, help="H200: 140; H100: 80")
    ap.add_argument("--workers", type=int, default=16, help="verifier workers sharing the GPU")
    ap.add_argument("--kb", default=None, help="KernelBench parquet (default: the dedup config's local copy)")
    ap.add_argument("--accepted-per-min", type=float, default=200.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from opsynth.catalog import load_catalog, quiet_standalone_modules
    from opsynth.dedup import KernelBenchIndex
    from opsynth.generate.candidate import Candidate, check_kernelbench, render, sample, size
    from opsynth.generate.prepare import SizingPool
    from opsynth.graph import Sampler, SamplerConfig
    from opsynth.verify.config import VerifyConfig

    quiet_standalone_modules()
    catalog = load_catalog()
    vcfg = VerifyConfig(device="cuda")
    pool = SizingPool("cuda", vcfg.task_memory_budget_mb("cuda", args.gpu_mem_gb * 1024, args.workers))
    try:
        kb = KernelBenchIndex.from_config(kb_path=args.kb) if args.kb else KernelBenchIndex.from_config()
    except Exception as e:  # noqa: BLE001 - a clone without ../shared: measure without the check
        print(f"(no KernelBench index: {e}; kb_check not measured)")
        kb = None
    ctx = {"sampler": Sampler(SamplerConfig(), catalog, device="cuda"), "catalog": catalog, "verify_cfg": vcfg,
           "pool": pool, "kb": kb}
    stages = (sample, size, render, check_kernelbench)
    cpu = collections.Counter()
    wall = collections.Counter()
    reasons = collections.Counter()
    reached = 0
    t_all, c_all = time.perf_counter(), time.process_time()
    for i in range(args.candidates):
        cand = Candidate(index=i, seed=args.seed0 + i)
        for stage in stages:
            t, c = time.perf_counter(), time.process_time()
            ok = stage(ctx, cand)
            wall[stage.__name__] += time.perf_counter() - t
            cpu[stage.__name__] += time.process_time() - c
            if not ok:
                reasons[cand.reason] += 1
                break
        else:
            reached += 1
    total_cpu, total_wall = time.process_time() - c_all, time.perf_counter() - t_all
    n = args.candidates
    per_reached = n / max(1, reached)
    print(f"{n} candidates, {reached} reach the verifier ({reached / n:.2f}); budget "
          f"{pool.task_mem_budget_mb:.0f} MB a request ({args.gpu_mem_gb:g} GB / {args.workers})")
    print(f"{'stage':<18}{'cpu ms/cand':>12}{'wall ms/cand':>14}")
    for k in wall:
        print(f"{k:<18}{1e3 * cpu[k] / n:>12.2f}{1e3 * wall[k] / n:>14.2f}")
    print(f"{'all':<18}{1e3 * total_cpu / n:>12.2f}{1e3 * total_wall / n:>14.2f}")
    print("rejections:", dict(reasons.most_common()))
    # Candidates a minute at the target rate, if every candidate that reaches the verifier were
    # accepted (a lower bound: the verifier rejects some too), and the core that costs the parent.
    cand_per_min = args.accepted_per_min * per_reached
    core = cand_per_min / 60 * total_cpu / n
    print(f"at {args.accepted_per_min:g} accepted/min: >= {cand_per_min:.0f} candidates/min, "
          f">= {core:.2f} of one core (one GIL) for these stages alone")
    out = {"candidates": n, "reach_verifier": reached, "budget_mb": pool.task_mem_budget_mb,
           "gpu_mem_gb": args.gpu_mem_gb, "workers": args.workers,
           "cpu_ms_per_candidate": {k: 1e3 * cpu[k] / n for k in cpu}, "wall_ms_per_candidate": {k: 1e3 * wall[k] / n for k in wall},
           "all_cpu_ms_per_candidate": 1e3 * total_cpu / n, "rejections": dict(reasons),
           "accepted_per_min": args.accepted_per_min, "candidates_per_min_lower_bound": cand_per_min,
           "parent_cores_lower_bound": core, "machine": "2-core CPU (no GPU)"}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
