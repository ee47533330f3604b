"""The light torch/extension.h of candidate builds (opsynth.reward.light_headers): which requests try
it, the build child's fallback to the sources as written, and real builds through the service."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from opsynth.reward import build_runner
from opsynth.reward.light_headers import LIGHT_EXTENSION_H, lean_types_h, may_build_lean, may_build_light

KB_CU = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void scale_relu(const float* x, float* y, long n, float s) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i] * s; y[i] = v > 0.f ? v : 0.f; }
}

torch::Tensor scale_relu_cuda(torch::Tensor x, double s) {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "float expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    scale_relu<<<(n + 255) / 256, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n, (float)s);
    return y;
}
"""
DECL = "torch::Tensor scale_relu_cuda(torch::Tensor x, double s);"


def _inline(**args) -> dict:
    return {"kind": "inline", "name": "x", "args": args}


def test_kernelbench_layout_and_plain_wrappers_try_the_light_header():
    assert may_build_light(_inline(cpp_sources=DECL, cuda_sources=KB_CU, functions=["scale_relu_cuda"]))
    # pybind11 in C++ is fine: the light header keeps the bindings outside CUDA translation units
    assert may_build_light(_inline(cpp_sources="namespace py = pybind11;\nint f();", functions=["f"]))
    assert may_build_light({"kind": "files", "name": "x", "args": {}, "files": {"k.cu": KB_CU, "w.cpp": "#include <torch/extension.h>\n"}})


@pytest.mark.parametrize("where,use", [
    ("cpp_sources", "torch::nn::Linear lin(4, 4);"),
    ("cpp_sources", "auto g = torch::autograd::grad({y}, {x});"),
    ("cuda_sources", "torch::optim::SGD* opt = nullptr;"),
    ("cuda_sources", "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"f\", &f); }"),
    ("cuda_sources", "py::object o;"),
    ("cuda_sources", "PyObject* p = nullptr;"),
])
def test_sources_that_name_what_only_the_full_header_declares_are_built_as_written(where, use):
    args = {"cpp_sources": DECL, "cuda_sources": KB_CU}
    args[where] = args[where] + "\n" + use + "\n"
    assert not may_build_light(_inline(**args))


def _job(tmp_path, light_dir="/light", pch_dir="/pch", lean=False) -> dict:
    return {"request": _inline(cpp_sources=DECL, cuda_sources=KB_CU, functions=["scale_relu_cuda"]), "build_name": "opsx_t",
            "out_dir": str(tmp_path / "build"), "pch_dir": pch_dir, "light_dir": light_dir, "lean_cuda": lean}


def _fake_compile(outcomes: list, seen: list):
    def compile_(req, pch_dir, build_name, out, first_include=None, lean=False):
        seen.append((first_include, pch_dir) + (("lean",) if lean else ()))
        what = outcomes.pop(0)
        if isinstance(what, Exception):
            raise what
        os.makedirs(out, exist_ok=True)
        Path(out, "x.so").write_text("")
        return str(Path(out, "x.so"))
    return compile_


def test_the_light_folder_goes_first_and_torchs_pch_is_kept_for_the_fallback(tmp_path, monkeypatch):
    seen: list = []
    monkeypatch.setattr(build_runner, "_compile", _fake_compile(["ok"], seen))
    res = build_runner.run(_job(tmp_path))
    assert res["reason"] == "ok" and res["headers"] == "light" and seen == [("/light", None)]


def test_a_failed_light_build_is_built_again_as_written(tmp_path, monkeypatch):
    seen: list = []
    err = RuntimeError("Error building extension 'x': FAILED: main.o \nerror: 'TORCH_VERSION_MAJOR' was not declared in this scope\n")
    monkeypatch.setattr(build_runner, "_compile", _fake_compile([err, "ok"], seen))
    res = build_runner.run(_job(tmp_path))
    assert res["reason"] == "ok" and res["headers"] == "as_written_after_light_failed"
    assert seen == [("/light", None), (None, "/pch")]


@pytest.mark.parametrize("outcomes,headers,attempts", [
    (["ok"], "lean_cuda", [("/light", None, "lean")]),
    ([RuntimeError("FAILED: cuda.cuda.o"), "ok"], "light_after_lean_failed", [("/light", None, "lean"), ("/light", None)]),
    ([RuntimeError("FAILED: cuda.cuda.o"), RuntimeError("FAILED: main.o"), "ok"], "as_written_after_light_failed",
     [("/light", None, "lean"), ("/light", None), (None, "/pch")]),
])
def test_the_lean_cuda_header_goes_first_then_the_light_one_then_as_written(tmp_path, monkeypatch, outcomes, headers, attempts):
    seen: list = []
    monkeypatch.setattr(build_runner, "_compile", _fake_compile(outcomes, seen))
    res = build_runner.run(_job(tmp_path, lean=True))
    assert res["reason"] == "ok" and res["headers"] == headers and seen == attempts
    assert res["lean_attempt_s"] is not None


def test_lean_types_h_names_the_operators_the_cuda_sources_call():
    import torch.utils.cpp_extension as ce

    inc = ce.include_paths("cpu")[0]
    text = lean_types_h([KB_CU + "\nauto z = at::zeros({3}, x.options()); AT_DISPATCH_FLOATING_TYPES(t, \"f\", [&]{});"], inc)
    lines = text.splitlines()
    assert "#include <ATen/ops/empty_like.h>" in lines and "#include <ATen/ops/zeros.h>" in lines
    assert "#include <ATen/Dispatch.h>" in lines and "#include <ATen/core/Tensor.h>" in lines
    assert "#include <ATen/ATen.h>" not in lines and "#include <ATen/ops/relu.h>" not in lines  # not called
    assert "#include_next <torch/types.h>" in lines  # torch's own outside a lean CUDA unit
    # after `using namespace torch`, every called name that is an operator
    assert "#include <ATen/ops/relu.h>" in lean_types_h(["using namespace torch;\nauto y = relu(x);"], inc).splitlines()


def test_tensor_operators_and_indexing_come_in_where_the_source_uses_them():
    import torch.utils.cpp_extension as ce

    inc = ce.include_paths("cpu")[0]
    ops = "ATen/TensorOperators.h"
    assert ops not in lean_types_h([KB_CU], inc)  # `x[i] * s` in the kernel, `float* y`: not tensors
    assert ops in lean_types_h([KB_CU.replace("return y;", "return y + xc;")], inc)  # y = torch::empty_like(...)
    assert ops in lean_types_h(["torch::Tensor f(torch::Tensor x) { return 2.0 * x; }"], inc)
    assert ops not in lean_types_h(["__global__ void k(const float* x, float* y) { y[0] = 2.f * x[0]; }\n"
                                    "torch::Tensor f(torch::Tensor x) { return x.sum(); }"], inc)
    assert "ATen/TensorIndexing.h" in lean_types_h(["using namespace torch::indexing;"], inc)


def test_a_lean_compile_writes_its_header_and_gives_it_to_nvcc_only(tmp_path, monkeypatch):
    import torch.utils.cpp_extension as ce

    seen = {}
    monkeypatch.setattr(ce, "load_inline", lambda **kw: seen.update(kw) or "x.so")
    req = _inline(cpp_sources=DECL, cuda_sources=KB_CU, functions=["scale_relu_cuda"], extra_cuda_cflags="-O3")
    assert build_runner._compile(req, None, "opsx_t", str(tmp_path / "lean"), first_include="/light", lean=True) == "x.so"
    lean_dir = str(tmp_path / "lean" / "lean_include")
    assert seen["extra_cuda_cflags"] == ["-O3", "-DOPSYNTH_LEAN_CUDA", f"-I{lean_dir}"]
    assert "extra_cflags" not in seen and seen["extra_include_paths"] == ["/light"]  # the C++ side keeps the light header
    assert "#include <ATen/ops/empty_like.h>" in Path(lean_dir, "torch", "types.h").read_text().splitlines()
    assert req["args"]["extra_cuda_cflags"] == "-O3"  # the request itself is untouched (a fallback builds it again)


def test_a_workspaces_headers_beside_its_cu_are_read_for_the_operators_they_name():
    from opsynth.reward.light_headers import cuda_texts

    req = {"kind": "files", "name": "x", "args": {}, "files": {"k.cu": "#include \"ops.cuh\"\n", "ops.cuh": "auto z = torch::zeros({2});",
                                                              "w.cpp": "auto q = torch::ones({2});", "notes.txt": "torch::eye("}}
    assert cuda_texts(req) == ["#include \"ops.cuh\"\n", "auto z = torch::zeros({2});"]
    assert may_build_lean(req)
    assert not may_build_lean({**req, "files": {"k.cu": "", "ops.cuh": "torch::ones({2}, torch::requires_grad());"}})
    assert not may_build_lean({**req, "files": {"ops.cuh": "", "w.cpp": ""}})  # no CUDA unit


def test_autograd_aware_factories_skip_the_lean_attempt():
    assert may_build_lean(_inline(cpp_sources=DECL, cuda_sources=KB_CU))
    assert not may_build_lean(_inline(cpp_sources=DECL))  # no CUDA unit
    assert not may_build_lean(_inline(cpp_sources=DECL, cuda_sources=KB_CU.replace(
        "torch::empty_like(xc)", "torch::ones_like(xc, torch::TensorOptions().requires_grad(true))")))


def test_without_a_light_folder_it_builds_as_written_once(tmp_path, monkeypatch):
    seen: list = []
    monkeypatch.setattr(build_runner, "_compile", _fake_compile([RuntimeError("FAILED: main.o")], seen))
    res = build_runner.run(_job(tmp_path, light_dir=None))
    assert res["reason"] == "build_error" and res["headers"] == "as_written" and seen == [(None, "/pch")]


# ---- real builds through the service (gcc) ---------------------------------------------------------

WRAPPER = """
torch::Tensor twice_relu(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous(), "contiguous input expected");
    return torch::relu(x) * 2;
}
"""
# torch/version.h comes with the C++ frontend (torch/all.h), not with torch/types.h or torch/python.h,
# and the quick check does not know its macros: the light attempt fails and the sources build as written.
FRONTEND = """
int torch_major() { return TORCH_VERSION_MAJOR; }
"""


def _service(tmp_path, **kw):
    from opsynth.reward.builds import BuildService
    from opsynth.reward.eval_types import RewardConfig

    cfg = RewardConfig(device="cpu", cache_dir=str(tmp_path / "cache"), ccache="false", isolation="none", **kw)
    return BuildService(cfg, "cpu")


def _load(reply: dict):
    import importlib.util

    spec = importlib.util.spec_from_file_location(reply["name"], Path(reply["dir"]) / f"{reply['name']}.so")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_wrapper_builds_with_the_light_header_and_works(tmp_path):
    import torch

    svc = _service(tmp_path)
    reply = svc.handle(_inline(cpp_sources=WRAPPER, functions=["twice_relu"], extra_cflags=["-O1"]))
    assert reply["ok"], reply.get("error", "")[-3000:]
    assert reply["headers"] == "light" and svc.stats.light_headers == 1
    x = torch.randn(64)
    torch.testing.assert_close(_load(reply).twice_relu(x), torch.relu(x) * 2)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_source_that_needs_the_frontend_falls_back_and_builds(tmp_path):
    svc = _service(tmp_path)
    # cpp_sources as a list: load_inline appends its include and bindings to the list it is given, and
    # the second attempt must not see the first's (it did: "redefinition of PyInit_...")
    reply = svc.handle(_inline(cpp_sources=[FRONTEND], functions=["torch_major"], extra_cflags=["-O1"]))
    assert reply["ok"], reply.get("error", "")[-3000:]
    assert reply["headers"] == "as_written_after_light_failed" and svc.stats.light_fallbacks == 1
    import torch

    assert _load(reply).torch_major() == int(torch.__version__.split(".")[0])
    # Control: the light header alone cannot build it (what the fallback is for).
    from opsynth.reward import pch

    light = pch.light_include_dir(svc.cache_dir, ["-O1"], False)
    assert Path(light, "torch", "extension.h").read_text() == LIGHT_EXTENSION_H
    with pytest.raises(Exception, match="TORCH_VERSION_MAJOR"):
        build_runner._compile(_inline(cpp_sources=FRONTEND, functions=["torch_major"], extra_cflags=["-O1"]), None,
                              "opsx_ctl", str(tmp_path / "ctl"), first_include=light)


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME")
    cand = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    return cand if cand and os.path.exists(cand) else None


def _nvcc_cmd(nvcc: str, light: str, lean_dir: str | None) -> list[str]:
    import torch.utils.cpp_extension as ce

    home = str(Path(os.path.realpath(nvcc)).parents[1])
    dirs = [*ce.include_paths("cpu"), f"{home}/include", sysconfig.get_path("include")]
    if os.path.isdir(f"{home}/include/cccl"):
        dirs.append(f"{home}/include/cccl")
    lean = ["-DOPSYNTH_LEAN_CUDA", f"-I{lean_dir}"] if lean_dir else []
    return [nvcc, "-I", light, *(a for d in dirs for a in ("-isystem", d)), "-DTORCH_EXTENSION_NAME=x",
            "-DTORCH_API_INCLUDE_EXTENSION_H", *ce.COMMON_NVCC_FLAGS, "-gencode=arch=compute_90,code=sm_90",
            "--compiler-options", "-fPIC", "-std=c++20", *lean]


# load_inline's form of a CUDA unit: torch/types.h prepended to the candidate's cuda_sources
INLINE_CU = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + KB_CU.replace("#include <torch/extension.h>\n", "")


def _lean_dir(tmp_path, text: str) -> str:
    import torch.utils.cpp_extension as ce

    d = tmp_path / "lean_include"
    (d / "torch").mkdir(parents=True, exist_ok=True)
    (d / "torch" / "types.h").write_text(lean_types_h([text], ce.include_paths("cpu")[0]))
    return str(d)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(_nvcc() is None, reason="no nvcc")
@pytest.mark.parametrize("header", ["light", "lean_kernelbench_layout", "lean_load_inline"])
def test_nvcc_compiles_a_cuda_unit_with_the_light_and_the_lean_header(tmp_path, header):
    """The real compiler on the candidate's text with the light folder first, and the lean torch/types.h
    in front for the lean attempt (compile only: linking a CUDA extension needs a CUDA build of torch)."""
    from opsynth.reward import pch

    light = pch.light_include_dir(tmp_path, [], True)
    text = INLINE_CU if header == "lean_load_inline" else KB_CU
    lean_dir = _lean_dir(tmp_path, text) if header.startswith("lean") else None
    src = tmp_path / "k.cu"
    src.write_text(text)
    cmd = _nvcc_cmd(_nvcc(), light, lean_dir)
    deps = subprocess.run(cmd + ["-M", str(src)], capture_output=True, text=True, timeout=600)
    assert deps.returncode == 0, deps.stderr[-3000:]
    assert "torch/all.h" not in deps.stdout and "pybind11" not in deps.stdout
    if lean_dir:  # the Tensor class and the one operator named, not every operator's declaration
        assert str(Path(lean_dir, "torch", "types.h")) in deps.stdout and "ATen/ops/empty_like.h" in deps.stdout
        assert "ATen/ATen.h" not in deps.stdout and "ATen/Functions.h" not in deps.stdout
    else:
        assert light in deps.stdout and "ATen/ATen.h" in deps.stdout
    p = subprocess.run(cmd + ["-c", str(src), "-o", str(tmp_path / "k.o")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(_nvcc() is None, reason="no nvcc")
def test_a_cuda_unit_with_tensor_operators_fails_lean_which_is_what_the_fallback_is_for(tmp_path):
    from opsynth.reward import pch

    light = pch.light_include_dir(tmp_path, [], True)
    # ATen/TensorOperators.h comes in where a declared tensor stands beside an operator; `xc` is
    # `auto xc = x.contiguous()`, which the guess does not take for a tensor: the lean attempt fails
    text = KB_CU.replace("return y;", "return xc * 2.0;")
    src = tmp_path / "k.cu"
    src.write_text(text)
    p = subprocess.run(_nvcc_cmd(_nvcc(), light, _lean_dir(tmp_path, text)) + ["-c", str(src), "-o", str(tmp_path / "k.o")],
                       capture_output=True, text=True, timeout=600)
    assert "ATen/TensorOperators.h" not in Path(tmp_path, "lean_include", "torch", "types.h").read_text()
    assert p.returncode != 0 and "operator" in p.stderr, p.stderr[-3000:]


# What C++ wrappers commonly use from torch/extension.h (the bandit's CPU candidate used
# at::parallel_for, which torch/types.h alone does not declare).
WRAPPER_USES = r"""
#include <torch/extension.h>
#include <vector>
torch::Tensor f(torch::Tensor x) {
    auto y = torch::zeros_like(x);
    at::parallel_for(0, 10, 1, [&](int64_t b, int64_t e) {});
    for (auto i : c10::irange(3)) { (void)i; }
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "f", [&] { auto a = x.accessor<scalar_t, 1>(); (void)a; });
    auto s = x.index({torch::indexing::Slice(0, 2)});
    torch::NoGradGuard g;
    c10::InferenceMode im;
    auto n = at::get_num_threads();
    TORCH_CHECK(x.dim() == 1, "x");
    auto z = torch::empty({2, 3}, torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU));
    std::vector<int64_t> sh = x.sizes().vec();
    return y + s.sum() + torch::matmul(z, z.t()).sum() + n;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", torch::wrap_pybind_function(f), "f"); }
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_light_header_declares_what_wrappers_commonly_use(tmp_path):
    import torch.utils.cpp_extension as ce

    from opsynth.reward import pch

    light = pch.light_include_dir(tmp_path, [], False)
    src = tmp_path / "w.cpp"
    src.write_text(WRAPPER_USES)
    inc = [a for d in [*ce.include_paths("cpu"), sysconfig.get_path("include")] for a in ("-isystem", d)]
    p = subprocess.run([ce.get_cxx_compiler(), f"-I{light}", *inc, "-DTORCH_EXTENSION_NAME=w", "-std=c++20",
                        "-fsyntax-only", "-H", str(src)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    headers = [ln.lstrip(". ") for ln in p.stderr.splitlines() if ln.startswith(".")]
    assert headers[0] == str(Path(light, "torch", "extension.h"))  # the light one, not torch's
    assert not any(h.endswith("torch/all.h") for h in headers)
