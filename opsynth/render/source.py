"""Render an `OpGraph` as a task file in the KernelBench / Ops-6K format, the way a person writes
one: size constants at module level, passed to `Model.__init__` through `get_init_inputs()`, one
line per operator in `forward`, fresh random inputs on every `get_inputs()` call.

Deterministic: the same graph renders to the same bytes.
"""

from __future__ import annotations

import re

from opsynth.catalog import Catalog
from opsynth.graph import OpGraph

from .task_file import DTYPE_NAME, PASS_NAME, TaskKind, kind_lines

SCALAR_NAMES = {"torch.add": "add_value", "torch.sub": "subtract_value", "torch.mul": "multiplier",
                "torch.div": "divisor", "torch.rsub": "subtract_value"}
PARAM_NAMES = {"torch.add": "bias", "torch.sub": "bias", "torch.rsub": "bias", "torch.mul": "scale",
               "torch.div": "scale"}


def _snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    s = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", s)
    return s.lower()


class _Names:
    """Unique identifiers; a constant name is reused when it already holds the same value."""

    def __init__(self, reserved=()):
        self.used: dict[str, object] = {n: object() for n in reserved}

    def unique(self, base: str) -> str:
        name, i = base, 2
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used[name] = None
        return name

    def const(self, base: str, value, consts: dict) -> str:
        name, i = base, 2
        while name in consts and consts[name] != value or (name in self.used and name not in consts):
            name, i = f"{base}_{i}", i + 1
        consts[name] = value
        self.used[name] = value
        return name


def _lit(v) -> str:
    if isinstance(v, float):
        return repr(float(v))
    return repr(tuple(v)) if isinstance(v, list) else repr(v)


def render_task(graph: OpGraph, catalog: Catalog | None = None) -> str:
    """The task file of `graph`: name its inputs, write one line per operator (and what its
    `__init__` builds), then the inputs' constructors and the file around them."""
    if catalog is None:
        from opsynth.catalog import load_catalog

        catalog = load_catalog()
    r = _Renderer(graph, catalog)
    r.name_inputs()
    r.save_residuals()
    for n in r.ops:
        r.render_op(n)
    return r.assemble(r.make_inputs())


class _Renderer:
    """The state one rendering builds up: constants, names, `__init__` and `forward` lines."""

    def __init__(self, graph: OpGraph, catalog: Catalog):
        self.graph, self.catalog = graph, catalog
        self.consts: dict[str, object] = {}
        self.kind = TaskKind(graph.dtype, graph.task_pass)
        # module-level constants and forward locals (the kind's names are the task contract's)
        self.names = _Names(reserved=() if self.kind.is_default else (DTYPE_NAME, PASS_NAME))
        self.attrs = _Names(reserved=("training",))  # self.<attr> names
        self.init_args: list[str] = []  # constant names passed to __init__, in order
        self.init_lines: list[str] = []
        self.fwd_lines: list[str] = []
        self.imports: list[str] = []
        self.inputs = graph.input_nodes()
        self.ops = graph.op_nodes()
        first = graph.node(self.ops[0])
        self.dim_alias = {idx: p for p, idx in first.get("derived", {}).items()}
        self.arg_names: dict[str, str] = {}
        self.input_dims: dict[str, list[str]] = {}
        self.saved: dict[str, str] = {}

    def init_arg(self, base, value) -> str:
        name = self.names.const(base, value, self.consts)
        if name not in self.init_args:
            self.init_args.append(name)
        return name

    def name_inputs(self) -> None:
        """Inputs: the first one's dimensions take the names of the first operator's parameters that
        copy them (Conv2d's in_channels, Linear's in_features), as a person would name them."""
        extra = iter(["y", "z", "w"])
        first_input = self.inputs[0]
        for n in self.inputs:
            d = self.graph.node(n)
            dn = d.get("dim_names") or [f"dim{i}" for i in range(len(d["shape"]))]
            dims = []
            for i, (base, v) in enumerate(zip(dn, d["shape"])):
                if i == 0:
                    base = "batch_size"
                elif n == first_input and i in self.dim_alias:
                    base = self.dim_alias[i]
                dims.append(self.names.const(base, int(v), self.consts))
            self.input_dims[n] = dims
            if n == first_input:
                self.arg_names[n] = "x"
            elif d["role"] == "target":
                self.arg_names[n] = "target"
            else:
                self.arg_names[n] = next(extra)

    def save_residuals(self) -> None:
        """Tensors that a later operator reads again (residual operands) get saved under a name."""
        for n in self.ops:
            opnd = self.graph.node(n).get("operand") or {}
            if opnd.get("kind") == "node" and opnd["node"].startswith("op") or opnd.get("node") == self.inputs[0]:
                self.saved.setdefault(opnd["node"], self.names.unique("identity"))
        if self.inputs[0] in self.saved:
            self.fwd_lines.append(f"{self.saved[self.inputs[0]]} = x")

    def render_op(self, n: str) -> None:
        """One operator: what `__init__` builds for it and its line in `forward`."""
        d = self.graph.node(n)
        spec = self.catalog.ops[d["op"]]
        other = self._operand(spec, d.get("operand"))
        if spec.kind == "module":
            call = self._module_call(spec, d["params"], d.get("derived", {}), n == self.ops[0], other)
        else:
            fn = spec.name  # torch.<fn> or F.<fn>
            params = d["params"]
            kwargs = [f"{p}={_lit(params[p])}" for p in (*spec.required, *spec.tunable) if p in params]
            args = ["x"] + ([other] if other is not None else []) + kwargs
            call = f"{fn}({', '.join(args)})"
        self.fwd_lines.append(f"x = {call}")
        if n in self.saved:
            self.fwd_lines.append(f"{self.saved[n]} = x")

    def _operand(self, spec, opnd) -> str | None:
        """The second operand's expression: a scalar or parameter `__init__` keeps, or a tensor."""
        if opnd and opnd["kind"] == "scalar":
            base = SCALAR_NAMES.get(spec.name, f"{spec.name.split('.')[-1]}_value")
            cname = self.init_arg(base, opnd["value"])
            attr = self.attrs.unique(base)
            self.init_lines.append(f"self.{attr} = {cname}")
            return f"self.{attr}"
        if opnd and opnd["kind"] in ("param", "weight"):
            base = "weight" if opnd["kind"] == "weight" else PARAM_NAMES.get(spec.name, "other")
            cname = self.init_arg(f"{base}_shape", tuple(opnd["shape"]))
            attr = self.attrs.unique(base)
            std = " * 0.02" if opnd["kind"] == "weight" else ""
            self.init_lines.append(f"self.{attr} = nn.Parameter(torch.randn({cname}){std})")
            return f"self.{attr}"
        if opnd and opnd["kind"] == "node":
            return self.saved.get(opnd["node"]) or self.arg_names[opnd["node"]]
        return None

    def _module_call(self, spec, params: dict, derived: dict, is_first: bool, other: str | None) -> str:
        """An nn.Module (or transformers module) operator: its construction in `__init__`, its call."""

        def value_expr(p, v):
            if is_first and p in derived and derived[p] in self.dim_alias:
                name = self.input_dims[self.inputs[0]][derived[p]]
                if name not in self.init_args:
                    self.init_args.append(name)
                return name
            if isinstance(v, bool) or v is None or isinstance(v, str):
                return _lit(v)
            if isinstance(v, int) or (isinstance(v, (list, tuple)) and all(isinstance(e, int) for e in v)):
                return self.init_arg(p, v)
            return _lit(v)

        attr = self.attrs.unique(_snake(spec.name.split(".")[-1]))
        cls_name = spec.import_path.rsplit(".", 1)[-1]
        if spec.source == "transformers":
            module_path = spec.import_path.rsplit(".", 1)[0]
            self.imports.append(f"from {module_path} import {cls_name}")
            ctor_name = cls_name
        else:
            ctor_name = f"nn.{cls_name}"
        if spec.config_class:
            cfg_mod, cfg_cls = spec.config_class.rsplit(".", 1)
            self.imports.append(f"from {cfg_mod} import {cfg_cls}")
            kw = ", ".join(f"{p}={value_expr(p, v)}" for p, v in params.items())
            self.init_lines.append(f"config = {cfg_cls}({kw})")
            self.init_lines.append(f"self.{attr} = {ctor_name}(config)")
        else:
            args = [value_expr(p, params[p]) for p in spec.required]
            args += [f"{p}={value_expr(p, params[p])}" for p in spec.tunable if p in params]
            self.init_lines.append(f"self.{attr} = {ctor_name}({', '.join(args)})")
        call = f"self.{attr}(x, {other})" if spec.pattern == "loss" else f"self.{attr}(x)"
        return call + "[0]" if spec.tuple_output else call

    def make_inputs(self) -> list[str]:
        """get_inputs: fresh random tensors on the current default device (float ones in the task's dtype)."""
        make = []
        in_dtype = "" if self.kind.dtype == "float32" else f", dtype={DTYPE_NAME}"
        for n in self.inputs:
            d = self.graph.node(n)
            dims = ", ".join(self.input_dims[n])
            if d["dtype"] == "int64":
                high = d.get("high") or 16
                hname = next((p for p, v in self.consts.items() if v == high and p.startswith("num_embeddings")), None)
                make.append(f"torch.randint(0, {hname or high}, ({dims},))")
            elif d["role"] == "target":
                make.append(f"torch.rand({dims}{in_dtype})")
            else:
                make.append(f"torch.randn({dims}{in_dtype})")
        return make

    def assemble(self, make: list[str]) -> str:
        """The file: imports, `Model`, the size constants (batch_size first), get_inputs, get_init_inputs."""
        forward_args = ", ".join(["self"] + [self.arg_names[n] for n in self.inputs])
        doc = ", then ".join(self.graph.ops())
        lines = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
        lines += sorted(set(self.imports))
        lines += ["", "", "class Model(nn.Module):", f'    """{doc}."""', "",
                  f"    def __init__({', '.join(['self'] + self.init_args)}):", "        super().__init__()"]
        lines += [f"        {ln}" for ln in self.init_lines]
        if self.kind.dtype != "float32" and self.init_lines:  # parameters and buffers in the task's precision
            lines.append(f"        self.to({DTYPE_NAME})")
        lines += ["", f"    def forward({forward_args}):"]
        lines += [f"        {ln}" for ln in self.fwd_lines]
        lines += ["        return x", "", ""]
        # batch_size first: it is the constant runtime calibration rescales.
        order = ["batch_size"] + [c for c in self.consts if c != "batch_size"]
        lines += [f"{c} = {_lit(self.consts[c])}" for c in order if c in self.consts]
        lines += kind_lines(self.kind)
        lines += ["", "", "def get_inputs():", f"    return [{', '.join(make)}]", "", "",
                  "def get_init_inputs():", f"    return [{', '.join(self.init_args)}]", ""]
        return "\n".join(lines)
