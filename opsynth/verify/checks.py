"""The task-quality checks, as run inside a worker process (they execute task code).

Each failing check raises :class:`Reject` with a reason from ``result.REASONS``; the worker turns
that into a reply. Order is cheapest first: load, build, eager run, finiteness, constant output,
determinism, input sensitivity, memory cap; timing and torch.compile come after, in the worker.
"""

from __future__ import annotations

import traceback
import types
from typing import Any

import torch

TASK_MODULE = "opsynth_verify_task"
SEED_MODEL = 0
SEED_INPUTS = 1
SEED_INPUTS_ALT = 2

_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "std::bad_alloc")
_CUDA_MARKERS = (
    "cuda error",
    "illegal memory access",
    "illegal instruction",
    "device-side assert",
    "cublas_status",
    "cudnn_status",
    "unspecified launch failure",
    "misaligned address",
    "an illegal",
)


class Reject(Exception):
    def __init__(self, reason: str, message: str, **evidence: Any):
        super().__init__(message)
        self.reason = reason
        self.evidence = {"message": message, **evidence}


def _tail(exc: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-limit:]


def classify(exc: BaseException, default: str) -> Reject:
    """Name what went wrong: out-of-memory and CUDA faults are worth distinguishing from plain
    task bugs because the pool reacts to them (recycle, retry alone)."""
    if isinstance(exc, Reject):
        return exc
    if isinstance(exc, SystemExit):
        return Reject("exit_called", f"SystemExit({exc.code!r})", traceback=_tail(exc))
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if isinstance(exc, MemoryError) or isinstance(exc, getattr(torch, "OutOfMemoryError", ())) or any(
        m in low for m in _OOM_MARKERS
    ):
        return Reject("oom", text[:2000], traceback=_tail(exc))
    if isinstance(exc, getattr(torch, "AcceleratorError", ())) or any(m in low for m in _CUDA_MARKERS):
        return Reject("cuda_error", text[:2000], traceback=_tail(exc))
    return Reject(default, text[:2000], traceback=_tail(exc))


def load_task(source: str) -> types.ModuleType:
    """Execute the task as a registered module (the task contract's loader), classifying failures."""
    from opsynth.render.task_file import load_task_module, missing_names

    try:
        mod = load_task_module(source, TASK_MODULE, register=True)
    except SyntaxError as exc:
        raise Reject("syntax_error", f"{exc.msg} (line {exc.lineno})") from None
    except BaseException as exc:  # noqa: BLE001 - untrusted code: anything may come out
        raise classify(exc, "load_error") from None
    missing = missing_names(mod)
    if missing:
        raise Reject("missing_definitions", f"missing {', '.join(missing)}")
    return mod


def seed_all(seed: int) -> None:
    import random

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def build_model(mod: types.ModuleType, device: str) -> torch.nn.Module:
    """Model(*get_init_inputs()) with seeded weights, created directly on ``device``."""
    try:
        seed_all(SEED_MODEL)
        with torch.device(device):
            model = mod.Model(*mod.get_init_inputs())
        return model.to(device)
    except BaseException as exc:  # noqa: BLE001
        raise classify(exc, "init_error") from None


def make_inputs(mod: types.ModuleType, device: str, seed: int) -> list[Any]:
    """get_inputs() under the device context, so tensors are born where they are used."""
    try:
        seed_all(seed)
        with torch.device(device):
            inputs = list(mod.get_inputs())
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    except BaseException as exc:  # noqa: BLE001
        raise classify(exc, "init_error") from None


def _cloned(inputs: list[Any]) -> list[Any]:
    # A forward that writes into its input in place must see the same values on every call.
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def forward(model: torch.nn.Module, inputs: list[Any], device: str, default: str = "eager_error",
            clone: bool = True) -> Any:
    """One forward under no_grad, outside any device context (a task that creates tensors on the
    wrong device in forward fails here, as it would in a kernel-evaluation harness)."""
    try:
        with torch.no_grad():
            out = model(*(_cloned(inputs) if clone else inputs))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return out
    except BaseException as exc:  # noqa: BLE001
        raise classify(exc, default) from None


def flat_tensors(out: Any) -> list[torch.Tensor]:
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return [t.detach() for t in leaves if isinstance(t, torch.Tensor)]


def output_spec(tensors: list[torch.Tensor]) -> list[dict[str, Any]]:
    return [{"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")} for t in tensors]


def check_outputs_exist(tensors: list[torch.Tensor]) -> None:
    if not tensors:
        raise Reject("no_tensor_output", "forward returned no tensor")


def check_finite(tensors: list[torch.Tensor], label: str) -> None:
    for i, t in enumerate(tensors):
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            n_nan = int(torch.isnan(t).sum())
            n_inf = int(torch.isinf(t).sum())
            raise Reject("non_finite", f"output {i} on {label} inputs has {n_nan} NaN and {n_inf} Inf",
                         output=i, nan=n_nan, inf=n_inf)


def check_not_constant(tensors: list[torch.Tensor]) -> None:
    """Reject when every output holds one value throughout (zeros, a filled tensor, x - x). A
    single-element output cannot be judged here; input sensitivity catches it if it never moves."""
    sized = [t for t in tensors if t.numel() > 1]
    if not sized:
        return
    for t in sized:
        flat = t.reshape(-1)
        if not bool((flat == flat[0]).all()):
            return
    raise Reject("constant_output", f"every output element equals {sized[0].reshape(-1)[0].item()!r}")


_CHUNK = 1 << 24  # elements per comparison slice: temporaries stay small next to the outputs


def _slices(x: torch.Tensor, y: torch.Tensor):
    xf, yf = x.reshape(-1), y.reshape(-1)
    if xf.dtype != yf.dtype or not (xf.is_floating_point() or xf.is_complex()):
        kind = torch.float64 if not (xf.is_complex() or yf.is_complex()) else torch.complex128
        for i in range(0, xf.numel(), _CHUNK):
            yield xf[i : i + _CHUNK].to(kind), yf[i : i + _CHUNK].to(kind)
    else:
        for i in range(0, xf.numel(), _CHUNK):
            yield xf[i : i + _CHUNK], yf[i : i + _CHUNK]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Largest absolute difference (inf for a shape mismatch, nan where NaNs disagree)."""
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return float("inf")
        for xs, ys in _slices(x, y):
            worst = max(worst, float((xs - ys).abs().max().item()))
    return worst


def close(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, rtol: float) -> bool:
    """Same structure, shapes and values within atol + rtol*|b| (NaN only equal to NaN),
    compared slice by slice so a 10 GB output does not need 30 GB of temporaries."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return False
        for xs, ys in _slices(x, y):
            if not torch.allclose(xs, ys, atol=atol, rtol=rtol, equal_nan=True):
                return False
    return True


def check_deterministic(first: list[torch.Tensor], second: list[torch.Tensor], atol: float, rtol: float) -> None:
    if not close(first, second, atol, rtol):
        raise Reject("nondeterministic", "same inputs and weights gave different outputs",
                     max_abs_diff=max_diff(first, second))


def check_input_sensitive(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, rtol: float) -> None:
    if close(a, b, atol, rtol):
        raise Reject("input_insensitive", "outputs for two different random inputs are equal within tolerance",
                     max_abs_diff=max_diff(a, b))


def check_inputs_vary(a: list[Any], b: list[Any]) -> None:
    """Reject a `get_inputs()` whose values do not depend on the random generator: called under two
    seeds, no tensor it returns differs (`torch.ones`, `torch.arange`, a constant list). One
    varying tensor is enough (a fixed index tensor next to a random input is a real task)."""
    pairs = [(x, y) for x, y in zip(a, b) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)]
    for x, y in pairs:
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            return
    what = f"its {len(pairs)} tensor(s) are equal" if pairs else "it returns no tensor"
    raise Reject("fixed_inputs", f"get_inputs() under seeds {SEED_INPUTS} and {SEED_INPUTS_ALT}: {what}")


def trace_forward(model: torch.nn.Module, inputs: list[Any], default: str = "eager_error"):
    """One watched forward (`opsynth.verify.tracing.ForwardTrace`) on copies of the inputs."""
    from .tracing import ForwardTrace

    try:
        return ForwardTrace(model, _cloned(inputs))
    except BaseException as exc:  # noqa: BLE001
        raise classify(exc, default) from None


def choose_mode(model: torch.nn.Module, inputs: list[Any], atol: float, rtol: float):
    """The task's mode (`opsynth.render.task_file`): "train" when the outputs in train and in eval
    mode differ beyond atol/rtol, else "eval". Runs one watched forward in each mode (eval first:
    it changes no state) and puts every buffer back as it was (a train-mode BatchNorm updates its
    running statistics); the model is left in the chosen mode. Returns (mode, that mode's trace)."""
    from opsynth.render.task_file import set_mode

    saved = {n: b.clone() for n, b in model.named_buffers()}
    set_mode(model, "eval")
    t_eval = trace_forward(model, inputs)
    set_mode(model, "train")
    t_train = trace_forward(model, inputs)
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n in saved:
                b.copy_(saved[n])
    same = close(flat_tensors(t_eval.out), flat_tensors(t_train.out), atol, rtol)
    mode, trace = ("eval", t_eval) if same else ("train", t_train)
    set_mode(model, mode)
    t_eval.out = t_train.out = None
    return mode, trace


def read_kind(source: str):
    """The task's precision and pass (`opsynth.render.task_file.task_kind`), `load_error` if it states an unknown one."""
    from opsynth.render.task_file import task_kind

    try:
        return task_kind(source)
    except ValueError as exc:
        raise Reject("load_error", str(exc)) from None


def kind_tolerance(kind, cfg):
    """The tolerances this task is checked with: the configured ones for float32 (`verify.atol`,
    `rtol`, `det_atol`, `det_rtol`), the task contract's table for a reduced precision."""
    from opsynth.render.task_file import Tolerance, tolerance

    if kind.dtype == "float32":
        return Tolerance(cfg.atol, cfg.rtol, cfg.det_atol, cfg.det_rtol)
    return tolerance(kind.dtype)


def check_precision(model: torch.nn.Module, inputs: list[Any], outputs: list[torch.Tensor], kind) -> None:
    """Every floating input, parameter, buffer and output is in the task's precision: a chain that
    leaves it (an operator returning float32 from bfloat16) is not a task in that precision."""
    want = kind.torch_dtype()
    named = [(f"input {i}", x) for i, x in enumerate(inputs)]
    named += [(f"parameter {n}", p) for n, p in model.named_parameters()]
    named += [(f"buffer {n}", b) for n, b in model.named_buffers()]
    named += [(f"output {i}", o) for i, o in enumerate(outputs)]
    for label, t in named:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != want:
            raise Reject("dtype_mismatch", f"{label} is {str(t.dtype).removeprefix('torch.')}, the task is {kind.dtype}")


def kind_signature(signature: str, kind) -> str:
    """The trace signature of a task of this kind: the forward's, and for any other kind than float32
    forward its precision and pass too (the same chain in bf16, or backward, is another task)."""
    if kind.is_default:
        return signature
    import hashlib

    return hashlib.sha256(f"{signature}|{kind.dtype}|{kind.task_pass}".encode()).hexdigest()[:16]


def run_step(step, args: list[Any], device: str, default: str = "backward_error") -> list:
    """One backward step (`opsynth.render.task_file.task_step`) on copies of the arguments:
    outputs then gradients, None for a missing gradient."""
    try:
        out = step(*_cloned(args))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return [t.detach() if isinstance(t, torch.Tensor) else t for t in out]
    except BaseException as exc:  # noqa: BLE001
        raise classify(exc, default) from None


def check_gradients(grads: list, labels: list[str], label: str) -> list[torch.Tensor]:
    """Every gradient exists and is finite (`no_gradient`, `non_finite`); returns them."""
    for name, g in zip(labels, grads):
        if g is None:
            raise Reject("no_gradient", f"{name} does not exist (nothing it holds reaches the output differentiably)")
    for name, g in zip(labels, grads):
        if not bool(torch.isfinite(g).all()):
            raise Reject("non_finite", f"{name} on {label} inputs has NaN or Inf")
    return list(grads)


def check_gradients_sensitive(a: list[torch.Tensor], b: list[torch.Tensor], labels: list[str], atol: float,
                              rtol: float) -> None:
    """Each gradient differs between two draws of inputs and grad_output beyond atol/rtol (a zero or
    constant gradient teaches no backward kernel)."""
    for name, x, y in zip(labels, a, b):
        if close([x], [y], atol, rtol):
            raise Reject("gradient_insensitive", f"{name} is equal within tolerance for two different random "
                         "inputs and grad_outputs", max_abs_diff=max_diff([x], [y]))


def check_state_used(model: torch.nn.Module, trace) -> None:
    """Reject a Model whose `__init__` made parameters, buffers or submodules its forward (in the
    task's mode) never reads: a kernel that ignores them is still correct, and they teach nothing."""
    unused = trace.unused_state(model)
    if unused:
        raise Reject("unused_state", f"Model.__init__ makes {', '.join(unused[:8])} but forward never reads "
                     f"{'it' if len(unused) == 1 else 'them'}", unused=unused)
