#!/usr/bin/env bash
# H200, one device call (< 10 minutes): benchmarks/reward_throughput.py with the hardened sandbox
# (reward.isolation=auto) and without any (reward.isolation=none), same settings, fresh caches each.
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_sandbox_throughput.sh", carry=[".whl", ".kb", ".tools"], timeout_s=600)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for iso in ${ISOLATIONS:-auto none}; do  # ISOLATIONS=auto: the hardened sandbox alone
  timeout ${RUN_S:-270} python3 benchmarks/reward_throughput.py --baseline-count 2 --isolation $iso \
    --out "$OUT/reward_throughput_$iso.json" > "$OUT/reward_throughput_$iso.log" 2>&1
  echo "isolation=$iso rc=$?"; tail -7 "$OUT/reward_throughput_$iso.log"
done
