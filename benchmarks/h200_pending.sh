#!/usr/bin/env bash
# The H200 work still open (issue 6's throughput), in device calls of < 10 minutes each:
#   run(command="bash benchmarks/h200_pending.sh reward", carry=[".whl", ".kb"], timeout_s=600)
#   run(command="bash benchmarks/h200_pending.sh throughput", carry=[".whl", ".kb"], timeout_s=600)
# after `bash benchmarks/device_wheels.sh` here. Results land in $OUT; commit them under
# benchmarks/results/ (reward_throughput.json, reward_throughput_heavy.json, build_cost_h200.json,
# reward_gpu_tests_h200_run3.log).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet TORCH_CUDA_ARCH_LIST=9.0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/train_h200"
STAGE=${1:-reward}   # reward | throughput | both (throughput, then reward's GPU tests) | train | all (all: more than one call's 10 minutes)
if [ "$STAGE" = all ] || [ "$STAGE" = throughput ] || [ "$STAGE" = both ]; then
# Reward evaluations per minute, overlapped vs one at a time. Light: the layout the policy brief asks
# for (torch-free .cu, C++ wrapper on the shared PCH); heavy: torch headers in the .cu.
# 2026-12-01: light, 48 candidates, separate build children (--prebuild yes, then the default): 12.15/min
# overlapped vs 2.04 one at a time (results/reward_throughput.json). Now the default on cuda is one child
# per candidate (build, then measure, one per core): a run cut off by the device budget saw its first 7
# results 28-32 s into the batch (results/reward_throughput_h200_noprebuild_cutoff.*). Needs ~300 s.
timeout 420 python3 benchmarks/reward_throughput.py --styles light --count 48 --baseline-count 3 --out "$OUT/reward_throughput.json" > "$OUT/reward_throughput.log" 2>&1
tail -40 "$OUT/reward_throughput.log"
fi
if [ "$STAGE" = all ] || [ "$STAGE" = reward ] || [ "$STAGE" = both ]; then
# 1. reward environment on CUDA: adversarial and good candidates (passed 10/10 on 2026-11-30: benchmarks/results/reward_gpu_tests_h200*.log)
# (-s shows each candidate's verdict as the module fixture computes them; all share one nvcc build)
timeout 290 python3 -m pytest -s -v -m gpu tests/reward/test_reward_gpu.py -p no:cacheprovider --timeout 280 --durations=3 > "$OUT/gpu_tests.log" 2>&1
tail -14 "$OUT/gpu_tests.log"
[ "$STAGE" = both ] && exit 0
# 2. what one build costs by part, with this host's nvcc (CPU work; light vs heavy .cu, PCH or not)
timeout 250 python3 benchmarks/build_cost.py --repeats 1 --out "$OUT/build_cost_h200.json" 2>&1 | tail -8
fi
if [ "$STAGE" = all ] || [ "$STAGE" = train ]; then
# 3. a few accepted tasks on the GPU, then a short GRPO run on them (bandit run: real CUDA rewards)
timeout 90 python3 -m pipelines.generate cluster=local_cuda cluster.threads_per_worker=14 verify=cuda n_tasks=40 \
  output_dir=/tmp/gen progress=false 2>&1 | tail -3
timeout 170 python3 benchmarks/train_h200.py --shards /tmp/gen --steps 2 --out /tmp/train_h200 2>&1 | tail -15
cp /tmp/train_h200/metrics.jsonl /tmp/train_h200/summary.json "$OUT/train_h200/" 2>/dev/null
fi
