"""A user's warm CLI evaluation of a KernelBench-layout CUDA candidate, end to end (issue 28).

For each setting of `reward.light_headers` (the light torch/extension.h first,
or the sources as written), in a fresh cache of its own:

1. prime: `python -m pipelines.evaluate` on one KernelBench-layout candidate (builds the shared PCH,
   the C++ wrapper, ccache, the task's reference);
2. warm: the same command on a *different* candidate (another kernel in the `.cu`, the same
   `cpp_sources`): only its own CUDA translation unit builds.

Prints a table (wall of the whole command, the build, setup, locked and judge seconds from the
result's `times`) and writes JSON. Needs a CUDA device and nvcc:

    python benchmarks/cli_eval_kb.py --out benchmarks/results/cli_eval_kb_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A KernelBench-layout answer: torch/extension.h in the .cu, the torch::Tensor wrapper beside the
# kernel, load_inline's functions= binding it. BLOCK differs between the two candidates.
CANDIDATE = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void fused_chain(const float* __restrict__ x, float* __restrict__ y, long n, float s, float b) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i] * s + b;
        v = v > 0.f ? v : 0.f;
        y[i] = fabsf(v * 0.5f - 0.25f);
    }
}

torch::Tensor fused_chain_cuda(torch::Tensor x, double s, double b) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    const int block = BLOCK;
    long grid = std::min<long>((n + block - 1) / block, 65535L * 8);
    fused_chain<<<grid, block>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n, (float)s, (float)b);
    return y;
}
"""

cpp_source = "torch::Tensor fused_chain_cuda(torch::Tensor x, double s, double b);"

fused = load_inline(name="fused_chain", cpp_sources=cpp_source, cuda_sources=cuda_source,
                    functions=["fused_chain_cuda"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return fused.fused_chain_cuda(x, self.scale, self.shift)
'''

TIMES = ("prebuild_s", "prebuild_wall_s", "build_s", "setup_s", "locked_s", "judge_s", "measure_wall_s")


def evaluate(task: Path, cand: Path, cache: Path, light: bool, timeout: float, extra: tuple = ()) -> dict:
    cmd = [sys.executable, "-m", "pipelines.evaluate", f"task={task}", f"candidate={cand}", "quiet=true",
           f"reward.cache_dir={cache}", f"reward.light_headers={str(light).lower()}", *extra]
    t0 = time.perf_counter()
    # stdout read as it comes: when the result line arrives (what a user reads) and when the command has
    # exited (its children stopped, its scratch removed) are both part of the wall
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    reader.start()
    lines, result_at = [], None
    try:
        for line in p.stdout:
            lines.append(line)
            if line.startswith("{"):
                result_at = time.perf_counter() - t0
        p.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    wall = time.perf_counter() - t0
    reader.join(5)
    try:
        res = json.loads("".join(lines).strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        res = {"reason": f"no result (exit {p.returncode})", "stderr": "".join(err)[-2000:]}
    times = res.get("times") or {}
    # every time the result carries (compile_wait_s, the reference's, ...) beside the table's: where the wall goes
    return {"wall_s": round(wall, 2), "result_at_s": None if result_at is None else round(result_at, 2),
            "reward": res.get("reward"), "reason": res.get("reason"),
            **{k: times.get(k) for k in TIMES}, "times": times,
            "builds": (res.get("details") or {}).get("builds")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default=str(REPO / "tests/reward/candidates/tasks/chain_gpu.py"))
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/cli_eval_kb.json"))
    ap.add_argument("--settings", default="true,false", help="light_headers values to run, in order")
    ap.add_argument("--timeout", type=float, default=280)
    ap.add_argument("--parallel-nvcc", default="true", help="reward.parallel_nvcc values, in order (e.g. true,false: "
                    "each setting's prime and warm runs in a cache of its own)")
    args = ap.parse_args()

    import torch

    work = Path(tempfile.mkdtemp(prefix="cli_eval_kb_"))
    prime, warm = work / "prime.py", work / "warm.py"
    prime.write_text(CANDIDATE.replace("BLOCK", "256"))
    warm.write_text(CANDIDATE.replace("BLOCK", "512"))
    out = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "cpu_count": os.cpu_count(),
           "torch": torch.__version__, "task": Path(args.task).name, "runs": []}
    combos = [(light, par) for light in [s.strip() == "true" for s in args.settings.split(",")]
              for par in [s.strip() == "true" for s in args.parallel_nvcc.split(",")]]
    for light, par in combos:
        cache = work / f"cache_{'light' if light else 'as_written'}{'_par' if par else ''}"
        for phase, cand in (("prime", prime), ("warm", warm)):
            r = {"light_headers": light, "parallel_nvcc": par, "phase": phase,
                 **evaluate(Path(args.task), cand, cache, light, args.timeout, (f"reward.parallel_nvcc={str(par).lower()}",))}
            out["runs"].append(r)
            print(json.dumps(r), flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(out, indent=2))  # partial results survive a cut-off
    print()
    print(f"{'light_headers, parallel_nvcc':<30}{'phase':<7}{'wall s':>8}{'build s':>9}{'setup s':>9}{'locked s':>9}{'judge s':>9}  reward")
    for r in out["runs"]:
        b = r.get("prebuild_wall_s") or r.get("build_s")
        print(f"{str(r['light_headers']) + ', ' + str(r.get('parallel_nvcc')):<30}{r['phase']:<7}{r['wall_s']:>8}{b if b is not None else '-':>9}"
              f"{r.get('setup_s') or '-':>9}{r.get('locked_s') or '-':>9}{r.get('judge_s') or '-':>9}  {r['reward']} {r['reason']}")
    # Where the CLI's wall goes: its own start (the command's wall less evaluate()'s), then the batch's
    # timeline (seconds into evaluate(): services up, reference ready, build asked for, build ended,
    # measurement started, done; between "build" and "built" less the build child's own wall: the fork server's start)
    # "CLI start": the result line's arrival less evaluate()'s wall; "exit": the command's wall after that line
    print(f"\n{'light_headers':<20}{'phase':<7}{'CLI start':>10}{'services':>9}{'reference':>10}{'build':>7}{'built':>7}{'measure':>8}"
          f"{'done':>7}{'exit':>6}")
    for r in out["runs"]:
        t = r.get("times") or {}
        shown = r.get("result_at_s") or r["wall_s"]
        start = round(shown - t["wall_s"], 2) if t.get("wall_s") is not None else "-"
        end = round(r["wall_s"] - r["result_at_s"], 2) if r.get("result_at_s") is not None else "-"
        cells = [t.get(k) if t.get(k) is not None else "-"
                 for k in ("services_at_s", "reference_at_s", "build_at_s", "built_at_s", "measure_at_s", "done_at_s")]
        print(f"{str(r['light_headers']):<20}{r['phase']:<7}{start:>10}{cells[0]:>9}{cells[1]:>10}{cells[2]:>7}{cells[3]:>7}{cells[4]:>8}"
              f"{cells[5]:>7}{end:>6}")
    # the reference's own phases (evaluate's `reference_*` times): its child, the read of what it wrote, the facts, when
    # its baseline children started
    print(f"\n{'phase':<7}{'ref child':>10}{'server wait':>12}{'read':>6}{'facts':>6}{'baselines at':>13}{'compile wait':>13}")
    for r in out["runs"]:
        t = r.get("times") or {}
        cells = [t.get(k) if t.get(k) is not None else "-" for k in ("reference_child_s", "reference_server_wait_s", "reference_read_s",
                                                                      "reference_facts_s", "reference_baselines_at_s", "compile_wait_s")]
        print(f"{r['phase']:<7}{cells[0]:>10}{cells[1]:>12}{cells[2]:>6}{cells[3]:>6}{cells[4]:>13}{cells[5]:>13}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
