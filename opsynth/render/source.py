"""Render an `OpGraph` as a task file in the KernelBench / Ops-6K format, the way a person writes
one: size constants at module level, passed to `Model.__init__` through `get_init_inputs()`, one
line per operator in `forward`, fresh random inputs on every `get_inputs()` call.

Deterministic: the same graph renders to the same bytes.
"""

from __future__ import annotations

import re

from opsynth.catalog import Catalog
from opsynth.graph import OpGraph

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
    if catalog is None:
        from opsynth.catalog import load_catalog

        catalog = load_catalog()
    consts: dict[str, object] = {}
    names = _Names()  # module-level constants and forward locals
    attrs = _Names(reserved=("training",))  # self.<attr> names
    init_args: list[str] = []  # constant names passed to __init__, in order
    init_lines: list[str] = []
    fwd_lines: list[str] = []
    imports: list[str] = []

    def init_arg(base, value):
        name = names.const(base, value, consts)
        if name not in init_args:
            init_args.append(name)
        return name

    # Inputs: the first one's dimensions take the names of the first operator's parameters that
    # copy them (Conv2d's in_channels, Linear's in_features), as a person would name them.
    inputs = graph.input_nodes()
    ops = graph.op_nodes()
    first = graph.node(ops[0])
    dim_alias = {idx: p for p, idx in first.get("derived", {}).items()}
    arg_names: dict[str, str] = {}
    input_dims: dict[str, list[str]] = {}
    extra = iter(["y", "z", "w"])
    for n in inputs:
        d = graph.node(n)
        dn = d.get("dim_names") or [f"dim{i}" for i in range(len(d["shape"]))]
        dims = []
        for i, (base, v) in enumerate(zip(dn, d["shape"])):
            if i == 0:
                base = "batch_size"
            elif n == inputs[0] and i in dim_alias:
                base = dim_alias[i]
            dims.append(names.const(base, int(v), consts))
        input_dims[n] = dims
        if n == inputs[0]:
            arg_names[n] = "x"
        elif d["role"] == "target":
            arg_names[n] = "target"
        else:
            arg_names[n] = next(extra)
    # Tensors that a later operator reads again (residual operands) get saved under a name.
    saved: dict[str, str] = {}
    for n in ops:
        opnd = graph.node(n).get("operand") or {}
        if opnd.get("kind") == "node" and opnd["node"].startswith("op") or opnd.get("node") == inputs[0]:
            saved.setdefault(opnd["node"], names.unique("identity"))
    if inputs[0] in saved:
        fwd_lines.append(f"{saved[inputs[0]]} = x")

    for n in ops:
        d = graph.node(n)
        spec = catalog.ops[d["op"]]
        params, derived = d["params"], d.get("derived", {})
        opnd = d.get("operand")
        is_first = n == ops[0]

        def value_expr(p, v):
            if is_first and p in derived and derived[p] in dim_alias:
                name = input_dims[inputs[0]][derived[p]]
                if name not in init_args:
                    init_args.append(name)
                return name
            if isinstance(v, bool) or v is None or isinstance(v, str):
                return _lit(v)
            if isinstance(v, int) or (isinstance(v, (list, tuple)) and all(isinstance(e, int) for e in v)):
                return init_arg(p, v)
            return _lit(v)

        if opnd and opnd["kind"] == "scalar":
            base = SCALAR_NAMES.get(spec.name, f"{spec.name.split('.')[-1]}_value")
            cname = init_arg(base, opnd["value"])
            attr = attrs.unique(base)
            init_lines.append(f"self.{attr} = {cname}")
            other = f"self.{attr}"
        elif opnd and opnd["kind"] in ("param", "weight"):
            base = "weight" if opnd["kind"] == "weight" else PARAM_NAMES.get(spec.name, "other")
            cname = init_arg(f"{base}_shape", tuple(opnd["shape"]))
            attr = attrs.unique(base)
            std = " * 0.02" if opnd["kind"] == "weight" else ""
            init_lines.append(f"self.{attr} = nn.Parameter(torch.randn({cname}){std})")
            other = f"self.{attr}"
        elif opnd and opnd["kind"] == "node":
            other = saved.get(opnd["node"]) or arg_names[opnd["node"]]
        else:
            other = None

        if spec.kind == "module":
            attr = attrs.unique(_snake(spec.name.split(".")[-1]))
            cls_name = spec.import_path.rsplit(".", 1)[-1]
            if spec.source == "transformers":
                module_path = spec.import_path.rsplit(".", 1)[0]
                imports.append(f"from {module_path} import {cls_name}")
                ctor_name = cls_name
            else:
                ctor_name = f"nn.{cls_name}"
            if spec.config_class:
                cfg_mod, cfg_cls = spec.config_class.rsplit(".", 1)
                imports.append(f"from {cfg_mod} import {cfg_cls}")
                kw = ", ".join(f"{p}={value_expr(p, v)}" for p, v in params.items())
                init_lines.append(f"config = {cfg_cls}({kw})")
                init_lines.append(f"self.{attr} = {ctor_name}(config)")
            else:
                args = [value_expr(p, params[p]) for p in spec.required]
                args += [f"{p}={value_expr(p, params[p])}" for p in spec.tunable if p in params]
                init_lines.append(f"self.{attr} = {ctor_name}({', '.join(args)})")
            call = f"self.{attr}(x, {other})" if spec.pattern == "loss" else f"self.{attr}(x)"
            if spec.tuple_output:
                call += "[0]"
        else:
            fn = spec.name  # torch.<fn> or F.<fn>
            kwargs = [f"{p}={_lit(params[p])}" for p in (*spec.required, *spec.tunable) if p in params]
            args = ["x"] + ([other] if other is not None else []) + kwargs
            call = f"{fn}({', '.join(args)})"
        fwd_lines.append(f"x = {call}")
        if n in saved:
            fwd_lines.append(f"{saved[n]} = x")

    # get_inputs: fresh random tensors on the current default device.
    make = []
    for n in inputs:
        d = graph.node(n)
        dims = ", ".join(input_dims[n])
        if d["dtype"] == "int64":
            high = d.get("high") or 16
            hname = next((p for p, v in consts.items() if v == high and p.startswith("num_embeddings")), None)
            make.append(f"torch.randint(0, {hname or high}, ({dims},))")
        elif d["role"] == "target":
            make.append(f"torch.rand({dims})")
        else:
            make.append(f"torch.randn({dims})")

    forward_args = ", ".join(["self"] + [arg_names[n] for n in inputs])
    doc = ", then ".join(graph.ops())
    lines = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
    lines += sorted(set(imports))
    lines += ["", "", "class Model(nn.Module):", f'    """{doc}."""', "",
              f"    def __init__({', '.join(['self'] + init_args)}):", "        super().__init__()"]
    lines += [f"        {ln}" for ln in init_lines]
    lines += ["", f"    def forward({forward_args}):"]
    lines += [f"        {ln}" for ln in fwd_lines]
    lines += ["        return x", "", ""]
    # batch_size first: it is the constant runtime calibration rescales.
    order = ["batch_size"] + [c for c in consts if c != "batch_size"]
    lines += [f"{c} = {_lit(consts[c])}" for c in order if c in consts]
    lines += ["", "", "def get_inputs():", f"    return [{', '.join(make)}]", "", "",
              "def get_init_inputs():", f"    return [{', '.join(init_args)}]", ""]
    return "\n".join(lines)
