"""Lighter torch headers for a candidate's CUDA translation units, with the original as fallback.

A KernelBench-layout answer puts `#include <torch/extension.h>` at the top of its `.cu`. nvcc parses
a translation unit three times (cudafe++ splitting host from device code, cicc for the device code,
the host compiler for the rest), none of them can use a precompiled header, and `torch/extension.h`
is `torch/all.h` (the whole C++ frontend: nn, optim, serialization, ...) plus `torch/python.h`
(pybind11 and Python.h). Measured on a 2-core Xeon with nvcc 13 (`benchmarks/build_cost.py`): the
same kernel and `torch::Tensor` wrapper compile in 76 s with `torch/extension.h` and 26 s with
`torch/types.h`, the header `load_inline` itself puts in front of every CUDA source. A `.cu` needs
`torch::Tensor`, the factory functions, `TORCH_CHECK`, `AT_DISPATCH_*`: all in `torch/types.h`.

So a `.cu` that includes `torch/extension.h` and shows no sign of needing what only it brings
(pybind11, Python, the C++ frontend's modules) is first built with that line replaced by
`torch/types.h`. A header is declarations: a source that compiles without the omitted ones means
what it meant with them (barring an overload only they declared, which the reward's correctness
checks would see like any other wrong answer). If the lighter build fails for any reason, the
original text is built as it was written, so no candidate that built before fails now; the cost of
a wrong guess is the failed attempt (usually its first pass over the lighter headers).
"""

from __future__ import annotations

import re

_EXTENSION_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/extension\.h[>"][ \t]*$', re.M)
LIGHT_HEADER = "#include <torch/types.h>"

# Names a translation unit may use that torch/types.h does not declare but torch/extension.h does:
# pybind11 and Python (torch/python.h) and the C++ frontend's modules (torch/all.h). Seen in a source,
# they keep its text as written.
_NEEDS_FULL = re.compile(
    r"\bpybind11\b|\bPYBIND11_|\bpy::|\bPy[A-Z_][A-Za-z_]*\b|\bTORCH_LIBRARY\w*|"
    r"\btorch::(nn|optim|data|jit|serialize|autograd|cuda|fft|linalg|special|nested|sparse|utils|python|"
    r"save|load|Module|NoGradGuard|manual_seed)\b|torch/(python|all|torch|script)\.h"
)


def lighter(text: str) -> str | None:
    """`text` with its `torch/extension.h` include(s) replaced by `torch/types.h`, or None when there
    is nothing to lighten or the text may need what only the full header declares."""
    if not _EXTENSION_INCLUDE.search(text) or _NEEDS_FULL.search(_EXTENSION_INCLUDE.sub("", text)):
        return None
    return _EXTENSION_INCLUDE.sub(LIGHT_HEADER, text)


def lighter_request(req: dict) -> dict | None:
    """A build request (`builds.BuildService.normalise`'s form) whose CUDA sources are lightened, or
    None when none of them can be. Only `.cu` text changes: C++ sources keep their header, which the
    shared PCH already makes cheap."""
    args = dict(req.get("args") or {})
    changed = False
    if req.get("kind") == "inline" and args.get("cuda_sources"):
        srcs = args["cuda_sources"]
        many = not isinstance(srcs, str)
        new = [lighter(s) for s in (srcs if many else [srcs])]
        if any(n is not None for n in new):
            changed = True
            lit = [n if n is not None else s for n, s in zip(new, srcs if many else [srcs])]
            args["cuda_sources"] = lit if many else lit[0]
    files = dict(req.get("files") or {})
    for name, text in list(files.items()):
        if name.endswith(".cu") and isinstance(text, str) and (light := lighter(text)) is not None:
            files[name] = light
            changed = True
    if not changed:
        return None
    out = {**req, "args": args}
    if files:
        out["files"] = files
    return out
