#!/usr/bin/env bash
# Wheels the H200 image lacks (it has torch, transformers, accelerate, pyarrow 25, ...; see
# ../.library/device/KINDS.md). Run here, then carry .whl (and .kb, a copy of the KernelBench
# Parquet for dedup=offline) to the device. Seen to install and import there on 2026-11-30.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .kb .git/info && touch .git/info/exclude
grep -qx "/.whl/" .git/info/exclude || echo "/.whl/" >> .git/info/exclude
grep -qx "/.kb/" .git/info/exclude || echo "/.kb/" >> .git/info/exclude
cp "${OPSYNTH_KERNELBENCH:-../shared/kernelbench/kernelbench.parquet}" .kb/kernelbench.parquet
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl dask==2026.8.0 distributed==2026.8.0 hydra-core==1.3.8 omegaconf==2.3.1 \
  datasets==5.2.0 datasketch==2.0.0 trl==1.16.0 tblib zict locket partd tornado dill==0.4.1 multiprocess==0.70.19 \
  pyseccomp==0.1.2
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # sdist only on PyPI
du -sh .whl
