#!/usr/bin/env bash
# Issue 29 on the H200, one device call (< 10 minutes): a cluster=local_cuda generate with the
# verifier's quiet timing (verify.quiet_timing, default on: a timed call has the device to itself),
# cut off at GEN_S, then benchmarks/recheck_gpu.py on SAMPLE random rows in a fresh process on the
# quiet GPU: pass share and the quiet / row eager_ms ratio (before: median 0.727, recheck_h200.json).
#   here:   bash benchmarks/device_wheels.sh
#   device: run(command="bash benchmarks/h200_quiet_recheck.sh", carry=[".whl", ".kb"], timeout_s=600)
set -uo pipefail
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/generate"
DS=/tmp/gen_quiet
timeout ${GEN_S:-300} python3 -m pipelines.generate cluster=local_cuda verify=cuda n_tasks=${N_TASKS:-1000} \
  output_dir=$DS hydra.run.dir=/tmp/hydra_gen progress=false ${GEN_ARGS:-} > "$OUT/generate.log" 2>&1
echo "generate exit code $? at ${SECONDS}s"; tail -4 "$OUT/generate.log"
cp $DS/report.json $DS/README.md $DS/.opsynth-state.json "$OUT/generate/" 2>/dev/null
python3 -c "import pyarrow.parquet as pq, glob; print('rows in the folder:', sum(pq.ParquetFile(f).metadata.num_rows for f in glob.glob('$DS/data/*.parquet')))"
timeout $(( ${LIMIT_S:-560} - SECONDS )) python3 benchmarks/recheck_gpu.py $DS --device cuda --sample ${SAMPLE:-100} \
  --warmup 3 --repeats 10 --out "$OUT/recheck_quiet_h200.json" > "$OUT/recheck.log" 2>&1
echo "recheck exit code $? at ${SECONDS}s"; tail -25 "$OUT/recheck.log"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
