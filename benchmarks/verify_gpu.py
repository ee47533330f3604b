"""Verifier throughput and acceptance on freshly sampled tasks, next to a naive baseline.

    python benchmarks/verify_gpu.py                       # H200: 300 tasks, warm pool + baseline
    python benchmarks/verify_gpu.py --device cpu --candidates 12 --workers 2 --baseline-candidates 2

Samples ``--candidates`` tasks with the project's sampler (seeds from ``--seed-start``; or
``--source kernelbench`` for KernelBench problems from the parquet), verifies them with a warm
``WorkerPool``, then verifies the first ``--baseline-candidates`` of them the naive way: a fresh
Python worker process per candidate (torch import and CUDA initialisation every time, no warm
workers), ``--baseline-jobs`` at a time (default: as many as the pool has workers, so the
comparison isolates warm workers rather than parallelism). Prints acceptance by reason, the
eager-runtime distribution of accepted tasks, calibration steps and candidates per minute for
both, and writes JSON (default benchmarks/results/verify_gpu.json).

Needs torch, numpy, pyarrow (kernelbench source), networkx (sampler); not dask, hydra or datasets.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opsynth.verify import VerifyConfig, WorkerPool  # noqa: E402


def sample_tasks(n: int, seed_start: int) -> list[tuple[str, str]]:
    """(label, source) for n freshly sampled tasks; seeds the sampler cannot fill are skipped."""
    from opsynth.catalog import load_catalog
    from opsynth.graph import Sampler, SamplerConfig
    from opsynth.render import render_task

    t = time.time()
    sampler = Sampler(SamplerConfig(), load_catalog())
    print(f"catalog + sampler ready in {time.time() - t:.1f} s", flush=True)
    out, seed, skipped = [], seed_start, 0
    while len(out) < n:
        try:
            task = sampler.sample(seed)
            out.append((f"seed{seed}", render_task(task.graph)))
        except Exception as exc:  # noqa: BLE001 - a sampler failure is not the verifier's business
            skipped += 1
            if skipped > 10 * n:
                raise RuntimeError(f"sampler keeps failing: {exc}") from exc
        seed += 1
    print(f"sampled {n} tasks in {time.time() - t:.1f} s ({skipped} seeds skipped)", flush=True)
    return out


def kernelbench_tasks(n: int, path: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    rows = pq.read_table(path, columns=["level", "problem_id", "code"]).to_pylist()
    rows = [r for r in rows if r["level"] in (1, 2)]
    return [(f"kb{r['level']}_{r['problem_id']}", r["code"]) for r in rows[:n]]


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def run_pool(cfg: VerifyConfig, tasks: list[tuple[str, str]], deadline_s: float | None) -> tuple[list, float, float, WorkerPool]:
    t0 = time.time()
    pool = WorkerPool(cfg, sampled=True).start()  # freshly sampled graphs: verify.sandbox=auto leaves them unconfined
    startup = time.time() - t0
    print(f"pool: {pool.n_workers} warm workers on {pool.device_name} (torch {pool.torch_version}) "
          f"in {startup:.1f} s", flush=True)
    results: list = [None] * len(tasks)
    t1 = time.time()
    done = accepted = 0
    try:
        futures = {pool.submit(src): i for i, (_, src) in enumerate(tasks)}
        for fut in as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            done += 1
            accepted += results[i].accepted
            if done % max(1, len(tasks) // 20) == 0 or done == len(tasks):
                el = time.time() - t1
                print(f"  [{done}/{len(tasks)}] accepted {accepted}  {60 * done / el:.1f} candidates/min  "
                      f"({el:.0f} s)", flush=True)
            if deadline_s and time.time() - t1 > deadline_s:
                print(f"  deadline of {deadline_s:.0f} s reached; cancelling the rest", flush=True)
                for f in futures:
                    f.cancel()
                break
        # Finish what already started (a cancelled future never ran).
        for f, i in futures.items():
            if results[i] is None and not f.cancelled():
                results[i] = f.result()
    finally:
        wall = time.time() - t1
        pool.close()
    return results, wall, startup, pool


def run_baseline(cfg: VerifyConfig, tasks: list[tuple[str, str]], jobs: int) -> tuple[list, float]:
    """The naive way: a fresh worker process (import torch, init CUDA, verify, exit) per task."""
    one = dataclasses.replace(cfg, n_workers=1)

    def verify_fresh(src: str):
        with WorkerPool(one, sampled=True) as p:
            return p.verify(src)

    t = time.time()
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        futs = [ex.submit(verify_fresh, src) for _, src in tasks]
        results = []
        for k, f in enumerate(futs, 1):
            results.append(f.result())
            print(f"  baseline [{k}/{len(tasks)}] {results[-1].reason} ({time.time() - t:.0f} s)", flush=True)
    return results, time.time() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--candidates", type=int, default=300)
    ap.add_argument("--workers", type=int, default=0, help="pool workers (0: CPU cores - 1)")
    ap.add_argument("--baseline-candidates", type=int, default=16)
    ap.add_argument("--baseline-jobs", type=int, default=0, help="fresh processes at a time (0: same as workers)")
    ap.add_argument("--source", default="sampler", choices=["sampler", "kernelbench"])
    ap.add_argument("--kernelbench", type=Path, default=REPO.parent / "shared" / "kernelbench" / "kernelbench.parquet")
    ap.add_argument("--seed-start", type=int, default=1_000_000)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--timeout-s", type=float, default=180.0)
    ap.add_argument("--deadline-s", type=float, default=0.0, help="stop submitting pool work after this long")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "verify_gpu.json")
    args = ap.parse_args()

    workers = args.workers or max(1, (os.cpu_count() or 2) - 1)
    # Sources without an op graph (sampled as drawn, or KernelBench): the verifier's timing calibration
    # sizes them (the generate pipeline sizes its tasks with the cost model instead).
    cfg = VerifyConfig(device=args.device, n_workers=workers, compile_backend=args.backend, timeout_s=args.timeout_s,
                       calibrate=True)
    t_all = time.time()
    tasks = (sample_tasks(args.candidates, args.seed_start) if args.source == "sampler"
             else kernelbench_tasks(args.candidates, args.kernelbench))

    results, wall, startup, pool = run_pool(cfg, tasks, args.deadline_s or None)
    done = [(lab, r) for (lab, _), r in zip(tasks, results) if r is not None]
    rs = [r for _, r in done]
    acc = [r for r in rs if r.accepted]
    lim = cfg.limits(pool.device)
    in_band = [r for r in acc if lim.min_ms <= r.eager_ms <= lim.max_ms]
    reasons = Counter(r.reason for r in rs)
    eager = [r.eager_ms for r in acc]
    steps = Counter(r.calib_steps for r in acc)
    cpm = 60 * len(rs) / wall if wall > 0 else 0.0

    nb = min(args.baseline_candidates, len(done))
    base_results, base_wall = [], 0.0
    if nb:
        jobs = args.baseline_jobs or workers
        print(f"baseline: {nb} candidates, a fresh process each, {jobs} at a time", flush=True)
        base_results, base_wall = run_baseline(cfg, [(lab, src) for (lab, src), r in zip(tasks, results)
                                                     if r is not None][:nb], jobs)
    base_cpm = 60 * nb / base_wall if base_wall > 0 else None
    agree = sum(a.reason == b.reason for a, b in zip(rs[:nb], base_results))

    print()
    print(f"device {pool.device_name}, torch {pool.torch_version}, {workers} workers, backend {cfg.compile_backend}, "
          f"band [{lim.min_ms}, {lim.max_ms}] ms")
    print(f"{'reason':<22}{'count':>7}{'share':>8}")
    for reason, c in reasons.most_common():
        print(f"{reason:<22}{c:>7}{c / max(1, len(rs)):>8.1%}")
    print(f"{'total':<22}{len(rs):>7}")
    print()
    if eager:
        print("eager ms of accepted: " + "  ".join(f"p{int(q * 100)} {pct(eager, q):.2f}" for q in (0.1, 0.25, 0.5, 0.75, 0.9))
              + f"  (min {min(eager):.2f}, max {max(eager):.2f})")
    print("calibration steps of accepted: " + ", ".join(f"{k}: {v}" for k, v in sorted(steps.items())))
    print()
    print(f"{'':<28}{'candidates':>11}{'wall s':>9}{'cand/min':>10}")
    print(f"{'warm pool':<28}{len(rs):>11}{wall:>9.1f}{cpm:>10.1f}")
    if nb:
        print(f"{'naive (fresh process each)':<28}{nb:>11}{base_wall:>9.1f}{base_cpm:>10.1f}")
        print(f"speed-up {cpm / base_cpm:.1f}x; same verdict on {agree}/{nb} baseline candidates")
    print(f"pool start-up {startup:.1f} s (not in the warm-pool wall time); worker restarts {pool.restarts}")

    out = {
        "device": pool.device_name,
        "torch_version": pool.torch_version,
        "source": args.source,
        "workers": workers,
        "compile_backend": cfg.compile_backend,
        "band_ms": [lim.min_ms, lim.max_ms],
        "candidates": len(rs),
        "accepted": len(acc),
        "acceptance_rate": len(acc) / max(1, len(rs)),
        "accepted_in_band_share": (len(in_band) / len(acc)) if acc else None,
        "candidates_per_min": cpm,
        "baseline_candidates_per_min": base_cpm,
        "baseline_candidates": nb,
        "baseline_jobs": (args.baseline_jobs or workers) if nb else 0,
        "baseline_reason_agreement": agree / nb if nb else None,
        "rejections": {k: v for k, v in reasons.items() if k != "accepted"},
        "eager_ms_accepted": {f"p{int(q * 100)}": pct(eager, q) for q in (0.1, 0.25, 0.5, 0.75, 0.9)},
        "compile_ms_accepted_median": statistics.median([r.compile_ms for r in acc if r.compile_ms]) if acc else None,
        "calib_steps_accepted": {str(k): v for k, v in sorted(steps.items())},
        "calibrated_share_of_accepted": sum(1 for r in acc if r.calib_steps) / len(acc) if acc else None,
        "pool_wall_s": wall,
        "pool_startup_s": startup,
        "worker_restarts": pool.restarts,
        "baseline_wall_s": base_wall,
        "total_wall_s": time.time() - t_all,
        "per_task": [
            {"label": lab, "reason": r.reason, "eager_ms": r.eager_ms, "compile_ms": r.compile_ms,
             "calib_steps": r.calib_steps, "peak_mem_mb": r.peak_mem_mb, "elapsed_s": round(r.elapsed_s, 3),
             "message": str(r.evidence.get("message", ""))[:300]}
            for lab, r in done
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
