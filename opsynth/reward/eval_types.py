"""Plain records of the reward environment: its settings, its verdict, and the reward rule.

Kept free of torch so that the trainer and the command line can import them cheaply.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path


# The children's entry modules, imported once by the fork server (opsynth.runtime) before it forks.
RUNNERS = ("opsynth.reward.guards", "opsynth.reward.candidate_runner", "opsynth.reward.reference_runner", "opsynth.reward.build_runner",
           "opsynth.reward.baseline_runner",
           # and the harness modules a measuring child imports in `_prepare`, before its candidate runs (0.16-0.18 s
           # of each child's set-up on a 2-core CPU, mostly opsynth.render's networkx; with the tracker's import,
           # `prewarm`, 1.3-1.5 s on a loaded H100 host: benchmarks/results/issue28_h100/2026-12-08)
           "opsynth.render.task_file", "opsynth.runtime.timing", "opsynth.reward.rounds", "opsynth.reward.timed_inputs",
           "opsynth.reward.host_copies", "opsynth.reward.cuda_state", "opsynth.reward.outputs_file")
# Those of the children that only build (a candidate's module run for its extensions' sources, the
# compilers' child), imported by a light server (`run_child(light=True)`): a cold evaluation's build
# does not wait for Dynamo to load.
BUILD_RUNNERS = ("opsynth.reward.guards", "opsynth.reward.candidate_runner", "opsynth.reward.build_runner")


def default_cache_dir() -> Path:
    """Where builds and baseline timings are kept between evaluations (content-addressed, so shared safely)."""
    env = os.environ.get("OPSYNTH_RL_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "opsynth" / "rl"


def device_env(cfg: "RewardConfig", device: str) -> dict:
    """A child's environment for the device: it sees exactly this process's GPU (under several ranks
    or workers, each its own). Every child the reward starts gets it (reference, candidate, baselines)."""
    if device != "cuda":
        return {}
    from opsynth.runtime.timing import gpu_key

    return {"CUDA_VISIBLE_DEVICES": gpu_key(cfg.resolved_device_index())}


def device_lock_file(cfg: "RewardConfig", device: str) -> str:
    """The device's one lock (shared with the verifier), its files created here so a confined child
    can open them. Every part of the reward that locks, or forks a child that locks, asks here."""
    from opsynth.runtime.device_lock import create_lock_files, device_lock_path

    path = device_lock_path(device, cfg.resolved_device_index())
    create_lock_files(path)
    return path


# Runtime guards a test may switch off (RewardConfig.disabled_guards), to show what each one stops.
# "harness_class_methods" is the class-method part of "harness_snapshot" (guards.HarnessSnapshot's class_methods);
# "call_wall_floor" the claims' floor on the parent's clock, part of "wall_clock" (rounds.call_floor);
# "quiet_device" the baseline children's wait for an idle device before each block (timing.QuietDevice).
GUARDS = ("fresh_inputs", "poison_outputs", "harness_snapshot", "harness_class_methods", "wall_clock", "physical_floor",
          "launch_check", "l2_reset", "upcast", "outputs_file", "call_wall_floor", "quiet_device")


@dataclass
class RewardConfig:
    """Settings of one reward evaluation. Defaults follow CUDA-Agent (5 trials, atol = rtol = 1e-2)."""

    device: str = "auto"  # "auto" (cuda when visible, else cpu), "cuda" or "cpu"
    atol: float = 1e-2
    rtol: float = 1e-2
    num_trials: int = 5
    second_shape: bool = True  # re-check on a scaled batch_size when the task has one
    margin: float = 0.95  # "faster" means t < margin * t0
    warmup: int | None = None  # None: 10 on cuda, 3 on cpu
    repeats: int | None = None  # None: 30 on cuda, 10 on cpu
    flush_l2: bool = True  # cuda only: overwrite a 256 MiB buffer between timed calls
    compile_baseline: bool = True  # also time torch.compile(Model) for reward 3
    compile_cache: bool = True  # a task's compile baseline child starts from the inductor/triton caches its
    # earlier batches' compile children left (opsynth.reward.compile_cache; the chain task 22.2 -> 14.6 s on 2 cpu cores)
    compile_prestart: bool | None = None  # start each task's torch.compile child with its eager child (it compiles
    # beside the builds, stopped in every quiet window) instead of when a candidate first beats eager (None: on cuda
    # when the batch holds at most baselines.COMPILE_POOL tasks: a user's evaluation, a cold first; a big GRPO batch
    # would compile every task, most for nothing, and the pool would evict its own children; baselines.prestarts_compile)
    cpu_threads: int | None = None  # torch.set_num_threads in both children (None: torch's default on
    # cpu; 2 on cuda, where forward runs on the GPU and a dozen children share the cores with compilers)
    static_check: bool = True  # quick AST/source pre-check before anything runs
    cache_dir: str | None = None  # None: default_cache_dir()
    shared_pch: bool = True  # precompile torch/extension.h once per flag set for all builds (gcc; opsynth.reward.pch)
    light_headers: bool = True  # build first with a torch/extension.h of tensor API and bindings only (not torch/all.h),
    # as written if that fails (a KernelBench-layout .cu: 102 s -> 38 s on 2 cores; opsynth.reward.light_headers)
    lean_cuda_headers: bool = True  # with light_headers: CUDA units first get a torch/types.h of the Tensor class and
    # the operators they name (38 s -> 14-20 s for that .cu on 2 cores), the light header if that fails
    parallel_nvcc: bool = True  # nvcc's host and device front ends side by side (opsynth.reward.nvcc_parallel: the lean
    # KernelBench-layout .cu 19.0 -> 12.8 s on 2 cores, 15.8 -> 12.6 s warm on the H100, its kernels judged right there)
    build_timeout_s: float = 900.0
    run_timeout_s: float = 300.0
    reference_timeout_s: float = 600.0
    memory_limit_gb: float = 32.0  # RLIMIT_AS on the cpu backend (cuda reserves huge address ranges)
    prebuild: bool | None = None  # evaluate_many: run each candidate's module top level (its builds) in a
    # separate child first (None: yes; children fork from a warm server, so the second one is cheap, and
    # builds overlap the reference run); on cpu every build then ends before anything is timed
    build_workers: int | None = None  # evaluate_many with prebuild: parallel builds (None: cpu_count on
    # cuda, where the compilers have the cores to themselves; cpu_count // 2 on cpu)
    measure_workers: int | None = None  # evaluate_many: children in flight (None: on cuda cpu_count without
    # prebuild, 3/4 of the cores up to 12 with it; 1 on cpu); their checked and timed sections hold an exclusive
    # device lock, so only builds and start-up (imports, CUDA context, profiler) overlap
    ready_children: int | None = None  # measuring children forked, confined and started (CUDA context) before their
    # candidate arrives, each for one job (opsynth.reward.ready_children; None: on cuda min(4, measure_workers), 0 on cpu)
    keep_scratch: bool = False  # keep per-evaluation scratch dirs for debugging
    isolation: str = "auto"  # "auto"/"namespaces": confine every child (mount, net, pid namespaces), refuse
    # to run where that is impossible; "none": unconfined, with a warning (README: Reward isolation)
    ccache: str = "auto"  # "auto": ccache from PATH or $OPSYNTH_CCACHE in front of the compilers; "false"; or a path
    device_index: int | None = None  # which visible GPU (None: LOCAL_RANK under accelerate, else 0)
    remote_builds: bool = False  # evaluate_many with a Dask client: send builds to any worker
    disabled_guards: list = field(default_factory=list)  # for tests only: guards switched off to show that the
    # attack they stop succeeds without them (a control); names in GUARDS. Never set this in training.
    baselines: str = "fresh"  # "fresh": every correct candidate is timed in blocks alternating with fresh eager (and,
    # once it beats eager, torch.compile) blocks, the reward follows the ratio's interval, and the cached baselines are
    # re-validated against them (opsynth.reward.baselines); "cached": a complete cached entry decides as stored
    confidence: float = 0.95  # two-sided level of the ratio's interval (opsynth.reward.confidence)
    timing_block: int | None = None  # timed calls per block, candidate and baseline alike (None: 10 on cuda, 5 on cpu)
    max_timed_calls: int | None = None  # cap on a candidate's timed calls while a ratio is near a threshold (None: 3x repeats)
    min_timed_calls: int | None = None  # a main pass may end after this many timed calls once every threshold is clear
    # of the ratio's interval by a margin (opsynth.reward.baselines.Pacer.ends_main_pass; None: 10; repeats: never early)
    baseline_drift: float = 2.0  # a cached baseline is replaced when outside the fresh median's interval widened by
    # this factor either way (the failures seen were 10-100x; a shared 2-core machine drifts ~1.6x between minutes)

    def quoted_settings(self) -> dict:
        """What `details["settings"]` of a verdict holds (SETTINGS_QUOTED)."""
        return {k: getattr(self, k) for k in SETTINGS_QUOTED}

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()

    def __post_init__(self):
        from opsynth.runtime.isolation import MODES

        if self.isolation not in MODES:
            raise ValueError(f"reward.isolation must be one of {list(MODES)}, got {self.isolation!r}")
        unknown = [g for g in self.disabled_guards if g not in GUARDS]
        if unknown:
            raise ValueError(f"reward.disabled_guards: unknown guard(s) {unknown}; known: {list(GUARDS)}")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"reward.device must be auto, cuda or cpu, got {self.device!r}")
        self.ccache = str(self.ccache).lower() if isinstance(self.ccache, bool) else self.ccache
        if self.baselines not in ("fresh", "cached"):
            raise ValueError(f"reward.baselines must be fresh or cached, got {self.baselines!r}")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"reward.confidence must be in [0.5, 1), got {self.confidence}")
        if self.min_timed_calls is not None and self.min_timed_calls < 2:
            raise ValueError(f"reward.min_timed_calls must be >= 2 (the rounds compared in full are drawn among them), got {self.min_timed_calls}")
        if self.timing_block is not None and self.timing_block < 1:
            raise ValueError(f"reward.timing_block must be >= 1, got {self.timing_block}")
        if isinstance(self.ready_children, bool) or (self.ready_children is not None and (not isinstance(self.ready_children, int) or self.ready_children < 0)):
            raise ValueError(f"reward.ready_children must be an integer >= 0 or null, got {self.ready_children!r}")
        if self.baseline_drift < 1.0:
            raise ValueError(f"reward.baseline_drift must be >= 1, got {self.baseline_drift}")

    def resolved_device_index(self) -> int:
        if self.device_index is not None:
            return int(self.device_index)
        return int(os.environ.get("LOCAL_RANK", "0") or 0)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        try:
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        except Exception:
            return "cpu"

    def check_device(self) -> None:
        """ValueError when `device=cuda` cannot work here (no GPU torch can see): every candidate's
        child would crash, one by one, and the reward would read -1 `crashed` for all of them."""
        if self.device != "cuda":
            return
        import torch

        if not torch.cuda.is_available():
            raise ValueError("reward.device=cuda, but this machine has no GPU that torch can see "
                             "(torch.cuda.is_available() is False); use reward.device=cpu or auto")

    def resolved_build_workers(self, device: str) -> int:
        if self.build_workers:
            return self.build_workers
        n = os.cpu_count() or 2
        return n if device == "cuda" else max(1, n // 2)

    def resolved_prebuild(self, device: str) -> bool:
        return self.prebuild if self.prebuild is not None else True

    def resolved_measure_workers(self, device: str) -> int:
        if self.measure_workers:
            return self.measure_workers
        if device != "cuda":
            return 1
        n = os.cpu_count() or 2
        # three quarters of the cores up to 12 (H200, 16 cores, GRPO-shaped batches of 24: 12 in flight beat
        # 8 and 16 on 2026-12-05 and 12-06; benchmarks/results/issue28_h200/README.md)
        return max(1, min(12, 3 * n // 4)) if self.resolved_prebuild(device) else n

    def resolved_ready_children(self, device: str) -> int:
        if self.ready_children is not None:
            return int(self.ready_children)
        return min(4, self.resolved_measure_workers(device)) if device == "cuda" else 0

    def resolved_cpu_threads(self, device: str) -> int | None:
        if self.cpu_threads:
            return self.cpu_threads
        return 2 if device == "cuda" else None

    def resolved_timing_block(self, device: str) -> int:
        return self.timing_block or (10 if device == "cuda" else 5)

    def resolved_min_timed(self, device: str) -> int:
        """The fewest timed calls (warm-up excluded) of a candidate's main pass."""
        reps = self.timing(device)[1]
        return min(reps, self.min_timed_calls if self.min_timed_calls is not None else 10)

    def timing_cap(self, device: str) -> int:
        """Most timed calls (warm-up excluded) a candidate's main pass may reach."""
        reps = self.timing(device)[1]
        return max(reps, self.max_timed_calls if self.max_timed_calls is not None else 3 * reps)

    def timing(self, device: str) -> tuple[int, int]:
        warm = self.warmup if self.warmup is not None else (10 if device == "cuda" else 3)
        reps = self.repeats if self.repeats is not None else (30 if device == "cuda" else 10)
        return warm, reps

    @classmethod
    def from_dict(cls, d: dict | None) -> "RewardConfig":
        """From a plain mapping (a Hydra node as a dict); unknown keys are an error, so a typo in
        YAML or on the command line does not pass silently."""
        from opsynth.config import build

        return build(cls, d, "reward")


# The settings a verdict depends on, recorded with every result (`details["settings"]`) so that the
# feedback a policy reads quotes the input sets, tolerance and margin it was judged with.
SETTINGS_QUOTED = ("num_trials", "atol", "rtol", "margin")


@dataclass
class EvalResult:
    """The verdict on one candidate. reward is -1 unless correct; reason names why."""

    reward: int
    correct: bool
    reason: str
    times: dict = field(default_factory=dict)  # candidate_ms, eager_ms, compile_ms (None when unmeasured)
    log: str = ""
    device: str = ""
    details: dict = field(default_factory=dict)  # structured extras: detail (why), kernels, kernel_times, builds

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def rejected(cls, reason: str, log: str = "", times: dict | None = None, device: str = "") -> "EvalResult":
        return cls(reward=-1, correct=False, reason=reason, times=dict(times or {}), log=log, device=device)


def reward_from_times(candidate_ms: float, eager_ms: float | None, compile_ms: float | None, margin: float = 0.95) -> int:
    """CUDA-Agent's rule for a correct candidate: 3 beats eager and compile, 2 beats eager, else 1.

    Beating means t < margin * t0 (margin 0.95: more than 5 % faster). A missing baseline is never beaten.
    """
    beats_eager = eager_ms is not None and candidate_ms < margin * eager_ms
    beats_compile = compile_ms is not None and candidate_ms < margin * compile_ms
    if beats_eager and beats_compile:
        return 3
    if beats_eager:
        return 2
    return 1
