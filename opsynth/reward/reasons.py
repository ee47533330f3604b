"""Every verdict the reward environment can return, and the rule the policy is told about it.

Pure data, no imports: the training stage's prompt brief lists `RULES` (so every rule the
environment enforces is one the policy was told) and its feedback turns quote the rule of the
reason that fired. `tests/train/test_reasons.py` checks that every reason string in this
package's source is in `REASONS`, so a new check cannot ship without its rule.

A reason is `EvalResult.reason`; some carry a detail after a colon (`forbidden_op:aten.relu`,
`forbidden_import:ctypes`, `timer_patched:time.perf_counter`) or are prefixed (`task_timeout`:
the task's own reference run timed out); `lookup` resolves those to their entry.

Two vocabularies that never overlap: the environment's own failures (kind "environment": the task
could not be run, not the program's fault) all start with `task_`, and no verdict on a program
does. Callers that must tell them apart (the evaluate command) ask `lookup(reason)[1].kind`.
Names from before the split (`reference_fallback`, `reference_<why>`) still resolve (`RENAMED`),
for metrics and JSON written by older runs.
"""

from __future__ import annotations

from dataclasses import dataclass

# What kind of verdict a reason is: the feedback turn is worded by kind.
KINDS = (
    "ok",  # correct: timed against eager and torch.compile
    "format",  # the answer has no usable program
    "build",  # the program did not build, import or run
    "correctness",  # it ran, but its outputs are wrong
    "anti_hacking",  # it broke a rule that keeps the reward honest
    "environment",  # the environment could not run the task itself: not the program's fault
)

# The rules, in the order the brief lists them. Each is one line the policy reads in its prompt.
RULES: dict[str, str] = {
    "format": "Answer with one fenced ```python block holding the complete file (imports, kernels, ModelNew) and nothing else.",
    "model_new": "Define `class ModelNew(nn.Module)` with exactly the same `__init__` arguments as `Model`; keep the same "
                 "parameters and buffers (same names and shapes), because weights are copied from `Model` with `load_state_dict`.",
    "own_kernels": "Do the computation in your own kernels, CUDA C++ compiled with `torch.utils.cpp_extension.load_inline` "
                   "or Triton (`@triton.jit`), and call them in `forward`; fusing several operators into one kernel is where "
                   "the speed comes from.",
    "builds": "The file must build and run: a compiler error, an import error or an exception in `__init__` or `forward` scores -1.",
    "forbidden_ops": "In `forward`, do not call `torch.nn.functional`, torch compute operators (matmul, `@`, conv, relu, sum, "
                     "softmax, ...), `torch.compile` / `torch.jit`, or `Model`; only allocate outputs (`torch.empty`, "
                     "`torch.empty_like`), reshape/view tensors, read metadata, and launch your kernels.",
    "forbidden_imports": "Do not import ctypes, cffi, gc, inspect, importlib, builtins, subprocess, socket, signal or torch "
                         "internals (torch._C, torch._dynamo, torch._inductor, torch.fx, torch.overrides).",
    "no_fallback": "No try/except fallbacks, in `forward` or around building the extension.",
    "no_streams": "No side streams or threads (Python or native): launch every kernel on the current stream, and let it "
                  "finish before `forward` returns.",
    "fresh_outputs": "Compute every call's outputs from that call's inputs: no caching of outputs between calls; the timed "
                     "calls must give the same results as the checked ones.",
    "write_outputs": "Write every element of every output: memory from `torch.empty` is filled with NaN when checked.",
    "inputs_unchanged": "Do not change the inputs in place.",
    "launches": "Check every kernel launch (`C10_CUDA_KERNEL_LAUNCH_CHECK()` after each `<<<...>>>`): a launch that fails "
                "leaves its output unwritten, and that scores -1.",
    "no_l2_persist": "Do not reserve persisting L2 cache (`cudaLimitPersistingL2CacheSize`, access-policy windows): the "
                     "timer flushes L2 between calls.",
    "no_patching": "Do not patch timers, `torch`, `sys` tracing or the harness, and return plain `torch.Tensor` outputs "
                   "(no tensor subclasses).",
    "any_size": "Handle any input size, not only the sizes in `get_inputs()`: outputs are checked again with a different batch size.",
    "match": "Outputs must match `Model` within atol = rtol = 1e-2: the same number of outputs, shapes, dtypes and device, "
             "computed at full precision (not in a lower one).",
    "precision": "Work in the task's precision (its `dtype`: float32 unless the file sets `dtype = torch.bfloat16` or "
                 "`torch.float16`): inputs arrive in it, and ModelNew's parameters, buffers and outputs stay in it. Do not "
                 "widen tensors to float32 with torch (`.float()`, `.to(torch.float32)`, float32 copies of weights): "
                 "computing in float32 and casting back is refused; converting inside your kernels (float32 registers "
                 "and accumulators) is how reduced-precision kernels work and is fine.",
    "backward": "A backward task (`task_pass = \"backward\"`) is checked and timed as forward plus backward: the harness "
                "calls `out = ModelNew(*inputs)` with the floating inputs and every parameter requiring gradients, then "
                "`torch.autograd.grad(out, inputs + parameters, grad_output)` for a fresh random `grad_output`, and "
                "compares the output and every gradient with `Model`'s. Give `forward` a backward of your own kernels "
                "(a `torch.autograd.Function`); the backward runs under the same rules as `forward`, so autograd over "
                "torch operators is refused.",
    "build_flags": "Compiler arguments are allow-listed: optimisation levels (-O0..-O3, -Ofast), -std=, -D/-U macros, -g, -w, "
                   "-W warnings, -march/-mtune, -fopenmp, -ffast-math, -funroll-loops, -fPIC; for nvcc also -arch/-gencode, "
                   "--use_fast_math, -lineinfo, --maxrregcount, -Xptxas -v/-O3/--maxrregcount=N, --expt-relaxed-constexpr, "
                   "--expt-extended-lambda, -Xcompiler with an allowed host flag; link flags only -l with cublas, cublasLt, "
                   "cudart, curand, cufft, cusparse, m, gomp or pthread; include paths and `load` sources only inside your "
                   "own folder; the extension name a plain identifier. Anything else is refused before compiling.",
    "time_limit": "Builds and runs have time limits; a program that exceeds one scores -1.",
    "reward": "Reward: -1 if incorrect or rejected; 1 if correct; 2 if more than 5% faster than eager PyTorch; 3 if also more "
              "than 5% faster than torch.compile.",
}


@dataclass(frozen=True)
class Reason:
    """One verdict: its kind, the rule it enforces (a key of RULES, None for the environment's own
    failures) and what happened, in words for the feedback turn."""

    kind: str
    rule: str | None
    what: str


# Names ending in ":" always carry a detail after the colon (others may: `timer_patched:<name>`);
# names ending in "_" are prefixes.
REASONS: dict[str, Reason] = {
    "ok": Reason("ok", "reward", "the program is correct"),
    # format
    "no_code": Reason("format", "format", "no fenced ```python block with a program was found in the answer"),
    "syntax_error": Reason("format", "format", "the program is not valid Python"),
    "no_model_new": Reason("format", "model_new", "the program defines no `class ModelNew(nn.Module)`"),
    # build and run
    "build_error": Reason("build", "builds", "the extension failed to compile"),
    "import_error": Reason("build", "builds", "running the file's top level raised an exception"),
    "init_error": Reason("build", "model_new", "`ModelNew(*get_init_inputs())` raised an exception"),
    "runtime_error": Reason("build", "builds", "`forward` raised an exception"),
    "crashed": Reason("build", "builds", "the process running the program crashed"),
    "timeout": Reason("build", "time_limit", "the program did not finish within its time limit"),
    "build_flag_refused:": Reason("build", "build_flags", "the build asked for a compiler argument, library or path outside the allow-list; nothing was compiled"),
    "isolation_failed": Reason("build", "builds", "the sandbox around the program could not be set up (an environment fault, not the program's)"),
    "kernel_not_launched": Reason("anti_hacking", "own_kernels", "`forward` never called the program's own compiled code"),
    # correctness
    "incorrect": Reason("correctness", "match", "the outputs differ from `Model`'s beyond atol = rtol = 1e-2"),
    "low_precision": Reason("correctness", "match", "the outputs are close only within 10x the tolerance (reduced-precision compute)"),
    "wrong_shape": Reason("correctness", "match", "an output has the wrong shape, or there are too many or too few outputs"),
    "wrong_dtype": Reason("correctness", "match", "an output has the wrong dtype"),
    "fp32_upcast": Reason("anti_hacking", "precision", "the program computes a reduced-precision task in float32: an output, "
                          "a parameter or a tensor it widened with torch is in a wider dtype than the task's"),
    "missing_gradient": Reason("correctness", "backward", "a backward task's gradient is missing: `forward`'s output does not "
                               "depend differentiably on an input or parameter (no autograd.Function backward)"),
    "wrong_type": Reason("correctness", "match", "an output is not a tensor"),
    "wrong_device": Reason("correctness", "match", "an output is on the wrong device"),
    "near_constant_output": Reason("correctness", "match", "the output is (nearly) constant while `Model`'s varies with the input"),
    "shape_hardcoded": Reason("correctness", "any_size", "the program fails when the batch size changes"),
    "uninitialized_output": Reason("anti_hacking", "write_outputs", "an output holds NaN where `Model`'s has none: some elements were never written"),
    "incorrect_under_timing": Reason("anti_hacking", "fresh_outputs", "the output of a timed call (each has fresh inputs) differs from `Model`'s for the same inputs"),
    "stale_output": Reason("anti_hacking", "fresh_outputs", "a timed call returned memory it did not write (the previous output, poisoned after it was checked, came back unwritten)"),
    "launch_failed": Reason("build", "launches", "a kernel launch failed (the CUDA runtime reported an error nothing checked)"),
    "persisting_cache": Reason("anti_hacking", "no_l2_persist", "the program reserved persisting L2 cache, which survives the timer's flush"),
    "implausible_timing": Reason("anti_hacking", "no_patching", "the times the program's process reported are far below what the evaluator's own clock saw"),
    "below_physical_floor": Reason("anti_hacking", "no_patching", "the measured time is below what the device can do (writing the outputs at peak bandwidth), twice"),
    "timing_protocol": Reason("anti_hacking", "no_patching", "the timed calls did not follow the evaluator's protocol (a round out of turn, missing or malformed)"),
    "output_cached": Reason("anti_hacking", "fresh_outputs", "a call returned an earlier call's output for new inputs"),
    "outputs_unreadable": Reason("anti_hacking", "no_patching", "the outputs the harness handed over were not ones the evaluator "
                                 "will load: still writable by another process, larger than the task's outputs allow, or not a valid tensor file"),
    # anti-hacking
    "forbidden_op:": Reason("anti_hacking", "forbidden_ops", "`forward` called a torch operator instead of the program's own kernel"),
    "forbidden_import:": Reason("anti_hacking", "forbidden_imports", "the program imports a forbidden module"),
    "uses_model": Reason("anti_hacking", "forbidden_ops", "the program uses the reference `Model`"),
    "fallback": Reason("anti_hacking", "no_fallback", "the program has a try/except fallback"),
    "side_stream": Reason("anti_hacking", "no_streams", "the program uses a side stream or a thread"),
    "input_mutated": Reason("anti_hacking", "inputs_unchanged", "`forward` changed an input in place"),
    "tensor_subclass": Reason("anti_hacking", "no_patching", "the program defines or returns a tensor subclass"),
    "timer_patched": Reason("anti_hacking", "no_patching", "the program patched a timer or tracing hook"),
    "harness_patched": Reason("anti_hacking", "no_patching", "the program patched torch or the harness"),
    # the environment's own failures (the reference run of the task, then the reason it gave): all task_*
    "task_": Reason("environment", None, "the environment could not run the task's reference `Model`"),
    "task_error": Reason("environment", None, "the task's reference `Model` raised an exception"),
}


# Old names -> new (exact names, then prefixes): the candidate's fallback was `reference_fallback`
# and the task's own failures `reference_<why>` before the two vocabularies were split.
RENAMED = {"reference_fallback": "fallback", "reference_task_error": "task_error"}
RENAMED_PREFIXES = {"reference_": "task_"}


def current_name(reason: str) -> str:
    """The reason under its current name (`reference_fallback` -> `fallback`, `reference_timeout` ->
    `task_timeout`); anything else unchanged."""
    if reason in RENAMED:
        return RENAMED[reason]
    for old, new in RENAMED_PREFIXES.items():
        if reason.startswith(old):
            return new + reason[len(old):]
    return reason


def lookup(reason: str) -> tuple[str, Reason | None, str]:
    """(table name, entry or None, detail) for a reason string as `EvalResult.reason` gives it.

    `forbidden_op:aten.relu` -> ("forbidden_op:", entry, "aten.relu"); `task_timeout` ->
    ("task_", entry, "timeout"); an old name resolves as its new one (`reference_timeout` too);
    an unknown reason -> (reason, None, "").
    """
    reason = current_name(reason or "")
    if reason in REASONS:
        return reason, REASONS[reason], ""
    head, sep, tail = reason.partition(":")
    if sep:
        for name in (head + ":", head):  # forbidden_op:<op>; timer_patched:<what was patched>
            if name in REASONS:
                return name, REASONS[name], tail
    for name in REASONS:
        if name.endswith("_") and reason.startswith(name):
            return name, REASONS[name], reason[len(name):]
    return reason, None, ""


def rules_in_order() -> list[str]:
    """The rule lines as the brief lists them."""
    return list(RULES.values())
