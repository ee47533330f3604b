#!/usr/bin/env bash
# H200, one device call (< 10 minutes): the GPU reward suite with the 2026 hacking classes (JSON report
# with each candidate's time). On 2026-12-02 the suite needed more than 420 s (24 of 30 done, the six
# controls not reached), so it has the whole call now; the sandbox A/B is h200_sandbox_throughput.sh.
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_hacks.sh", carry=[".whl", ".kb", ".tools"], timeout_s=600)
set -uo pipefail
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export OPSYNTH_GPU_HACKS_REPORT=$OUT/reward_hacks_gpu.json
timeout 540 python3 -m pytest -s -v -m gpu tests/reward/test_reward_gpu.py -p no:cacheprovider --timeout 530 --durations=8 > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at ${SECONDS}s"; grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | tail -40
