"""Fork servers started ahead of the first evaluation (opsynth.reward.servers.prestart), and a package
import that leaves torch for later so that the start can come first.

The command line's `evaluate` on a cold process waited for its fork servers after its own imports
(5 s on the H200 before `evaluate()` began, then the servers' start). It now starts them before it
imports torch; that the evaluation then finds them started is tested with the servers
(`tests/runtime/test_fork_servers.py`).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CANDS = Path(__file__).parent / "candidates"


def _python(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_the_package_and_its_config_import_without_torch_and_evaluate_stays_the_function():
    out = _python("""
        import sys
        import opsynth.reward
        from opsynth.reward import RewardConfig, extract_candidate
        import opsynth.reward.servers
        print("torch before:", "torch" in sys.modules)
        from opsynth.reward import evaluate, evaluate_many
        import opsynth.reward.evaluate  # the submodule, bound on its package by the import system
        from opsynth.reward import evaluate as again
        print("function:", callable(evaluate) and again is evaluate and opsynth.reward.evaluate is evaluate
              and type(evaluate).__name__ == "function")
        import importlib
        print("module:", type(importlib.import_module("opsynth.reward.evaluate")).__name__)
    """)
    assert "torch before: False" in out, out
    assert "function: True" in out, out
    assert "module: module" in out, out


def test_the_command_line_starts_the_servers_before_it_imports_torch(tmp_path):
    """pipelines.evaluate's reward mode: prestart is called while torch is still unimported (stubbed
    here to record that and stop the run)."""
    cand = tmp_path / "cand.py"
    cand.write_text("class ModelNew: pass\n")
    out = _python(f"""
        import sys
        import opsynth.reward.servers as servers

        def stub(cfg):
            print("torch at prestart:", "torch" in sys.modules, flush=True)
            raise SystemExit(0)

        servers.prestart = stub
        import pipelines.evaluate as pe
        pe._reward({{"task": {str(CANDS / 'tasks' / 'chain.py')!r}, "candidate": {str(cand)!r}, "reward": {{"device": "cpu"}}}})
    """)
    assert "torch at prestart: False" in out, out
