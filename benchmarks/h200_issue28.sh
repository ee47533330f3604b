#!/usr/bin/env bash
# H200, one device call (< 10 minutes): issue 28's build and baseline checks.
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_issue28.sh", carry=[".whl", ".tools"], timeout_s=600)
# 1. benchmarks/cli_eval_kb.py: a warm CLI evaluation of a KernelBench-layout CUDA candidate, with
#    reward.light_headers on, then off (about 4 minutes);
# 2. benchmarks/two_caches.py: one candidate in two fresh caches, one beside another build (about 2);
# 3. benchmarks/reward_stability.py --aa, as long as time is left (writes after every batch).
# Results in $OUT: cli_eval_kb_h200.json, two_caches_h200.json, reward_stability_h200.json and logs.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 HF_HUB_OFFLINE=1
[ -x .tools/ccache/ccache ] && export OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
timeout ${CLI_S:-280} python3 benchmarks/cli_eval_kb.py --out "$OUT/cli_eval_kb_h200.json" > "$OUT/cli_eval_kb.log" 2>&1
echo "cli_eval_kb rc=$?"; tail -8 "$OUT/cli_eval_kb.log"
timeout ${TWO_S:-150} python3 benchmarks/two_caches.py --device cuda --out "$OUT/two_caches_h200.json" > "$OUT/two_caches.log" 2>&1
echo "two_caches rc=$?"; tail -6 "$OUT/two_caches.log"
left=$(( ${LIMIT_S:-560} - ($(date +%s) - start) - 20 ))
if [ $left -gt 60 ]; then
  timeout $left python3 benchmarks/reward_stability.py --device cuda --aa --deadline-s $(( left - 40 )) \
    --out "$OUT/reward_stability_h200.json" > "$OUT/reward_stability.log" 2>&1
  echo "stability rc=$?"; tail -20 "$OUT/reward_stability.log"
fi
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
