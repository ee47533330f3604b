"""The suite's own promise (README, Tests): tests that read KernelBench skip when the reference is
absent, except in CI (CI=true), where its absence is an error instead of silent skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBE = "tests/render/test_render_parse.py::test_all_kernelbench_problems_parse"  # reads the reference


def _run_probe(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(OPSYNTH_KERNELBENCH=str(tmp_path / "absent.parquet"), PYTHONPATH=str(REPO))
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", PROBE],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("ci,want_rc,want", [(None, 0, "1 skipped"), ("true", 1, "1 error")])
def test_a_missing_kernelbench_skips_locally_and_errors_in_ci(tmp_path, ci, want_rc, want):
    proc = _run_probe(tmp_path, ci)
    assert proc.returncode == want_rc, proc.stdout[-2000:]
    assert want in proc.stdout and "KernelBench reference not found" in proc.stdout
