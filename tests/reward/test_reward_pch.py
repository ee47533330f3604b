"""The shared precompiled torch/extension.h (opsynth.reward.pch) is built once and accepted by torch's builds."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch.utils.cpp_extension as ce  # noqa: E402

from opsynth.reward.pch import pch_include_dir  # noqa: E402

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which(ce.get_cxx_compiler()) is None or not ce.check_compiler_is_gcc(ce.get_cxx_compiler()), reason="needs gcc"),
]


@pytest.mark.slow
def test_pch_is_built_once_and_used_by_torch_build_flags(tmp_path):
    d = pch_include_dir(tmp_path, ["-O3"])
    assert d is not None
    gch = Path(d) / "torch" / "extension.h.gch"
    assert gch.is_file() and gch.stat().st_size > 1_000_000
    stamp = gch.stat().st_mtime_ns
    assert pch_include_dir(tmp_path, ["-O3"]) == d  # reused, not rebuilt
    assert gch.stat().st_mtime_ns == stamp

    # The flags torch itself writes for a load_inline build of this extension, plus our -I.
    build = tmp_path / "probe"
    build.mkdir()
    main = build / "main.cpp"
    main.write_text("#include <torch/extension.h>\nint f(torch::Tensor x) { return x.dim(); }\n")
    ce._write_ninja_file_to_build_library(
        path=str(build / "build.ninja"), name="some_candidate_ext", sources=[str(main)], extra_cflags=["-O3"],
        extra_cuda_cflags=[], extra_sycl_cflags=[], extra_ldflags=[], extra_include_paths=[], with_cuda=False,
        with_sycl=False, is_standalone=False,
    )
    line = next(x for x in (build / "build.ninja").read_text().splitlines() if x.startswith("cflags = "))
    flags = [f"-I{d}", *shlex.split(line[len("cflags = "):])]
    proc = subprocess.run([ce.get_cxx_compiler(), *flags, "-H", "-Winvalid-pch", "-fsyntax-only", str(main)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # gcc's -H marks a precompiled header it used with '!'
    assert f"! {gch}" in proc.stderr, proc.stderr[:2000]


def test_pch_failure_is_recorded_and_the_build_goes_on_without_it(tmp_path):
    msgs = []
    bad = ["-march=no-such-cpu-for-opsynth"]  # on the build allow-list, refused by gcc
    assert pch_include_dir(tmp_path, bad, log=msgs.append) is None
    failed = list((tmp_path / "pch").glob("*/FAILED"))
    assert len(failed) == 1 and "no-such-cpu" in failed[0].read_text()
    assert any("build failed" in m for m in msgs)
    assert pch_include_dir(tmp_path, bad) is None  # not retried


def test_include_paths_do_not_split_the_pch_key():
    from opsynth.reward.pch import _without_include_paths

    flags = ["-O3", "-I", "/scratch/a/kernels", "-I/scratch/b", "-isystem", "/x", "-DFOO=1"]
    assert _without_include_paths(flags) == ["-O3", "-DFOO=1"]


def test_only_sources_that_start_with_torch_extension_h_use_the_pch(tmp_path):
    from opsynth.reward.pch import first_include

    a = tmp_path / "a.cpp"
    a.write_text("// binding\n#include <torch/extension.h>\n#include <vector>\n")
    b = tmp_path / "b.cpp"
    b.write_text('#include <pybind11/pybind11.h>\n#include "torch/extension.h"\n')
    c = tmp_path / "c.cpp"
    c.write_text("int f() { return 1; }\n")
    assert first_include(a.read_text()) == "torch/extension.h"
    assert first_include(b.read_text()) == "pybind11/pybind11.h"
    assert first_include(c.read_text()) is None
