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

Calibration, coarse then fine: the ladder can bend sharply between two of its counts (H200,
2026-12-03: 32 FMAs 0.410 ms, 64 FMAs 0.672 ms, eager 0.445 ms; the interpolated 36 and 47 FMAs
both read ~1.16 x eager), so `--refine N` (default 5 on cuda, 0 on cpu) times N evenly spaced counts
between the two ladder counts that bracket each target, all targets in one more batch (timed as the
ladder is), and each count is read off the ladder and those points together. Where the measured
curve passes a target more than once (noise, not monotone), no interpolation is made: the measured
count nearest the target by the running max is taken, and the printed line says so.

Two diagnostics for where a flip comes from (seen on the H200: the same candidate 0.92 then 1.06 x
eager, intervals apart): `--serial` evaluates the candidates of a batch one after another (nothing
else of this evaluator on the device meanwhile), so a spread that stays is between processes, not
from neighbours; `--aa` adds a candidate that makes eager's three passes through memory. It is NOT
the task's own Model: it is the candidate extension's `run3`, three custom kernels (`launch3` on
CUDA: x * s, + b, relu, each a pass through memory; on CPU three plain loops). Its level is not 1.0:
its ratio measures those kernels' quality against PyTorch's plus the harness's noise. On the H200 the
first version (one element per thread) read 1.78 x eager, PyTorch's elementwise kernels being
vectorised; the CUDA kernels are now vectorised too (float4 where aligned, grid-stride, scalar tail),
which should bring it towards eager's kernels but not make it a true A/A. Its spread across batches
is still the decision's noise; its level is not the harness's bias.

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
// One of eager's three passes (OP 0: x * a, 1: x + a, 2: relu), vectorised like PyTorch's elementwise
// kernels: float4 loads and stores when `vec` (both pointers 16-byte aligned), grid-stride, then a
// scalar tail (n need not be a multiple of 4); with vec == 0 the tail loop is the whole pass.
template <int OP> __device__ __forceinline__ float op1(float v, float a) {
    return OP == 0 ? v * a : OP == 1 ? v + a : (v > 0.f ? v : 0.f);
}
template <int OP> __global__ void pass(const float* __restrict__ x, float* __restrict__ y, long n, float a, int vec) {
    long tid = blockIdx.x * (long)blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    long n4 = vec ? n / 4 : 0;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (long i = tid; i < n4; i += stride) {
        float4 v = x4[i];
        v.x = op1<OP>(v.x, a); v.y = op1<OP>(v.y, a); v.z = op1<OP>(v.z, a); v.w = op1<OP>(v.w, a);
        y4[i] = v;
    }
    for (long i = 4 * n4 + tid; i < n; i += stride) y[i] = op1<OP>(x[i], a);
}
template <int OP> void pass_launch(const float* x, float* y, long n, float a) {
    int vec = ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y)) & 15) == 0;
    long work = vec ? (n + 3) / 4 : n, blocks = (work + 255) / 256;
    if (blocks > 65535L * 8) blocks = 65535L * 8;
    pass<OP><<<blocks, 256>>>(x, y, n, a, vec);
}
// eager's three passes (x * s, + b, relu), each through memory: the A/A candidate
void launch3(const float* x, float* t1, float* t2, float* y, long n, float s, float b) {
    if (n <= 0) return;
    pass_launch<0>(x, t1, n, s);
    pass_launch<1>(t1, t2, n, b);
    pass_launch<2>(t2, y, n, 0.f);
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


def _crossings(pts: list[tuple[float, float]], target_ms: float) -> list[int]:
    """Indices i where the sorted curve passes target_ms between pts[i] and pts[i + 1] (either way)."""
    return [i for i in range(len(pts) - 1) if (pts[i][1] >= target_ms) != (pts[i + 1][1] >= target_ms)]


def bracket(curve: list[tuple[float, float]], target_ms: float) -> tuple[float, float] | None:
    """The two measured counts between which the curve reaches target_ms, or None (below the floor, past the
    ladder): one crossing gives its two points; a noisy curve crossing several times gives the span of all."""
    pts = sorted(curve)
    cross = _crossings(pts, target_ms)
    return (pts[cross[0]][0], pts[cross[-1] + 1][0]) if cross else None


def refine_counts(curve: list[tuple[float, float]], targets_ms: list[float], n: int, integer: bool) -> list[float]:
    """n evenly spaced counts strictly inside each target's bracket (rounded to whole counts when `integer`,
    else to 0.001), without the counts already measured: one sorted list for all targets."""
    have = {r for r, _ in curve}
    new = set()
    for tgt in targets_ms:
        br = bracket(curve, tgt)
        if not br or n <= 0:
            continue
        lo, hi = sorted(br)
        for k in range(1, n + 1):
            x = lo + (hi - lo) * k / (n + 1)
            x = float(round(x)) if integer else round(x, 3)
            if lo < x < hi and x not in have:
                new.add(x)
    return sorted(new)


def choose_reps(curve: list[tuple[float, float]], target_ms: float) -> tuple[float, str]:
    """The FMA count for target_ms from a measured curve (the ladder with its refined points).

    Where the sorted curve passes the target once (monotone there), linear between the two points on
    either side (`reps_for`). Where noise makes it pass the target more than once, no interpolation is
    meaningful: the measured count whose running-max time (the curve made monotone) is nearest the
    target, ties to the one whose own time is nearest; the note says so."""
    pts = sorted(curve)
    n = len(_crossings(pts, target_ms))
    if n <= 1:
        return reps_for(pts, target_ms)
    env, m = [], float("-inf")
    for _, t in pts:
        m = max(m, t)
        env.append(m)
    i = min(range(len(pts)), key=lambda j: (abs(env[j] - target_ms), abs(pts[j][1] - target_ms), pts[j][0]))
    return pts[i][0], (f"(curve not monotone here: it passes the target {n} times; nearest measured point by "
                       f"running max, {pts[i][1]:.4f} ms, running max {env[i]:.4f} ms)")


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
        # the claims' host part beyond the device's clock (candidate, reference): does load explain a flip?
        "host_ms": res.times.get("host_ms"), "reference_host_ms": res.times.get("reference_host_ms"),
        # the claims' floor (rounds.call_margin): an honest candidate's margin is what its slack must cover
        "call_margin_ms": res.times.get("call_margin_ms"), "call_floor_scale": res.times.get("call_floor_scale"),
        "compile_ratio": (d.get("compile") or {}).get("ratio"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", required=True, help="where the JSON goes (written as the run goes)")
    ap.add_argument("--targets", default="0.85,1.0,1.2", help="ratios of candidate to eager time")
    ap.add_argument("--repeats", type=int, default=None, help="evaluations of each candidate, one batch each (default 5; 2 with --tiny)")
    ap.add_argument("--ladder", default=None, help="FMA counts timed to calibrate (default on cuda: 0..2048 in powers of 2; on cpu 0..16, fractions too)")
    ap.add_argument("--refine", type=int, default=None,
                    help="counts timed between the two ladder counts that bracket each target, in one more batch, before "
                         "choosing (default 5 on cuda, 0 on cpu; 0 skips)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (reward 3 in reach; one torch.compile per batch)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke setting: small tensors, short ladder, 2 repeats unless given")
    ap.add_argument("--deadline-s", type=float, default=480.0, help="start no batch after this many seconds (the JSON keeps what ran)")
    ap.add_argument("--cache-dir", default=None, help="default: a fresh temp dir")
    ap.add_argument("--isolation", default="auto")
    ap.add_argument("--bs", type=int, default=None, help="the task's batch size (default: 16384 on cuda, eager ~0.45 ms on "
                    "the H200; Ops-6K's tasks run 1-100 ms, and a claim's host part, launch and sync, weighs less there)")
    ap.add_argument("--serial", action="store_true", help="evaluate a batch's candidates one at a time (no neighbours on the device)")
    ap.add_argument("--aa", action="store_true", help="add a candidate making eager's three passes with three custom kernels (run3), not the task's Model: "
                         "its spread across batches is the decision's noise, its level (not 1.0) the kernels' quality")
    ap.add_argument("--skip-calibration", default=None,
                    help="target:fmas,... to use instead of calibrating (e.g. from an earlier run's chosen_fmas)")
    args = ap.parse_args()

    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    targets = [float(t) for t in args.targets.split(",") if t]
    default_ladder = ("0,1,2,4,8" if args.tiny else "0,0.5,1,1.5,2,3,4,6,8,16") if device == "cpu" else "0,8,16,32,64,128,256,512,1024,2048"
    ladder = [float(x) for x in (args.ladder or default_ladder).split(",") if x]
    repeats = args.repeats or (2 if args.tiny else 5)
    if args.refine is None:
        args.refine = 5 if device == "cuda" else 0
    size = dict(SIZES["cpu_tiny" if (args.tiny and device == "cpu") else device])
    if args.bs:
        size["bs"] = args.bs
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


def _time_counts(device, task, counts, cfg, out, save, what) -> tuple[list[tuple[float, float]], float]:
    """One evaluate_many batch over FMA counts: (count, ms) at each candidate's own ratio times the batch's median eager ms."""
    res = evaluate_many([(task, candidate(device, r)) for r in counts], cfg)
    bad = [(r, x.reason, x.log[-1500:]) for r, x in zip(counts, res) if x.reason != "ok"]
    if bad:
        out[f"{what}_errors"] = [b[:2] for b in bad]
        save()
        raise SystemExit(f"{what} candidate(s) failed: {bad[0][0]} FMAs: {bad[0][1]}\n{bad[0][2]}")
    eager_ms = statistics.median(x.times["eager_ms"] for x in res)
    return [(r, x.times["eager_ratio"]) for r, x in zip(counts, res)], eager_ms


def calibrate(args, device, task, ladder, targets, cfg, out, save) -> dict:
    """One batch over the ladder (the first build happens here), then (`--refine N`) one batch over N counts
    inside each target's bracket; the FMA count for each target, read off the refined curve."""
    t0 = time.perf_counter()
    ratios, eager_ms = _time_counts(device, task, ladder, cfg, out, save, "calibration")
    curve = [(r, q * eager_ms) for r, q in ratios]  # each at its own ratio, in the ladder's eager ms
    out["calibration"] = {"seconds": round(time.perf_counter() - t0, 1), "eager_ms": eager_ms,
                          "curve_ms": [[r, round(t, 5)] for r, t in curve]}
    print(f"[calibration {out['calibration']['seconds']} s] eager {eager_ms:.4f} ms; candidate ms by FMA count: "
          + ", ".join(f"{r}:{t:.4f}" for r, t in curve), flush=True)
    coarse = {tgt: choose_reps(curve, tgt * eager_ms) for tgt in targets}
    counts = refine_counts(curve, [tgt * eager_ms for tgt in targets], args.refine, integer=device == "cuda")
    if counts:
        t1 = time.perf_counter()
        ratios, refine_eager = _time_counts(device, task, counts, cfg, out, save, "refine")
        points = [(r, q * eager_ms) for r, q in ratios]  # in the ladder's eager ms, as the ladder's points
        out["calibration"]["refine"] = {
            "seconds": round(time.perf_counter() - t1, 1), "per_bracket": args.refine, "eager_ms": refine_eager,
            "brackets": {str(tgt): list(bracket(curve, tgt * eager_ms) or []) for tgt in targets},
            "points_ms": [[r, round(t, 5)] for r, t in points],
            "coarse_fmas": {str(k): v[0] for k, v in coarse.items()},
        }
        print(f"[refine {out['calibration']['refine']['seconds']} s] eager {refine_eager:.4f} ms; candidate ms by FMA count: "
              + ", ".join(f"{r}:{t:.4f}" for r, t in points), flush=True)
        curve = sorted(curve + points)
    elif args.refine:
        out["calibration"]["refine"] = {"per_bracket": args.refine, "points_ms": [], "note": "nothing to add: every target below the floor, past the ladder, or between adjacent counts"}
    chosen = {}
    for tgt in targets:
        reps, note = choose_reps(curve, tgt * eager_ms)
        chosen[tgt] = reps
        was = f" (ladder alone: {coarse[tgt][0]:.3f})" if counts else ""
        print(f"  target {tgt}: {reps:.3f} FMAs{was} {note}".rstrip(), flush=True)
    out["chosen_fmas"] = {str(k): v for k, v in chosen.items()}
    save()
    return chosen


def aa_candidate(device: str) -> str:
    """Eager's three passes (x * s, + b, relu) in the candidate's own kernels (`run3`), not the task's Model: its
    ratio to eager is those kernels' quality against PyTorch's plus noise, not a true 1.0 (1.78 on the H200 with
    one-element-per-thread kernels; the CUDA ones are now vectorised)."""
    return (CUDA_CANDIDATE if device == "cuda" else CPU_CANDIDATE) + MODEL_NEW.format(reps=0, call="ext.run3(x, self.scale, self.shift)")


def _rel_sd(xs) -> float | None:
    xs = [x for x in xs if x]
    return round(statistics.stdev(xs) / statistics.mean(xs), 4) if len(xs) > 1 else None


def _ms(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def table(labels, runs, out, save, args) -> None:
    print(f"\n{'target':>7} {'run':>4} {'reward':>6} {'ratio':>7} {'interval':>17} {'calls':>5} {'vs 0.95':>8} {'vs 1.0':>7} {'cand ms':>8} {'host ms':>8} {'margin':>7} baseline")
    summary = {}
    for t in labels:
        rows = runs[t]
        for i, r in enumerate(rows):
            iv = f"[{r['lo']:.3f}, {r['hi']:.3f}]" if r["lo"] is not None else "-"
            ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
            print(f"{t:>7} {i + 1:>4} {r['reward']:>6} {ratio:>7} {iv:>17} {str(r['timed_calls']):>5} {str(r['side']):>8} "
                  f"{str(r['side_vs_1']):>7} {_ms(r.get('candidate_ms')):>8} {_ms(r.get('host_ms')):>8} {_ms(r.get('call_margin_ms')):>7} {r['baseline']}")
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
