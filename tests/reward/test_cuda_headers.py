"""Lighter torch headers for CUDA translation units (opsynth.reward.cuda_headers) and the build
child's fallback to the sources as written."""

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from opsynth.reward import build_runner
from opsynth.reward.cuda_headers import LIGHT_HEADER, lighter, lighter_request

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


def test_a_kernelbench_layout_cu_is_lightened_and_keeps_every_other_line():
    light = lighter(KB_CU)
    assert light is not None and "torch/extension.h" not in light and LIGHT_HEADER in light
    assert light.replace(LIGHT_HEADER, "#include <torch/extension.h>") == KB_CU


@pytest.mark.parametrize("use", [
    "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"f\", &f); }",
    "namespace py = pybind11;",
    "py::object o;",
    "PyObject* p = nullptr;",
    "torch::nn::Linear lin(4, 4);",
    "auto g = torch::autograd::grad({y}, {x});",
    "#include <torch/python.h>",
])
def test_a_cu_that_may_need_the_full_header_keeps_it(use):
    assert lighter(KB_CU + "\n" + use + "\n") is None


def test_sources_without_the_header_are_left_alone():
    assert lighter(KB_CU.replace("#include <torch/extension.h>\n", "")) is None
    assert lighter_request({"kind": "inline", "name": "x", "args": {"cpp_sources": "#include <torch/extension.h>\n"}}) is None


def test_requests_lighten_cuda_sources_and_cu_files_only():
    req = {"kind": "inline", "name": "x", "args": {"cpp_sources": "#include <torch/extension.h>\nint f();",
                                                     "cuda_sources": [KB_CU, "__global__ void k() {}"]}}
    light = lighter_request(req)
    assert light["args"]["cpp_sources"] == req["args"]["cpp_sources"]  # C++ keeps its header (the PCH covers it)
    assert light["args"]["cuda_sources"] == [lighter(KB_CU), "__global__ void k() {}"]
    assert req["args"]["cuda_sources"][0] == KB_CU  # the request itself is untouched
    files = {"kind": "files", "name": "x", "args": {}, "files": {"k.cu": KB_CU, "w.cpp": "#include <torch/extension.h>\n"}}
    lf = lighter_request(files)
    assert lf["files"]["k.cu"] == lighter(KB_CU) and lf["files"]["w.cpp"] == files["files"]["w.cpp"]


def _job(tmp_path, **kw) -> dict:
    req = {"kind": "inline", "name": "x", "args": {"cpp_sources": "torch::Tensor scale_relu_cuda(torch::Tensor x, double s);",
                                                   "cuda_sources": KB_CU, "functions": ["scale_relu_cuda"]}}
    return {"request": req, "build_name": "opsx_test", "out_dir": str(tmp_path / "build"), "pch_dir": None, **kw}


def _fake_compile(outcomes: list, seen: list):
    def compile_(req, pch_dir, build_name, out):
        seen.append(req["args"]["cuda_sources"])
        what = outcomes.pop(0)
        if isinstance(what, Exception):
            raise what
        os.makedirs(out, exist_ok=True)
        Path(out, "x.so").write_text("")
        return str(Path(out, "x.so"))
    return compile_


def test_the_runner_builds_the_lighter_text_first(tmp_path, monkeypatch):
    seen: list = []
    monkeypatch.setattr(build_runner, "_compile", _fake_compile(["ok"], seen))
    res = build_runner.run(_job(tmp_path))
    assert res["reason"] == "ok" and res["headers"] == "light" and seen == [lighter(KB_CU)]


def test_a_failed_light_build_of_the_cu_is_built_again_as_written(tmp_path, monkeypatch):
    seen: list = []
    err = RuntimeError("Error building extension 'x': [1/3] nvcc ...\nFAILED: cuda.cuda.o \nerror: identifier ... is undefined\n")
    monkeypatch.setattr(build_runner, "_compile", _fake_compile([err, "ok"], seen))
    res = build_runner.run(_job(tmp_path))
    assert res["reason"] == "ok" and res["headers"] == "as_written_after_light_failed"
    assert seen == [lighter(KB_CU), KB_CU]


def test_a_failure_in_the_untouched_cpp_is_not_built_twice(tmp_path, monkeypatch):
    seen: list = []
    err = RuntimeError("Error building extension 'x': [1/3] c++ ...\nFAILED: main.o \nmain.cpp:1:9: error: expected ';'\n")
    monkeypatch.setattr(build_runner, "_compile", _fake_compile([err, "ok"], seen))
    res = build_runner.run(_job(tmp_path))
    assert res["reason"] == "build_error" and "expected ';'" in res["detail"] and len(seen) == 1


def test_the_setting_off_builds_as_written(tmp_path, monkeypatch):
    seen: list = []
    monkeypatch.setattr(build_runner, "_compile", _fake_compile(["ok"], seen))
    res = build_runner.run(_job(tmp_path, light_cuda_headers=False))
    assert res["headers"] == "as_written" and seen == [KB_CU]


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME")
    cand = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    return cand if cand and os.path.exists(cand) else None


@pytest.mark.slow
@pytest.mark.skipif(_nvcc() is None, reason="no nvcc")
def test_nvcc_compiles_the_lightened_kernelbench_layout_cu(tmp_path):
    """The real compiler on the lightened text (compile only: linking a CUDA extension needs a CUDA
    build of torch). The host side uses torch::Tensor, the factories and TORCH_CHECK."""
    import torch.utils.cpp_extension as ce

    nvcc = _nvcc()
    home = str(Path(os.path.realpath(nvcc)).parents[1])
    dirs = [*ce.include_paths("cpu"), f"{home}/include", sysconfig.get_path("include")]
    if os.path.isdir(f"{home}/include/cccl"):
        dirs.append(f"{home}/include/cccl")
    src = tmp_path / "k.cu"
    src.write_text(lighter(KB_CU))
    cmd = [nvcc, *(a for d in dirs for a in ("-isystem", d)), "-DTORCH_EXTENSION_NAME=x", "-DTORCH_API_INCLUDE_EXTENSION_H",
           *ce.COMMON_NVCC_FLAGS, "-gencode=arch=compute_90,code=sm_90", "--compiler-options", "-fPIC", "-std=c++20",
           "-c", str(src), "-o", str(tmp_path / "k.o")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "k.o").stat().st_size > 0
