"""One forward of a task's Model, watched: which of its state it reads, and its call graph.

Both facts come from running the model, not from reading its source: a static (AST or torch.fx)
reading misses state reached indirectly (`F.linear(x, self.fc.weight)`, an LSTM's flat weight list,
a `getattr(self, name)`), fails on data-dependent control flow and on most transformers modules
(torch.fx cannot trace them), and cannot tell a read from a metadata query (`self.w.shape[0]`).

- **State read**: a `TorchDispatchMode` sees every aten operator the forward runs and the tensors it
  is given; a parameter or buffer is read when its storage is an argument of an operator that is
  not a pure view (a view does not read values). Hooks record which submodules' forwards ran.
  `ForwardTrace.unused_state(model)` names the state made in `Model.__init__` (its direct
  parameters, buffers and submodules) that the forward never read: a direct submodule counts as
  used when its forward, or that of anything inside it, ran, or any of its state was read, so a
  BatchNorm's `num_batches_tracked` (read only in train mode) does not count against its module.
- **Call graph**: a `TorchFunctionMode` sees the outermost torch calls as the task wrote them
  (`F.conv2d`, `torch.relu`, `x.mean`, `F.multi_head_attention_forward`), which, unlike aten
  operators, do not change with the device or the sizes (SDPA picks a different aten kernel on CPU
  and on a GPU). `ForwardTrace.signature()` hashes the sequence of calls that return a tensor, each
  as its normalised name and where its tensor arguments come from (an input, a parameter, an earlier
  call, a constant); sizes and every non-tensor argument (constants, dims, kernel sizes) are left
  out. Two rows with the same signature are the same task up to sizes and constants.

Runs inside a verifier worker (it executes task code), on whatever inputs the worker has.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Spellings of one operation: `x + y`, `x.add(y)`, `torch.add(x, y)`, `x += y`, `x.add_(y)`.
_DUNDER = {"radd": "add", "iadd": "add", "rsub": "sub", "isub": "sub", "rmul": "mul", "imul": "mul",
           "rtruediv": "div", "truediv": "div", "itruediv": "div", "rdiv": "div", "idiv": "div",
           "rmatmul": "matmul", "imatmul": "matmul", "rpow": "pow", "ipow": "pow", "rfloordiv": "floor_divide",
           "floordiv": "floor_divide", "ifloordiv": "floor_divide", "neg": "neg", "rmod": "remainder",
           "mod": "remainder", "imod": "remainder", "and": "bitwise_and", "or": "bitwise_or",
           "xor": "bitwise_xor", "invert": "bitwise_not", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
           "eq": "eq", "ne": "ne"}


def call_name(func: Any) -> str:
    """The normalised name of a torch call: module path dropped, operators and in-place variants
    folded onto their plain name (`__radd__`, `add_`, `torch.add` and `F`-less spellings -> `add`)."""
    name = getattr(func, "__name__", None) or str(func)
    if name == "__get__":  # a tensor property (`x.T`, `x.mT`, `x.real`)
        name = getattr(getattr(func, "__self__", None), "__name__", "get")
    if name.startswith("__") and name.endswith("__"):
        core = name[2:-2]
        name = _DUNDER.get(core, core)
    if name.endswith("_") and not name.endswith("__") and len(name) > 1:
        name = name[:-1]
    return name.lstrip("_") or name


class _Reads(TorchDispatchMode):
    """Storages of every tensor an aten operator reads (pure views excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not getattr(func, "is_view", False):
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor) and t.numel() and t.device.type != "meta":
                    try:
                        self.storages.add(t.untyped_storage().data_ptr())
                    except (RuntimeError, NotImplementedError):  # a tensor without storage
                        pass
        return func(*args, **kwargs)


class _Calls(TorchFunctionMode):
    """The outermost torch calls that return tensors, with where their tensor arguments came from."""

    def __init__(self, refs: dict[int, tuple[weakref.ref, str]]) -> None:
        super().__init__()
        self.refs = refs
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def _ref(self, t: torch.Tensor) -> str:
        hit = self.refs.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        return "c"  # a tensor the forward did not make from its inputs: a constant

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if outs:
            srcs = tuple(self._ref(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
            node = f"v{len(self.calls)}"
            self.calls.append((call_name(func), srcs))
            for t in outs:
                self.refs[id(t)] = (weakref.ref(t), node)
        return out


class ForwardTrace:
    """Run `model(*inputs)` once under no_grad, recording what it reads and calls; see the module
    docstring. `out` holds the forward's result."""

    def __init__(self, model: torch.nn.Module, inputs: list[Any]):
        self.model = model
        refs: dict[int, tuple[weakref.ref, str]] = {}
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                refs[id(x)] = (weakref.ref(x), f"in{i}")
        for _, t in [*model.named_parameters(), *model.named_buffers()]:
            refs[id(t)] = (weakref.ref(t), "p")
        self._calls = _Calls(refs)
        self._reads = _Reads()
        self.called: set[int] = set()
        hooks = [m.register_forward_pre_hook(self._hook) for m in model.modules()]
        try:
            with torch.no_grad(), self._calls, self._reads:
                self.out = model(*inputs)
        finally:
            for h in hooks:
                h.remove()
        self.calls = self._calls.calls
        self.outputs = [self._calls._ref(t) for t in tree_leaves(self.out) if isinstance(t, torch.Tensor)]

    def _hook(self, module, args) -> None:
        self.called.add(id(module))

    def _read(self, t: torch.Tensor) -> bool:
        if not t.numel():
            return True  # an empty tensor holds nothing to read; never reported
        try:
            return t.untyped_storage().data_ptr() in self._reads.storages
        except (RuntimeError, NotImplementedError):
            return True

    def unused_state(self, model: torch.nn.Module | None = None) -> list[str]:
        """Names of the direct parameters, buffers and submodules of `model` the forward never read."""
        model = model if model is not None else self.model
        unused = [n for n, p in model._parameters.items() if p is not None and not self._read(p)]
        unused += [n for n, b in model._buffers.items() if b is not None and not self._read(b)]
        for name, sub in model._modules.items():
            if sub is None:
                continue
            ran = any(id(m) in self.called for m in sub.modules())
            read = any(self._read(t) for t in [*sub.parameters(), *sub.buffers()])
            if not (ran or read):
                unused.append(name)
        return unused

    def op_names(self) -> list[str]:
        """The normalised names of the calls, in order."""
        return [name for name, _ in self.calls]

    def signature(self) -> str:
        """The call graph's hash (16 hex digits): the same task up to sizes and constants."""
        parts = [f"{name}({','.join(srcs)})" for name, srcs in self.calls]
        parts.append("out(" + ",".join(self.outputs) + ")")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
