#!/usr/bin/env bash
# H200, one device call (< 10 minutes): issue 28's stability benchmark with the given flags, e.g.
#   device: run(command="bash benchmarks/h200_stability.sh --bs 131072 --serial", carry=[".whl", ".tools"], timeout_s=600)
# Each evaluation now records `host_ms` (the claim's part beyond the device's clock: launch, event
# records, the sync's wake-up) beside its ratio, so a flip can be told apart: host time that load
# stretches, or the device's own time. --bs picks the task's size (default 16384: eager ~0.45 ms;
# 131072: ~3.6 ms, inside Ops-6K's 1-100 ms); --serial keeps the batch's candidates off each other.
# Results in $OUT: reward_stability_h200.json (written after every batch), reward_stability.log, gpu_name.txt.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 HF_HUB_OFFLINE=1
[ -x .tools/ccache/ccache ] && export OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
left=${LIMIT_S:-540}
timeout $left python3 benchmarks/reward_stability.py --device cuda --deadline-s $(( left - 60 )) "$@" \
  --out "$OUT/reward_stability_h200.json" > "$OUT/reward_stability.log" 2>&1
echo "stability rc=$?"; tail -30 "$OUT/reward_stability.log"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
