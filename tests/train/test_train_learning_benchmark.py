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
    trained = bench.main(common + ["--save-warm-start", str(tmp_path / "warm")])
    # the control starts from the trained arm's warm start (the GPU's is not bit-reproducible)
    control = bench.main(common + ["--control", "--warm-start-from", str(tmp_path / "warm")])
    assert trained["ok"] and control["ok"] and trained["settings"]["lr"] > 0 and control["settings"]["lr"] == 0
    assert trained["global_step"] == control["global_step"] == 4  # --steps 1 round x --num-iterations 4
    assert trained["tasks"] == control["tasks"] and trained["tasks"]["train"] > 0  # the same tasks
    assert trained["warm_start"]["examples"] == trained["tasks"]["trained_on"] > 0  # every training task's program
    for arm in ("trained", "control"):
        steps = json.loads((tmp_path / arm / "steps.json").read_text())
        # one generation round, trained on for the default 4 optimiser steps (TRL's num_iterations)
        assert [(s["round"], s["step"], s["updates"]) for s in steps] == [(1, 1, 4)]
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
    assert summary["same_warm_start"] and control["warm_start_from"] == str(tmp_path / "warm")
    assert trained["warm_start_sha256"] == control["warm_start_sha256"] is not None
    assert json.loads((tmp_path / "summary.json").read_text())["steps_compared"] == 1


def _bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import train_learning_h200 as bench

    return bench


def test_num_iterations_and_scale_rewards_reach_grpo_config_and_steps_count_rounds(tmp_path):
    """--num-iterations is TRL's num_iterations (GRPO's mu) and --steps counts generation rounds, so
    max_steps (optimiser steps) is their product; the control differs from the trained arm only in its
    learning rate."""
    from opsynth.train.trainer import grpo_config

    bench = _bench()
    argv = ["--num-iterations", "3", "--steps", "5", "--scale-rewards", "none", "--lr", "5e-4"]
    cfgs = {arm: grpo_config(bench.train_settings(bench.parse(argv + extra), str(tmp_path / "t"), str(tmp_path / arm),
                                                  {"cpu_threads": 1}), use_cpu=True)
            for arm, extra in (("trained", []), ("control", ["--control"]))}
    for cfg in cfgs.values():
        assert (cfg.num_iterations, cfg.max_steps, cfg.scale_rewards) == (3, 15, "none")
    assert (cfgs["trained"].learning_rate, cfgs["control"].learning_rate) == (5e-4, 0.0)
    plain = {k: v for k, v in cfgs["trained"].to_dict().items() if k not in ("learning_rate", "output_dir", "logging_dir")}
    assert plain == {k: v for k, v in cfgs["control"].to_dict().items() if k not in ("learning_rate", "output_dir", "logging_dir")}


def test_step_table_has_one_row_per_generation_round(tmp_path):
    """With num_iterations=2 TRL logs the reward at the optimiser step that generated (1, 3, ...);
    the table has one row per round, with its optimiser steps and their summed time."""
    bench = _bench()
    rows = [{"step": 1, "reward": 0.5, "kernel/pass_rate": 0.75, "step_time": 10.0, "step_time_s": 10.0},
            {"step": 2, "loss": 0.1, "step_time": 0.5},
            {"step": 3, "reward": 0.25, "kernel/pass_rate": 0.625, "step_time": 8.0, "step_time_s": 8.0},
            {"step": 4, "loss": 0.1, "step_time": 0.25},
            {"step": 4, "train_runtime": 19.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "evaluations-rank0.jsonl").write_text(json.dumps({"step": 3, "reason": "syntax_error"}) + "\n")
    table = bench.read_steps(str(tmp_path), turns=2)
    assert [(r["round"], r["step"], r["reward"], r["updates"], r["round_s"]) for r in table] == \
        [(1, 1, 0.5, 2, 10.5), (2, 3, 0.25, 2, 8.25)]
    assert table[1]["reasons"] == {"syntax_error": 1}


def test_default_rounds_hold_every_training_task_and_train_each_batch_four_times(tmp_path):
    """The defaults the H200 calls run with (cpu_sweeps_2.json): every one of the 8 training tasks
    x 8 episodes each round (a round's mean does not move with which tasks it drew), 4 optimiser
    steps per round; --steps counts rounds."""
    from opsynth.train.trainer import grpo_config

    bench = _bench()
    args = bench.parse([])
    assert args.tasks_per_step == args.limit_tasks == 8 and (args.window, args.budget_s) == (3, 380.0)
    cfg = grpo_config(bench.train_settings(args, str(tmp_path / "t"), str(tmp_path / "r"), {}), use_cpu=True)
    assert (cfg.per_device_train_batch_size, cfg.num_generations, cfg.num_iterations) == (64, 8, 4)
    assert (cfg.max_steps, cfg.learning_rate, cfg.loss_type, cfg.beta) == (args.steps * 4, 3e-4, "grpo", 0.0)


def test_summary_compares_a_named_trained_arm_with_the_control(tmp_path):
    """A variant of the trained arm (--arm trained_scored --turn-credit scored) pairs with the one
    control: only the loss side and the learning rate may differ; other settings must match."""
    bench = _bench()

    def arm(rewards, lr, **settings):
        return {"steps": [{"reward": r, "pass_rate": (r + 1) / 2} for r in rewards], "heldout": {}, "trained_tasks": {},
                "warm_start": {}, "tasks": {"train": 8}, "device": "cpu",
                "settings": {"lr": lr, "control": lr == 0, "out": "x", "seed": 0, **settings}}

    (tmp_path / "trained_scored.json").write_text(json.dumps(arm([0.4, 0.5, 0.5, 0.8, 0.9, 0.9], 3e-4,
                                                                 arm="trained_scored", turn_credit="scored")))
    (tmp_path / "control.json").write_text(json.dumps(arm([0.4, 0.5, 0.4, 0.5, 0.4, 0.5], 0.0, arm="control",
                                                          turn_credit="all")))
    s = bench.summarize(str(tmp_path), 2, trained_arm="trained_scored")
    assert s["trained_arm"] == "trained_scored" and s["same_settings"] and s["learned"]
    assert s["trained_first_reward"] == pytest.approx(0.45) and s["trained_last_reward"] == pytest.approx(0.9)
    # a setting outside the loss differs: not the same run
    (tmp_path / "control.json").write_text(json.dumps(arm([0.4] * 6, 0.0, seed=1)))
    assert not bench.summarize(str(tmp_path), 2, trained_arm="trained_scored")["same_settings"]


def test_an_arm_refuses_a_warm_start_of_other_settings(tmp_path):
    """--warm-start-from seeds the trainer's smoke-policy cache; if the recipe key there is not the
    one this arm's settings build (other tasks, other warm-start settings), the trainer warm-starts
    anew and the arms would not share a policy: the arm stops before its first round."""
    bench = _bench()
    run = tmp_path / "run" / "smoke_policy"
    run.mkdir(parents=True)
    (run / "smoke_recipe.json").write_text(json.dumps({"key": "rebuilt"}))
    check = [c for c in bench._callbacks(60, str(tmp_path / "run"), str(tmp_path / "s.json"), 2, "given")
             if type(c).__name__ == "SameWarmStart"]
    with pytest.raises(RuntimeError, match="not start from the same policy"):
        check[0].on_train_begin(None, None, None)
    (run / "smoke_recipe.json").write_text(json.dumps({"key": "given"}))
    check[0].on_train_begin(None, None, None)  # the given warm start: no complaint
    assert not [c for c in bench._callbacks(60, str(tmp_path / "run"), str(tmp_path / "s.json"), 2)
                if type(c).__name__ == "SameWarmStart"]


def test_summary_reads_every_round_and_whether_the_arms_shared_a_warm_start(tmp_path):
    """Beside the window criterion, a line through each arm's rounds (slope and its standard error)
    and the mean after the first round; same_warm_start from the weights' digests."""
    bench = _bench()

    def arm(rewards, lr, sha):
        return {"steps": [{"reward": r, "pass_rate": (r + 1) / 2} for r in rewards], "heldout": {}, "trained_tasks": {},
                "warm_start": {}, "tasks": {"train": 8}, "device": "cpu", "warm_start_sha256": sha,
                "settings": {"lr": lr, "control": lr == 0, "seed": 0}}

    (tmp_path / "trained.json").write_text(json.dumps(arm([0.0, 0.1, 0.2, 0.3, 0.4], 3e-4, "a")))
    (tmp_path / "control.json").write_text(json.dumps(arm([0.5, 0.3, 0.5, 0.3, 0.5], 0.0, "a")))
    s = bench.summarize(str(tmp_path), 2)
    assert s["same_warm_start"] is True
    t, c = s["trend"]["trained"], s["trend"]["control"]
    assert t["slope"] == pytest.approx(0.1) and t["slope_se"] == pytest.approx(0.0, abs=1e-12)
    assert t["mean_after_first"] == pytest.approx(0.25) and c["mean_after_first"] == pytest.approx(0.4)
    assert c["slope"] == pytest.approx(0.0) and c["slope_se"] > 0
    (tmp_path / "control.json").write_text(json.dumps(arm([0.5] * 5, 0.0, "b")))
    assert bench.summarize(str(tmp_path), 2)["same_warm_start"] is False
