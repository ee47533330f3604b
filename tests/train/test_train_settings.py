"""TrainSettings through the shared builder: nested dataclasses, not dicts, and one knob per value."""

from __future__ import annotations

import pytest

from opsynth.cluster import ClusterConfig
from opsynth.reward import RewardConfig
from opsynth.train.trainer import TrainSettings, reward_env_config, rewards_in_process


def test_reward_env_and_cluster_are_dataclasses_built_from_yaml_mappings():
    s = TrainSettings.from_dict({"shards": ".", "reward_env": {"run_timeout_s": 120, "device": "cpu"},
                                 "reward_cluster": {"kind": "none", "address": None}})
    assert isinstance(s.reward_env, RewardConfig) and s.reward_env.run_timeout_s == 120
    assert isinstance(s.reward_cluster, ClusterConfig) and rewards_in_process(s)
    with pytest.raises(ValueError, match="unknown reward setting"):
        TrainSettings.from_dict({"shards": ".", "reward_env": {"run_timout_s": 1}})
    with pytest.raises(ValueError, match="reward_cluster.n_workers must be int"):
        TrainSettings.from_dict({"shards": ".", "reward_cluster": {"kind": "local", "n_workers": "many"}})
    with pytest.raises(ValueError, match="cluster.address"):  # checked when built, not when the run starts
        TrainSettings(shards=".", reward_cluster={"kind": "scheduler"})


def test_reward_workers_sets_build_workers_and_without_prebuild_measure_workers():
    pre = reward_env_config(TrainSettings(shards=".", reward_workers=3, reward_env={"device": "cpu"}))
    assert (pre.build_workers, pre.measure_workers) == (3, None)
    nopre = reward_env_config(TrainSettings(shards=".", reward_workers=3, reward_env={"device": "cpu", "prebuild": False}))
    assert (nopre.build_workers, nopre.measure_workers) == (3, 3)
    same = TrainSettings(shards=".", reward_workers=2, reward_env={"prebuild": False, "measure_workers": 2})
    assert reward_env_config(same).measure_workers == 2


def test_the_measuring_children_have_one_knob():
    with pytest.raises(ValueError, match="reward_workers=2 and reward_env.measure_workers=8 both set"):
        TrainSettings(shards=".", reward_workers=2, reward_env={"prebuild": False, "measure_workers": 8})
    # With prebuild, measure_workers is a value of its own (builds run in separate children first).
    assert reward_env_config(TrainSettings(shards=".", reward_workers=2, reward_env={"measure_workers": 8})).measure_workers == 8


def test_policy_settings_go_through_the_builder():
    with pytest.raises(ValueError, match=r"unknown policy setting\(s\) \['nme_or_path'\]"):
        TrainSettings.from_dict({"shards": ".", "policy": {"nme_or_path": "x"}})
    with pytest.raises(ValueError, match="policy.smoke.hidden_size must be int"):
        TrainSettings.from_dict({"shards": ".", "policy": {"smoke": {"hidden_size": "big"}}})
