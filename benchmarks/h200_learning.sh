#!/usr/bin/env bash
# One H200 device call per arm of benchmarks/train_learning_h200.py (each about 9 minutes, < 9.5: warm
# start ~60-90 s, 380 s of generation rounds (8 tasks x 8 episodes x 2 turns each, 4 optimiser steps
# per round; the first round also measures the 8 tasks' baselines), then two scorings ~85 s):
#   here:   bash benchmarks/device_wheels.sh && bash benchmarks/device_tools.sh
#   device: run(command="bash benchmarks/h200_learning.sh trained", carry=[".whl", ".tools"], timeout_s=600)
#           run(command="bash benchmarks/h200_learning.sh control", carry=[".whl", ".tools"], timeout_s=600)
#   a variant of the trained arm: its name, then its flags (the control, learning rate 0, pairs with any
#   variant that changes only the loss), e.g.
#           run(command="bash benchmarks/h200_learning.sh trained_scored --turn-credit scored", ...)
#           then --summarize DIR --trained-arm trained_scored
#   here:   copy each call's files_at/train_learning/ into benchmarks/results/train_learning_h200/ (untar
#           <arm>_logs.tar there and warm_policy.tar into .warm/), then
#           python benchmarks/train_learning_h200.py --summarize benchmarks/results/train_learning_h200
# The same starting policy for every arm: each call saves its warm-started policy in $OUT/warm_policy/
# (about 3 MB; back as train_learning/warm_policy.tar); unpack that here into .warm/ (ignored: `echo /.warm/ >> .git/info/exclude`) and carry
# ".warm" in the next calls: an arm finding .warm/ starts from it (--warm-start-from) instead of warming
# anew (the GPU's warm start is not bit-reproducible: same seed, 280-345 steps, sampling rate 0.62-0.70,
# first-round reward 0.38-0.59 in four calls of 2026-12-03/04).
set -uo pipefail
arm=${1:-trained}; shift; extra=("$@")
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 HF_HUB_OFFLINE=1
[ -x .tools/ccache/ccache ] && export OPSYNTH_CCACHE=$PWD/.tools/ccache/ccache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/train_learning"
python3 -c "import peft, accelerate, trl; print('peft', peft.__version__, 'accelerate', accelerate.__version__, 'trl', trl.__version__)"
flag=""; [ "$arm" = control ] && flag="--control"
warm=(--save-warm-start "$OUT/warm_policy")
[ -f .warm/smoke_recipe.json ] && { warm+=(--warm-start-from "$PWD/.warm"); echo "starting from the carried warm start (.warm)"; }
timeout 550 python3 benchmarks/train_learning_h200.py --out "$OUT/train_learning" --arm "$arm" $flag "${warm[@]}" "${extra[@]}" > "$OUT/train_learning/$arm.log" 2>&1
echo "$arm rc=$?"; tail -40 "$OUT/train_learning/$arm.log"
# What comes back: at most 8 files, no deeper than $OUT/a/b/file (2026-12-04: the control's warm
# policy, 6 files more, was left behind). So: <arm>.json, <arm>.log, the two scorings, the run's three
# logs in one tar, the warm-started policy in one tar (unpack it here into .warm/), the GPU's name.
tar -C "$OUT/train_learning/$arm/run" -cf "$OUT/train_learning/${arm}_logs.tar" evaluations-rank0.jsonl metrics.jsonl rollouts-rank0.jsonl 2>/dev/null
for k in heldout trained_tasks; do cp "$OUT/train_learning/$arm/score_$k/score.json" "$OUT/train_learning/${arm}_score_$k.json" 2>/dev/null; done
[ -d "$OUT/warm_policy" ] && tar -C "$OUT/warm_policy" -cf "$OUT/train_learning/warm_policy.tar" . && rm -rf "$OUT/warm_policy"
rm -rf "$OUT/train_learning/$arm"
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/train_learning/gpu_name.txt"
ls -la "$OUT/train_learning"
