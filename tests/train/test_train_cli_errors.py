"""`python -m pipelines.train` as a new user meets it: a misspelled key, shards that are not there
or hold nothing, a trainer key GRPO does not have, a bad episode setting: each is one `error:` line
on stderr that names the setting (exit 2, no traceback), before any model is loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# name -> (overrides, texts the error line must hold); {tmp} is the case's own folder
CASES = {
    "misspelled_key": (["shard={tmp}"], ["unknown setting 'shard'", "did you mean 'shards'?"]),
    "missing_folder": (["shards={tmp}/nope"], ["shards={tmp}/nope", "not a local folder or file"]),
    "folder_without_shards": (["shards={tmp}"], ["no Parquet shards under {tmp}"]),
    "unknown_trainer_key": (["shards={tmp}", "++trainer.group_size=8"], ["invalid configuration",
                                                                         "GRPOConfig has no field(s) ['group_size']"]),
    "bad_episode_reward": (["shards={tmp}", "episode_reward=mean"], ["invalid configuration", "episode_reward"]),
    # (CUDA_VISIBLE_DEVICES is emptied for this case: no GPU, also on a GPU machine)
    "reward_on_cuda_without_a_gpu": (["shards={tmp}", "++reward_env.device=cuda"], ["reward.device=cuda", "no GPU"]),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_cli")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    procs = {}
    for name, (overrides, _) in CASES.items():
        tmp = root / name
        tmp.mkdir()
        args = [o.format(tmp=tmp) for o in overrides] + [f"output_dir={tmp}/out", f"hydra.run.dir={tmp}/hydra"]
        case_env = {**env, "CUDA_VISIBLE_DEVICES": ""} if name == "reward_on_cuda_without_a_gpu" else env
        procs[name] = (subprocess.Popen([sys.executable, "-m", "pipelines.train", *args], cwd=REPO, env=case_env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), tmp)
    done = {}
    for name, (proc, tmp) in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        done[name] = (proc.returncode, stdout, stderr, tmp)
    return done


@pytest.mark.parametrize("name", list(CASES))
def test_a_train_usage_error_is_one_line_naming_the_setting_exit_2(results, name):
    code, stdout, stderr, tmp = results[name]
    assert code == 2, (name, stdout, stderr[-3000:])
    assert "Traceback" not in stdout + stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-3000:]
    for text in CASES[name][1]:
        assert text.format(tmp=tmp) in lines[0], (text, lines[0])
    assert not (tmp / "out").exists()  # nothing trained, nothing written


def test_ctrl_c_during_training_says_where_the_checkpoints_are_exit_130(tmp_path):
    import signal
    import time

    from bandit import task_source, write_task_shards

    out = tmp_path / "run"
    shards = write_task_shards(str(tmp_path / "shards"), task_source(), n=4)
    cmd = [sys.executable, "-m", "pipelines.train", f"shards={shards}", f"output_dir={out}",
           f"hydra.run.dir={tmp_path / 'hydra'}", "trainer.steps=50", "trainer.save_steps=1", "turns=1",
           "reward_workers=2", "++reward_env.prebuild=false"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    # own session and SIGINT to the whole group, as a terminal's Ctrl-C; a default SIGINT even when
    # the suite runs with it ignored
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None and not (out / "checkpoint-1").is_dir():
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (f"interrupted: the checkpoints saved so far are in {out}; "
                                               "the same command with resume=true continues from the newest one")
    assert (out / "checkpoint-1").is_dir()


def test_the_default_output_dir_is_not_where_hydra_writes_its_log_folders():
    """Hydra writes each train command's log folder under hydra.run.dir's parent; the default
    output_dir must not be that folder (nor inside it), or a second run mixes with the first."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "train.yaml"), resolve=False)
    logs_root = Path(raw["hydra"]["run"]["dir"].split("${", 1)[0]).resolve()
    out = Path(raw["output_dir"]).resolve()
    assert out != logs_root and logs_root not in out.parents and out not in logs_root.parents, (out, logs_root)
    from opsynth.train.trainer import TrainSettings

    assert TrainSettings(shards=".").output_dir == raw["output_dir"]


def test_a_fresh_run_in_a_folder_holding_an_earlier_run_is_refused_in_one_line(tmp_path):
    from bandit import task_source, write_task_shards

    shards = write_task_shards(str(tmp_path / "shards"), task_source(), n=4)
    out = tmp_path / "run"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "pipelines.train", f"shards={shards}", f"output_dir={out}",
                        f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2, (p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr[-2000:]
    assert f"output_dir={out} holds an earlier training run (checkpoint-2, metrics.jsonl)" in lines[0]
    assert "resume=true" in lines[0]
    assert sorted(os.listdir(out)) == ["checkpoint-2", "metrics.jsonl"]  # nothing written, no policy built
