#!/usr/bin/env bash
# H200, one device call (< 10 minutes): the lean CUDA header and the compile baseline's cache, measured
# where they should show (issue 28).
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_reward_cuts.sh", carry=[".whl", ".tools"], timeout_s=600)
# 1. benchmarks/cli_eval_kb.py --settings true: a KernelBench-layout CLI evaluation, prime then warm
#    (about 2 minutes; 2026-12-03: warm 52.6 s with the build at 21.2 s: where do the other 22 s go?);
# 2. benchmarks/reward_throughput.py with the hardened sandbox (about 6.5 minutes): distinct, GRPO-shaped
#    and cold first, with which headers the builds took.
# The number of measuring children in flight, measured (issue 28): THROUGHPUT_ARGS="--skip-distinct
# --group-sweep 12,16" times the GRPO-shaped phase at the default 8, then at 12 and 16 (fresh bodies each).
# CLI_ARGS="--parallel-nvcc false,true": the CLI's prime and warm runs with nvcc as is, then with its front ends side
# by side (reward.parallel_nvcc; about 170 s in all: CLI_S=190). CLI_S=0 or RUN_S=0 skips that stage, PROBES=0 the probes.
# THROUGHPUT_ARGS="--plain-lock-group": after the GRPO-shaped phase, the same shape with the device lock's timings
# not a phase ($OPSYNTH_LOCK_PHASES=0, the control), then with them again (about 30 s each).
# THROUGHPUT_ARGS="--warmup-sweep 5,3": after the GRPO-shaped phase, the same shape with 5 and then 3 warm-up rounds
# (10 by default on cuda) inside each candidate's locked section, the GRPO-shaped floor (about 16 s each).
# THROUGHPUT_ARGS="--skip-distinct --fresh-copies-group --late-data-group": after the GRPO-shaped phase, A/B/A of the outputs'
# host copies into reserved memory ($OPSYNTH_HOST_COPIES=fresh is the control) and of candidates started on the
# reference's data ($OPSYNTH_EARLY_REFERENCE_DATA=0 is the control), about 25 s a phase (2026-12-07, fourth session).
# THROUGHPUT_ARGS="--skip-distinct --copies-in-lock-group --late-data-group": A/B/A of the outputs' copies held on the device
# until the lock is let go ($OPSYNTH_HOLD_OUTPUTS=0 copies inside the checks' share and the lock, the control), and of the
# early data; "--pageable-copies-group --fresh-copies-group": the host memory the copies land in (2026-12-07, fifth session).
# D2H=1: first benchmarks/d2h_probe.py (about 40 s): fresh, pre-touched and page-locked copies to the host, plain and namespaced.
# Results in $OUT: probes.log, cuda_ipc_probe.json, cli_eval_kb_h200.json/.log, reward_throughput_auto.json/.log, gpu_name.txt.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 HF_HUB_OFFLINE=1
[ -x .tools/ccache/ccache ] && export OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
if [ "${D2H:-0}" != 0 ]; then
  timeout 60 python3 benchmarks/d2h_probe.py --out "$OUT/d2h_probe.json" > "$OUT/d2h_probe.log" 2>&1; echo "d2h_probe rc=$?"; cat "$OUT/d2h_probe.log"
fi
# 0. Probes (about 30 s): the fork servers' imports (full, light), and the outputs channel on this kernel
#    (a memfd sealed and mapped: the reward's judging depends on it; where it cannot seal, a copy is judged).
if [ "${PROBES:-1}" != 0 ]; then  # PROBES=0: skip them (measured on 2026-12-05 and 12-06)
{ for m in "torch" "torch, opsynth.reward.guards, opsynth.reward.candidate_runner, opsynth.reward.build_runner" \
    "torch, torch.nn.functional, torch.profiler, torch._dynamo, opsynth.reward.guards, opsynth.reward.candidate_runner, opsynth.reward.reference_runner, opsynth.reward.build_runner, opsynth.reward.baseline_runner"; do
    /usr/bin/time -f "%e s import: $m" python3 -c "import $m" 2>&1 | tail -1; done
  python3 - <<'PROBE'
import fcntl, io, os, time, torch
from opsynth.reward.outputs_file import OutputsChannel, seal
x = {"trials": [[torch.randn(512, 32768)] for _ in range(5)]}
with OutputsChannel("probe") as ch:
    t0 = time.perf_counter()
    with os.fdopen(os.dup(ch.fd), "wb") as f:
        torch.save(x, f)
    t1 = time.perf_counter()
    sealed = seal(ch.fd)
    out = ch.read()
    t2 = time.perf_counter()
    same = all(torch.equal(a[0], b[0]) for a, b in zip(out["trials"], x["trials"]))
    print(f"channel: sealed {sealed}, loaded equal {same}, {ch.size() >> 20} MB, save {t1 - t0:.3f} s, seal+load {t2 - t1:.3f} s")
PROBE
  timeout 90 python3 benchmarks/cuda_ipc_probe.py --out "$OUT/cuda_ipc_probe.json"  # judging on the device: does CUDA IPC work here?
} > "$OUT/probes.log" 2>&1
echo "probes:"; cat "$OUT/probes.log"
fi
if [ "${CLI_S:-150}" != 0 ]; then  # CLI_S=0: no CLI evaluation (timeout 0 would mean no limit)
timeout ${CLI_S:-150} python3 benchmarks/cli_eval_kb.py --settings true ${CLI_ARGS:-} --timeout 120 --out "$OUT/cli_eval_kb_h200.json" > "$OUT/cli_eval_kb.log" 2>&1
echo "cli_eval_kb rc=$?"; tail -5 "$OUT/cli_eval_kb.log"
fi
[ "${RUN_S:-390}" != 0 ] && timeout ${RUN_S:-390} python3 benchmarks/reward_throughput.py --baseline-count 2 --isolation auto ${THROUGHPUT_ARGS:-} \
  --out "$OUT/reward_throughput_auto.json" > "$OUT/reward_throughput_auto.log" 2>&1
echo "throughput rc=$?"; tail -7 "$OUT/reward_throughput_auto.log"
