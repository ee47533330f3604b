"""The task contract, in one place: load a KernelBench-format task file, read and rewrite its sizes.

Used by verify (calibration, checks) and reward (reference runner, second shape) alike, so the two
never disagree about what a task file is. The contract (docs/INTERFACES.md): `batch_size` is a
module-level int literal, the leading dimension of every input, and nothing in `get_init_inputs()`
depends on it, so the same Model and weights accept any batch size.
"""

from __future__ import annotations

import ast
import linecache
import sys
import types
from dataclasses import dataclass

from opsynth.catalog.precision import DEFAULT_DTYPE, DEFAULT_PASS, PASSES, REDUCED, dtype_name

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


def load_task_module(source: str, name: str = "task_module", register: bool = False) -> types.ModuleType:
    """Execute a task's source as a fresh module.

    With `register`, the module is put in `sys.modules` and its source in `linecache`, so dynamo,
    `inspect` and tracebacks can see it (torch.compile needs this). Raises whatever the source raises
    (SyntaxError included): callers classify the failure.
    """
    filename = f"<{name}>"
    code = compile(source, filename, "exec")
    mod = types.ModuleType(name)
    mod.__file__ = filename
    if register:
        sys.modules[name] = mod
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(code, mod.__dict__)
    return mod


def missing_names(mod: types.ModuleType) -> list[str]:
    """The contract's required definitions the module lacks."""
    return [n for n in REQUIRED_NAMES if not hasattr(mod, n)]


def _batch_size_node(source: str) -> ast.Constant | None:
    """The int literal of the module-level ``batch_size = N`` assignment, if there is one."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found = None
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "batch_size" for t in targets):
                value = node.value
                if isinstance(value, ast.Constant) and isinstance(value.value, int) and not isinstance(value.value, bool):
                    found = value  # the last assignment wins, as it would when executed
                else:
                    found = None
    return found


def read_batch_size(source: str) -> int | None:
    node = _batch_size_node(source)
    return None if node is None else int(node.value)


def set_batch_size(source: str, batch_size: int) -> str:
    """Return ``source`` with its ``batch_size`` literal replaced; the rest of the text is untouched."""
    node = _batch_size_node(source)
    if node is None:
        raise ValueError("task has no module-level integer batch_size")
    if node.lineno != node.end_lineno:
        raise ValueError("batch_size literal spans lines")
    lines = source.splitlines(keepends=True)
    i = node.lineno - 1
    raw = lines[i].encode()  # col offsets are in UTF-8 bytes
    raw = raw[: node.col_offset] + str(int(batch_size)).encode() + raw[node.end_col_offset :]
    lines[i] = raw.decode()
    return "".join(lines)


def second_batch_size(bs: int) -> int:
    """A different, odd-ish batch size that catches kernels hard-coding get_inputs shapes."""
    return bs + 1 if bs < 4 else bs // 2 + 1


def with_second_shape(source: str) -> str | None:
    """The task at a second batch size (to catch hard-coded shapes), or None when it has no batch_size."""
    bs = read_batch_size(source)
    if bs is None:
        return None
    try:
        return set_batch_size(source, second_batch_size(bs))
    except ValueError:
        return None


# The mode a task's Model runs in (the row's `mode` column). A Model whose output is the same in
# train and eval mode is an "eval" task (what the reward has always run); one whose output differs
# (BatchNorm's batch statistics, say) means what it computes as constructed, which is train mode
# (KernelBench runs such tasks so). The verifier decides it (`opsynth.verify.checks.choose_mode`);
# the verifier's later checks, its compile check and the reward's reference and candidate all put
# the model in that mode with `set_mode`, and nowhere else.
MODES = ("train", "eval")
DEFAULT_MODE = "eval"  # for a task whose row does not say (an Ops-6K row, a task file on disk)


def check_mode(mode: str | None) -> str:
    """The mode, `DEFAULT_MODE` for None; a ValueError naming the choices for anything else."""
    if mode is None or mode == "":
        return DEFAULT_MODE
    if mode not in MODES:
        raise ValueError(f"task mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def set_mode(model, mode: str | None):
    """Put `model` (an nn.Module) in the task's mode; returns it."""
    model.train(check_mode(mode) == "train")
    return model


# ---- precision and pass ------------------------------------------------------------------------
# A task's kind is part of its code: module-level `dtype = torch.bfloat16` (inputs are made in it in
# `get_inputs()`, and `Model.__init__` ends with `self.to(dtype)`) and `task_pass = "backward"`.
# A task without them (every Ops-6K row) is float32 forward. `task_kind(source)` reads them without
# running anything; the verifier, the reward and the prompt all ask it. How a kind is run is
# below, once: the tolerances of each precision, and the backward step (`task_step`).

DTYPE_NAME = "dtype"
PASS_NAME = "task_pass"
# The loss a backward task states (its code's comment and the policy's prompt say it in these words).
BACKWARD_LOSS = ("the gradients of the scalar loss sum(output * grad_output) with respect to every floating-point "
                 "input and every parameter, where grad_output is a standard-normal tensor shaped like the output, "
                 "drawn afresh with each call's inputs")


@dataclass(frozen=True)
class TaskKind:
    """A task's precision (torch's dtype name) and pass ("forward", or "backward": forward and gradients)."""

    dtype: str = DEFAULT_DTYPE
    task_pass: str = DEFAULT_PASS

    @property
    def backward(self) -> bool:
        return self.task_pass == "backward"

    @property
    def reduced(self) -> bool:
        """bf16 / fp16: the reward also checks that nothing is computed in float32 instead."""
        return self.dtype in REDUCED

    @property
    def is_default(self) -> bool:
        return (self.dtype, self.task_pass) == (DEFAULT_DTYPE, DEFAULT_PASS)

    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)


def kind_lines(kind: TaskKind) -> list[str]:
    """The module-level lines that state a task's kind (none for float32 forward)."""
    lines = []
    if kind.dtype != DEFAULT_DTYPE:
        lines.append(f"{DTYPE_NAME} = torch.{kind.dtype}")
    if kind.backward:
        import textwrap

        lines += textwrap.wrap(f"backward: the output and {BACKWARD_LOSS}.", 100, initial_indent="# ",
                               subsequent_indent="# ")
        lines.append(f'{PASS_NAME} = "backward"')
    return lines


def task_kind(source: str) -> TaskKind:
    """The kind a task's code states (the last module-level assignment of each name wins, as when
    run); a ValueError names an unknown precision or pass."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return TaskKind()
    dtype, task_pass = DEFAULT_DTYPE, DEFAULT_PASS
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for t in node.targets:
            if not isinstance(t, ast.Name):
                continue
            v = node.value
            if t.id == DTYPE_NAME:
                if not (isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "torch"):
                    raise ValueError(f"task's `{DTYPE_NAME} = ...` must name a torch dtype, got {ast.unparse(v)!r}")
                dtype = dtype_name(v.attr)
            elif t.id == PASS_NAME:
                if not (isinstance(v, ast.Constant) and v.value in PASSES):
                    raise ValueError(f"task's `{PASS_NAME} = ...` must be one of {', '.join(map(repr, PASSES))}, "
                                     f"got {ast.unparse(v)}")
                task_pass = v.value
    return TaskKind(dtype, task_pass)


@dataclass(frozen=True)
class Tolerance:
    """Where two results of one task count as the same: atol + rtol |reference| (the compile check,
    input sensitivity, the reward's comparison) and the much tighter pair of the determinism check."""

    atol: float
    rtol: float
    det_atol: float
    det_rtol: float


# Per precision, the one table (the dataset card prints it). Comparisons (the compile check, input
# sensitivity, the reward): atol = rtol = 1e-2 in every precision, CUDA-Agent's for float32 and
# KernelBench's for float16 and bfloat16. Measured on the CPU (inductor against eager, 60 sampled
# bf16 tasks): 4 disagree beyond 1e-2 and the same 4 beyond 2e-2 (discontinuous operators, `frac`,
# `remainder`, `floor_divide`, which no tolerance saves), so the looser bf16 pair buys nothing.
# Determinism: float32 up to float reassociation; the reduced precisions within about one ulp of
# theirs (2**-10 for float16, 2**-7 for bfloat16), since a reordered sum (CUDA atomics) rounds coarser.
TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(atol=1e-2, rtol=1e-2, det_atol=1e-6, det_rtol=1e-5),
    "float16": Tolerance(atol=1e-2, rtol=1e-2, det_atol=1e-4, det_rtol=2e-3),
    "bfloat16": Tolerance(atol=1e-2, rtol=1e-2, det_atol=1e-3, det_rtol=8e-3),
}
# What one step of a pass costs in forwards (for sizing: a backward computes about two forwards' work).
PASS_COST = {"forward": 1.0, "backward": 3.0}


def tolerance(dtype: str) -> Tolerance:
    return TOLERANCES[dtype_name(dtype)]


def grad_outputs(outputs: list, seed: int) -> list:
    """A backward task's grad_output for each floating output of one call: standard normal, from a
    generator seeded with the call's input seed, made on the output's device in its dtype."""
    import torch

    out = []
    for k, o in enumerate(t for t in outputs if isinstance(t, torch.Tensor) and t.is_floating_point()):
        g = torch.Generator(device=o.device)
        g.manual_seed((int(seed) * 1000003 + 7919 * (k + 1)) % (2**62))
        out.append(torch.randn(o.shape, generator=g, device=o.device, dtype=o.dtype))
    return out


def differentiable_inputs(inputs: list) -> list[int]:
    """Positions of the inputs a backward task takes gradients for: the floating-point tensors."""
    import torch

    return [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()]


def parameter_names(model) -> list[str]:
    """The parameters a backward task takes gradients for, by name: every one that requires a gradient."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def _output_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def task_step(model, kind: TaskKind, n_inputs: int = 0, param_names: list[str] | None = None, owner=None):
    """The call a task's harness makes and times, as a function of the call's arguments.

    Forward: the model itself. Backward: `step(*inputs, *grad_outputs)` (the first `n_inputs`
    arguments are the task's inputs, one grad_output per floating output follows) runs the forward
    with gradients on and `torch.autograd.grad` for the differentiable inputs, then for the named
    parameters (default: all of `model`'s), and returns `[*outputs, *input_grads, *param_grads]`,
    None where a gradient does not exist (the caller names it). Nothing accumulates in `.grad`, so
    no call sees another's gradients. `owner`: the module whose parameters these are, when `model`
    wraps it (`torch.compile(model)`). The functions it calls are bound here, before any candidate
    code runs in the process."""
    if not kind.backward:
        return model
    import torch

    grad, enable, tensor = torch.autograd.grad, torch.enable_grad, torch.Tensor
    params = dict((owner if owner is not None else model).named_parameters())
    names = list(param_names) if param_names is not None else parameter_names(owner if owner is not None else model)

    def step(*args):
        inputs, gouts = list(args[:n_inputs]), list(args[n_inputs:])
        diff = differentiable_inputs(inputs)
        with enable():
            for i in diff:
                inputs[i] = inputs[i].detach().requires_grad_()
            outs = _output_list(model(*inputs))
            wrt = [inputs[i] for i in diff] + [params.get(n) for n in names]
            live = [t for t in wrt if isinstance(t, tensor) and t.requires_grad]
            floating = [o for o in outs if isinstance(o, tensor) and o.is_floating_point()]
            pairs = [(o, g) for o, g in zip(floating, gouts) if o.requires_grad]
            got = (grad([o for o, _ in pairs], live, grad_outputs=[g for _, g in pairs], allow_unused=True)
                   if pairs and live else [None] * len(live))
        found = iter(got)
        grads = [next(found) if isinstance(t, tensor) and t.requires_grad else None for t in wrt]
        return [o.detach() if isinstance(o, tensor) else o for o in outs] + grads

    return step


def gradient_labels(inputs: list, param_names: list[str]) -> list[str]:
    """What each gradient of a backward step is, in its order (for messages)."""
    return [f"gradient of input {i}" for i in differentiable_inputs(inputs)] + [f"gradient of {n}" for n in param_names]
