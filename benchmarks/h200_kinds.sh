#!/usr/bin/env bash
# H200, one device call (< 10 minutes) for issue 26: a mixed-precision, forward+backward generate run
# (benchmarks/generate_dtypes.py, >= 200 rows, time-boxed) and the GPU reward suite for bf16 and
# backward CUDA candidates (tests/reward/test_reward_kinds_gpu.py, its results as JSON).
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_kinds.sh", carry=[".whl", ".kb", ".tools"], timeout_s=600)
set -uo pipefail
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet TORCH_CUDA_ARCH_LIST=9.0 HF_HUB_OFFLINE=1
[ -x .tools/ccache/ccache ] && export OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
OPSYNTH_KINDS_GPU_JSON=$OUT/reward_kinds_gpu_h200.json timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/reward/test_reward_kinds_gpu.py -s > "$OUT/reward_kinds_gpu_h200.log" 2>&1
echo "reward kinds suite rc=$? at ${SECONDS}s"; grep -E "passed|failed|error" "$OUT/reward_kinds_gpu_h200.log" | tail -3
timeout $(( ${LIMIT_S:-560} - SECONDS )) python3 benchmarks/generate_dtypes.py --device cuda --n-tasks ${N_TASKS:-240} \
  --minutes $(python3 -c "print(round((${LIMIT_S:-560} - $SECONDS - 40) / 60, 2))") --out "$OUT/generate_dtypes_h200.json" \
  > "$OUT/generate_dtypes_h200.log" 2>&1
echo "generate_dtypes rc=$? at ${SECONDS}s"; tail -25 "$OUT/generate_dtypes_h200.log"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
exit 0
