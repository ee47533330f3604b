#!/usr/bin/env bash
# H200, one device call (< 10 minutes): is the hardened sandbox accepted on this machine's kernel
# (namespaces, capability drop, no_new_privs, seccomp filter, unprivileged uid), and do the GPU
# reward suite and the sandbox door tests for a CUDA candidate pass with it?
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_sandbox.sh", carry=[".whl", ".kb", ".tools"], timeout_s=600)
# Results land in $OUT: env.txt, gpu_tests.log, gpu_doors.log.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import ctypes.util, sys; sys.exit(0 if ctypes.util.find_library('seccomp') else 1)" \
  || export OPSYNTH_LIBSECCOMP=$PWD/.tools/lib/libseccomp.so.2
{ nvidia-smi -L; uname -r; id; nproc; ldconfig -p | grep -i seccomp; echo "OPSYNTH_LIBSECCOMP=${OPSYNTH_LIBSECCOMP:-}"
  python3 -c "from opsynth.runtime.isolation import probe; print('isolation probe:', probe())"
  python3 - <<'PY'
import os, tempfile, json
from opsynth.runtime import isolation, privileges
s = tempfile.mkdtemp(); ids = (2000000001, 2000000001); os.chown(s, *ids)
pid = os.fork()
if pid == 0:
    try:
        isolation.enter([s], readable=isolation.readable_paths(), ids=ids)
        import torch
        x = torch.ones(4, device="cuda"); torch.cuda.synchronize()
        print("confined child:", json.dumps(privileges.status()), "cuda sum", float(x.sum()))
    except BaseException as e:
        print("confined child failed:", type(e).__name__, e)
    os._exit(0)
os.waitpid(pid, 0)
PY
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 230 python3 -m pytest -s -v -m gpu tests/reward/test_reward_gpu.py -p no:cacheprovider --timeout 220 --durations=5 > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -16 "$OUT/gpu_tests.log"
timeout 250 python3 -m pytest -v -m gpu tests/runtime/test_sandbox_doors.py -p no:cacheprovider --timeout 240 --durations=3 > "$OUT/gpu_doors.log" 2>&1
echo "gpu doors rc=$?"; tail -12 "$OUT/gpu_doors.log"
