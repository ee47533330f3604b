#!/usr/bin/env bash
# H200, one device call (< 10 minutes): generate >= 500 rows on the GPU and audit them (issue 25).
# Resumable: the folder lives in /tmp on the device, so while the machine is warm a second call with
# the same command finishes the generation (the run resumes from its state file) and then audits.
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_audit.sh", carry=[".whl", ".kb", ".tools"], timeout_s=600)
set -uo pipefail
SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPSYNTH_KERNELBENCH=$PWD/.kb/kernelbench.parquet TORCH_CUDA_ARCH_LIST=9.0 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
N=${N_TASKS:-500}
timeout ${LIMIT_S:-540} python3 benchmarks/audit_run.py --n-tasks "$N" --folder /tmp/audit-run-$N \
  --out "$OUT/audit_run_h200.json" > "$OUT/audit_run_h200.log" 2>&1
echo "audit_run rc=$? at ${SECONDS}s"; tail -30 "$OUT/audit_run_h200.log"
for f in summary.json card.md README.md; do [ -f /tmp/audit-run-$N/$f ] && cp /tmp/audit-run-$N/$f "$OUT/generate_$f"; done
[ -d /tmp/audit-run-$N/audit ] && cp /tmp/audit-run-$N/audit/audit.json /tmp/audit-run-$N/audit/verdicts.parquet "$OUT/" 2>/dev/null
python3 - "$OUT/verdicts.parquet" <<'PY' 2>/dev/null || true
import sys, collections, pyarrow.parquet as pq
v = pq.read_table(sys.argv[1]).to_pylist()
by = collections.defaultdict(list)
for r in v:
    if r["reason"]:
        by[r["reason"]].append(r)
for reason, rs in by.items():
    print(f"{reason}: {len(rs)}; first: {(rs[0]['detail'] or '')[:300]}")
PY
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
exit 0
