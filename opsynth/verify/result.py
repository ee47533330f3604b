"""The verdict on one task: accepted with its measurements, or rejected with a named reason.

Reasons are plain strings (so reports count them and Parquet stores them); the names below are
the complete vocabulary, from the cheapest check to the most expensive.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ACCEPTED = "accepted"
TIMING_SKIPPED = "timing_skipped"  # WorkerPool.verify's go_timing stopped the task before its first timing

# What each reason means; the keys are the only values VerifyResult.reason takes.
REASONS: dict[str, str] = {
    ACCEPTED: "passed every check",
    "syntax_error": "the source does not parse",
    "load_error": "executing the module (imports, class definitions, constants) raised",
    "missing_definitions": "no Model, get_inputs or get_init_inputs",
    "init_error": "get_init_inputs(), Model(...) or get_inputs() raised",
    "eager_error": "the eager forward raised",
    "exit_called": "task code called sys.exit / raised SystemExit",
    "crashed": "the worker process died while running the task (segfault, os._exit, abort), twice",
    "timeout": "a request ran past timeout_s; the worker was killed",
    "oom": "the task ran out of memory or exceeded the hard per-worker limit",
    "cuda_error": "a CUDA error (illegal address, device-side assert) poisoned the context",
    "no_tensor_output": "forward returned no tensor",
    "non_finite": "output has NaN or Inf",
    "constant_output": "every element of an output is the same value",
    "unused_state": "Model.__init__ makes parameters, buffers or submodules that forward (in the task's mode) never reads",
    "nondeterministic": "the same inputs and weights gave different outputs twice",
    "fixed_inputs": "get_inputs() returns the same values under two seeds (they do not come from the random generator)",
    "input_insensitive": "two different random inputs gave outputs equal within tolerance",
    "mem_cap": "peak memory of inputs, weights and activations is above the memory cap (measured, or "
               "predicted by the cost model at batch_size 1)",
    "too_fast": "eager median below the acceptance window (min_ms plus the edge margin), or no batch_size "
                "the memory budget allows is predicted to reach the target window",
    "too_slow": "eager median above the acceptance window (max_ms less the edge margin), or even "
                "batch_size 1 is predicted above the target window",
    "size_error": "the cost model cannot replay the operators at the smallest batch_size",
    "predicted_oom": "the memory a verifier request is predicted to hold (times verify.mem_safety) is above what one "
                     "request may use on the device (verify.task_mem_budget_mb), at every batch_size that reaches the "
                     "runtime target: rejected by sizing, before any device work",
    "compile_skipped": "passed the eager checks and band; the caller stopped it before torch.compile (it will "
                       "reject it anyway: WorkerPool.verify's go_compile)",
    "timing_skipped": "passed the eager checks; the caller stopped it before its first timing (it will reject it "
                      "anyway: WorkerPool.verify's go_timing)",
    "compile_error": "torch.compile (or running the compiled model) raised",
    "compile_mismatch": "the compiled model's output differs from eager beyond atol/rtol",
    "worker_error": "the verifier itself failed (a bug, not the task's fault)",
    "dtype_mismatch": "a floating input, parameter, buffer or output is not in the task's precision (its `dtype`)",
    "backward_error": "a backward task's forward-and-gradients step raised (an operator without a derivative)",
    "no_gradient": "a backward task has no gradient for one of its floating inputs or parameters",
    "gradient_insensitive": "a backward task's gradient is equal within tolerance for two different random inputs "
                            "and grad_outputs (zero or constant)",
}


@dataclass
class VerifyResult:
    accepted: bool
    reason: str
    source: str  # the task as verified last: for an accepted task, with its calibrated sizes
    eager_ms: float | None = None
    compile_ms: float | None = None
    device: str | None = None  # e.g. "NVIDIA H200" or "cpu"
    torch_version: str | None = None
    peak_mem_mb: float | None = None
    calib_steps: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0  # wall time this verification took, worker restarts included
    stage_s: dict[str, float] = field(default_factory=dict)  # where elapsed_s went (verify/stages.py)
    gpu_sections: list = field(default_factory=list)  # (start, end) wall-clock seconds of device work
    device_sections: dict = field(default_factory=dict)  # the same and compile's, by kind (stages.device_sections)
    timed: list = field(default_factory=list)  # each timing the workers ran: op, runs, warmup, stop, spent_ms (worker.py)
    compiles: int = 0  # compile requests made: 0 when rejected before compiling, else 1
    graphs: int = 0  # graphs Dynamo compiled for it (graph breaks and recompiles add one each; an OOM retry's too)
    # Of the compile stage's seconds: Dynamo's frame compiles (dynamo_s), their backend's part (backend_s),
    # and the wait to take the memory share again after code generation (share_wait_s; worker.py).
    compile_split: dict = field(default_factory=dict)
    # Known once the eager checks passed (opsynth.verify.checks.choose_mode, opsynth.verify.tracing):
    mode: str | None = None  # "train" or "eval": the mode the task means (opsynth.render.task_file)
    signature: str | None = None  # the forward's call graph up to sizes and constants
    calls: list | None = None  # the forward's torch calls, normalised names, in order

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"unknown reason {self.reason!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
