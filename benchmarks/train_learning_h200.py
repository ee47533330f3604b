"""Does multi-turn GRPO with the real reward raise the reward? A trained run beside a
learning_rate=0 control on the same tasks, seeds and evaluation budget, then held-out scoring of both.

One call runs one arm (about 9 minutes on the H200, warm start included), so two device calls
give both; `--summarize` then writes the comparison here (no GPU):

    python benchmarks/train_learning_h200.py --out $OUT/train_learning            # the trained arm
    python benchmarks/train_learning_h200.py --out $OUT/train_learning --control  # learning_rate=0
    python benchmarks/train_learning_h200.py --summarize benchmarks/results/train_learning_h200

Tasks: a generated shard folder (`--shards`), or tasks drawn here by the generator's sampler and
renderer (`--sample-seeds`, not verified: the reward runs each reference anyway), kept to those the
smoke policy's warm start can write a program for (`--tasks lowerable`; on the others every episode
scores -1 and GRPO has nothing to compare), split by the task-id hash into training and held-out
tasks (`--heldout-fraction`), the first `--limit-tasks` training tasks trained on (so each recurs
within the rounds). The policy is the smoke policy warm-started on every one of those tasks' program
(`policy.smoke.warm_start_tasks=null`, with size variants) until sampling at the trainer's
temperature writes them with probability `--warm-start-rate`; then GRPO, `--turns` turns an episode
(scored by its best turn: a sampled revision that breaks a correct first program would otherwise
erase the first turn's signal), in generation rounds of `--tasks-per-step` tasks x
`--num-generations` episodes, each batch trained on for `--num-iterations` optimiser steps (TRL's
num_iterations, GRPO's mu, with the clipped ratio; TRL's global_step counts those steps, the step
table counts rounds), for `--steps` rounds or until `--budget-s` has passed (the optimiser step in
progress finishes). The control is the same run with learning_rate=0 (the same warm start, tasks,
seeds, round count and evaluation budget).

The defaults come from CPU sweeps (benchmarks/results/train_learning_h200/attempts/cpu_sweeps_2.json):
every round holds all 8 training tasks x 8 episodes, so a round's mean reward varies only by sampling
(the control's round-to-round std 0.09, against 0.35 at 2 tasks a step in cpu_sweeps.json, where which
tasks a step drew moved the mean more than learning did), and each batch is trained on 4 times with Adam 3e-4
(evaluation dominates a round, so the extra updates cost little). On the CPU the trained arm rose
within 3-5 rounds and then held: rounds 4-15 averaged 0.62 against the control's 0.37 (seed 0;
`learned` cut at 10, 13, 15, 20 or 25 rounds) and 0.53 against 0.45 (seed 1; `learned` at 10, 12 and
15 rounds, not at 13): a margin of one to a few of the control's std, so likely, not sure. A round
evaluates 128 programs (64 episodes x 2 turns; identical programs build and run once), about 2.6
times a 16-episode step on the CPU, so the H200's 380 s hold fewer rounds than its ~25 steps at 2
tasks x 8: about 10-15 (an estimate, not yet measured there).

Writes under `--out`: `<arm>/steps.json` (rewritten after every round: per round mean reward, pass
rate, faster-than-eager and faster-than-compile shares, overall and after each turn, seconds, the
optimiser steps it ran),
`<arm>.json` (settings, warm start, steps, held-out score table with `mode=score`, times) and the
trainer's logs under `<arm>/run/` (weights and checkpoints removed). `--summarize DIR` reads
`trained.json` and `control.json` there and writes `summary.json`: `trained_first_reward`,
`trained_last_reward`, `control_first_reward`, `control_last_reward` (mean reward over the first and
last `--window` rounds of the rounds both arms ran), `control_step_std` (the control's round-to-round
standard deviation), `learned` (the trained arm's last rounds above its first and above the control's
by more than that spread) and both held-out tables. On the CPU it runs as is (C++ programs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
DEFAULT_OUT = os.path.join(REPO, "benchmarks", "results", "train_learning_h200")

from train_multiturn_h200 import _budget_callback, _device, _jsonl  # noqa: E402 - the multi-turn benchmark's helpers


def build_tasks(args, folder: str) -> dict:
    """The task folder both arms use (Hub layout): from `--shards` or the sampler, kept to the
    tasks the warm start lowers (unless `--tasks all`). Deterministic in its arguments."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from opsynth.train.data import load_rows, split_rows
    from opsynth.train.warm_start import lower_task

    device = "cuda" if _device() != "cpu" else "cpu"
    if args.shards:
        rows = load_rows(args.shards)
    else:
        from opsynth.graph.sampler import Sampler, SamplerConfig
        from opsynth.render.parse import task_id
        from opsynth.render.source import render_task

        sampler = Sampler(SamplerConfig(scale=args.scale))
        rows = []
        for seed in range(args.sample_seeds):
            st = sampler.sample(seed)
            code = render_task(st.graph)
            rows.append({"code": code, "task_id": task_id(code), "ops": [], "num_ops": st.num_ops,
                         "data_source": st.data_source, "seed": seed})
    seen, kept = set(), []
    for r in rows:
        if r["task_id"] in seen:
            continue
        seen.add(r["task_id"])
        if args.tasks == "all" or lower_task(r["code"], device) is not None:
            kept.append({k: r.get(k) for k in ("code", "task_id", "ops", "num_ops", "data_source")})
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(kept), os.path.join(folder, "data", "train-00000-of-00001.parquet"))
    train = split_rows(kept, "train", args.heldout_fraction)
    return {"source": args.shards or f"sampler seeds 0..{args.sample_seeds - 1} scale {args.scale}",
            "rows_read": len(rows), "kept": len(kept), "train": len(train), "heldout": len(kept) - len(train),
            "trained_on": min(len(train), args.limit_tasks) if args.limit_tasks else len(train), "kept_by": args.tasks}


def step_row(m: dict, rollout: dict, turns: int) -> dict:
    """One step of the trainer's metrics (and the rollout's time split) as the benchmark reports it."""
    def turn(key: str) -> list:
        return [m.get(f"turn/{t}/{key}") for t in range(1, turns + 1)]

    return {
        "step": m["step"], "reward": m.get("reward"), "pass_rate": m.get("kernel/pass_rate"),
        "faster_than_eager": m.get("kernel/faster_than_eager"), "faster_than_compile": m.get("kernel/faster_than_compile"),
        "reward_after_turn": turn("reward"), "pass_rate_after_turn": turn("pass_rate"),
        "faster_than_eager_after_turn": turn("faster_than_eager"),
        "faster_than_compile_after_turn": turn("faster_than_compile"),
        "improved": m.get("episode/improved"), "step_s": m.get("step_time_s"),
        "generation_s": round(sum(rollout.get("generation_s", [])), 3),
        "evaluation_s": round(sum(rollout.get("evaluation_s", [])), 3),
    }


def read_steps(run_dir: str, turns: int) -> list[dict]:
    """Step rows, each with its verdicts' reasons counted (a run whose rewards do not move says why)."""
    import collections

    rollouts = {r["step"]: r for r in _jsonl(os.path.join(run_dir, "rollouts-rank0.jsonl"))}
    reasons: dict = collections.defaultdict(collections.Counter)
    for e in _jsonl(os.path.join(run_dir, "evaluations-rank0.jsonl")):
        reasons[e.get("step")][e.get("reason") or "ok"] += 1
    rows = []
    for m in _jsonl(os.path.join(run_dir, "metrics.jsonl")):
        if "reward" in m:  # logged by the optimiser step that generated: the first of its round
            row = {"round": len(rows) + 1, **step_row(m, rollouts.get(m["step"], {}), turns)}
            row["reasons"] = dict(reasons.get(m["step"], {}))
            row["updates"], row["round_s"] = 0, 0.0
            rows.append(row)
        if rows and "step_time" in m:  # TRL's time of each optimiser step (generation included)
            rows[-1]["updates"] += 1
            rows[-1]["round_s"] = round(rows[-1]["round_s"] + float(m["step_time"]), 3)
    return rows


def _callbacks(budget_s: float, run_dir: str, steps_path: str, turns: int, warm_key: str | None = None):
    from transformers import TrainerCallback

    class SaveSteps(TrainerCallback):
        """Rewrite steps.json after every logged step, so a run cut off keeps what it did."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs and "reward" in logs:
                _write(steps_path, read_steps(run_dir, turns))

    class SameWarmStart(TrainerCallback):
        """With --warm-start-from: stop before the first round if the policy was warm-started anew
        (its recipe key differs: other tasks or settings), not after the whole arm has run."""

        def on_train_begin(self, args, state, control, **kwargs):
            got = warm_start_key(os.path.join(run_dir, "smoke_policy"))
            if got != warm_key:
                raise RuntimeError(f"--warm-start-from holds the warm start of other tasks or settings (recipe key "
                                   f"{warm_key}, this arm's {got}): the arms would not start from the same policy")

    return [_budget_callback(budget_s), SaveSteps()] + ([SameWarmStart()] if warm_key else [])


def warm_start_key(folder: str) -> str | None:
    """The recipe key of a smoke-policy folder (`smoke_recipe.json`), None if it has none."""
    try:
        with open(os.path.join(folder, "smoke_recipe.json")) as f:
            return json.load(f).get("key")
    except (OSError, ValueError):
        return None


def weights_sha256(folder: str) -> str | None:
    """A digest of a policy folder's weights: equal in two arms means the same starting policy."""
    import hashlib

    names = sorted(n for n in os.listdir(folder) if n.endswith((".safetensors", ".bin"))) if os.path.isdir(folder) else []
    if not names:
        return None
    h = hashlib.sha256()
    for n in names:
        with open(os.path.join(folder, n), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _write(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=str)
    os.replace(tmp, path)


def train_settings(args, tasks_dir: str, run_dir: str, reward_env: dict):
    """The trainer's settings for one arm (the control differs only in its learning rate)."""
    from opsynth.train.policy import PolicyConfig, SmokePolicyConfig
    from opsynth.train.trainer import TrainSettings

    smoke = SmokePolicyConfig(warm_start_tasks=None, warm_start_rate=args.warm_start_rate,
                              warm_start_size_variants=args.size_variants, warm_start_steps=args.warm_start_steps,
                              seed=args.seed)
    return TrainSettings(
        shards=tasks_dir, output_dir=run_dir, split="train", heldout_fraction=args.heldout_fraction, seed=args.seed,
        limit_tasks=args.limit_tasks or None,
        policy=PolicyConfig(name_or_path="smoke", dtype="float32", chat=False, smoke=smoke),
        reward_workers=args.reward_workers, reward_env=reward_env, turns=args.turns, episode_reward=args.episode_reward,
        turn_credit=args.turn_credit,
        gradient_checkpointing=False,
        # --steps counts generation rounds; each is --num-iterations optimiser steps (TRL's global_step).
        trainer=dict(steps=args.steps * args.num_iterations, num_iterations=args.num_iterations,
                     scale_rewards=args.scale_rewards, learning_rate=args.lr, beta=0.0,
                     num_generations=args.num_generations,
                     per_device_train_batch_size=args.num_generations * args.tasks_per_step,
                     max_completion_length=args.max_completion_length, temperature=args.temperature,
                     save_steps=10_000, loss_type=args.loss_type, optim=args.optim, bf16=False,
                     lr_scheduler_type="constant_with_warmup" if args.warmup_steps else "constant",
                     warmup_steps=args.warmup_steps),
    )


def run_arm(args) -> dict:
    """One arm: warm start, GRPO (learning rate `--lr`, 0 for the control), held-out scoring."""
    import torch
    import transformers
    import trl

    from opsynth.reward.eval_types import RewardConfig
    from opsynth.train.score import ScoreSettings, run_settings
    from opsynth.train.trainer import train

    arm = args.arm or ("control" if args.lr == 0 else "trained")
    device = _device()
    on_gpu = device != "cpu"
    arm_dir = os.path.join(args.out, arm)
    shutil.rmtree(arm_dir, ignore_errors=True)
    os.makedirs(arm_dir)
    tasks_dir, run_dir, steps_path = os.path.join(arm_dir, "tasks"), os.path.join(arm_dir, "run"), os.path.join(arm_dir, "steps.json")
    t0 = time.time()
    report: dict = {"arm": arm, "device": device, "torch": torch.__version__, "transformers": transformers.__version__,
                    "trl": trl.__version__, "settings": {k: v for k, v in vars(args).items() if k != "summarize"}}
    report["tasks"] = build_tasks(args, tasks_dir)
    print(f"[bench] {arm}: tasks {report['tasks']}", flush=True)
    reward_env = {"cpu_threads": 1} if not on_gpu else {}
    settings = train_settings(args, tasks_dir, run_dir, reward_env)
    warm_key = None
    if args.warm_start_from:  # the trainer's smoke-policy cache: the same recipe key reloads it as is
        warm_key = warm_start_key(args.warm_start_from)
        if warm_key is None:
            raise SystemExit(f"--warm-start-from {args.warm_start_from}: no smoke_recipe.json there (give the folder "
                             "an earlier arm wrote with --save-warm-start)")
        shutil.copytree(args.warm_start_from, os.path.join(run_dir, "smoke_policy"))
        report["warm_start_from"] = args.warm_start_from
    try:
        result = train(settings, callbacks=_callbacks(args.budget_s, run_dir, steps_path, args.turns, warm_key))
        report.update(ok=True, global_step=result.get("global_step"), evaluations=result.get("evaluations"),
                      train_runtime_s=result.get("train_runtime_s"))
    except Exception as exc:  # keep whatever the run wrote
        import traceback

        traceback.print_exc()
        report.update(ok=False, error=repr(exc)[:500])
    report["train_wall_s"] = round(time.time() - t0, 1)
    recipe = os.path.join(run_dir, "smoke_policy", "smoke_recipe.json")
    if os.path.exists(recipe):
        with open(recipe) as f:
            ws = json.load(f).get("warm_start") or {}
        report["warm_start"] = {k: v for k, v in ws.items() if k != "completion_tokens"}
    report["warm_start_sha256"] = weights_sha256(os.path.join(run_dir, "smoke_policy"))
    if args.save_warm_start and os.path.isdir(os.path.join(run_dir, "smoke_policy")):
        shutil.rmtree(args.save_warm_start, ignore_errors=True)
        shutil.copytree(os.path.join(run_dir, "smoke_policy"), args.save_warm_start)
    report["steps"] = read_steps(run_dir, args.turns) if os.path.isdir(run_dir) else []
    _write(steps_path, report["steps"])

    final = os.path.join(run_dir, "final")
    if report.get("ok") and os.path.isdir(final) and args.score_limit != 0:
        t1 = time.time()
        # What `python -m pipelines.evaluate mode=score score.policy=<final>` runs: on the held-out
        # tasks (other operator chains: the smoke policy writes programs only for chains it was
        # warmed on, so both arms score -1 there), and on the tasks trained on (greedy decoding).
        for key, split, limit in (("heldout", "heldout", args.score_limit or None),
                                  ("trained_tasks", "train", args.limit_tasks or None)):
            try:
                s = ScoreSettings(shards=tasks_dir, split=split, policy=final, heldout_fraction=args.heldout_fraction,
                                  limit=limit, turns=args.turns, samples_per_task=args.score_samples,
                                  max_new_tokens=args.max_completion_length, temperature=0.0,
                                  out=os.path.join(arm_dir, f"score_{key}"))
                report[key] = run_settings(s, eval_cfg=RewardConfig(**reward_env))
            except Exception as exc:
                import traceback

                traceback.print_exc()
                report[key] = {"error": repr(exc)[:500]}
        report["score_wall_s"] = round(time.time() - t1, 1)
    report["wall_s"] = round(time.time() - t0, 1)
    if os.path.isdir(run_dir):  # keep logs and plots, not checkpoints or weights
        for sub in os.listdir(run_dir):
            if os.path.isdir(os.path.join(run_dir, sub)):
                shutil.rmtree(os.path.join(run_dir, sub), ignore_errors=True)
    _write(os.path.join(args.out, f"{arm}.json"), report)
    _print_arm(report)
    return report


def _fmt(v, spec=".2f"):
    return format(v, spec) if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) else "-"


def _print_arm(report: dict) -> None:
    print(f"\n{report['arm']} on {report['device']}: {report['tasks']['trained_on']} training tasks, "
          f"{report['tasks']['heldout']} held out; warm start {report.get('warm_start')}")
    print(f"{'round':>5} {'step':>4} {'reward':>7} {'pass':>5} {'>eager':>6} {'>comp':>6}  {'reward after turn':<18} "
          f"{'round s':>7}")
    for r in report["steps"]:
        print(f"{r.get('round', '-'):>5} {r['step']:>4} {_fmt(r['reward']):>7} {_fmt(r['pass_rate']):>5} "
              f"{_fmt(r['faster_than_eager']):>6} {_fmt(r['faster_than_compile']):>6}  "
              f"{' '.join(_fmt(x) for x in r['reward_after_turn']):<18} {_fmt(r.get('round_s', r['step_s']), '.1f'):>7}")
    for key, label in (("heldout", "held-out"), ("trained_tasks", "trained tasks, greedy")):
        h = report.get(key) or {}
        if "reward_mean" in h:
            first = (h.get("by_turn") or [{}])[0]
            print(f"{label} ({h.get('n')} episodes): reward {_fmt(h['reward_mean'])} pass {_fmt(h['pass_rate'])} "
                  f">eager {_fmt(h['faster_than_eager_rate'])} >compile {_fmt(h['faster_than_compile_rate'])}; "
                  f"first turn: reward {_fmt(first.get('reward_mean'))} pass {_fmt(first.get('pass_rate'))}")
    print(f"ok={report.get('ok')} steps={report.get('global_step')} wall={report['wall_s']} s")


SETTINGS_FREE = ("lr", "control", "out", "arm", "trained_arm", "turn_credit", "warm_start_from", "save_warm_start",
                 "summary_name")


def summarize(folder: str, window: int = 3, trained_arm: str = "trained", out_name: str = "summary.json") -> dict:
    """`out_name` (summary.json) from `<trained_arm>.json` and control.json in `folder` (see the module docstring)."""
    arms = {}
    for arm, name in (("trained", trained_arm), ("control", "control")):
        with open(os.path.join(folder, f"{name}.json")) as f:
            arms[arm] = json.load(f)
    n = min(len(arms["trained"]["steps"]), len(arms["control"]["steps"]))
    if n == 0:
        raise ValueError("an arm has no steps")
    k = max(1, min(window, n // 2))
    rewards = {a: [s["reward"] for s in r["steps"][:n]] for a, r in arms.items()}

    def mean(xs):
        return sum(xs) / len(xs)

    std = statistics.pstdev(rewards["control"]) if n > 1 else 0.0
    out = {
        "steps_compared": n, "window": k,
        "trained_first_reward": mean(rewards["trained"][:k]), "trained_last_reward": mean(rewards["trained"][-k:]),
        "control_first_reward": mean(rewards["control"][:k]), "control_last_reward": mean(rewards["control"][-k:]),
        "control_step_std": std,
        "reward_by_step": {a: rewards[a] for a in rewards},
        "pass_rate_by_step": {a: [s["pass_rate"] for s in r["steps"][:n]] for a, r in arms.items()},
        "heldout": {a: r.get("heldout") for a, r in arms.items()},
        "trained_tasks": {a: r.get("trained_tasks") for a, r in arms.items()},
        "warm_start": {a: r.get("warm_start") for a, r in arms.items()},
        "tasks": arms["trained"]["tasks"], "device": arms["trained"]["device"],
        "trained_arm": trained_arm,
        # what may differ: the learning rate and what only the loss sees (turn_credit: lr 0 trains nothing)
        "same_settings": {k2: v for k2, v in arms["trained"]["settings"].items() if k2 not in SETTINGS_FREE}
        == {k2: v for k2, v in arms["control"]["settings"].items() if k2 not in SETTINGS_FREE},
    }
    out["learned"] = (out["trained_last_reward"] > out["trained_first_reward"]
                      and out["trained_last_reward"] - out["control_last_reward"] > std)
    # The window criterion reads 3 rounds at each end, so one lucky round can decide it; beside it,
    # what uses every round: a line through each arm's rounds, and the mean of the rounds after the
    # first (the first is sampled before any update) with its standard error.
    out["trend"] = {a: trend(rewards[a]) for a in rewards}
    out["same_warm_start"] = (None if not all(r.get("warm_start_sha256") for r in arms.values())
                              else arms["trained"]["warm_start_sha256"] == arms["control"]["warm_start_sha256"])
    _write(os.path.join(folder, out_name), out)
    print(json.dumps({k2: out[k2] for k2 in ("steps_compared", "trained_first_reward", "trained_last_reward",
                                             "control_last_reward", "control_step_std", "learned", "same_warm_start",
                                             "trend")}, indent=2))
    for a in ("trained", "control"):
        t = out["trained_tasks"].get(a) or {}
        t1 = (t.get("by_turn") or [{}])[0]
        print(f"trained tasks {a}: reward {_fmt(t.get('reward_mean'))} pass {_fmt(t.get('pass_rate'))}; first turn: "
              f"reward {_fmt(t1.get('reward_mean'))} pass {_fmt(t1.get('pass_rate'))}")
        h = out["heldout"].get(a) or {}
        print(f"held-out {a}: reward {_fmt(h.get('reward_mean'))} pass {_fmt(h.get('pass_rate'))} "
              f">eager {_fmt(h.get('faster_than_eager_rate'))} >compile {_fmt(h.get('faster_than_compile_rate'))}")
    return out


def trend(rewards: list[float]) -> dict:
    """Least-squares slope per round (with its standard error) and the mean of the rounds after the
    first (with its standard error), of one arm's per-round mean rewards."""
    n = len(rewards)
    out: dict = {"rounds": n, "first_round": rewards[0] if rewards else None}
    if n >= 3:
        mx, my = (n - 1) / 2, statistics.fmean(rewards)
        sxx = sum((i - mx) ** 2 for i in range(n))
        slope = sum((i - mx) * (y - my) for i, y in enumerate(rewards)) / sxx
        resid = sum((y - my - slope * (i - mx)) ** 2 for i, y in enumerate(rewards))
        out.update(slope=slope, slope_se=math.sqrt(resid / (n - 2) / sxx))
    later = rewards[1:]
    if len(later) >= 2:
        out.update(mean_after_first=statistics.fmean(later), mean_after_first_se=statistics.stdev(later) / math.sqrt(len(later)))
    return out


def parse(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", default=None, help="a generated shard folder (default: tasks drawn by the sampler)")
    p.add_argument("--sample-seeds", type=int, default=800, help="without --shards: sampler seeds 0..N-1")
    p.add_argument("--scale", type=float, default=1.0, help="sampler size scale (1.0: GPU sizes)")
    p.add_argument("--tasks", default="lowerable", choices=["lowerable", "all"])
    p.add_argument("--heldout-fraction", type=float, default=0.15)
    p.add_argument("--limit-tasks", type=int, default=8,
                   help="train (and warm-start) on the first N training tasks, so each recurs in the steps (0: all)")
    p.add_argument("--steps", type=int, default=60, help="generation rounds at most (each --num-iterations optimiser steps)")
    p.add_argument("--budget-s", type=float, default=380.0, help="training stops after the step that ends past this")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--episode-reward", default="best", choices=["last", "best", "discounted"],
                   help="best (default): a sampled revision can break a correct first program (the warm start "
                        "writes the program again after feedback about 3 times in 4); the best turn keeps the first turn's signal")
    p.add_argument("--turn-credit", default="all", choices=["all", "scored"],
                   help="scored: the turns after the best one get no advantage (TrainSettings.turn_credit)")
    p.add_argument("--num-generations", type=int, default=8, help="episodes per task (GRPO group)")
    p.add_argument("--tasks-per-step", type=int, default=8, help="tasks a generation round (default: every one "
                   "of the --limit-tasks 8, so a round's mean reward does not move with which tasks it drew)")
    p.add_argument("--num-iterations", type=int, default=4, help="TRL's num_iterations (GRPO's mu): optimiser "
                   "steps on each generated batch (the clipped ratio keeps them near the sampling policy); --steps "
                   "and the step table count generation rounds, TRL's global_step counts optimiser steps")
    p.add_argument("--scale-rewards", default="group", choices=["group", "batch", "none"],
                   help="TRL's scale_rewards: advantages divided by the group's reward std, the batch's, or not")
    p.add_argument("--max-completion-length", type=int, default=160, help="tokens per turn")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=3e-4, help="learning rate (0: the control). Adam at 1e-3 and up "
                   "undoes the warm start faster than GRPO's signal builds at 2 tasks a step (CPU sweeps: "
                   "benchmarks/results/train_learning_h200/attempts/cpu_sweeps.json); at 8 tasks x 8 and 4 "
                   "iterations 6e-4 learned no faster than 3e-4 (cpu_sweeps_2.json)")
    p.add_argument("--control", action="store_true", help="the control arm: learning_rate=0")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear learning-rate warm-up (Adam's first steps "
                   "move every weight by about the learning rate: at 1e-3 and up they undo the warm start)")
    p.add_argument("--optim", default="adamw_torch", help="transformers' optim (sgd: a step in proportion to the "
                   "gradient; Adam moves every weight by about the learning rate from the first step, noise included)")
    p.add_argument("--loss-type", default="grpo", help="TRL's loss_type (grpo: each episode's tokens averaged "
                   "on their own, so the long failed episodes do not outweigh the short correct ones as under dapo)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-start-rate", type=float, default=0.6)
    p.add_argument("--size-variants", type=int, default=2)
    p.add_argument("--warm-start-steps", type=int, default=4000, help="at most; it stops at --warm-start-rate")
    p.add_argument("--reward-workers", type=int, default=None)
    p.add_argument("--score-limit", type=int, default=8, help="held-out tasks scored (0: no scoring; -1: all)")
    p.add_argument("--score-samples", type=int, default=1)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--warm-start-from", default=None, help="a warm-started policy an earlier arm saved "
                   "(--save-warm-start): this arm starts from it, so both arms start from the same weights (the warm "
                   "start on the GPU is not bit-reproducible: three runs of the same seed stopped after 280-345 steps)")
    p.add_argument("--save-warm-start", default=None, help="copy this arm's warm-started policy here (a few MB)")
    p.add_argument("--summarize", default=None, help="write summary.json from trained.json and control.json in DIR")
    p.add_argument("--window", type=int, default=3, help="rounds averaged at each end (--summarize)")
    p.add_argument("--arm", default=None, help="the arm's name in --out (default: trained, or control with --control)")
    p.add_argument("--summary-name", default="summary.json", help="--summarize: the file written in DIR (one per trained arm)")
    p.add_argument("--trained-arm", default="trained", help="--summarize: the trained arm's name (e.g. trained_scored)")
    args = p.parse_args(argv)
    if args.control:
        args.lr = 0.0
    if args.score_limit < 0:
        args.score_limit = None
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.summarize:
        return summarize(args.summarize, args.window, args.trained_arm, args.summary_name)
    os.makedirs(args.out, exist_ok=True)
    return run_arm(args)


if __name__ == "__main__":
    main()
