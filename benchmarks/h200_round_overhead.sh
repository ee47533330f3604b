#!/usr/bin/env bash
# H200, one device call (about 3 minutes): where a timed round's harness time goes (issue 28), and the
# one-transfer fingerprints checked value for value against the old functions on CUDA.
#   here:   bash benchmarks/device_wheels.sh
#   device: run(command="bash benchmarks/h200_round_overhead.sh", carry=[".whl"], timeout_s=600)
# 1. the CUDA tests of tests/reward/test_timed_inputs_one_transfer.py (bit-identical values, one sync);
# 2. benchmarks/round_overhead.py --device cuda (about a minute; writes its JSON after every task).
# Results in $OUT: round_overhead_cuda.json/.log, one_transfer_tests.log, gpu_name.txt.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
timeout ${TEST_S:-120} python3 -m pytest -q -p no:cacheprovider tests/reward/test_timed_inputs_one_transfer.py > "$OUT/one_transfer_tests.log" 2>&1
echo "one_transfer tests rc=$?"; grep -E "passed|failed|error" "$OUT/one_transfer_tests.log" | tail -3
timeout ${BENCH_S:-180} python3 benchmarks/round_overhead.py --device cuda --out "$OUT/round_overhead_cuda.json" > "$OUT/round_overhead_cuda.log" 2>&1
echo "round_overhead rc=$?"; tail -80 "$OUT/round_overhead_cuda.log"
