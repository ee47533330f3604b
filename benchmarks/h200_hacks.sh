#!/usr/bin/env bash
# H200, one device call (< 10 minutes): the GPU reward suite with the 2026 hacking classes (JSON report
# with each candidate's time), then, if time is left, a short reward-throughput A/B of the hardened
# sandbox against none in the opposite order of h200_sandbox_throughput.sh.
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_hacks.sh", carry=[".whl", ".kb", ".tools"], timeout_s=600)
set -uo pipefail
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export OPSYNTH_GPU_HACKS_REPORT=$OUT/reward_hacks_gpu.json
timeout 420 python3 -m pytest -s -v -m gpu tests/reward/test_reward_gpu.py -p no:cacheprovider --timeout 410 --durations=8 > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at ${SECONDS}s"; grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | tail -40
left=$((560 - SECONDS))
if [ $left -gt 120 ]; then
  per=$((left / 2 - 5))
  for iso in none auto; do
    timeout $per python3 benchmarks/reward_throughput.py --count 24 --baseline-count 1 --isolation $iso \
      --out "$OUT/reward_throughput_ab_$iso.json" > "$OUT/reward_throughput_ab_$iso.log" 2>&1
    echo "A/B isolation=$iso rc=$? (limit ${per}s)"; grep -E "^\[(distinct|one_at_a_time|group)\] " "$OUT/reward_throughput_ab_$iso.log"
  done
fi
