"""Which seed operators work in a precision and a pass on a device: the catalog's exclusions per kind.

The catalog is mined in float32 forward (`mine.py`). A bf16 or fp16 task, or a backward one, can
only use the operators that run that way on the device the run verifies on: torch's CPU kernels
lack many reduced-precision variants, some operators change the dtype of their output (a chain
must stay in its precision), and some have no derivative or a zero one (a backward task asks for
gradients). Each operator is probed here as a task runs it (parameters cast to the dtype, inputs
made in it, on small real tensors of every rank it accepts, on the device); those that fail are
excluded for that (dtype, pass, device) with the reason, before any candidate is drawn. So the
sampler never composes a task the device cannot run, and nothing is rejected after a GPU run for
a missing kernel.

Probing costs seconds; the table is cached on disk next to the catalog (keyed by the catalog, the
kind and the device's name). CUDA is probed in a child process (`python -m
opsynth.catalog.precision`), so the caller (a Dask worker that only samples) never holds a CUDA
context of its own.
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
import tempfile
import warnings

# Short names the config uses -> torch dtype names (what rows, `input_shapes` and task code say).
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DEFAULT_DTYPE = "float32"
REDUCED = frozenset({"bfloat16", "float16"})  # reduced-precision floats: the reward's upcast check applies
PASSES = ("forward", "backward")
DEFAULT_PASS = "forward"


def dtype_name(name: str) -> str:
    """The torch name of a precision given by its short name or its torch name (`bf16`, `bfloat16`)."""
    key = str(name).removeprefix("torch.")
    if key in DTYPES:
        return DTYPES[key]
    if key in DTYPES.values():
        return key
    raise ValueError(f"unknown precision {name!r}; choose from {', '.join(DTYPES)} "
                     f"(or {', '.join(DTYPES.values())})")


def check_pass(name: str) -> str:
    """The pass, or a ValueError naming the choices."""
    if name not in PASSES:
        raise ValueError(f"unknown pass {name!r}; choose from {', '.join(PASSES)}")
    return name


def probe(spec, dtype: str, task_pass: str, device: str) -> str | None:
    """Why `spec` cannot be used in `dtype` and `task_pass` on `device`, or None when it can.
    Every rank it accepts is tried, as a task would call it: parameters cast with `.to(dtype)`,
    the float input and operand made in `dtype`; the output must be a finite float tensor of that
    dtype, and a backward pass must give finite gradients, not all zero, for the input."""
    import torch

    from .call import apply, instantiate
    from .mine import ALWAYS_SET, PROBE_SHAPES
    from .params import ParamContext, fill_params

    from .transformers_seeds import config_params

    dt = getattr(torch, dtype)
    for rank in spec.ranks:
        shape = (2, 8, 64) if spec.source == "transformers" else PROBE_SHAPES[rank]  # as the sampler draws them
        try:
            if spec.source == "transformers":
                params = config_params(spec, 64)
            else:
                params, _ = fill_params((*spec.required, *[t for t in spec.tunable if t in ALWAYS_SET]),
                                        ParamContext(shape=shape, rng=random.Random(0)))
            with warnings.catch_warnings(), torch.device(device):
                warnings.simplefilter("ignore")
                torch.manual_seed(0)
                module = instantiate(spec, params).to(dt) if spec.kind == "module" else None
                if spec.input_dtype == "int64":
                    x = torch.randint(0, 16, shape)
                else:
                    x = torch.randn(shape, dtype=dt).requires_grad_(task_pass == "backward")
                other = None
                if spec.pattern == "binary":
                    other = torch.randn(shape, dtype=dt)
                elif spec.pattern == "loss":
                    other = torch.rand(shape, dtype=dt)
                elif spec.pattern == "matmul":
                    other = torch.randn(shape[-1], 24, dtype=dt)
                with torch.set_grad_enabled(task_pass == "backward"):
                    out = apply(spec, x, params, operand=other, module=module)
                if not isinstance(out, torch.Tensor) or not out.is_floating_point():
                    return f"rank {rank}: output is not a float tensor in {dtype}"
                if out.dtype != dt:
                    return f"rank {rank}: output is {str(out.dtype).removeprefix('torch.')}, not {dtype}"
                if not bool(torch.isfinite(out).all()):
                    return f"rank {rank}: output not finite in {dtype}"
                if task_pass == "backward":
                    why = _backward_problem(torch, module, x, out)
                    if why:
                        return f"rank {rank}: {why}"
        except Exception as e:  # noqa: BLE001 - a missing kernel, an unsupported dtype: the reason
            return f"rank {rank}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return None


def _backward_problem(torch, module, x, out) -> str | None:
    if not out.requires_grad:
        return "output has no gradient"
    wrt = [t for t in [x, *(module.parameters() if module is not None else ())] if t.requires_grad]
    grads = torch.autograd.grad(out, wrt, grad_outputs=torch.randn_like(out), allow_unused=True)
    if x.requires_grad:
        gx = grads[0]
        if gx is None or not bool(torch.isfinite(gx).all()) or not bool((gx != 0).any()):
            return "no finite, nonzero gradient for the input"
    if any(g is None or not bool(torch.isfinite(g).all()) for g in grads):
        return "a parameter has no finite gradient"
    return None


def probe_all(catalog, dtype: str, device: str) -> dict[str, dict[str, str]]:
    """{pass: {operator: why it is excluded}} for `dtype` on this device (in this process). One
    backward probe per operator answers both passes, unless it fails (then the forward is probed)."""
    import torch

    out: dict[str, dict[str, str]] = {p: {} for p in PASSES}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead (3x on a loaded 2-core machine)
    try:
        for name, spec in sorted(catalog.ops.items()):
            why = probe(spec, dtype, "backward", device)
            if why:
                out["backward"][name] = why
                fwd = None if dtype == DEFAULT_DTYPE else probe(spec, dtype, "forward", device)
                if fwd:
                    out["forward"][name] = fwd
    finally:
        torch.set_num_threads(threads)
    return out


@functools.lru_cache(maxsize=4)
def device_name(device: str) -> str:
    """What the cache is keyed by: `cpu`, or the GPU's name (the kernels it has differ by architecture)."""
    if device == "cpu":
        return "cpu"
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                         capture_output=True, text=True, timeout=300)
    return out.stdout.strip() or "cuda"


_MEMO: dict = {}


def exclusions(catalog, dtype: str, task_pass: str, device: str = "cpu") -> dict[str, str]:
    """The operators the catalog excludes for (`dtype`, `task_pass`) on `device` ("cpu" or "cuda"),
    with the reason; {} for the catalog's own kind (float32 forward). Cached in memory and on disk."""
    dtype, task_pass = dtype_name(dtype), check_pass(task_pass)
    if (dtype, task_pass) == (DEFAULT_DTYPE, DEFAULT_PASS):
        return {}
    from . import cache

    kind = "cpu" if device == "cpu" else "cuda"
    memo_key = (id(catalog), dtype, task_pass, kind)
    if memo_key in _MEMO:
        return _MEMO[memo_key]
    import torch

    name = device_name(kind)
    key = cache.cache_key(torch.__version__, catalog.transformers_version) + f"-{dtype}-{_slug(name)}"
    path = cache.cache_dir() / f"precision-{key}.json"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = None
    if table is None or set(table.get("ops", ())) != set(catalog.ops):
        table = {"ops": sorted(catalog.ops), "excluded": _probe_on(catalog, dtype, kind)}
        _save(path, table)
    for p in PASSES:
        _MEMO[(id(catalog), dtype, p, kind)] = dict(table["excluded"][p])
    return _MEMO[memo_key]


def _probe_on(catalog, dtype: str, device: str) -> dict[str, dict[str, str]]:
    if device == "cpu":
        return probe_all(catalog, dtype, "cpu")
    cmd = [sys.executable, "-m", "opsynth.catalog.precision", "--dtype", dtype, "--device", device]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this opsynth's checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"probing {dtype} on {device} failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in s)[:60]


def _save(path, table: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(table, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs probing again


def main(argv: list[str] | None = None) -> int:
    import argparse

    from . import load_catalog

    ap = argparse.ArgumentParser(description="probe the catalog's operators in one precision, both passes")
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    print(json.dumps(probe_all(load_catalog(), dtype_name(a.dtype), a.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
