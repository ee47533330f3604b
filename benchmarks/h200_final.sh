#!/usr/bin/env bash
# One H200 device call (< 10 minutes) for the generate side and the multi-turn trainer:
#   1. benchmarks/generate_throughput.py: a 4.5-minute cluster=local_cuda window (start-up included)
#      and a 30 s fresh-process baseline; its output folder is kept and is the run the next two use;
#   2. benchmarks/recheck_gpu.py: 60 random rows of that folder re-measured in a fresh process;
#   3. benchmarks/train_multiturn_h200.py: a short multi-turn GRPO run on those shards, real CUDA rewards.
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_final.sh", carry=[".whl", ".kb", ".tools"], timeout_s=600)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet TORCH_CUDA_ARCH_LIST=9.0 HF_HUB_OFFLINE=1
export OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/train_multiturn_h200"
timeout 345 python3 benchmarks/generate_throughput.py --minutes 4.5 --baseline-seconds 30 --keep \
  --out "$OUT/generate_throughput.json" > "$OUT/generate_throughput.log" 2>&1
echo "generate_throughput rc=$?"; tail -30 "$OUT/generate_throughput.log"
DS=""
for d in /tmp/opsynth-throughput-*/*/; do [ -d "$d/data" ] && DS=$d && break; done
echo "dataset: $DS"
python3 -c "import pyarrow.parquet as pq, glob; print('rows in the folder:', sum(pq.ParquetFile(f).metadata.num_rows for f in glob.glob('$DS/data/*.parquet')))"
timeout 100 python3 benchmarks/recheck_gpu.py "$DS" --device cuda --sample 60 --warmup 3 --repeats 10 \
  --out "$OUT/recheck_h200.json" > "$OUT/recheck.log" 2>&1
echo "recheck rc=$?"; tail -14 "$OUT/recheck.log"
timeout 125 python3 benchmarks/train_multiturn_h200.py --shards "$DS" --steps 3 --budget-s 80 --out /tmp/tm > "$OUT/train_multiturn.log" 2>&1
echo "train rc=$?"; tail -12 "$OUT/train_multiturn.log"
cp /tmp/tm/per_step.jsonl /tmp/tm/per_turn.json /tmp/tm/summary.json "$OUT/train_multiturn_h200/" 2>/dev/null
