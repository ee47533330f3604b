"""One folder for the device locks, asked for in one place (`opsynth.runtime.device_lock`) by the
verifier's pool and the reward environment: with a non-default folder, one GPU still has one lock."""

from __future__ import annotations

import os

from opsynth.runtime import device_lock
from opsynth.runtime.device_lock import LOCK_DIR_ENV, device_lock_path, resolve_lock_dir


def test_the_folder_is_the_setting_else_the_temp_folder(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.delenv(LOCK_DIR_ENV, raising=False)
    assert resolve_lock_dir() == tempfile.gettempdir()
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    assert resolve_lock_dir() == str(tmp_path)
    assert resolve_lock_dir("/elsewhere") == "/elsewhere"  # an explicit folder (tests, a pool handing it on)


def test_verifier_and_reward_lock_the_same_file_in_a_non_default_folder(tmp_path, monkeypatch):
    from opsynth.reward.evaluate import _lock_path
    from opsynth.reward.eval_types import RewardConfig
    from opsynth.verify import VerifyConfig, WorkerPool

    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    pool = WorkerPool(VerifyConfig(device="cpu", n_workers=1))
    env = pool._env(0)  # what the pool's workers are started with
    assert env[LOCK_DIR_ENV] == str(tmp_path)
    for device in ("cpu", "cuda"):
        verifier = device_lock_path(device, 0, env[LOCK_DIR_ENV], env)
        reward = _lock_path(RewardConfig(device="cpu", device_index=0), device)
        assert verifier == reward and os.path.dirname(reward) == str(tmp_path), (verifier, reward)


def test_the_childs_lock_function_is_bound_where_the_harness_snapshot_sees_it():
    """`sandbox.device_lock` takes the flock from its defaults (watched by the reward's harness
    snapshot), not from a module global a candidate could rebind unseen."""
    from opsynth.runtime import sandbox

    assert sandbox.device_lock.__defaults__ == (device_lock.file_lock,)
