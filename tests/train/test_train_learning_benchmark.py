"""benchmarks/train_learning_h200.py runs end to end on the CPU backend of the reward: both arms
(trained and learning_rate=0) for a step, each writing its per-step JSON and held-out score, then
the summary with the keys the H200 result is read by. Whether the reward rises is the H200's
question (benchmarks/results/train_learning_h200/), not this one's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_learning_benchmark_runs_both_arms_and_summarizes(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import train_learning_h200 as bench

    common = ["--sample-seeds", "70", "--scale", "0.25", "--heldout-fraction", "0.3", "--steps", "1", "--turns", "2",
              "--num-generations", "2", "--tasks-per-step", "1", "--max-completion-length", "96", "--score-limit", "1",
              "--reward-workers", "2", "--limit-tasks", "2", "--out", str(tmp_path)]
    trained = bench.main(common)
    control = bench.main(common + ["--control"])
    assert trained["ok"] and control["ok"] and trained["settings"]["lr"] > 0 and control["settings"]["lr"] == 0
    assert trained["tasks"] == control["tasks"] and trained["tasks"]["train"] > 0  # the same tasks
    assert trained["warm_start"]["examples"] == trained["tasks"]["trained_on"] > 0  # every training task's program
    for arm in ("trained", "control"):
        steps = json.loads((tmp_path / arm / "steps.json").read_text())
        assert [s["step"] for s in steps] == [1]
        assert sum(steps[0]["reasons"].values()) >= 2, steps[0]  # each episode's verdicts, by reason
        assert {"reward", "pass_rate", "faster_than_eager", "faster_than_compile", "reward_after_turn",
                "faster_than_compile_after_turn"} <= set(steps[0]) and len(steps[0]["reward_after_turn"]) == 2
        heldout = json.loads((tmp_path / f"{arm}.json").read_text())["heldout"]
        assert "by_turn" in heldout and heldout["n"] >= 1, heldout
        trained_tasks = json.loads((tmp_path / f"{arm}.json").read_text())["trained_tasks"]
        assert trained_tasks["n"] == 2, trained_tasks  # the --limit-tasks tasks trained on, scored too
        assert not list((tmp_path / arm / "run").glob("checkpoint-*"))  # weights are not kept
    summary = bench.main(["--summarize", str(tmp_path)])
    for key in ("trained_first_reward", "trained_last_reward", "control_last_reward", "control_step_std"):
        assert isinstance(summary[key], float), key
    assert summary["same_settings"] and set(summary["heldout"]) == {"trained", "control"}
    assert json.loads((tmp_path / "summary.json").read_text())["steps_compared"] == 1
