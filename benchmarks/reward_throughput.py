"""Reward evaluations per minute: overlapped (evaluate_many) vs one at a time (evaluate), same run.

Every candidate is a distinct `load_inline` source (a salted template), so each needs its own build,
as completions from a policy do. Baselines (eager / torch.compile timings) and the shared precompiled
header are made once before either run, as in steady-state training where they are cached. On CUDA
two candidate layouts are measured: "light" (what the policy brief asks for: a torch-free .cu with
no_implicit_headers=True, the torch wrapper in C++) and "heavy" (torch headers in the .cu).

    python benchmarks/reward_throughput.py                      # H200: CUDA candidates
    python benchmarks/reward_throughput.py --device cpu --count 6 --baseline-count 2   # CPU

Imports only torch and opsynth.reward (no dask / hydra / datasets).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import platform
import sys
import statistics
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opsynth.reward import RewardConfig, evaluate, evaluate_many  # noqa: E402

# ---- tasks (KernelBench format) -------------------------------------------------------------------

TASKS = {
    "chain": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        x = x * self.scale
        x = x + self.shift
        x = torch.relu(x)
        x = x * 0.5
        x = x - 0.25
        return torch.abs(x)


batch_size = {bs}
dim = {dim}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [2.0, 1.0]
''',
    "relu_scale": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


batch_size = {bs}
dim = {dim}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [3.0]
''',
    "linear_relu": '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


batch_size = {bs}
in_features = {k}
out_features = {k}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
''',
}

SIZES = {
    "cuda": {"chain": dict(bs=512, dim=32768), "relu_scale": dict(bs=512, dim=32768), "linear_relu": dict(bs=1024, k=1024)},
    "cpu": {"chain": dict(bs=64, dim=8192), "relu_scale": dict(bs=64, dim=8192), "linear_relu": dict(bs=64, k=128)},
}

# ---- candidate templates: {salt} makes every source distinct, {threads} varies the launch ----------

# The kernels both layouts share (format templates: {body}, {{ }} for braces).
ELEMENTWISE_KERNEL = r'''__global__ void k(const float* __restrict__ x, float* __restrict__ y, long n, float a, float b) {{
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {{
        float v = x[i]{body};
        y[i] = v;
    }}
}}
'''

LINEAR_KERNEL = r'''#define T 16
__global__ void k(const float* X, const float* W, const float* B, float* Y, int n, int kk, int m) {{
    __shared__ float xs[T][T], ws[T][T];
    int i = blockIdx.y * T + threadIdx.y, j = blockIdx.x * T + threadIdx.x;
    float acc = 0.f;
    for (int t0 = 0; t0 < kk; t0 += T) {{
        xs[threadIdx.y][threadIdx.x] = (i < n && t0 + threadIdx.x < kk) ? X[(long)i * kk + t0 + threadIdx.x] : 0.f;
        ws[threadIdx.y][threadIdx.x] = (blockIdx.x * T + threadIdx.y < m && t0 + threadIdx.x < kk) ? W[(long)(blockIdx.x * T + threadIdx.y) * kk + t0 + threadIdx.x] : 0.f;
        __syncthreads();
        for (int t = 0; t < T; ++t) acc += xs[threadIdx.y][t] * ws[threadIdx.x][t];
        __syncthreads();
    }}
    if (i < n && j < m) {{ float v = acc + B[j]; Y[(long)i * m + j] = v > 0.f ? v : 0.f; }}
}}
'''

CUDA_ELEMENTWISE = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
// variant {salt}
''' + ELEMENTWISE_KERNEL + r'''torch::Tensor run(torch::Tensor x, double a, double b) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    long blocks = std::min<long>((n + {threads} - 1) / {threads}, 65535L * 8);
    k<<<blocks, {threads}, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n, (float)a, (float)b);
    return y;
}}
"""

ext = load_inline(name="bench_{task}_{salt}", cpp_sources="torch::Tensor run(torch::Tensor x, double a, double b);",
                  cuda_sources=_SRC, functions=["run"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.a = float(args[0])
        self.b = float(args[1]) if len(args) > 1 else 0.0

    def forward(self, x):
        return ext.run(x, self.a, self.b)
'''

CUDA_LINEAR = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
// variant {salt}
''' + LINEAR_KERNEL + r'''torch::Tensor run(torch::Tensor x, torch::Tensor w, torch::Tensor b) {{
    auto xc = x.contiguous(); auto wc = w.contiguous();
    int n = xc.size(0), kk = xc.size(1), m = wc.size(0);
    auto y = torch::empty({{n, m}}, xc.options());
    dim3 block(T, T), grid((m + T - 1) / T, (n + T - 1) / T);
    k<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), wc.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), n, kk, m);
    return y;
}}
"""

ext = load_inline(name="bench_{task}_{salt}", cpp_sources="torch::Tensor run(torch::Tensor x, torch::Tensor w, torch::Tensor b);",
                  cuda_sources=_SRC, functions=["run"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return ext.run(x, self.linear.weight, self.linear.bias)
'''

CPU_ELEMENTWISE = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
// variant {salt}
torch::Tensor run(torch::Tensor x, double a, double b) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* p = xc.data_ptr<float>();
    float* q = y.data_ptr<float>();
    for (long i = 0; i < xc.numel(); ++i) {{ float v = p[i]{body}; q[i] = v; }}
    return y;
}}
"""

ext = load_inline(name="bench_{task}_{salt}", cpp_sources=_SRC, functions=["run"], extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.a = float(args[0])
        self.b = float(args[1]) if len(args) > 1 else 0.0

    def forward(self, x):
        return ext.run(x, self.a, self.b)
'''

# "light" layout (what the policy brief asks for): kernels and a raw-pointer launcher in a torch-free
# .cu (no_implicit_headers=True, so nvcc never parses ATen), the torch::Tensor wrapper in C++, whose
# torch/extension.h comes from the shared precompiled header.
CUDA_ELEMENTWISE_LIGHT = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CU = r"""
#include <cuda_runtime.h>
// variant {salt}
''' + ELEMENTWISE_KERNEL + r'''void launch(const float* x, float* y, long n, float a, float b) {{
    long blocks = (n + {threads} - 1) / {threads};
    if (blocks > 65535L * 8) blocks = 65535L * 8;
    k<<<blocks, {threads}>>>(x, y, n, a, b);
}}
"""

_CPP = r"""
#include <torch/extension.h>
void launch(const float* x, float* y, long n, float a, float b);
torch::Tensor run(torch::Tensor x, double a, double b) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), (float)a, (float)b);
    return y;
}}
"""

ext = load_inline(name="bench_{task}_{salt}", cpp_sources=_CPP, cuda_sources=_CU, functions=["run"],
                  extra_cflags=["-O3"], extra_cuda_cflags=["-O3"], no_implicit_headers=True)


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.a = float(args[0])
        self.b = float(args[1]) if len(args) > 1 else 0.0

    def forward(self, x):
        return ext.run(x, self.a, self.b)
'''

CUDA_LINEAR_LIGHT = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CU = r"""
#include <cuda_runtime.h>
// variant {salt}
''' + LINEAR_KERNEL + r'''void launch(const float* X, const float* W, const float* B, float* Y, int n, int kk, int m) {{
    dim3 block(T, T), grid((m + T - 1) / T, (n + T - 1) / T);
    k<<<grid, block>>>(X, W, B, Y, n, kk, m);
}}
"""

_CPP = r"""
#include <torch/extension.h>
void launch(const float* X, const float* W, const float* B, float* Y, int n, int kk, int m);
torch::Tensor run(torch::Tensor x, torch::Tensor w, torch::Tensor b) {{
    auto xc = x.contiguous(); auto wc = w.contiguous(); auto bc = b.contiguous();
    int n = xc.size(0), kk = xc.size(1), m = wc.size(0);
    auto y = torch::empty({{n, m}}, xc.options());
    launch(xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), y.data_ptr<float>(), n, kk, m);
    return y;
}}
"""

ext = load_inline(name="bench_{task}_{salt}", cpp_sources=_CPP, cuda_sources=_CU, functions=["run"],
                  extra_cflags=["-O3"], extra_cuda_cflags=["-O3"], no_implicit_headers=True)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return ext.run(x, self.linear.weight, self.linear.bias)
'''

CHAIN_BODY = " * a + b; v = v > 0.f ? v : 0.f; v = fabsf(v * 0.5f - 0.25f)"
RELU_SCALE_BODY = " * 1.0f; v = (v > 0.f ? v : 0.f) * a"


def candidate_source(task: str, salt: int, device: str, style: str = "heavy") -> str:
    """One distinct candidate. style "heavy": torch headers in the .cu (the usual KernelBench-style
    answer; nvcc parses ATen); "light": the layout the policy brief asks for (CUDA only)."""
    threads = (128, 256, 512)[salt % 3]
    light = style == "light" and device == "cuda"
    if task == "linear_relu":
        if device == "cuda":
            return (CUDA_LINEAR_LIGHT if light else CUDA_LINEAR).format(salt=salt, task=task)
        task = "relu_scale"  # CPU smoke runs keep to the elementwise template
    body = CHAIN_BODY if task == "chain" else RELU_SCALE_BODY
    if device == "cuda":
        tpl = CUDA_ELEMENTWISE_LIGHT if light else CUDA_ELEMENTWISE
    else:
        tpl = CPU_ELEMENTWISE
    return tpl.format(salt=salt, task=task, body=body, threads=threads)


def make_pairs(device: str, tasks: list[str], count: int, salt0: int, style: str = "heavy") -> tuple[list, dict]:
    srcs = {t: TASKS[t].format(**SIZES[device][t]) for t in tasks}
    pairs = []
    for i in range(count):
        t = tasks[i % len(tasks)]
        pairs.append((t, srcs[t], candidate_source(t, salt0 + i, device, style)))
    return pairs, srcs


def _summary(res) -> dict:
    return dict(collections.Counter(f"{r.reward}:{r.reason}" for r in res))


PHASES = ("reference_at_s", "built_at_s", "measure_at_s", "done_at_s",  # the batch timeline (s into it)
          "prebuild_s", "prebuild_wall_s", "setup_s", "prepare_s", "build_s", "instantiate_s", "weights_s", "host_alloc_s", "cuda_init_s", "profiler_init_s", "checks_wait_s", "locked_s", "trials_s", "profiled_s", "harness_warm_s",
          "timing_wait_s", "rounds_s", "land_s", "timing_prep_s", "rounds_run_s", "timing_done_s", "timing_checks_s", "intervals_s",
          "baseline_blocks_s", "baseline_calls_s", "baseline_block_overhead_s", "candidate_stop_s",
          "quiet_window_s", "compile_wait_s", "measure_wall_s", "child_run_s", "save_outputs_s", "judge_s", "judge_read_s", "judge_compare_s", "outputs_mb",
          "round_overhead_ms", "call_overhead_ms", "round_period_ms", "round_periods_s", "round_period_max_ms", "round_period_max_at", "first_round_ms", "pacer_before_rounds_s", "settle_device_s", "reference_rounds_s", "reference_untimed_rounds_s",
          "reference_outputs_s", "reference_save_s", "reference_data_at_s", "reference_handed_at_s", "reference_all_rounds_s", "reference_land_s", "reference_flops_s", "reference_outputs_land_s", "reference_channel_s",
          "reference_round_overhead_ms", "reference_round_period_ms", "host_ms", "reference_host_ms",
          "call_margin_ms", "call_floor_scale",  # the claims' floor: honest margins calibrate its slack
          "baseline_quiet_wait_ms", "baseline_disturbed_blocks",  # CUDA: waits for an idle device before baseline blocks
          # the round's stretches outside the call, held to the reference's (rounds.gaps_plausible)
          "before_call_ms", "reference_before_call_ms", "after_call_ms", "reference_after_call_ms", "settle_ms",
          "reference_settle_ms",
          # the reference's own phases (evaluate's _Reference.phases): its child, the fork server's start before it,
          # the parent's read of its data, the facts, when the task's baseline children started
          "reference_child_s", "reference_server_wait_s", "reference_read_s", "reference_facts_s", "reference_baselines_at_s")  # EvalResult.times keys


def _median(values) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float))]  # numbers only (first_round_ms is a dict)
    return round(statistics.median_high(vals), 2) if vals else None


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds * 60, 2) if seconds > 0 else 0.0


def group_source(task: str, member: int, device: str) -> str:
    """A GRPO-shaped completion: one extension name and one wrapper per task, kernel bodies differ."""
    src = candidate_source(task, 7, device, "light")
    src = src.replace("// variant 7", f"// completion {member}")
    src = src.replace("y[i] = v;", f"y[i] = v + 0.0f * {member}.0f;").replace("Y[(long)i * m + j] = v > 0.f ? v : 0.f;", f"Y[(long)i * m + j] = (v > 0.f ? v : 0.f) + 0.0f * {member}.0f;")
    return src.replace('name="bench_{t}_7"'.format(t=task), f'name="group_{task}"')


def _tu(stats_before: dict, stats_after: dict) -> dict:
    from opsynth.reward.builds import tu_hit_counts

    hits, total = tu_hit_counts(stats_before, stats_after)
    return {"tu_hits": hits, "tu_compiles": total, "tu_hit_rate": round(hits / total, 3) if total else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tasks", default="chain,relu_scale,linear_relu")
    ap.add_argument("--count", type=int, default=48, help="distinct light-layout candidates in the overlapped run")
    ap.add_argument("--group-size", type=int, default=8, help="completions per task in the GRPO-shaped run")
    ap.add_argument("--baseline-count", type=int, default=3, help="candidates evaluated one at a time")
    ap.add_argument("--build-workers", type=int, default=None, help="default: RewardConfig's (cpu_count on cuda)")
    ap.add_argument("--measure-workers", type=int, default=None)
    ap.add_argument("--group-sweep", default="", help="after the GRPO-shaped phase, the same shape again (fresh kernel "
                    "bodies) with each of these measure-worker counts, e.g. 12,16: the number in flight, measured")
    ap.add_argument("--ready-children", type=int, default=None, help="reward.ready_children (default: the config's: "
                    "on cuda min(4, measure workers))")
    ap.add_argument("--plain-lock-group", action="store_true", help="after the GRPO-shaped phase, the same shape with "
                    "the device lock's timings not a phase ($OPSYNTH_LOCK_PHASES=0, the control), then with them again")
    ap.add_argument("--fresh-copies-group", action="store_true", help="after the GRPO-shaped phase, the same shape with "
                    "the outputs' host copies into new memory ($OPSYNTH_HOST_COPIES=fresh, the control), then reserved again")
    ap.add_argument("--pageable-copies-group", action="store_true", help="after the GRPO-shaped phase, the same shape with "
                    "the outputs' host copies reserved pageable ($OPSYNTH_HOST_COPIES=pageable), then page-locked again")
    ap.add_argument("--copies-in-lock-group", action="store_true", help="after the GRPO-shaped phase, the same shape with "
                    "the outputs copied to the host inside the checks' share and the timing lock ($OPSYNTH_HOLD_OUTPUTS=0, the "
                    "control), then held on the device until the lock is let go again")
    ap.add_argument("--late-data-group", action="store_true", help="after the GRPO-shaped phase, the same shape with "
                    "candidates started only on the whole reference ($OPSYNTH_EARLY_REFERENCE_DATA=0, the control), then early again")
    ap.add_argument("--ready-sweep", default="", help="after the GRPO-shaped phase (and its sweep), the same shape again "
                    "with each of these reward.ready_children counts, e.g. 0,8, or 12,4,12 (A/B/A: phase order warms caches): measuring "
                    "children parked ahead, measured")
    ap.add_argument("--warmup-sweep", default="", help="after the GRPO-shaped phase (and the sweeps above), the same shape "
                    "again with each of these reward.warmup counts, e.g. 5,3: the warm-up rounds each candidate runs inside "
                    "its locked section (10 on cuda by default), measured in the phase's median locked_s and rewards")
    ap.add_argument("--skip-distinct", action="store_true", help="skip the one-at-a-time and distinct phases (a sweep's call)")
    ap.add_argument("--no-shared-pch", action="store_true", help="build without the shared precompiled torch/extension.h")
    ap.add_argument("--ccache", default="auto", help="reward.ccache: auto, false, or a path")
    ap.add_argument("--isolation", default="auto", help="reward.isolation: auto, namespaces, none")
    ap.add_argument("--cache-dir", default=None, help="default: a fresh temp dir (fresh caches: every build is real)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "reward_throughput.json"))
    args = ap.parse_args()
    try:  # before any phase: a bad value must not cost a device call's minutes
        warmups = [int(x) for x in args.warmup_sweep.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--warmup-sweep takes warm-up counts separated by commas, e.g. 5,3; got {args.warmup_sweep!r}")
    if any(n < 0 for n in warmups):
        ap.error(f"--warmup-sweep: warm-up counts must be >= 0, got {args.warmup_sweep!r}")

    import torch

    from opsynth.reward.builds import ccache_stats
    from opsynth.reward.evaluate import build_service
    from opsynth.reward.pch import pch_include_dir, pch_root

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    tasks = [t for t in args.tasks.split(",") if t]
    if device == "cpu":
        tasks = [t for t in tasks if t != "linear_relu"] or ["chain"]
    cache = args.cache_dir or tempfile.mkdtemp(prefix="reward_bench_")
    cfg = RewardConfig(device=device, cache_dir=cache, build_workers=args.build_workers,
                       measure_workers=args.measure_workers, shared_pch=not args.no_shared_pch,
                       ccache=args.ccache, isolation=args.isolation, ready_children=args.ready_children)
    run_salt = int(time.time()) % 100000 * 1000  # fresh sources even with a reused cache dir
    style = "light" if device == "cuda" else "heavy"
    out = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "evals_per_min": None,
        "baseline_evals_per_min": None,
        "group_evals_per_min": None,
        "cache_hit_rate": None,
        "cold_first_eval_s": None,
        "complete": False,
        "style": style,
        "isolation": args.isolation,
        "cpu_count": os.cpu_count(),
        "build_workers": cfg.resolved_build_workers(device),
        "measure_workers": cfg.resolved_measure_workers(device),
        "ready_children": cfg.resolved_ready_children(device),
        "shared_pch": cfg.shared_pch,
        "tasks": tasks,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "phases": {},
    }

    def save():  # after every phase, so a run cut short still leaves its numbers
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2))

    say = lambda m: print(f"  {m}", flush=True)  # noqa: E731

    # 1. Cold: fresh caches, nothing warm (fork server, baselines, PCH, builds): one evaluation.
    svc = build_service(cfg, device)
    out["ccache_path"] = svc.ccache
    pairs, task_srcs = make_pairs(device, tasks, 1, run_salt + 1, style)
    t0 = time.perf_counter()
    cold = evaluate(pairs[0][1], pairs[0][2], cfg, progress=say)
    out["cold_first_eval_s"] = round(time.perf_counter() - t0, 1)
    out["cold_first_eval"] = {"reward": cold.reward, "reason": cold.reason, "times": cold.times}
    print(f"[cold] first evaluation {out['cold_first_eval_s']} s: {cold.reward} {cold.reason}; timeline (s): "
          + " ".join(f"{k[:-5]} {cold.times.get(k)}" for k in ("services_at_s", "reference_at_s", "build_at_s", "built_at_s",
                                                                 "measure_at_s", "done_at_s"))
          + f"; build child {cold.times.get('prebuild_wall_s')} s (its fork server's start before it "
          f"{cold.times.get('prebuild_server_wait_s')} s), measuring child {cold.times.get('measure_wall_s')} s, "
          f"judge {cold.times.get('judge_s')} s; builds {(cold.details or {}).get('builds')}", flush=True)
    save()

    # Warm-up, as in steady-state training: the other tasks' baselines (cached) and the shared PCH
    # (built once per compiler and flag set; the cold run started it in the background).
    t0 = time.perf_counter()
    _, task_srcs = make_pairs(device, tasks, len(tasks), 0)
    from opsynth.reward.evaluate import _cleanup, _prepare_reference

    for name, src in task_srcs.items():
        ref = _prepare_reference(src, cfg, device)
        print(f"[warm-up {time.perf_counter() - t0:.0f} s] {name}: ok={ref.ok} eager={ref.eager_ms} compile={ref.compile_ms}", flush=True)
        _cleanup(ref.scratch, cfg)
    if cfg.shared_pch:  # the light header's (what builds use, opsynth.reward.light_headers), else torch's own
        d = pch_include_dir(pch_root(cache), ["-O3"], with_cuda=device == "cuda", log=print, light=cfg.light_headers)
        print(f"[warm-up] shared PCH {'ready' if d else 'unavailable'}", flush=True)
    out["warmup_s"] = round(time.perf_counter() - t0, 1)
    save()

    def phase(name: str, pairs: list, one_at_a_time: bool = False, pcfg=None) -> dict:
        pcfg = pcfg or cfg
        rec = out["phases"].setdefault(name, {})
        rec["measure_workers"] = pcfg.resolved_measure_workers(device)
        rec["ready_children"] = pcfg.resolved_ready_children(device)
        before, ext_before = ccache_stats(svc.ccache, svc.cache_dir), svc.stats.as_dict()
        t0 = time.perf_counter()
        done: list = []
        lock = threading.Lock()  # results arrive on evaluate_many's worker threads

        def progress(_i, res):
            with lock:
                done.append(round(time.perf_counter() - t0, 1))
                rec["progress"] = {"done": len(done), "of": len(pairs), "elapsed_s": done[-1]}
                print(f"[{name} {done[-1]:.0f} s] {len(done)}/{len(pairs)} {res.reward} {res.reason} "
                      + " ".join(f"{k2} {res.times.get(k2)}" for k2 in (*PHASES, "ready_reference", "ready_eager", "host_pinned", "held_copies", "early_data", "harness_warm_parts", "prepare_parts")), flush=True)
                if len(done) % 4 == 0:
                    save()

        if one_at_a_time:
            results = []
            for i, (src, cand) in enumerate(pairs):
                results.append(evaluate(src, cand, pcfg))
                progress(i, results[-1])
        else:
            results = evaluate_many(pairs, pcfg, on_result=progress)
        wall = time.perf_counter() - t0
        ext_after = svc.stats.as_dict()
        rec.update(count=len(results), seconds=round(wall, 1), evals_per_min=_rate(len(results), wall), rewards=_summary(results),
                   ext_requests=ext_after["requests"] - ext_before["requests"], ext_hits=ext_after["ext_hits"] - ext_before["ext_hits"],
                   builds=ext_after["builds"] - ext_before["builds"],
                   # which headers the builds took (opsynth.reward.light_headers): lean .cu, light, fallbacks
                   headers={k2: ext_after[k2] - ext_before[k2] for k2 in ("lean_cuda", "lean_fallbacks", "light_headers", "light_fallbacks")},
                   **_tu(before, ccache_stats(svc.ccache, svc.cache_dir)),
                   **{f"median_{k2}": _median(r.times.get(k2) for r in results) for k2 in PHASES},
                   ready_handed=sum(1 for r in results if r.times.get("ready_child")),  # measured in a parked child
                   # tasks whose reference / eager baseline child was parked ahead (ready_children roles)
                   ready_references=len({r.times.get("reference_at_s") for r in results if r.times.get("ready_reference")}),
                   ready_eager=len({r.times.get("reference_at_s") for r in results if r.times.get("ready_eager")}),
                   median_rounds=_median((r.details.get("rounds") or {}).get("total") for r in results),  # timed rounds a candidate ran
                   rounds_by_pass={k2: sum((r.details.get("rounds") or {}).get(k2) or 0 for r in results)
                                   for k2 in ("warmup", "main", "extended", "remeasure", "total")})
        print(f"[{name}] {len(results)} in {wall:.0f} s = {rec['evals_per_min']}/min: {rec['rewards']}", flush=True)
        save()
        return rec

    if not args.skip_distinct:
        # 2. One at a time (distinct candidates), the old way to use the environment.
        base_pairs, _ = make_pairs(device, tasks, args.baseline_count, run_salt + 50_000, style)
        out["baseline_evals_per_min"] = phase("one_at_a_time", [(s, c) for _, s, c in base_pairs], one_at_a_time=True)["evals_per_min"]
        # 3. Distinct candidates, overlapped.
        dist_pairs, _ = make_pairs(device, tasks, args.count, run_salt + 100_000, style)
        rec = phase("distinct", [(s, c) for _, s, c in dist_pairs])
        out["evals_per_min"] = rec["evals_per_min"]

    # 4. GRPO-shaped: group_size completions per task that differ only in their kernel bodies.
    def group_pairs(first: int, salt: int) -> list:
        if device == "cuda":
            return [(task_srcs[t], group_source(t, first + m, device)) for t in tasks for m in range(args.group_size)]
        return [(task_srcs[t], c) for t in tasks for _, _, c in make_pairs(device, [t], args.group_size, salt, style)[0]]

    out["group_evals_per_min"] = phase("group", group_pairs(0, run_salt + 200_000))["evals_per_min"]
    # 5. The same shape with other numbers of children in flight (fresh bodies: each group builds its own)
    for k, n in enumerate(int(x) for x in args.group_sweep.split(",") if x.strip()):  # a repeated count (16,12,16)
        name = f"group_w{n}" if f"group_w{n}" not in out["phases"] else f"group_w{n}_{k}"  # gets its own phase
        phase(name, group_pairs(1000 * (k + 1), run_salt + 300_000 + 1000 * k), pcfg=dataclasses.replace(cfg, measure_workers=n))
    from opsynth.reward.evaluate import EARLY_DATA_ENV
    from opsynth.reward.host_copies import HOLD_ENV, MODE_ENV
    from opsynth.runtime.device_lock import PHASES_ENV

    # A/B/A controls: after the default phase, the same shape with one change switched off by its environment
    # variable (read by the parent as it makes each job or takes each lock), then with it on again
    controls = [(args.plain_lock_group, PHASES_ENV, "0", "group_plain_lock", "group_again", 70_000, 500_000),  # timings not a phase
                (args.fresh_copies_group, MODE_ENV, "fresh", "group_fresh_copies", "group_reserved_again", 80_000, 700_000),  # copies into new memory
                (args.pageable_copies_group, MODE_ENV, "pageable", "group_pageable_copies", "group_pinned_again", 86_000, 706_000),  # not page-locked
                (args.copies_in_lock_group, HOLD_ENV, "0", "group_copies_in_lock", "group_held_again", 84_000, 704_000),  # copies inside the lock
                (args.late_data_group, EARLY_DATA_ENV, "0", "group_late_data", "group_early_again", 82_000, 702_000)]  # the whole reference first
    for wanted, env, value, off_name, on_name, first, salt in controls:
        if not wanted:
            continue
        os.environ[env] = value
        try:
            phase(off_name, group_pairs(first, run_salt + salt))
        finally:
            os.environ.pop(env, None)
        phase(on_name, group_pairs(first + 1000, run_salt + salt + 1000))
    for k, n in enumerate(int(x) for x in args.ready_sweep.split(",") if x.strip()):  # a repeated count (12,4,12: A/B/A) gets
        name = f"group_r{n}" if f"group_r{n}" not in out["phases"] else f"group_r{n}_{k}"  # its own phase
        phase(name, group_pairs(50_000 + 1000 * k, run_salt + 400_000 + 1000 * k), pcfg=dataclasses.replace(cfg, ready_children=n))
    # 6. The same shape with fewer warm-up rounds: the locked section is the GRPO-shaped floor (24 x 0.44 s on the
    # H200, 2026-12-06), and the candidate's checked trials have already run its kernels once
    for k, n in enumerate(warmups):
        phase(f"group_u{n}", group_pairs(60_000 + 1000 * k, run_salt + 600_000 + 1000 * k), pcfg=dataclasses.replace(cfg, warmup=n))
    names = [p for p in ("distinct", "group") if p in out["phases"]]
    tu_h = sum(out["phases"][p]["tu_hits"] for p in names)
    tu_n = sum(out["phases"][p]["tu_compiles"] for p in names)
    out["cache_hit_rate"] = round(tu_h / tu_n, 3) if tu_n else None  # translation units served by ccache
    out["ccache"] = ccache_stats(svc.ccache, svc.cache_dir)
    out["complete"] = True
    save()
    print()
    print(f"{'phase':<15}{'in flight':>10}{'evals':>7}{'seconds':>10}{'evals/min':>11}{'TU hits':>9}{'ext hits':>10}"
          f"{'setup_s':>9}{'locked_s':>10}{'prebuild_wall':>14}{'judge_s':>9}{'lock wait':>10}{'cuda_init':>10}{'ready':>7}")
    for name, rec in out["phases"].items():
        print(f"{name:<15}{rec['measure_workers']:>10}{rec['count']:>7}{rec['seconds']:>10}{rec['evals_per_min']:>11}{rec['tu_hits']:>4}/{rec['tu_compiles']:<4}"
              f"{rec['ext_hits']:>5}/{rec['ext_requests']:<4}{str(rec['median_setup_s']):>9}{str(rec['median_locked_s']):>10}{str(rec['median_prebuild_wall_s']):>14}"
              f"{str(rec['median_judge_s']):>9}{str(rec['median_timing_wait_s']):>10}{str(rec.get('median_cuda_init_s')):>10}"
              f"{rec.get('ready_handed', 0):>3}/{rec.get('ready_children', 0):<3}")
    print(f"cold first evaluation: {out['cold_first_eval_s']} s; cache hit rate (translation units, distinct+group): {out['cache_hit_rate']}")
    print(f"device: {out['device']}; isolation {args.isolation}; build workers {out['build_workers']}, measure workers "
          f"{out['measure_workers']}, ccache {out['ccache_path']}; wrote {args.out}")


if __name__ == "__main__":
    main()
