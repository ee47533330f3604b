"""What one candidate build costs, by part: the C++ bindings (with and without the shared PCH) and
the CUDA source (torch headers in it, or not; the light torch/extension.h, and the lean torch/types.h
of the lean attempt). Compilers run on the CPU, so this needs no GPU: only
gcc, and nvcc for the CUDA rows (CUDA_HOME, or nvcc on PATH; rows are skipped without it).

    python benchmarks/build_cost.py --out benchmarks/results/build_cost_cpu.json

Each row compiles the same translation unit a reward evaluation compiles, with the flags torch's
`load_inline` uses (read from the ninja file torch writes), `--repeats` times, and reports the median.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The C++ side of a load_inline build: what torch writes to main.cpp for a one-function extension
# whose torch::Tensor wrapper lives in cpp_sources (the light layout; a heavy one only declares it).
MAIN_CPP = """#include <torch/extension.h>
void launch(const float* x, float* y, long n, float a, float b);
torch::Tensor run(torch::Tensor x, double a, double b) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), (float)a, (float)b);
    return y;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
m.def("run", torch::wrap_pybind_function(run), "run");
}
"""

KERNEL = """
__global__ void k(const float* __restrict__ x, float* __restrict__ y, long n, float a, float b) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i] * a + b; v = v > 0.f ? v : 0.f; y[i] = fabsf(v * 0.5f - 0.25f);
    }
}
"""

# torch-free .cu, as the policy brief asks (load_inline(..., no_implicit_headers=True))
LIGHT_CU = "#include <cuda_runtime.h>\n" + KERNEL + """
void launch(const float* x, float* y, long n, float a, float b) {
    long blocks = (n + 255) / 256;
    if (blocks > 65535L * 8) blocks = 65535L * 8;
    k<<<blocks, 256>>>(x, y, n, a, b);
}
"""

# torch in the .cu: load_inline's implicit headers, plus the usual torch/extension.h of a KernelBench
# answer (the CUDA stream header is left out: CPU builds of torch lack its generated config header).
HEAVY_CU = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n#include <torch/extension.h>\n" + KERNEL + """
torch::Tensor run(torch::Tensor x, double a, double b) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    k<<<std::min<long>((n + 255) / 256, 65535L * 8), 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n, (float)a, (float)b);
    return y;
}
"""


def _time(cmd: list[str], repeats: int, cwd: str) -> tuple[float | None, str, float | None]:
    """Median wall seconds, an error tail, and the median CPU seconds (user + system of the compiler
    and its children: what a busy machine does not inflate, unlike the wall)."""
    import resource

    times, cpu = [], []
    for _ in range(repeats):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
        if p.returncode != 0:
            return None, p.stderr[-1500:], None
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return statistics.median(times), "", statistics.median(cpu)


def _nvcc() -> tuple[str, str] | None:
    import torch.utils.cpp_extension as ce

    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or ce.CUDA_HOME
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        return None
    home = home or str(Path(nvcc).resolve().parents[1])
    return nvcc, home


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--arch", default="90", help="CUDA compute capability for the .cu rows (default: 90, Hopper)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "build_cost_cpu.json"))
    ap.add_argument("--lean-only", action="store_true", help="only the lean .cu rows (nvcc as is, and its front ends side by side)")
    args = ap.parse_args()

    import torch
    import torch.utils.cpp_extension as ce

    from opsynth.reward.pch import _torch_cflags, light_include_dir, pch_include_dir

    work = tempfile.mkdtemp(prefix="build_cost_")
    rows = []
    cxx = ce.get_cxx_compiler()
    flags = _torch_cflags(["-O3"], with_cuda=False)
    main_cpp = Path(work, "main.cpp")
    main_cpp.write_text(MAIN_CPP)
    base = [cxx, "-DTORCH_EXTENSION_NAME=bench_ext", *flags, "-c", str(main_cpp), "-o", str(Path(work, "main.o"))]

    t0 = time.perf_counter()
    pch = None if args.lean_only else pch_include_dir(work, ["-O3"], log=print)
    pch_s = time.perf_counter() - t0
    # opsynth.reward.light_headers: the light torch/extension.h first on the include path, before its
    # PCH exists (a cold build; another root) and with it
    light_cold = light_include_dir(Path(work, "cold"), ["-O3"], False)
    t0 = time.perf_counter()
    light_pch = None if args.lean_only else pch_include_dir(work, ["-O3"], log=print, light=True)
    light_pch_s = time.perf_counter() - t0

    def with_dir(d):
        return base[:1] + [f"-I{d}"] + base[1:] if d else None

    for label, cmd in [("main.cpp (bindings), plain", base), ("main.cpp (bindings), shared PCH", with_dir(pch)),
                       ("main.cpp (bindings), light header, no PCH yet", with_dir(light_cold)),
                       ("main.cpp (bindings), light header and its PCH", with_dir(light_pch))]:
        if args.lean_only:
            break
        if cmd is None:
            rows.append({"part": label, "seconds": None, "note": "no PCH (not gcc?)"})
            continue
        s, err, c = _time(cmd, args.repeats, work)
        rows.append({"part": label, "seconds": None if s is None else round(s, 2), "cpu_s": c and round(c, 2), "note": err})
        print(f"{label:<40} {s if s is None else round(s, 2)}", flush=True)

    nv = _nvcc()
    if nv is None:
        rows.append({"part": "cuda.cu", "seconds": None, "note": "no nvcc (set CUDA_HOME)"})
    else:
        nvcc, home = nv
        import sysconfig

        dirs = [*ce.include_paths("cpu"), f"{home}/include"]
        if os.path.isdir(f"{home}/include/cccl"):
            dirs.append(f"{home}/include/cccl")  # pip-installed CUDA keeps libcu++ here
        dirs.append(sysconfig.get_path("include"))
        inc = [a for d in dirs for a in ("-isystem", d)]
        nvflags = ["-DTORCH_EXTENSION_NAME=bench_ext", "-DTORCH_API_INCLUDE_EXTENSION_H", *inc, *ce.COMMON_NVCC_FLAGS,
                   f"-gencode=arch=compute_{args.arch},code=compute_{args.arch}", f"-gencode=arch=compute_{args.arch},code=sm_{args.arch}",
                   "--compiler-options", "-fPIC", "-O3", "-std=c++20"]
        # opsynth.reward.light_headers.lean_types_h: the lean attempt's torch/types.h, for this source
        from opsynth.reward.light_headers import LEAN_MACRO, lean_types_h

        lean_dir = Path(work, "lean_include")
        (lean_dir / "torch").mkdir(parents=True, exist_ok=True)
        (lean_dir / "torch" / "types.h").write_text(lean_types_h([HEAVY_CU], ce.include_paths("cpu")[0]))
        lean = ["-I", light_cold, f"-D{LEAN_MACRO}", "-I", str(lean_dir)]
        for i, (label, text, first) in enumerate([("cuda.cu, torch-free (light)", LIGHT_CU, []),
                                                  ("cuda.cu, torch headers (heavy)", HEAVY_CU, []),
                                                  ("cuda.cu, heavy, light torch/extension.h", HEAVY_CU, ["-I", light_cold]),
                                                  ("cuda.cu, heavy, light torch/extension.h + lean torch/types.h", HEAVY_CU, lean)]):
            if args.lean_only and first is not lean:
                continue
            src = Path(work, f"cu{i}.cu")
            src.write_text(text)
            s, err, c = _time([nvcc, *first, *nvflags, "-c", str(src), "-o", str(src.with_suffix(".o"))], args.repeats, work)
            rows.append({"part": label, "seconds": None if s is None else round(s, 2), "cpu_s": c and round(c, 2), "note": err})
            print(f"{label:<40} {s if s is None else round(s, 2)}", flush=True)
            if first is lean:  # the same unit through opsynth.reward.nvcc_parallel (reward.parallel_nvcc): front ends side by side
                label = "cuda.cu, lean, host and device front ends side by side"
                s, err, c = _time([sys.executable, "-m", "opsynth.reward.nvcc_parallel", nvcc, *first, *nvflags, "-c", str(src),
                                   "-o", str(src.with_suffix(".par.o"))], args.repeats, work)
                rows.append({"part": label, "seconds": None if s is None else round(s, 2), "cpu_s": c and round(c, 2), "note": err})
                print(f"{label:<40} {s if s is None else round(s, 2)}", flush=True)
        ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    shutil.rmtree(work, ignore_errors=True)

    out = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "cxx": subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "nvcc": ver[-1] if nv else None,
        "torch": torch.__version__,
        "repeats": args.repeats,
        "pch_build_s": round(pch_s, 1),
        "light_pch_build_s": round(light_pch_s, 1),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print()
    print(f"{'part':<68}{'median s':>10}{'cpu s':>8}")
    for r in rows:
        print(f"{r['part']:<68}{'-' if r['seconds'] is None else r['seconds']:>10}{'-' if r.get('cpu_s') is None else r['cpu_s']:>8}")
    print(f"shared PCH built once in {out['pch_build_s']} s, the light header's in {out['light_pch_build_s']} s; wrote {args.out}")


if __name__ == "__main__":
    main()
