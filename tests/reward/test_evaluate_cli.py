"""`python -m pipelines.evaluate`: a reward of -1 is a result (exit 0); a task or candidate that cannot
be read or run is the caller's error (one line on stderr, exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHAIN = REPO / "tests" / "reward" / "candidates" / "tasks" / "chain.py"


def _run(*args: str):
    return subprocess.run([sys.executable, "-m", "pipelines.evaluate", *args, "reward.device=cpu"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def _one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr[-2000:]
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_candidate_file_is_a_usage_error(tmp_path):
    _one_line_error(_run(f"task={CHAIN}", f"candidate={tmp_path / 'nope.py'}"), "candidate=", "no such file")


def test_missing_task_file_is_a_usage_error(tmp_path):
    _one_line_error(_run(f"task={tmp_path / 'nope.py'}", f"candidate={CHAIN}"), "task=", "no such file")


def test_task_with_a_syntax_error_names_it(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("class Model(nn.Module:\n    pass\n")
    _one_line_error(_run(f"task={bad}", f"candidate={CHAIN}"), "SyntaxError", "line 1")


def test_task_missing_the_contract_names_what_is_missing(tmp_path):
    t = tmp_path / "t.py"
    t.write_text("import torch\nx = 1\n")
    _one_line_error(_run(f"task={t}", f"candidate={CHAIN}"), "Model", "get_inputs")


def test_a_candidate_without_code_is_a_result_not_an_error(tmp_path):
    c = tmp_path / "completion.txt"
    c.write_text("I would fuse these two operators, but here is no code.\n")
    p = _run(f"task={CHAIN}", f"candidate={c}")
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["reward"] == -1 and out["reason"] == "no_code"


def test_a_misspelled_reward_setting_suggests_the_right_one():
    _one_line_error(_run(f"task={CHAIN}", f"candidate={CHAIN}", "reward.isolaton=none"), "isolaton", "isolation")


def test_an_evaluator_that_cannot_confine_children_refuses_in_one_line(tmp_path):
    """No libseccomp here (pointed at a missing library): one line naming it, exit 2, nothing evaluated;
    reward.isolation=none is the stated way out."""
    import os

    fast = REPO / "tests" / "reward" / "candidates" / "cpu" / "fast.py"
    env = {**os.environ, "OPSYNTH_LIBSECCOMP": str(tmp_path / "no-libseccomp.so.2"), "OPSYNTH_RL_CACHE": str(tmp_path / "c")}
    p = subprocess.run([sys.executable, "-m", "pipelines.evaluate", f"task={CHAIN}", f"candidate={fast}", "reward.device=cpu"],
                       capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    _one_line_error(p, "cannot sandbox", "libseccomp", "reward.isolation=none")
    assert not (tmp_path / "c" / "ext").exists() or not any((tmp_path / "c" / "ext").iterdir())


def test_a_candidates_try_except_fallback_is_its_verdict_not_the_tasks_failure(tmp_path):
    """`fallback` is a verdict on the program (reward -1, exit 0); only the task's own failures
    (task_*) are the caller's error. (Its reason used to be `reference_fallback`, which the command
    took for "the task does not run".)"""
    c = tmp_path / "fallback.py"
    c.write_text((REPO / "tests" / "reward" / "candidates" / "cpu" / "ext_prelude.py").read_text() + "\n"
                 + (REPO / "tests" / "reward" / "candidates" / "cpu" / "fallback.py").read_text())
    p = _run(f"task={CHAIN}", f"candidate={c}")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "error:" not in p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["reward"] == -1 and out["reason"] == "fallback", out


def test_reward_device_cuda_without_a_gpu_is_said_in_one_line(tmp_path):
    """Not reward -1 `crashed` for every candidate: the setting cannot work on this machine."""
    import os

    c = tmp_path / "fast.py"
    c.write_text((REPO / "tests" / "reward" / "candidates" / "cpu" / "ext_prelude.py").read_text() + "\n"
                 + (REPO / "tests" / "reward" / "candidates" / "cpu" / "fast.py").read_text())
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, also on a GPU machine
    p = subprocess.run([sys.executable, "-m", "pipelines.evaluate", f"task={CHAIN}", f"candidate={c}",
                        "reward.device=cuda", f"hydra.run.dir={tmp_path / 'hydra'}"],
                       capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    _one_line_error(p, "reward.device=cuda", "no GPU")
    assert p.stdout.strip() == ""
