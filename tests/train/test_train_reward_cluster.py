"""`reward_cluster`: the trainer's batches go to a Dask cluster with generate's cluster settings."""

from __future__ import annotations

import pytest

from opsynth.reward import RewardConfig
from opsynth.train.trainer import TrainSettings, reward_cluster_evaluator


def test_none_keeps_rewards_in_this_process():
    assert reward_cluster_evaluator(TrainSettings(shards=".")) is None


def test_an_unknown_cluster_setting_is_refused():
    with pytest.raises(ValueError, match="adress"):
        reward_cluster_evaluator(TrainSettings(shards=".", reward_cluster={"kind": "scheduler", "adress": "tcp://x:1"}))


def test_batches_run_on_the_cluster_workers():
    from distributed import Scheduler, Worker  # noqa: F401  (the cluster below is a real one)

    evaluate = reward_cluster_evaluator(TrainSettings(shards=".", reward_cluster={"kind": "local", "n_workers": 1, "threads_per_worker": 1}))
    assert evaluate is not None
    task = "import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    pass\n"
    results = evaluate([(task, "no program here"), (task, "still none")], RewardConfig(device="cpu"))
    assert [(r.reward, r.reason) for r in results] == [(-1, "no_code"), (-1, "no_code")]
