"""What the verifier accepts and how hard it tries: one flat dataclass, so a Hydra YAML under
conf/verify/ maps onto it key for key (``VerifyConfig(**yaml)``).

CPU and CUDA differ in what a sensible runtime band and memory budget are, so the fields that
depend on the device come in pairs (``min_ms`` / ``cpu_min_ms`` ...) and :meth:`VerifyConfig.limits`
picks the pair for the device the workers actually run on.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceLimits:
    """The band and memory numbers that apply on one device kind."""

    min_ms: float
    max_ms: float
    mem_cap_gb: float  # acceptance cap on a task's peak memory (inputs, weights, activations)
    mem_limit_gb: float  # hard per-worker limit; above it the task is stopped ("oom")


@dataclass
class VerifyConfig:
    # Where tasks run: "auto" picks CUDA when a GPU is visible, else CPU.
    device: str = "auto"
    # Warm worker processes; 0 means one per CPU core on CPU, 8 on CUDA.
    n_workers: int = 0
    # Restrict CUDA workers to these GPU indices (round-robin); None: the default GPU.
    cuda_devices: list[int] | None = None
    # Torch intra-op threads per worker on CPU; 0 means cores // n_workers.
    cpu_threads_per_worker: int = 0

    # Wall-clock limit of one request to a worker (one eager check or one compile check);
    # time spent waiting for the shared timing lock does not count.
    timeout_s: float = 180.0
    # Time a fresh worker may take to import torch (and initialise CUDA).
    startup_timeout_s: float = 180.0
    # Recycle a worker after this many tasks to bound leaks (dynamo caches, allocator).
    max_tasks_per_worker: int = 200
    # Retry a task once on a fresh worker when its worker dies, before calling it "crashed".
    retry_crashed: bool = True
    # Import torch's compiler stack when a worker starts (seconds), so the first compile request
    # does not pay for it; tests that restart workers often turn it off.
    preload_compiler: bool = True

    # Runtime band (Ops-6K: 1 to 100 ms of eager time on the GPU) and memory, per device kind.
    min_ms: float = 1.0
    max_ms: float = 100.0
    mem_cap_gb: float = 24.0
    mem_limit_gb: float = 32.0
    cpu_min_ms: float = 0.05
    cpu_max_ms: float = 100.0
    cpu_mem_cap_gb: float = 4.0
    cpu_mem_limit_gb: float = 8.0
    # Host RSS growth allowed to a CUDA worker before the parent kills it.
    cuda_host_mem_limit_gb: float = 32.0

    # torch.compile settings; "inductor" is what the dataset promises, "aot_eager" or "eager" are
    # much faster to compile and useful in tests.
    compile_backend: str = "inductor"
    compile_mode: str | None = None
    check_compile: bool = True

    # Tolerances: compile-vs-eager match and input sensitivity use atol/rtol (the reward's 1e-2);
    # determinism uses a much tighter pair (identical up to float reassociation, which CUDA
    # atomics in e.g. scatter_add introduce; exact equality would reject those operators).
    atol: float = 1e-2
    rtol: float = 1e-2
    det_atol: float = 1e-6
    det_rtol: float = 1e-5

    # Timing: medians over `repeats` runs after `warmup` runs, fewer repeats for slow tasks so one
    # timing takes about `timing_budget_ms`, but never fewer than `min_repeats`.
    warmup: int = 3
    repeats: int = 20
    min_repeats: int = 5
    timing_budget_ms: float = 1000.0
    # Stop repeating once min_repeats ran and their interquartile range is within this share of the
    # median (0: always run the full count). Saves device time on stable GPU timings.
    timing_rel_tol: float = 0.0
    # Serialise timing across all workers (and pools) on one device with a file lock.
    serialize_timing: bool = True
    lock_dir: str | None = None

    # Calibration: rescale batch_size toward a target runtime drawn (per task, seeded by its
    # source) from a log-normal with this median and 90th percentile, clipped to the band shrunk
    # by `band_margin` on both sides so a landing near the target is safely inside.
    calibrate: bool = True
    max_calib_steps: int = 6
    target_median_ms: float = 4.0
    target_p90_ms: float = 20.0
    band_margin: float = 1.5

    def limits(self, device: str) -> DeviceLimits:
        """The band and memory limits for ``device`` ("cpu" or "cuda")."""
        if device == "cpu":
            return DeviceLimits(self.cpu_min_ms, self.cpu_max_ms, self.cpu_mem_cap_gb, self.cpu_mem_limit_gb)
        return DeviceLimits(self.min_ms, self.max_ms, self.mem_cap_gb, self.mem_limit_gb)

    def target_sigma(self) -> float:
        """Log-normal sigma such that P(T < target_p90_ms) = 0.9."""
        return math.log(self.target_p90_ms / self.target_median_ms) / 1.2815515655446004

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "VerifyConfig":
        """Build from a plain mapping (e.g. a Hydra/OmegaConf node turned into a dict); unknown
        keys are an error so a typo in YAML does not pass silently."""
        d = dict(d or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown VerifyConfig keys: {unknown}")
        return cls(**d)
