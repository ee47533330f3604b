"""The README command trains the smoke policy a few steps on CPU, offline, judging real programs.

`python -m pipelines.train shards=... output_dir=...` with the default config (policy=smoke,
trainer=smoke) must build its tokenizer and model locally, warm-start it on C++ programs for some
of its tasks, run multi-turn GRPO steps whose programs the reward environment builds, runs and
judges (most completions reach the environment, some score 1 or more, and the update changes the
weights), write checkpoints, metrics, a plot with whole-number steps, a one-line console summary
per step and a model card naming the policy, data and reward, and continue from its checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow
def test_smoke_policy_judges_programs_trains_and_resumes_from_the_readme_command(tmp_path, capsys, recwarn):
    from pipelines.train import run

    out = tmp_path / "run"
    shards = _shards(tmp_path / "shards")
    base = [f"shards={shards}", f"output_dir={out}", "trainer.steps=2", "trainer.save_steps=2", "turns=2",
            "reward_workers=2", "++reward_env.prebuild=false"]
    summary = run(_compose(base))
    assert summary["global_step"] == 2 and summary["policy"] == "smoke" and summary["turns"] == 2
    recipe = json.loads((out / "smoke_policy" / "smoke_recipe.json").read_text())  # built locally, cached
    assert recipe["warm_start"]["examples"] == 4 and recipe["warm_start"]["reproduces"]
    assert (out / "checkpoint-2").is_dir() and (out / "final" / "config.json").exists()

    evals = [json.loads(line) for line in (out / "evaluations-rank0.jsonl").read_text().splitlines()]
    assert {e["turn"] for e in evals} <= {1, 2} and len([e for e in evals if e["turn"] == 1]) == 2 * 4
    # The environment judged real programs: most completions had code it built and ran, some scored.
    reached = [e for e in evals if e["reason"] != "no_code"]
    assert len(reached) > len(evals) / 2, [e["reason"] for e in evals]
    assert any(e["reward"] >= 1 for e in evals), [e["reason"] for e in evals]
    assert not any(e["reason"].startswith("reward_env_error") for e in evals), evals[0]
    # Second turns hold programs too: the warm start's revisions generalise to feedback with timings
    # it never read (with 2 timings a program, not 6, every second turn here was a syntax error).
    assert any(e["turn"] == 2 and e["reward"] >= 1 for e in evals), [(e["turn"], e["reason"]) for e in evals]
    # ... and GRPO changed the weights it was warm-started with.
    # GRPO's advantage is an episode's reward (its last turn's, episode_reward=last) less its group's
    # mean, and a group is one prompt's generations: one step here (batch 4 = num_generations 4).
    # With no spread in any group (every episode of a step ending alike, which a sharp warm start
    # can give) the weights must stay put (beta 0, no weight decay); with a spread they must move.
    # Turns are not groups: every episode of a step can score 1 at turn 1 and -1 at turn 2.
    start, final = _weights(out / "smoke_policy"), _weights(out / "final")
    changed = any(not (start[k] == final[k]).all() for k in start)
    last = {}
    for e in sorted(evals, key=lambda e: e["turn"]):
        last[(e["step"], e["episode"])] = e["reward"]
    spread = any(len({r for (s, _), r in last.items() if s == step}) > 1 for step in {s for s, _ in last})
    assert changed == spread, (changed, [(e["step"], e["episode"], e["turn"], e["reward"]) for e in evals])

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        fracs = sum(r[f"kernel/reward_frac_{k}"] for k in (-1, 1, 2, 3))
        assert fracs == pytest.approx(1.0) and "turn/2/reward" in r and r["step_time_s"] > 0
    captured = capsys.readouterr()
    printed = captured.out
    # Nothing the user cannot act on: no per-save progress bar, no deprecation TRL itself triggers.
    assert "Writing model shards" not in captured.err, captured.err[-2000:]
    assert not [w for w in recwarn if "is_gradient_checkpointing" in str(w.message)]
    lines = [ln for ln in printed.splitlines() if ln.startswith("[train] step ")]
    assert len(lines) == 2 and "reward" in lines[0] and "pass" in lines[0] and ">compile" in lines[0]
    assert "'loss'" not in printed  # TRL's per-step dict is not printed
    assert (out / "metrics.png").stat().st_size > 0
    card = (out / "final" / "README.md").read_text()
    assert "[None]" not in card and "smoke" in card and str(shards) in card and "reward environment" in card
    assert "up to 2 turns" in card

    resumed = run(_compose(base[:2] + ["trainer.steps=3", "trainer.save_steps=2", "turns=2", "resume=true",
                                       "++reward_env.prebuild=false"]))
    assert resumed["resumed_from"].endswith("checkpoint-2") and resumed["global_step"] == 3
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward" in r] == [1, 2, 3]


def test_metrics_plot_has_whole_step_ticks(tmp_path):
    from opsynth.train.metrics import plot_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "reward": 0.5 * s, "turn/1/reward": 0.0, "turn/2/reward": 1.0,
                                        "kernel/pass_rate": 0.5}) + "\n" for s in (1, 2, 3)))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    captured = {}
    orig = plt.Figure.savefig

    def keep(fig, *a, **k):
        captured["ticks"] = [t for ax in fig.axes for t in ax.get_xticks() if 1 <= t <= 3]
        return orig(fig, *a, **k)

    plt.Figure.savefig = keep
    try:
        plot_metrics(str(path), str(tmp_path / "m.png"))
    finally:
        plt.Figure.savefig = orig
    assert captured["ticks"] and all(float(t).is_integer() for t in captured["ticks"])


def test_step_line_is_short_and_names_the_rates():
    from opsynth.train.metrics import step_line

    row = {"step": 3, "reward": 1.25, "kernel/pass_rate": 0.75, "kernel/faster_than_eager": 0.5,
           "kernel/faster_than_compile": 0.25, "turn/1/reward": 0.5, "turn/2/reward": 1.25,
           "episode/improved": 0.4, "time/generation_s": 2.0, "time/evaluation_s": 11.0, "step_time_s": 14.2}
    line = step_line(row, max_steps=10, turns=2)
    assert line == ("[train] step 3/10  reward 1.25  pass 0.75  >eager 0.50  >compile 0.25  by turn 0.50 1.25  "
                    "improved 0.40  gen 2.0 s  eval 11.0 s  step 14.2 s")
