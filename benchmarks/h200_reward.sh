#!/usr/bin/env bash
# H200 reward stage, one device call (< 10 minutes): isolation probe, reward throughput on fresh
# caches (benchmarks/reward_throughput.py), then the GPU reward suite with default settings.
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_reward.sh", carry=[".whl", ".kb", ".tools"], timeout_s=600)
# Results land in $OUT: reward_throughput.json/.log, gpu_tests.log, env.txt.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet TORCH_CUDA_ARCH_LIST=9.0
export OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi -L; nproc; python3 --version; $OPSYNTH_CCACHE --version | head -1; uname -r; id -u
  python3 -c "from opsynth.runtime.isolation import probe; print('isolation probe:', probe())"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
STAGE=${1:-all}
if [ "$STAGE" = all ] || [ "$STAGE" = throughput ]; then
timeout 400 python3 benchmarks/reward_throughput.py --baseline-count 2 --out "$OUT/reward_throughput.json" > "$OUT/reward_throughput.log" 2>&1
echo "throughput rc=$?"; tail -12 "$OUT/reward_throughput.log"
fi
if [ "$STAGE" = all ] || [ "$STAGE" = tests ]; then
timeout 170 python3 -m pytest -s -v -m gpu tests/reward/test_reward_gpu.py -p no:cacheprovider --timeout 160 --durations=3 > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -16 "$OUT/gpu_tests.log"
fi
