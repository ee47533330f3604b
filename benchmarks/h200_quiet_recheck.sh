#!/usr/bin/env bash
# Issue 29 on the H200: a cluster=local_cuda verify=cuda generate of N_TASKS rows with the verifier's
# quiet timing, then benchmarks/recheck_gpu.py on SAMPLE random rows in a fresh process on the quiet
# GPU: pass share and the quiet / row eager_ms ratio (before quiet timing: median 0.727, recheck_h200.json).
# A 1,000-row run takes longer than one device call (about 103 accepted/min sustained on 2026-12-03),
# so it spans calls: each call resumes the run from `.gen/` (carried: the last call's gen_rows.tar
# unpacked there), stops it with SIGINT (Ctrl-C: the rows are kept and the same command resumes) at
# GEN_S, and returns the folder as $OUT/gen_rows.tar; the re-check runs once the run is complete.
#   here:   bash benchmarks/device_wheels.sh; mkdir -p .gen; echo /.gen/ >> .git/info/exclude
#   device: run(command="bash benchmarks/h200_quiet_recheck.sh", carry=[".whl", ".kb", ".gen"], timeout_s=600)
#   here:   rm -rf .gen && mkdir .gen && tar -C .gen -xf <files_at>/gen_rows.tar   (then the next call)
# GEN_ARGS are Hydra overrides (not generate_throughput.py's --override), e.g. the 16-in-flight H100/H200 setting:
#   GEN_ARGS="cluster.threads_per_worker=16 verify.n_workers=16"; GEN_S: seconds before the SIGINT stop (480),
#   LIMIT_S: the call's budget the re-check must end within (560). 2026-12-07 (H100): 1,000 rows took 458 s + 48 s;
#   with verify.split_by_source (now the GPU default) 338 s, the re-check in the same call (376 s in all).
set -uo pipefail
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
N=${N_TASKS:-1000}
DS=/tmp/gen_quiet; rm -rf $DS; mkdir -p $DS
[ -d .gen ] && cp -a .gen/. $DS/ && echo "resuming from .gen: $(ls $DS/data 2>/dev/null | wc -l) shard(s)"
rows() { python3 -c "import pyarrow.parquet as pq, glob; print(sum(pq.ParquetFile(f).metadata.num_rows for f in glob.glob('$DS/data/*.parquet')))"; }
if [ "$(rows)" -lt "$N" ]; then
  timeout -s INT -k 30 ${GEN_S:-480} python3 -m pipelines.generate cluster=local_cuda verify=cuda n_tasks=$N \
    output_dir=$DS hydra.run.dir=/tmp/hydra_gen progress=false ${GEN_ARGS:-} >> "$OUT/generate.log" 2>&1
  echo "generate exit code $? at ${SECONDS}s"; tail -4 "$OUT/generate.log"
fi
have=$(rows); echo "rows in the folder: $have of $N"
# the mixture so far and why each slot's candidates were rejected (the state file: written by a stopped run too)
python3 -c "import json; s=json.load(open('$DS/.opsynth-state.json'))['stats']; q=s.get('mixture_quota') or {}; print('slots', json.dumps(q.get('rows')), 'of', json.dumps(q.get('quotas')), 'given up', q.get('given_up')); print('rejected_by_slot', json.dumps(s.get('rejected_by_slot'))); print('compile_deferrals', json.dumps(s.get('compile_deferrals')))" 2>/dev/null
tar -C $DS --ignore-failed-read -cf "$OUT/gen_rows.tar" data README.md report.json .opsynth-state.json 2>/dev/null
cp $DS/report.json "$OUT/" 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
if [ "$have" -ge "$N" ] || [ -n "${RECHECK:-}" ]; then
  timeout $(( ${LIMIT_S:-560} - SECONDS )) python3 benchmarks/recheck_gpu.py $DS --device cuda --sample ${SAMPLE:-100} \
    --warmup 3 --repeats 10 --out "$OUT/recheck_quiet_h200.json" > "$OUT/recheck.log" 2>&1
  echo "recheck exit code $? at ${SECONDS}s"; tail -25 "$OUT/recheck.log"
fi
