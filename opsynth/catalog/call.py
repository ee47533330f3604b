"""Build and call a seed operator the way a rendered task will, so probing and shape propagation
exercise exactly the code path the task runs."""

from __future__ import annotations

import importlib

import torch


def resolve(import_path: str):
    """`torch.nn.Conv2d` -> the class; `torch.nn.functional.gelu` -> the function."""
    module, _, attr = import_path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def instantiate(spec, params: dict):
    """Construct a module operator (required parameters positionally, tunables by keyword)."""
    cls = resolve(spec.import_path)
    if spec.config_class:
        config = resolve(spec.config_class)(**params)
        try:
            return cls(config)
        except TypeError:  # attention blocks that also want their layer index
            return cls(config, 0)
    args = [params[n] for n in spec.required]
    kwargs = {n: params[n] for n in spec.tunable if n in params}
    return cls(*args, **kwargs)


def function_kwargs(spec, params: dict) -> dict:
    return {n: params[n] for n in (*spec.required, *spec.tunable) if n in params}


def apply(spec, x, params: dict, operand=None, module=None):
    """Run one operator on `x` (meta or real). `operand` is the second argument of binary,
    matmul and loss operators."""
    if spec.kind == "module":
        mod = module if module is not None else instantiate(spec, params)
        out = mod(x, operand) if spec.pattern == "loss" else mod(x)
    else:
        fn = resolve(spec.import_path)
        kwargs = function_kwargs(spec, params)
        if spec.pattern in ("binary", "matmul", "loss"):
            out = fn(x, operand, **kwargs)
        else:
            out = fn(x, **kwargs)
    if spec.tuple_output and isinstance(out, (tuple, list)):
        out = out[0]
    return out


def is_float_tensor(out) -> bool:
    return isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() > 0
