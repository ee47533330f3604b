#!/usr/bin/env bash
# Issue 29 on the H200, one device call (< 10 minutes): the generate window of
# benchmarks/generate_throughput.py (cluster=local_cuda verify=cuda, quiet timing on), MINUTES of wall
# from the window process's start, so the sustained part after start-up (about 50 s) is >= 7 minutes.
#   here:   bash benchmarks/device_wheels.sh
#   device: run(command="bash benchmarks/h200_generate_window.sh", carry=[".whl", ".kb"], timeout_s=600)
# Results in $OUT: generate_throughput_h200.json (rewritten every 10 s: partial until done), .log, gpu_name.txt,
# window_rows.tar (the window's output folder: its rows for the mixture and benchmarks/recheck_gpu.py).
# RECHECK=N: then benchmarks/recheck_gpu.py on N random rows of the window in a fresh process (about 30 s for
# 100 rows; leave it room: MINUTES=7.5) -> recheck_window_h200.json, recheck.log.
set -uo pipefail
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
timeout ${LIMIT_S:-565} python3 benchmarks/generate_throughput.py --minutes ${MINUTES:-8.1} --baseline-seconds 0 --keep \
  --out "$OUT/generate_throughput_h200.json" ${GEN_ARGS:-} > "$OUT/generate_throughput_h200.log" 2>&1
echo "generate_throughput rc=$?"; tail -45 "$OUT/generate_throughput_h200.log"
# the window's rows (data/*.parquet, report, state), one file: for the mixture here and a later quiet re-check
w=$(ls -d /tmp/opsynth-throughput-*/window 2>/dev/null | head -1)
[ -n "$w" ] && tar -C "$w" --ignore-failed-read -cf "$OUT/window_rows.tar" data README.md report.json .opsynth-state.json&& echo "window rows: $(du -sh "$OUT/window_rows.tar")"
if [ -n "${RECHECK:-}" ] && [ -n "$w" ]; then
  timeout $(( ${CALL_S:-590} - SECONDS )) python3 benchmarks/recheck_gpu.py "$w" --device cuda --sample "$RECHECK" \
    --warmup 3 --repeats 10 --out "$OUT/recheck_window_h200.json" > "$OUT/recheck.log" 2>&1
  echo "recheck exit code $? at ${SECONDS}s"; tail -25 "$OUT/recheck.log"
fi
