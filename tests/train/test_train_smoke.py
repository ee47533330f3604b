"""The README command trains the smoke policy a few steps on CPU, offline, and resumes.

`python -m pipelines.train shards=... output_dir=...` with the default config (policy=smoke,
trainer=smoke) must build its tokenizer and model locally, run GRPO steps whose rewards come from
the reward environment, write checkpoints, metrics and a plot, and continue from its checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("trl")
pytest.importorskip("hydra")

REPO = Path(__file__).resolve().parents[2]

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """nn.Linear -> torch.relu"""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        x = torch.relu(x)
        return x


batch_size = 8
in_features = IN
out_features = 32


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
'''


def _shards(folder: Path, n: int = 6) -> str:
    (folder / "data").mkdir(parents=True)
    rows = [dict(code=TASK.replace("IN", str(16 * (i + 1))), ops=["nn.Linear", "torch.relu"], num_ops=2,
                 task_id=f"smoke{i}", data_source="torch#2") for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), folder / "data" / "train-00000-of-00001.parquet")
    return str(folder)


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose(config_name="train", overrides=overrides)


def test_default_config_is_the_offline_smoke_policy():
    cfg = _compose([])
    assert cfg.policy.name_or_path == "smoke"
    assert cfg.trainer.epsilon == 0.2 and cfg.trainer.epsilon_high == 0.28
    grpo = _compose(["trainer=grpo", "policy=qwen_coder"])
    assert grpo.trainer.num_generations == 8 and grpo.trainer.epsilon_high == 0.28


def test_unknown_trainer_key_is_rejected(tmp_path):
    from opsynth.train.trainer import TrainSettings, grpo_config

    with pytest.raises(ValueError, match="no field"):
        grpo_config(TrainSettings(shards=".", output_dir=str(tmp_path), trainer={"group_size": 8}))


@pytest.mark.slow
def test_smoke_policy_trains_and_resumes_from_the_readme_command(tmp_path):
    pytest.importorskip("opsynth.reward.evaluate")
    from pipelines.train import run

    out = tmp_path / "run"
    shards = _shards(tmp_path / "shards")
    base = [f"shards={shards}", f"output_dir={out}", "trainer.steps=2", "trainer.save_steps=2",
            "trainer.max_completion_length=8", "reward_workers=2"]
    summary = run(_compose(base))
    assert summary["global_step"] == 2 and summary["policy"] == "smoke"
    assert (out / "smoke_policy" / "smoke_recipe.json").exists()  # built locally, cached
    assert (out / "checkpoint-2").is_dir() and (out / "final" / "config.json").exists()
    assert (out / "metrics.png").stat().st_size > 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        fracs = sum(r[f"kernel/reward_frac_{k}"] for k in (-1, 1, 2, 3))
        assert fracs == pytest.approx(1.0) and r["reward"] >= -1
    evals = [json.loads(line) for line in (out / "evaluations-rank0.jsonl").read_text().splitlines()]
    assert len(evals) == 2 * 4  # steps x (per-device batch of 4 completions)
    # The reward environment itself judged every completion (a crash would read reward_env_error).
    assert not any(e["reason"].startswith("reward_env_error") for e in evals), evals[0]

    resumed = run(_compose(base[:2] + ["trainer.steps=3", "trainer.save_steps=2",
                                       "trainer.max_completion_length=8", "resume=true"]))
    assert resumed["resumed_from"].endswith("checkpoint-2") and resumed["global_step"] == 3
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward" in r] == [1, 2, 3]
