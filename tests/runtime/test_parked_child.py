"""Parked children (opsynth.runtime.sandbox.ParkedChild): forked and confined before their job exists,
prepared (`module.prewarm`), then given exactly one job.

What a user of the reward relies on: the job a parked child runs is the one written at `run` (not
anything that was in its scratch when it was forked), its preparation happened before that, it is as
confined as a child forked for the job, it never runs a second job, and one never used dies with its
pool instead of lingering.
"""

from __future__ import annotations

import os
import textwrap
import time
import types

import psutil
import pytest

from opsynth.runtime import sandbox

pytestmark = pytest.mark.timeout(300)

RUNNER = textwrap.dedent("""
    import json, os, time
    STATE = {}

    def prewarm(args):
        STATE.update(args=args, at=time.time(), pid=os.getpid())

    def run(job):
        out = {"reason": "ok", "prewarm": STATE.get("args"), "prewarm_at": STATE.get("at"), "marker": job["marker"],
               "same_process": STATE.get("pid") == os.getpid(), "stdin": os.read(0, 100).decode()}
        try:
            with open(job["outside"], "w") as f:
                f.write("x")
            out["wrote_outside"] = True
        except OSError:
            out["wrote_outside"] = False
        return out
""")


@pytest.fixture
def runner_env(tmp_path, monkeypatch):
    """The runner importable by the fork server's children (a server of its own: the env differs)."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "park_probe_runner.py").write_text(RUNNER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(mods), os.environ.get("PYTHONPATH", "")]))
    cfg = types.SimpleNamespace(isolation="auto", resolved_cache_dir=lambda: tmp_path / "cache")
    (tmp_path / "cache").mkdir()
    yield cfg
    sandbox.shutdown_servers()


def _parked(tmp_path, cfg, name="s"):
    scratch = tmp_path / name
    scratch.mkdir()
    return sandbox.ParkedChild("park_probe_runner", scratch, cfg, warm=("park_probe_runner",), prewarm={"device": "cpu", "n": 7})


def test_a_parked_child_prepares_first_then_runs_the_job_written_at_run(tmp_path, runner_env):
    child = _parked(tmp_path, runner_env)
    time.sleep(0.5)
    assert child.alive()
    # Written after the fork: what the child runs is what `run` hands it, read only after the go byte.
    outside = tmp_path / "outside.txt"
    t_release = time.time()
    job = {"result_path": str(child.scratch / "result.json"), "marker": "job-42", "outside": str(outside)}
    res = child.run(job, 60, stdin_bytes=b"inputs")
    assert res.reason == "ok", res.log
    d = res.data
    assert d["prewarm"] == {"device": "cpu", "n": 7} and d["same_process"]
    assert d["prewarm_at"] < t_release  # prepared while parked, not on the job's clock
    assert d["marker"] == "job-42" and d["stdin"] == "inputs"
    if sandbox.isolation_enabled("auto"):
        assert d["wrote_outside"] is False and not outside.exists()  # confined like any child
    assert not child.alive()
    with pytest.raises(RuntimeError, match="exactly one job"):
        child.run(job, 60)


def test_a_parked_child_never_used_ends_with_close(tmp_path, runner_env):
    child = _parked(tmp_path, runner_env)
    time.sleep(0.5)
    pid = child.pid
    assert psutil.pid_exists(pid)
    child.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the parked child {pid} outlived its close()")
    assert not child.alive()


def test_a_dead_parked_child_reads_as_dead_and_its_run_reports_no_verdict(tmp_path, runner_env):
    child = _parked(tmp_path, runner_env)
    time.sleep(0.5)
    from opsynth.runtime.supervise import kill_group

    kill_group(child.pid)
    deadline = time.time() + 10
    while child.alive() and time.time() < deadline:
        time.sleep(0.05)
    assert not child.alive()
    res = child.run({"result_path": str(child.scratch / "result.json"), "marker": "m", "outside": "/nonexistent/x"}, 30)
    assert res.reason == "crashed" and "no verdict" in res.log


def test_channel_names_of_the_sandbox_are_refused(tmp_path, runner_env):
    with pytest.raises(ValueError, match="go"):
        sandbox.ParkedChild("park_probe_runner", tmp_path, runner_env, channels={"go": 0})
