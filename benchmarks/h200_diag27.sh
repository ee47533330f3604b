#!/usr/bin/env bash
# H200, one device call: are the warm start's CUDA programs judged correct there
# (benchmarks/warm_start_programs.py, issue 27), then sizing's predicted peak memory against the
# measured one (benchmarks/peak_memory.py, issue 29: what verify.mem_safety must cover).
#   device: run(command="bash benchmarks/h200_diag27.sh", carry=[".whl", ".tools"], timeout_s=600)
set -uo pipefail
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 HF_HUB_OFFLINE=1
[ -x .tools/ccache/ccache ] && export OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 200 python3 benchmarks/warm_start_programs.py --device cuda --n ${N_PROGRAMS:-24} \
  --out "$OUT/warm_start_programs_h200.json" > "$OUT/warm_start_programs_h200.log" 2>&1
echo "warm_start_programs rc=$? at ${SECONDS}s"; tail -40 "$OUT/warm_start_programs_h200.log"
timeout $(( ${LIMIT_S:-540} - SECONDS )) python3 benchmarks/peak_memory.py --device cuda --n ${N_MEM:-200} --workers 4 \
  --out "$OUT/peak_memory_h200.json" > "$OUT/peak_memory_h200.log" 2>&1
echo "peak_memory rc=$? at ${SECONDS}s"; tail -4 "$OUT/peak_memory_h200.log"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
