#!/usr/bin/env bash
# The H200 work still open after session 1 (issues 6 and 7), in one device call of < 10 minutes:
#   run(command="bash benchmarks/h200_pending.sh", carry=[".whl", ".kb"], timeout_s=600)
# after `bash benchmarks/device_wheels.sh` here. Results land in $OUT; commit them under
# benchmarks/results/ (reward_throughput.json, train_h200/).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet TORCH_CUDA_ARCH_LIST=9.0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/train_h200"
STAGE=${1:-all}   # all | reward | train | train+throughput (two calls leave room to fix the second after the first)
if [ "$STAGE" = all ] || [ "$STAGE" = reward ]; then
# 1. reward environment on CUDA: adversarial and good candidates (passed 10/10 on 2026-11-30: benchmarks/results/reward_gpu_tests_h200*.log)
# (-s shows each candidate's verdict as the module fixture computes them; all share one nvcc build)
timeout 200 python3 -m pytest -s -v -m gpu tests/rl/test_reward_gpu.py -p no:cacheprovider --timeout 190 --durations=3 > "$OUT/gpu_tests.log" 2>&1
tail -14 "$OUT/gpu_tests.log"
# 2. reward evaluations per minute, overlapped vs one at a time
timeout 330 python3 benchmarks/reward_throughput.py --count 16 --baseline-count 2 --out "$OUT/reward_throughput.json" 2>&1 | tail -20
fi
if [ "$STAGE" != reward ]; then  # all, train, train+throughput
# 3. a few accepted tasks on the GPU, then a short GRPO run on them (bandit run: real CUDA rewards)
timeout 90 python3 -m pipelines.generate cluster=local_cuda cluster.threads_per_worker=14 verify=cuda n_tasks=40 \
  output_dir=/tmp/gen progress=false 2>&1 | tail -3
timeout 170 python3 benchmarks/train_h200.py --shards /tmp/gen --steps 2 --out /tmp/train_h200 2>&1 | tail -15
cp /tmp/train_h200/metrics.jsonl /tmp/train_h200/summary.json "$OUT/train_h200/" 2>/dev/null
fi
if [ "$STAGE" = train+throughput ]; then
timeout 250 python3 benchmarks/reward_throughput.py --count 16 --baseline-count 1 --build-workers 16 --out "$OUT/reward_throughput.json" 2>&1 | tail -12
fi
