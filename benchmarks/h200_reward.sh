#!/usr/bin/env bash
# H200 reward stage, one device call (< 10 minutes): isolation probe, reward throughput on fresh
# caches (benchmarks/reward_throughput.py), then the GPU reward suite with default settings.
# Stages (first argument): all (throughput + tests), throughput, tests (after the quiet probe's
# readings), quiet (those alone), controls (each attack with its guard off: the attack must pay;
# about 8 minutes for all eight).
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_reward.sh", carry=[".whl", ".kb", ".tools"], timeout_s=600)
# Results land in $OUT: reward_throughput.json/.log, quiet_probe_h200.json/.log, gpu_tests.log, env.txt.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet TORCH_CUDA_ARCH_LIST=9.0
export OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi -L; nproc; python3 --version; $OPSYNTH_CCACHE --version | head -1; uname -r; id -u
  python3 -c "from opsynth.runtime.isolation import probe; print('isolation probe:', probe())"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
STAGE=${1:-all}
if [ "$STAGE" = all ] || [ "$STAGE" = throughput ]; then
timeout ${THROUGHPUT_S:-320} python3 benchmarks/reward_throughput.py --baseline-count 2 --out "$OUT/reward_throughput.json" > "$OUT/reward_throughput.log" 2>&1
echo "throughput rc=$?"; tail -12 "$OUT/reward_throughput.log"
fi
# The suite without its controls took 150 s on 2026-12-03 (the quiet-device cases, added 2026-12-04, add two
# batches with their own builds); each control starts its own server and
# builds in a fresh cache (25-110 s each), so they are a stage of their own (CONTROLS=-k expression).
if [ "$STAGE" = all ] || [ "$STAGE" = tests ] || [ "$STAGE" = quiet ]; then
# the quiet-device probe's idle and busy readings (seconds): what its thresholds must separate
timeout 120 python3 benchmarks/quiet_probe.py --out "$OUT/quiet_probe_h200.json" > "$OUT/quiet_probe.log" 2>&1
echo "quiet probe rc=$?"; tail -8 "$OUT/quiet_probe.log"
fi
if [ "$STAGE" = all ] || [ "$STAGE" = tests ]; then
timeout ${TESTS_S:-420} python3 -m pytest -s -v -m gpu tests/reward/test_reward_gpu.py -k "not gpu_control" -p no:cacheprovider --timeout 230 --durations=3 > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -16 "$OUT/gpu_tests.log"
fi
if [ "$STAGE" = controls ]; then
timeout ${CONTROLS_S:-560} python3 -m pytest -s -v -m gpu tests/reward/test_reward_gpu.py -k "gpu_control and (${CONTROLS:-gpu_control})" -p no:cacheprovider --timeout 200 --durations=8 > "$OUT/gpu_controls.log" 2>&1
echo "gpu controls rc=$?"; grep -E "PASSED|FAILED|without" "$OUT/gpu_controls.log" | cut -c1-200
fi
