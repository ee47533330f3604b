"""How well sizing's predicted peak memory (`SizeChoice.predicted_peak_mb`, counted on meta tensors)
foresees what a verifier request really holds, on sampled graphs: the first forward's peak (what the
acceptance cap `mem_cap` measures) and the whole eager request's high-water mark (both input sets,
the outputs the checks keep, the clones, the timed runs: what a memory limit meets, hence `oom`).

    python benchmarks/peak_memory.py --n 24                     # CPU, 1 worker, no compile check
    python benchmarks/peak_memory.py --device cuda --n 200      # the GPU (sizes at scale 1)

`predicted_request_mb` (`GraphCost.request_bytes`: the request's holdings, predicted) is what sizing
admits against; the ratio request peak / predicted request is what `verify.mem_safety` must cover for sizing's admission
(`opsynth.verify.sizing`) to keep candidates that would run out of memory away from the device.
Prints a table and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def measure(n: int, device: str, seed: int = 0, target_ms: float | None = None, workers: int = 1) -> dict:
    """Sample, size and verify up to ``n`` candidates; the predicted and measured peaks of each."""
    from opsynth.catalog import load_catalog
    from opsynth.generate.config import CPU_SCALE, candidate_seed
    from opsynth.graph import Sampler, SamplerConfig, SamplingError
    from opsynth.graph.cost import with_batch
    from opsynth.render import render_task
    from opsynth.verify import VerifyConfig, WorkerPool
    from opsynth.verify.sizing import choose_batch

    catalog = load_catalog()
    sampler = Sampler(SamplerConfig(scale=CPU_SCALE if device == "cpu" else 1.0), catalog)
    extra = {}
    if target_ms and device == "cpu":  # larger CPU tasks: memory well above the RSS noise floor
        extra = {"cpu_target_median_ms": target_ms, "cpu_target_p90_ms": 2 * target_ms}
    cfg = VerifyConfig(device=device, n_workers=workers, check_compile=False, preload_compiler=False,
                       mem_safety=0.0, **extra)  # admission off: every size the cap allows is measured
    rows, t0 = [], time.time()
    with WorkerPool(cfg, sampled=True) as pool:
        sized = []
        for i in range(4 * n):
            if len(sized) >= n:
                break
            s = candidate_seed(seed, i)
            try:
                g = sampler.sample(s).graph
            except SamplingError:
                continue
            ch = choose_batch(g, catalog, s, cfg, device)
            if ch.reason is None:
                sized.append((s, g, ch))
        futures = [(s, g, ch, pool.submit(render_task(with_batch(g, ch.batch), catalog))) for s, g, ch in sized]
        for s, g, ch, f in futures:
            res = f.result()
            hist = (res.evidence or {}).get("history") or [{}]
            rows.append({"seed": s, "ops": g.ops(), "task_pass": g.task_pass, "batch": ch.batch,
                         "predicted_peak_mb": round(ch.predicted_peak_mb, 3),
                         "predicted_request_mb": round(ch.predicted_request_mb, 3), "reason": res.reason,
                         "forward_peak_mb": res.peak_mem_mb, "request_peak_mb": hist[-1].get("request_peak_mem_mb")})
    return {"device": device, "n": len(rows), "wall_s": round(time.time() - t0, 1), "rows": rows,
            "summary": summarize(rows)}


def summarize(rows: list[dict], floor_mb: float = 8.0) -> dict:
    """Ratios measured / predicted over the rows whose prediction is above ``floor_mb`` (below it
    the process's own allocations, malloc's arenas and page rounding decide the measurement)."""
    out: dict = {"floor_mb": floor_mb}
    for key, model in (("forward_peak_mb", "predicted_peak_mb"), ("request_peak_mb", "predicted_peak_mb"),
                       ("request_peak_mb", "predicted_request_mb")):
        r = sorted(x[key] / x[model] for x in rows if x.get(key) and x["predicted_peak_mb"] >= floor_mb)
        if r:
            out[f"{key[:-3]}_over_{model[:-3]}"] = {
                "n": len(r), "min": round(r[0], 3), "median": round(statistics.median(r), 3),
                "p90": round(r[min(len(r) - 1, int(0.9 * len(r)))], 3), "max": round(r[-1], 3)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--target-ms", type=float, default=20.0, help="CPU: median runtime target (bigger tasks)")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/peak_memory_cpu.json"))
    a = ap.parse_args(argv)
    d = measure(a.n, a.device, a.seed, a.target_ms, a.workers)
    print(f"{'seed':>12} {'pass':>8} {'batch':>7} {'pred peak':>10} {'pred req':>9} {'forward':>9} {'request':>9}  ops"
          "  (MB; measured: first forward, whole eager request)")
    for r in d["rows"]:
        f = lambda v: f"{v:9.1f}" if isinstance(v, (int, float)) else f"{'-':>9}"  # noqa: E731
        print(f"{r['seed']:>12} {r['task_pass']:>8} {r['batch']:>7} {r['predicted_peak_mb']:>10.1f} "
              f"{r['predicted_request_mb']:>9.1f} "
              f"{f(r['forward_peak_mb'])} {f(r['request_peak_mb'])}  {','.join(r['ops'])} {r['reason']}")
    print(json.dumps(d["summary"]))
    Path(a.out).write_text(json.dumps(d, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
