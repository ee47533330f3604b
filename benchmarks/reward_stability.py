"""Reward stability: three correct candidates at known ratios to eager, each evaluated five times.

One task (`relu(x * scale + shift)`, three eager kernels over a large tensor) and one fused kernel
whose per-element work is tuned by a runtime count of identity FMAs (`v = fma(v, one, zero)`, exact,
not foldable): the candidates differ only in that count, so one build serves them all. A calibration
batch times a ladder of counts, and the count for each target ratio (default 0.85, 1.0, 1.2 x eager)
is read off the measured curve. Then `--repeats` batches (default 5) each evaluate the three
candidates again, every batch with its own reference and eager baseline child (the cached baseline
re-validated by every candidate). The table gives, per evaluation, the reward, the ratio to eager
and its interval (`opsynth.reward.confidence`), the timed calls it took, where the interval lies
against the rule's threshold (0.95 x eager) and against eager itself, and what the cache did.

What it should show (issue 28): the two clear candidates (0.85 and 1.2) get the same reward 5 times
out of 5; the one at eager (1.0) says so in its interval (across 1.0: `side_vs_1` unclear). The
rule's threshold is 0.95 x eager: `--targets 0.85,0.95,1.2` puts one candidate on it instead.

Two diagnostics for where a flip comes from (seen on the H200: the same candidate 0.92 then 1.06 x
eager, intervals apart): `--serial` evaluates the candidates of a batch one after another (nothing
else of this evaluator on the device meanwhile), so a spread that stays is between processes, not
from neighbours; `--aa` adds a candidate that makes eager's own three passes through memory (true ratio about 1.0), whose
ratios across batches are the decision's whole noise.

The JSON is written after the calibration and after every batch (`complete: false` until the end);
with `--deadline-s` no batch starts past that many seconds, so a cut-off run still leaves its rows.

    python benchmarks/reward_stability.py --device cuda --out benchmarks/results/reward_stability_h200.json
    python benchmarks/reward_stability.py --device cpu --out benchmarks/results/reward_stability_cpu.json

Imports only torch and opsynth.reward (no dask / hydra / datasets).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opsynth.reward import RewardConfig, evaluate_many  # noqa: E402

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        return torch.relu(x * self.scale + self.shift)


batch_size = {bs}
dim = {dim}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [1.5, 0.1]
'''

SIZES = {"cuda": dict(bs=16384, dim=4096), "cpu": dict(bs=128, dim=8192), "cpu_tiny": dict(bs=32, dim=8192)}

# The policy brief's layout on CUDA: a torch-free .cu (nvcc never parses ATen), the wrapper in C++.
CUDA_CANDIDATE = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CU = r"""
#include <cuda_runtime.h>
__global__ void k(const float* __restrict__ x, float* __restrict__ y, long n, float s, float b, float one, float zero, int reps) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i] * s + b;
        for (int r = 0; r < reps; ++r) v = fmaf(v, one, zero);  // exact: extra work only
        y[i] = v > 0.f ? v : 0.f;
    }
}
__global__ void mul(const float* __restrict__ x, float* __restrict__ y, long n, float s) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}
__global__ void add(const float* __restrict__ x, float* __restrict__ y, long n, float b) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + b;
}
__global__ void relu(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
// eager's three passes (x * s, + b, relu), each through memory: the A/A candidate
void launch3(const float* x, float* t1, float* t2, float* y, long n, float s, float b) {
    long blocks = (n + 255) / 256;
    mul<<<blocks, 256>>>(x, t1, n, s);
    add<<<blocks, 256>>>(t1, t2, n, b);
    relu<<<blocks, 256>>>(t2, y, n);
}
void launch(const float* x, float* y, long n, float s, float b, float one, float zero, int reps) {
    long blocks = (n + 255) / 256;
    if (blocks > 65535L * 8) blocks = 65535L * 8;
    k<<<blocks, 256>>>(x, y, n, s, b, one, zero, reps);
}
"""

_CPP = r"""
#include <torch/extension.h>
void launch(const float* x, float* y, long n, float s, float b, float one, float zero, int reps);
void launch3(const float* x, float* t1, float* t2, float* y, long n, float s, float b);
torch::Tensor run3(torch::Tensor x, double s, double b) {
    auto xc = x.contiguous();
    auto t1 = torch::empty_like(xc), t2 = torch::empty_like(xc), y = torch::empty_like(xc);
    launch3(xc.data_ptr<float>(), t1.data_ptr<float>(), t2.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), (float)s, (float)b);
    return y;
}
torch::Tensor run(torch::Tensor x, double s, double b, double one, double zero, double reps) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), (float)s, (float)b, (float)one, (float)zero, (int)(reps + 0.5));
    return y;
}
"""

ext = load_inline(name="stability_relu_affine", cpp_sources=_CPP, cuda_sources=_CU, functions=["run", "run3"],
                  extra_cflags=["-O3"], extra_cuda_cflags=["-O3"], no_implicit_headers=True)
'''

CPU_CANDIDATE = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
// In chunks, so that each extra pass is a vectorised sweep over a chunk in L1; a fractional count
// spreads its integer parts over the chunks (chunk c gets floor((c+1)r) - floor(cr) passes): a fine knob.
torch::Tensor run(torch::Tensor x, double s, double b, double one, double zero, double reps) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* p = xc.data_ptr<float>();
    float* q = y.data_ptr<float>();
    const float fs = (float)s, fb = (float)b, f1 = (float)one, f0 = (float)zero;
    const long n = xc.numel();
    float buf[256];
    for (long i0 = 0; i0 < n; i0 += 256) {
        const long m = std::min(256L, n - i0);
        for (long j = 0; j < m; ++j) buf[j] = p[i0 + j] * fs + fb;
        const long c = i0 / 256, rc = (long)((c + 1) * reps) - (long)(c * reps);
        for (long r = 0; r < rc; ++r)
            for (long j = 0; j < m; ++j) buf[j] = buf[j] * f1 + f0;  // exact: extra work only (no -mfma: std::fma is a libm call)
        for (long j = 0; j < m; ++j) q[i0 + j] = buf[j] > 0.f ? buf[j] : 0.f;
    }
    return y;
}
// eager's three passes (x * s, + b, relu), each through memory: the A/A candidate
torch::Tensor run3(torch::Tensor x, double s, double b) {
    auto xc = x.contiguous();
    auto t1 = torch::empty_like(xc), t2 = torch::empty_like(xc), y = torch::empty_like(xc);
    const float* p = xc.data_ptr<float>();
    float *a = t1.data_ptr<float>(), *c = t2.data_ptr<float>(), *q = y.data_ptr<float>();
    const long n = xc.numel();
    const float fs = (float)s, fb = (float)b;
    for (long i = 0; i < n; ++i) a[i] = p[i] * fs;
    for (long i = 0; i < n; ++i) c[i] = a[i] + fb;
    for (long i = 0; i < n; ++i) q[i] = c[i] > 0.f ? c[i] : 0.f;
    return y;
}
"""

ext = load_inline(name="stability_relu_affine_cpu", cpp_sources=_CPP, functions=["run", "run3"], extra_cflags=["-O3"])
'''

MODEL_NEW = '''

REPS = {reps}


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale = float(scale)
        self.shift = float(shift)

    def forward(self, x):
        return {call}
'''


def candidate(device: str, reps: float) -> str:
    """The candidate with `reps` extra FMAs per element (whole on CUDA; on CPU a fraction is spread over chunks)."""
    reps = float(round(reps)) if device == "cuda" else round(float(reps), 3)
    return (CUDA_CANDIDATE if device == "cuda" else CPU_CANDIDATE) + MODEL_NEW.format(reps=reps, call="ext.run(x, self.scale, self.shift, 1.0, 0.0, REPS)")


def reps_for(curve: list[tuple[float, float]], target_ms: float) -> tuple[float, str]:
    """The FMA count whose measured time is target_ms: linear between the ladder's two bracketing points."""
    pts = sorted(curve)
    if target_ms <= pts[0][1]:
        return pts[0][0], "below the ladder (the memory-bound floor): the candidate is slower than its target"
    for (r0, t0), (r1, t1) in zip(pts, pts[1:]):
        if t0 <= target_ms <= t1 and t1 > t0:
            return r0 + (target_ms - t0) / (t1 - t0) * (r1 - r0), ""
    (r0, t0), (r1, t1) = pts[-2], pts[-1]
    slope = (t1 - t0) / (r1 - r0) if r1 != r0 and t1 > t0 else None
    if not slope:
        return pts[-1][0], "above the ladder"
    return r1 + (target_ms - t1) / slope, "extrapolated past the ladder"


def _row(res) -> dict:
    d = res.details.get("decision") or {}
    e = d.get("eager") or {}
    b = res.details.get("baseline") or {}
    return {
        "reward": res.reward,
        "reason": res.reason,
        "ratio": e.get("ratio"),
        "lo": e.get("lo"),
        "hi": e.get("hi"),
        "timed_calls": (d.get("timed_calls") or {}).get("candidate"),
        "baseline_calls": (d.get("timed_calls") or {}).get("eager"),
        "side": e.get("side"),  # against 0.95 x eager (the rule)
        "side_vs_1": e.get("side_vs_1"),  # against eager itself
        "undecided": d.get("undecided"),
        "capped": d.get("capped"),
        "baseline": b.get("eager"),
        "candidate_ms": res.times.get("candidate_ms"),
        "eager_ms": res.times.get("eager_ms"),
        "compile_ratio": (d.get("compile") or {}).get("ratio"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", required=True, help="where the JSON goes (written as the run goes)")
    ap.add_argument("--targets", default="0.85,1.0,1.2", help="ratios of candidate to eager time")
    ap.add_argument("--repeats", type=int, default=None, help="evaluations of each candidate, one batch each (default 5; 2 with --tiny)")
    ap.add_argument("--ladder", default=None, help="FMA counts timed to calibrate (default on cuda: 0..2048 in powers of 2; on cpu 0..16, fractions too)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (reward 3 in reach; one torch.compile per batch)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke setting: small tensors, short ladder, 2 repeats unless given")
    ap.add_argument("--deadline-s", type=float, default=480.0, help="start no batch after this many seconds (the JSON keeps what ran)")
    ap.add_argument("--cache-dir", default=None, help="default: a fresh temp dir")
    ap.add_argument("--isolation", default="auto")
    ap.add_argument("--serial", action="store_true", help="evaluate a batch's candidates one at a time (no neighbours on the device)")
    ap.add_argument("--aa", action="store_true", help="add the task's own Model as a candidate (true ratio 1.0: the A/A test)")
    ap.add_argument("--skip-calibration", default=None,
                    help="target:fmas,... to use instead of calibrating (e.g. from an earlier run's chosen_fmas)")
    args = ap.parse_args()

    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    targets = [float(t) for t in args.targets.split(",") if t]
    default_ladder = ("0,1,2,4,8" if args.tiny else "0,0.5,1,1.5,2,3,4,6,8,16") if device == "cpu" else "0,8,16,32,64,128,256,512,1024,2048"
    ladder = [float(x) for x in (args.ladder or default_ladder).split(",") if x]
    repeats = args.repeats or (2 if args.tiny else 5)
    size = SIZES["cpu_tiny" if (args.tiny and device == "cpu") else device]
    task = TASK.format(**size)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="reward_stability_")
    extra = dict(cpu_threads=1, warmup=3, repeats=11) if device == "cpu" else {}
    cfg = RewardConfig(device=device, cache_dir=cache, compile_baseline=args.compile, isolation=args.isolation, **extra)
    t_all = time.perf_counter()
    out = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "task_sizes": size,
        "targets": targets,
        "repeats": repeats,
        "compile_baseline": args.compile,
        "rule": f"2 when the eager ratio's {cfg.confidence:.0%} interval lies below {cfg.margin}; an interval across it "
                f"keeps the lower reward (more blocks first, up to {cfg.timing_cap(device)} timed calls)",
        "timing": {"warmup_repeats": list(cfg.timing(device)), "block": cfg.resolved_timing_block(device),
                   "cap": cfg.timing_cap(device), "baseline_drift": cfg.baseline_drift},
        "complete": False,
    }

    def save():
        out["seconds"] = round(time.perf_counter() - t_all, 1)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2))

    def batch(pairs):
        return [evaluate_many([p], cfg)[0] for p in pairs] if args.serial else evaluate_many(pairs, cfg)

    out["serial"] = args.serial
    if args.skip_calibration:
        chosen = {float(k): float(v) for k, v in (kv.split(":") for kv in args.skip_calibration.split(",") if kv)}
        targets = sorted(chosen)
        out["targets"], out["chosen_fmas"] = targets, {str(k): v for k, v in chosen.items()}
        print("  calibration skipped: " + ", ".join(f"{t}: {r} FMAs" for t, r in chosen.items()), flush=True)
    else:
        chosen = calibrate(args, device, task, ladder, targets, cfg, out, save)
    labels = [str(t) for t in targets] + (["aa"] if args.aa else [])
    sources = [candidate(device, chosen[t]) for t in targets] + ([aa_candidate(device)] if args.aa else [])

    # 2. The stability runs: every batch evaluates each candidate once, with a fresh reference and eager child.
    runs = {k: [] for k in labels}
    out["runs"] = runs
    for k in range(repeats):
        if time.perf_counter() - t_all > args.deadline_s:
            out["cut_off"] = f"deadline of {args.deadline_s:.0f} s reached before batch {k + 1}"
            print(f"[stop] {out['cut_off']}", flush=True)
            break
        t0 = time.perf_counter()
        res = batch([(task, src) for src in sources])
        for t, r in zip(labels, res):
            runs[t].append(_row(r))
        print(f"[batch {k + 1}/{repeats} {time.perf_counter() - t0:.0f} s] "
              + "  ".join(f"{t}: {r.reward} ({(r.details.get('decision') or {}).get('eager', {}).get('ratio')})" for t, r in zip(labels, res)),
              flush=True)
        save()

    # 3. The table.
    table(labels, runs, out, save, args)


def calibrate(args, device, task, ladder, targets, cfg, out, save) -> dict:
    """One batch over the ladder (the first build happens here); the FMA count for each target."""
    t0 = time.perf_counter()
    cal = evaluate_many([(task, candidate(device, r)) for r in ladder], cfg)
    bad = [(r, x.reason, x.log[-1500:]) for r, x in zip(ladder, cal) if x.reason != "ok"]
    if bad:
        out["calibration_errors"] = [b[:2] for b in bad]
        save()
        raise SystemExit(f"calibration candidate(s) failed: {bad[0][0]} FMAs: {bad[0][1]}\n{bad[0][2]}")
    eager_ms = statistics.median(x.times["eager_ms"] for x in cal)
    curve = [(r, x.times["eager_ratio"] * eager_ms) for r, x in zip(ladder, cal)]  # each at its own batch's ratio
    out["calibration"] = {"seconds": round(time.perf_counter() - t0, 1), "eager_ms": eager_ms,
                          "curve_ms": [[r, round(t, 5)] for r, t in curve]}
    print(f"[calibration {out['calibration']['seconds']} s] eager {eager_ms:.4f} ms; candidate ms by FMA count: "
          + ", ".join(f"{r}:{t:.4f}" for r, t in curve), flush=True)
    chosen = {}
    for tgt in targets:
        reps, note = reps_for(curve, tgt * eager_ms)
        chosen[tgt] = reps
        print(f"  target {tgt}: {reps:.3f} FMAs {note}".rstrip(), flush=True)
    out["chosen_fmas"] = {str(k): v for k, v in chosen.items()}
    save()
    return chosen


def aa_candidate(device: str) -> str:
    """Eager's own three passes in the candidate's extension: its true ratio to eager is about 1.0."""
    return (CUDA_CANDIDATE if device == "cuda" else CPU_CANDIDATE) + MODEL_NEW.format(reps=0, call="ext.run3(x, self.scale, self.shift)")


def _rel_sd(xs) -> float | None:
    xs = [x for x in xs if x]
    return round(statistics.stdev(xs) / statistics.mean(xs), 4) if len(xs) > 1 else None


def table(labels, runs, out, save, args) -> None:
    print(f"\n{'target':>7} {'run':>4} {'reward':>6} {'ratio':>7} {'interval':>17} {'calls':>5} {'vs 0.95':>8} {'vs 1.0':>7} baseline")
    summary = {}
    for t in labels:
        rows = runs[t]
        for i, r in enumerate(rows):
            iv = f"[{r['lo']:.3f}, {r['hi']:.3f}]" if r["lo"] is not None else "-"
            ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
            print(f"{t:>7} {i + 1:>4} {r['reward']:>6} {ratio:>7} {iv:>17} {str(r['timed_calls']):>5} {str(r['side']):>8} "
                  f"{str(r['side_vs_1']):>7} {r['baseline']}")
        rewards = [r["reward"] for r in rows]
        ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
        summary[t] = {
            "rewards": rewards,
            "same_reward": f"{max(rewards.count(v) for v in set(rewards))}/{len(rewards)}" if rewards else "0/0",
            "median_ratio": round(statistics.median(ratios), 4) if ratios else None,
            # across evaluations, relative: the noise one evaluation's interval should cover
            "ratio_rel_sd": round(statistics.stdev(ratios) / statistics.mean(ratios), 4) if len(ratios) > 1 else None,
            "eager_ms_rel_sd": _rel_sd([r["eager_ms"] for r in rows]),
            "unclear_vs_rule": sum(r["side"] == "unclear" for r in rows),
            "unclear_vs_eager": sum(r["side_vs_1"] == "unclear" for r in rows),
            "capped": sum(bool(r["capped"]) for r in rows),
            "baselines_replaced": sum(r["baseline"] == "replaced" for r in rows),
        }
    out["summary"] = summary
    out["complete"] = "cut_off" not in out
    save()
    print()
    for t, s in summary.items():
        print(f"target {t}: median ratio {s['median_ratio']} (rel. sd {s['ratio_rel_sd']}; eager's {s['eager_ms_rel_sd']}), rewards {s['rewards']} (same {s['same_reward']}), "
              f"interval across 0.95 in {s['unclear_vs_rule']}, across 1.0 in {s['unclear_vs_eager']}, "
              f"capped {s['capped']}, baselines replaced {s['baselines_replaced']}")
    print(f"total {out['seconds']} s; JSON: {args.out}")


if __name__ == "__main__":
    main()
