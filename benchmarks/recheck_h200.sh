#!/usr/bin/env bash
# Issue 13 on the H200, in one device call of < 10 minutes (after `bash benchmarks/device_wheels.sh` here):
#   run(command="bash benchmarks/recheck_h200.sh", carry=[".whl", ".kb"], timeout_s=600)
# 1. a 520-row cluster=local_cuda generate (cut off at 330 s; past runs made ~110 rows/min), then
# 2. benchmarks/recheck_gpu.py: 60 random rows re-measured in a fresh process (CUDA events, median
#    of 10 after 3 warm-ups; in band, finite, deterministic within tolerance, input-sensitive).
# Results land in $OUT: recheck_h200.json (commit it as benchmarks/results/recheck_h200.json),
# recheck.log, generate.log, and the run's report.json, README.md and state file.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/generate"
DS=/tmp/gen_h200
N=${N_TASKS:-520}
timeout 330 python3 -m pipelines.generate cluster=local_cuda verify=cuda n_tasks=$N \
  output_dir=$DS hydra.run.dir=/tmp/hydra_gen progress=false > "$OUT/generate.log" 2>&1
echo "generate exit code $?"; tail -4 "$OUT/generate.log"
cp $DS/report.json $DS/README.md $DS/.opsynth-state.json "$OUT/generate/" 2>/dev/null
python3 -c "import pyarrow.parquet as pq, glob; print('rows in the folder:', sum(pq.ParquetFile(f).metadata.num_rows for f in glob.glob('$DS/data/*.parquet')))"
timeout 240 python3 benchmarks/recheck_gpu.py $DS --device cuda --sample 60 --warmup 3 --repeats 10 \
  --out "$OUT/recheck_h200.json" > "$OUT/recheck.log" 2>&1
echo "recheck exit code $?"; tail -25 "$OUT/recheck.log"
