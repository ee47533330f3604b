"""nvcc with its host and device front ends side by side (opsynth.reward.nvcc_parallel, reward.parallel_nvcc).

What a user relies on when it is on: the object it builds is the one nvcc builds (the same kernels,
symbols and PTX, anonymous namespaces included), a broken source fails with nvcc's own message
once, and every call it does not know goes to nvcc unchanged. Needs nvcc (skipped without it);
no GPU: nothing is loaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsynth.reward import nvcc_parallel

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit); none on PATH")
pytestmark = pytest.mark.timeout(600)

SOURCE = r"""
#include <cuda_runtime.h>
namespace {
__global__ void scale(float* x, float a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }
}
template <typename T> __global__ void shift(T* x, T b, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += b; }
void launch(float* x, float a, float b, int n) {
    scale<<<(n + 255) / 256, 256>>>(x, a, n);
    shift<float><<<(n + 255) / 256, 256>>>(x, b, n);
}
"""
FLAGS = ["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90", "-O3", "--compiler-options", "-fPIC",
         "--no-compress"]  # the embedded PTX readable, to compare


def _nvcc(args, driver: bool, cwd):
    cmd = [sys.executable, "-m", "opsynth.reward.nvcc_parallel", NVCC, *args] if driver else [NVCC, *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)


def _symbols(obj: Path) -> list[str]:
    out = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True, check=True).stdout
    return sorted(_no_id(line.split(" ", 2)[-1]) for line in out.splitlines())


def _no_id(text: str) -> str:
    """The anonymous namespace is named after the module id (which the driver writes itself), with
    its length before it in mangled names: both left out of the comparison."""
    return re.sub(r"\d*_GLOBAL__N_\w*", "<anon>", text)


def _ptx(obj: Path) -> str:
    """The PTX image embedded in the object's fatbin (code=compute_90), comments and the id aside."""
    data = obj.read_bytes()
    i = data.find(b".version")
    assert i >= 0, "no PTX embedded"
    text = data[i:data.find(b"\0", i)].decode(errors="replace")
    return _no_id("\n".join(line for line in text.splitlines() if not line.startswith("//")))


@needs_nvcc
def test_the_driver_builds_the_object_nvcc_builds(tmp_path):
    (tmp_path / "k.cu").write_text(SOURCE)
    plain = _nvcc([*FLAGS, "-c", "k.cu", "-o", "plain.o"], False, tmp_path)
    assert plain.returncode == 0, plain.stderr
    par = _nvcc([*FLAGS, "-c", "k.cu", "-o", "par.o"], True, tmp_path)
    assert par.returncode == 0, par.stderr
    assert _symbols(tmp_path / "par.o") == _symbols(tmp_path / "plain.o")
    assert _ptx(tmp_path / "par.o") == _ptx(tmp_path / "plain.o")
    # and it links like nvcc's object
    link = subprocess.run(["g++", "-shared", "-o", str(tmp_path / "k.so"), str(tmp_path / "par.o")], capture_output=True, text=True)
    assert link.returncode == 0, link.stderr
    assert not list(Path("/tmp").glob("opsynth_nvcc_*/k.*")), "the driver left its intermediate files behind"


@needs_nvcc
def test_the_driver_really_splits_the_passes(tmp_path):
    """The plan has both chains and cudafe++ reads the id the driver writes (the control for the test
    above: a driver that passed everything to nvcc would pass it too)."""
    (tmp_path / "k.cu").write_text(SOURCE)
    args = [*FLAGS, "-c", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.o")]
    assert nvcc_parallel.splittable(args) == str(tmp_path / "k.cu")
    p = nvcc_parallel.plan(NVCC, args, str(tmp_path / "k.cu"))
    try:
        assert p is not None
        assert any("cudafe++" in c for c in p.host) and not any("--gen_module_id_file" in c for c in p.host)
        assert any("cicc" in c for c in p.device) and any("ptxas" in c for c in p.device)
        assert any(" -c " in c for c in p.final)
    finally:
        shutil.rmtree(p.keep_dir, ignore_errors=True)


@needs_nvcc
def test_a_broken_source_fails_with_nvccs_message_once(tmp_path):
    (tmp_path / "bad.cu").write_text(SOURCE + "\nvoid broken() { undeclared_thing(1); }\n")
    plain = _nvcc([*FLAGS, "-c", "bad.cu", "-o", "plain.o"], False, tmp_path)
    par = _nvcc([*FLAGS, "-c", "bad.cu", "-o", "par.o"], True, tmp_path)
    assert plain.returncode != 0 and par.returncode != 0
    assert "undeclared_thing" in par.stderr
    assert par.stderr.count("undeclared_thing") == plain.stderr.count("undeclared_thing")
    assert not (tmp_path / "par.o").exists()


@pytest.mark.parametrize("args", [
    ["-E", "k.cu"],
    ["-c", "a.cu", "b.cu"],
    ["-c", "k.cpp", "-o", "k.o"],
    ["--generate-dependencies-with-compile", "--dependency-output", "k.d", "-c", "k.cu", "-o", "k.o"],
    ["-rdc=true", "-c", "k.cu", "-o", "k.o"],
    ["--keep", "-c", "k.cu", "-o", "k.o"],
    ["--version"],
    ["k.cu", "-o", "k"],
])
def test_calls_it_does_not_know_go_to_nvcc_as_written(args):
    assert nvcc_parallel.splittable(args) is None


def test_the_build_service_puts_the_driver_in_front_of_nvcc_only_when_asked(tmp_path, monkeypatch):
    from opsynth.reward import builds

    monkeypatch.setattr(builds, "_nvcc_path", lambda: "/opt/cuda/bin/nvcc")
    off = builds.compiler_env(tmp_path, "/usr/bin/ccache")
    assert off["PYTORCH_NVCC"] == "/usr/bin/ccache /opt/cuda/bin/nvcc"
    on = builds.compiler_env(tmp_path, "/usr/bin/ccache", parallel_nvcc=True)
    launcher = tmp_path / "bin" / "nvcc"
    assert on["PYTORCH_NVCC"] == f"/usr/bin/ccache {launcher}"  # named nvcc: ccache treats it as nvcc
    assert "opsynth.reward.nvcc_parallel" in launcher.read_text() and "/opt/cuda/bin/nvcc" in launcher.read_text()
    assert os.access(launcher, os.X_OK) and on["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"
    bare = builds.compiler_env(tmp_path, None, parallel_nvcc=True)
    assert bare["PYTORCH_NVCC"] == str(launcher)
