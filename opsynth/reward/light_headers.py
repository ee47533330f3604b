"""A lighter `torch/extension.h` for candidate builds, with the sources as written as the fallback.

Nearly every candidate includes `torch/extension.h` (load_inline puts it first in the C++ wrapper;
a KernelBench-layout answer puts it in its `.cu` too). That header is `torch/all.h`, the whole C++
frontend (nn, optim, data, serialization, ...), plus `torch/python.h`. A candidate's wrapper needs
the tensor API (`torch/types.h`) and the Python bindings; its `.cu` needs only the tensor API. nvcc
parses a `.cu` three times (cudafe++, cicc, the host compiler) and none of them can use a
precompiled header. Measured on a 2-core Xeon beside other work (`benchmarks/build_cost.py`): a
KernelBench-layout `.cu` compiled in 102 s as written and 38 s with this header; the C++ wrapper in
24 s as written and 15 s with it before any PCH, 11 s and 8 s with each one's PCH.

So the build service first builds with an include folder of its own in front, whose
`torch/extension.h` is `LIGHT_EXTENSION_H` (the tensor API with `torch/utils.h`'s parallel_for and
grad-mode guards, and the Python bindings outside CUDA translation units), its precompiled form beside it once built (`opsynth.reward.pch`). The
candidate's text is compiled as written; only what that one header pulls in is less. A header is
declarations: a source that compiles without the omitted ones means what it meant with them
(barring an overload only they declared, which the reward's correctness checks would see like any
other wrong answer). If the build fails for any reason it is built again as written, with torch's
own header, so nothing that built before fails now; a wrong guess costs the failed attempt.
Sources that name what only the full header declares skip the attempt (`may_build_light`).
"""

from __future__ import annotations

import re

LIGHT_EXTENSION_H = """\
// opsynth's torch/extension.h for candidate builds (opsynth.reward.light_headers): torch's tensor API,
// at::parallel_for and the grad-mode guards, and, outside CUDA translation units, its Python bindings;
// not the C++ frontend of torch/all.h.
// A build that fails with it is built again with torch's own header.
#pragma once
#include <torch/types.h>
#include <torch/utils.h>
#ifndef __CUDACC__
#include <torch/python.h>
#endif
"""

# Names the C++ frontend (torch/all.h) declares and torch/types.h does not; in any source.
_FRONTEND = re.compile(
    r"\btorch::(nn|optim|data|jit|serialize|autograd|cuda|mps|xpu|fft|linalg|special|nested|sparse|utils|"
    r"save|load|Module)\b"
)
# pybind11 and Python, which the light header leaves out of CUDA translation units.
_PYTHON = re.compile(r"\bpybind11\b|\bPYBIND11_|\bpy::|\bPy[A-Z_][A-Za-z_]*\b|\bTORCH_LIBRARY\w*|torch/python\.h")


def _texts(srcs) -> list[str]:
    if srcs is None:
        return []
    return [srcs] if isinstance(srcs, str) else [s for s in srcs if isinstance(s, str)]


def may_build_light(req: dict) -> bool:
    """Whether a build request (`builds.BuildService.normalise`'s form) is worth a light attempt:
    none of its sources names what only torch's full header declares."""
    args = req.get("args") or {}
    files = req.get("files") or {}
    cpp = _texts(args.get("cpp_sources")) + [t for n, t in files.items() if not n.endswith(".cu") and isinstance(t, str)]
    cu = _texts(args.get("cuda_sources")) + [t for n, t in files.items() if n.endswith(".cu") and isinstance(t, str)]
    return not any(_FRONTEND.search(t) for t in cpp + cu) and not any(_PYTHON.search(t) for t in cu)
