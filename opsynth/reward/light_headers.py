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

import os
import re

LIGHT_EXTENSION_H = """\
// opsynth's torch/extension.h for candidate builds (opsynth.reward.light_headers): torch's tensor API,
// at::parallel_for and the grad-mode guards, and, outside CUDA translation units, its Python bindings;
// not the C++ frontend of torch/all.h.
// A build that fails with it is built again with torch's own header.
#pragma once
#include <torch/types.h>
#if !(defined(__CUDACC__) && defined(OPSYNTH_LEAN_CUDA))
#include <torch/utils.h>
#endif
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


# ---- the lean torch/types.h of CUDA translation units ----------------------------------------------
#
# A CUDA translation unit gets torch/types.h either from load_inline (which prepends it to every
# `cuda_sources`) or through torch/extension.h (a KernelBench-layout `.cu`); with the light header
# that is ATen/ATen.h: every operator's declaration, parsed by cudafe++, cicc and the host compiler
# alike. A `.cu`'s wrapper uses the Tensor class, TORCH_CHECK and a few factory functions. Measured
# with `nvcc --time` on the KernelBench-layout `.cu` of benchmarks/cli_eval_kb.py (2-core Xeon,
# nvcc 13, sm_90): 38.5 s with torch/types.h (cudafe++ 16.9, cicc 11.1, gcc 7.1), 14.0 s with the
# Tensor class and the one operator it names (3.5, 4.6, 4.7). So CUDA translation units are first
# built against a torch/types.h of that cut, written per build from the operators the sources name
# (`lean_types_h`); the host translation units keep the light header (and its PCH). A build that
# fails with it is built with the light header, then as written (`build_runner`), so what built
# before still builds; what it costs is the failed attempt (cudafe++ stops at the first error).
# Tensor operators (`a + b` on tensors: ATen/TensorOperators.h, +6 s of the 14) come in only where a
# variable the source declares as a tensor stands beside an arithmetic operator (`_tensor_arithmetic`);
# a use that this misses takes the fallback.

LEAN_MACRO = "OPSYNTH_LEAN_CUDA"  # defined for the CUDA translation units of a lean attempt

# torch/types.h's own names in namespace torch (beyond `using namespace at`), kept verbatim.
_TORCH_TYPES_NAMES = """\
namespace torch {
using namespace at;  // NOLINT
using std::nullopt;  // NOLINT
using std::optional;  // NOLINT
using Dtype = at::ScalarType;
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kUInt16 = at::kUInt16;
constexpr auto kUInt32 = at::kUInt32;
constexpr auto kUInt64 = at::kUInt64;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat64 = at::kDouble;
constexpr auto kU8 = kUInt8;
constexpr auto kU16 = kUInt16;
constexpr auto kU32 = kUInt32;
constexpr auto kU64 = kUInt64;
constexpr auto kI8 = kInt8;
constexpr auto kI16 = kInt16;
constexpr auto kI32 = kInt32;
constexpr auto kI64 = kInt64;
constexpr auto kF16 = kFloat16;
constexpr auto kF32 = kFloat32;
constexpr auto kF64 = kFloat64;
}  // namespace torch
"""

# Headers a source's words ask for, beyond the Tensor class (each included only where it exists).
_EXTRA = [
    (re.compile(r"\bAT_DISPATCH_|\bAT_PRIVATE_CASE"), "ATen/Dispatch.h"),
    (re.compile(r"\bindexing\b"), "ATen/TensorIndexing.h"),
    (re.compile(r"\b(at|c10)::cuda::|getCurrentCUDAStream|CUDAGuard"), "ATen/cuda/CUDAContext.h"),
    (re.compile(r"\bc10::irange\b|\birange\("), "c10/util/irange.h"),
    (re.compile(r"\bNoGradGuard|InferenceMode|AutoGradMode"), "ATen/core/grad_mode.h"),
]
_QUALIFIED_CALL = re.compile(r"\b(?:torch|at)\s*::\s*([a-z_][a-z0-9_]*)\s*[(<]")
_ANY_CALL = re.compile(r"\b([a-z_][a-z0-9_]*)\s*\(")
_USING_NS = re.compile(r"\busing\s+namespace\s+(torch|at)\b")
# What the lean header cannot give: autograd-aware factories (torch::ones(..., requires_grad) is
# torch's variable factory, at::ones is not), and the full header's frontend.
_NOT_LEAN = re.compile(r"requires_grad|\btorch::(autograd|jit|nn|optim|data)\b")


_TENSOR_VARS = [
    re.compile(r"\b(?:torch|at)::Tensor\s*&?\s*(\w+)"),  # parameters and declarations
    re.compile(r"\bauto\s*&?\s*(\w+)\s*=\s*(?:torch|at)::\w+\s*\("),  # auto y = torch::empty_like(...)
]


# `float* x`: a pointer's declaration, not a product (the word before the star is a type)
_POINTER_DECL = re.compile(r"\b(?:float|double|int|long|short|char|bool|void|half|__half|__nv_bfloat16|scalar_t|T|"
                           r"u?int(?:8|16|32|64)_t|size_t|unsigned|const|auto|float[24]|Half|BFloat16)\s*\*\s*$")


def _tensor_arithmetic(texts: list[str]) -> bool:
    """Whether a variable declared as a tensor stands beside + - * / (not indexed: `x[i] * s` in a
    kernel is a pointer's element; not `float* x`). A guess: a miss costs the fallback, a false hit
    about 6 s."""
    for t in texts:
        names = {n for rx in _TENSOR_VARS for n in rx.findall(t)} - {"const"}
        for n in names:
            if re.search(rf"(?<![\w.])\b{re.escape(n)}\s*[-+*/]=?\s*[\w(.]", t):
                return True
            for m in re.finditer(rf"[-+*/]\s*\b{re.escape(n)}\b(?!\s*[\[.(])", t):
                if not _POINTER_DECL.search(t[max(0, m.start() - 40):m.start() + 1]):
                    return True
    return False


CUDA_SIDE = (".cu", ".cuh", ".h", ".hpp", ".hh", ".inl")  # a workspace's files a .cu may include


def cuda_texts(req: dict) -> list[str]:
    """What the CUDA translation units of a build request read: its `cuda_sources`, and a
    workspace's `.cu` files with the headers beside them."""
    files = req.get("files") or {}
    return _texts((req.get("args") or {}).get("cuda_sources")) + [
        t for n, t in sorted(files.items()) if n.endswith(CUDA_SIDE) and isinstance(t, str)]


def may_build_lean(req: dict) -> bool:
    """Whether a light build request's CUDA translation units are worth a lean attempt: it has any,
    and none names what the lean torch/types.h leaves out on purpose (autograd-aware factories)."""
    files = req.get("files") or {}
    has_cu = bool(_texts((req.get("args") or {}).get("cuda_sources"))) or any(n.endswith(".cu") for n in files)
    return has_cu and not any(_NOT_LEAN.search(t) for t in cuda_texts(req))


def lean_types_h(cuda_texts: list[str], torch_include: str) -> str:
    """The lean torch/types.h for these CUDA sources (torch's own outside CUDA translation units):
    the Tensor class, TORCH_CHECK, the ATen operator headers of the operators the sources call by
    `torch::`/`at::` (every called name that is an operator, after `using namespace torch|at`), the
    headers `_EXTRA` names, and torch/types.h's names in namespace torch."""
    ops: set[str] = set()
    for t in cuda_texts:
        ops.update(_QUALIFIED_CALL.findall(t))
        if _USING_NS.search(t):
            ops.update(_ANY_CALL.findall(t))
    have = lambda rel: os.path.isfile(os.path.join(torch_include, rel))  # noqa: E731
    incs = ["ATen/core/Tensor.h", "c10/util/Exception.h", "c10/core/TensorOptions.h"]
    incs += [rel for rx, rel in _EXTRA if any(rx.search(t) for t in cuda_texts) and have(rel)]
    if _tensor_arithmetic(cuda_texts):
        incs.append("ATen/TensorOperators.h")
    incs += [f"ATen/ops/{op}.h" for op in sorted(ops) if have(f"ATen/ops/{op}.h")]
    body = "\n".join(f"#include <{rel}>" for rel in incs)
    return (f"// opsynth's lean torch/types.h for CUDA translation units (opsynth.reward.light_headers.lean_types_h).\n"
            f"// A build that fails with it is built with the light header, then as written.\n"
            f"#pragma once\n#if defined(__CUDACC__) && defined({LEAN_MACRO})\n{body}\n#include <optional>\n"
            f"{_TORCH_TYPES_NAMES}#else\n#include_next <torch/types.h>\n#endif\n")
