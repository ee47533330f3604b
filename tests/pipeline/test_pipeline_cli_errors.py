"""`python -m pipelines.generate` as a new user meets it: each mistake is one `error:` line on stderr
naming the setting and what would be valid (exit 2, nothing written, no traceback); Ctrl-C is one
line saying what was kept and that the same command resumes (exit 130); a first run prints no
library chatter; a finished folder says "nothing to generate" and nothing else about writing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pipeline_cli import FAST, REPO, generate_cmd, run_env, run_generate, wait_gone

from opsynth.shards import count_rows, read_rows


def _start(cmd, env, cwd=REPO) -> subprocess.Popen:
    # own session: a case that does not stop (the bug it pins) is killed with all it started
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


# name -> (overrides, texts the error line must hold); output_dir is set per case
CASES = {
    "misspelled_key": (["n_task=5"], ["unknown setting 'n_task'", "did you mean 'n_tasks'?", "settings: "]),
    "unknown_group_key": (["verify.bogus=1"], ["unknown setting 'verify.bogus'", "verify settings: ", "cpu_max_ms"]),
    "unknown_group_option": (["verify=gpu"], ["verify=gpu is not an option", "auto, cpu, cuda"]),
    "output_dir_is_a_file": ([], ["is a file, not a folder"]),
    # verify=auto's YAML does not list max_tasks_per_worker: it passes; n_tasks=0 is what stops the run
    "unlisted_dataclass_key_passes": (["verify=auto", "verify.max_tasks_per_worker=5", "n_tasks=0"],
                                      ["invalid configuration: n_tasks must be >= 1"]),
    # Settings that used to start the run and fail candidate after candidate (or hang):
    "zero_timeout": (["verify.timeout_s=0"], ["verify.timeout_s must be > 0"]),
    "cuda_without_a_gpu": (["verify=cuda"], ["verify=cuda", "no GPU", "verify=cpu"]),
    "unknown_compile_backend": (["verify.compile_backend=foo"], ["verify.compile_backend='foo'",
                                                                 "not a torch.compile backend", "inductor"]),
    "unwritable_output_dir": ([], ["output_dir=/proc/opsynth-x", "cannot write in /proc"]),
    # the user's own README.md in output_dir would be replaced by the dataset card
    "users_readme_in_output_dir": ([], ["holds a README.md that is not an opsynth dataset card"]),
    # a clone without ../shared beside it, offline, nothing cached: how to point at a local copy
    "kernelbench_offline_without_a_copy": ([], ["KernelBench reference", "HF_HUB_OFFLINE=1",
                                                "dedup.kb_path=/path/to/kernelbench.parquet"]),
}
STOPS_WITHIN_S = 120  # a torch import on a loaded 2-core machine, many cases at once; not a run
USERS_README = "# my notes\n\nnot a dataset card\n"


def _case_env(name, root, kernelbench_parquet) -> tuple[dict, str]:
    """(environment, working folder) of a case: the repository with the reference, as the other
    tests run; the offline case from a folder with no ../shared beside it and an empty HF cache."""
    env = run_env(kernelbench_parquet)
    if name == "cuda_without_a_gpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, also on a GPU machine
    if name != "kernelbench_offline_without_a_copy":
        return env, str(REPO)
    env.pop("OPSYNTH_KERNELBENCH")
    env.update(HF_HOME=str(root / "hf-empty"), PYTHONPATH=str(REPO))
    (root / "elsewhere").mkdir()
    return env, str(root / "elsewhere")


@pytest.fixture(scope="module")
def results(tmp_path_factory, kernelbench_parquet):
    """All cases at once (each pays a torch import); case -> (proc, stdout, stderr, output_dir)."""
    root = tmp_path_factory.mktemp("cli_errors")
    procs = {}
    for name, (overrides, _) in CASES.items():
        out = root / name
        if name == "output_dir_is_a_file":
            out.write_text("not a folder\n")
        if name == "unwritable_output_dir":
            out = Path("/proc/opsynth-x")
        if name == "users_readme_in_output_dir":
            out.mkdir()
            (out / "README.md").write_text(USERS_README)
        env, cwd = _case_env(name, root, kernelbench_parquet)
        cmd = generate_cmd(out, *overrides)
        if name == "unwritable_output_dir":
            cmd = [c if not c.startswith("hydra.run.dir=") else f"hydra.run.dir={root / 'proc-hydra'}" for c in cmd]
        procs[name] = (_start(cmd, env, cwd), out, time.monotonic())
    done = {}
    deadline = time.monotonic() + STOPS_WITHIN_S + 60  # one deadline for all: a hung case costs it once
    for name, (proc, out, t0) in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        done[name] = (proc, stdout, stderr, out, time.monotonic() - t0)
    return done


@pytest.mark.parametrize("name", list(CASES))
def test_a_usage_error_is_one_line_naming_the_setting_exit_2(results, name):
    proc, stdout, stderr, out, seconds = results[name]
    assert proc.returncode == 2, (name, stdout, stderr[-3000:])
    assert "Traceback" not in stdout + stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-3000:]
    for text in CASES[name][1]:
        assert text in lines[0], (name, lines[0])
    assert seconds < STOPS_WITHIN_S, f"{name}: stopped after {seconds:.0f} s, not before the work started"
    if name == "output_dir_is_a_file":
        assert str(out) in lines[0] and out.read_text() == "not a folder\n"
    elif name == "users_readme_in_output_dir":
        assert (out / "README.md").read_text() == USERS_README and sorted(os.listdir(out)) == ["README.md"]
    else:
        assert not out.exists(), "nothing is written for a bad setting"


@pytest.mark.slow
def test_ctrl_c_keeps_the_rows_says_so_and_the_same_command_resumes(tmp_path, kernelbench, marker):
    out = tmp_path / "ds"
    cmd = generate_cmd(out, "n_tasks=200", "flush_every=1", *FAST)
    # own session, and SIGINT to the whole group: what a terminal's Ctrl-C does
    # SIGINT handled as in a terminal even when the suite itself runs with SIGINT ignored (a shell
    # starts background jobs so, and Python then installs no handler: the signal would be lost).
    proc = subprocess.Popen(cmd, cwd=REPO, env=run_env(kernelbench, marker), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and not list((out / "data").glob("part-*.parquet")):
        time.sleep(0.3)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stdout + stderr and "KeyboardInterrupt" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    rows = count_rows(out)
    assert rows >= 1
    assert lines == [f"interrupted: kept {rows} row(s) in {out}; run the same command again to resume from there"]
    assert wait_gone(marker, timeout=30) == [], "Ctrl-C left processes behind"
    state = json.loads((out / ".opsynth-state.json").read_text())
    assert state["stats"]["accepted"] == rows and not state.get("finished")  # the resume point is on disk
    resumed = run_generate(generate_cmd(out, f"n_tasks={rows + 1}", *FAST), run_env(kernelbench), timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert count_rows(out) == rows + 1  # the resumed run went on from the kept rows
    assert json.loads(resumed.stdout.splitlines()[-1])["accepted"] == rows + 1  # counts carry over


@pytest.mark.slow
def test_a_first_run_prints_only_what_the_user_needs_and_a_rerun_writes_nothing(tmp_path, kernelbench):
    """Cold caches, as on a fresh clone: the catalog is mined (transformers' standalone-module
    warnings) and matplotlib builds its font cache (an INFO line) on this run."""
    env = run_env(kernelbench)
    env.update(OPSYNTH_CACHE=str(tmp_path / "cache"), MPLCONFIGDIR=str(tmp_path / "mpl"))
    out = tmp_path / "ds"
    first = run_generate(generate_cmd(out, "n_tasks=2", *FAST), env, timeout=400)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "cache").is_dir() and (tmp_path / "mpl").is_dir(), "the caches were cold"
    for noise in ("[transformers]", "xIELU", "AttentionInterface", "layer_idx", "font_manager", "fontManager"):
        assert noise not in first.stdout + first.stderr, noise
    assert first.stderr.strip().splitlines() == [f"wrote 1 shard(s) to {out}"]
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    assert summary["accepted"] == 2

    again = run_generate(generate_cmd(out, "n_tasks=2", *FAST), env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "nothing to generate" in again.stderr  # log lines go to stderr, stdout is the summary alone
    assert json.loads(again.stdout)["accepted"] == 2
    assert "wrote" not in again.stdout + again.stderr

    # Sampled transformers modules built standalone (seed 4: OPTAttention without layer_idx, then
    # attention forwards without _attn_implementation) warn in the workers that size them: not here.
    tf_out = tmp_path / "tf"
    tf = run_generate(generate_cmd(tf_out, "n_tasks=5", "seed=4", "sampler.mixture={transformers: 1.0}", *FAST),
                      env, timeout=300)
    assert tf.returncode == 0, tf.stderr
    assert "transformers.OPTAttention" in {op for row in read_rows(tf_out) for op in row["ops"]}
    assert tf.stderr.strip().splitlines() == [f"wrote 1 shard(s) to {tf_out}"], tf.stderr
