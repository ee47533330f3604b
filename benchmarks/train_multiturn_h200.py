"""A short multi-turn GRPO run on generated shards, with real rewards: per-step and per-turn
metrics and the time of each step split into generation, evaluation and the update.

The policy is the smoke policy (or a local model folder), warm-started on the programs that
`opsynth.train.warm_start` writes for a few of the tasks (CUDA on a GPU, C++ on the CPU backend),
so its completions build, run and are judged from the first step; each episode has up to `--turns`
turns, the environment's verdict going back to the policy between them; each turn's programs across
the batch are judged in one `evaluate_many` call. Training stops early once `--budget-s` has passed
(the step in progress finishes), so a call under a device time limit still ends with its results.

    python benchmarks/train_multiturn_h200.py --shards /tmp/gen --out /tmp/train_multiturn_h200

Writes under --out: `per_step.jsonl` (one row a step: reward, pass and faster rates, reward after
each turn, how often a later turn improved, seconds generating / evaluating / updating, programs
judged per turn), `per_turn.json` (per turn over the run: programs judged, pass and faster rates,
verdicts by reason, evaluation seconds), `summary.json` (device, versions, settings, totals) and
`run/` (the trainer's own metrics.jsonl, metrics.png, evaluations and rollouts logs; checkpoints and
weights removed). Prints a table. On the CPU it runs as is (C++ programs, small settings).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections import Counter, defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _budget_callback(budget_s: float):
    from transformers import TrainerCallback

    class Budget(TrainerCallback):
        """Stop after the step that ends past the time budget (its results are kept)."""

        def __init__(self):
            self.t0 = time.time()

        def on_step_end(self, args, state, control, **kwargs):
            if time.time() - self.t0 > budget_s:
                print(f"[bench] time budget of {budget_s:.0f} s reached after step {state.global_step}", flush=True)
                control.should_training_stop = True

    return Budget()


def per_step(run_dir: str, turns: int) -> list[dict]:
    """The trainer's metrics and the rollout's time split, one row a step."""
    rollouts = {r["step"]: r for r in _jsonl(os.path.join(run_dir, "rollouts-rank0.jsonl"))}
    out = []
    for m in _jsonl(os.path.join(run_dir, "metrics.jsonl")):
        if "reward" not in m:
            continue
        r = rollouts.get(m["step"], {})
        gen, ev = sum(r.get("generation_s", [])), sum(r.get("evaluation_s", []))
        step_s = m.get("step_time_s")
        row = {
            "step": m["step"], "reward": m.get("reward"), "pass_rate": m.get("kernel/pass_rate"),
            "faster_than_eager": m.get("kernel/faster_than_eager"), "faster_than_compile": m.get("kernel/faster_than_compile"),
            "reward_after_turn": [m.get(f"turn/{t}/reward") for t in range(1, turns + 1)],
            "pass_rate_after_turn": [m.get(f"turn/{t}/pass_rate") for t in range(1, turns + 1)],
            "improved": m.get("episode/improved"), "turns_used": m.get("episode/turns"),
            "generation_s": round(gen, 3), "evaluation_s": round(ev, 3),
            "generation_s_by_turn": r.get("generation_s"), "evaluation_s_by_turn": r.get("evaluation_s"),
            "judged_by_turn": r.get("evaluated"), "step_s": step_s,
            "update_s": round(step_s - gen - ev, 3) if isinstance(step_s, (int, float)) else None,
        }
        out.append(row)
    return out


def per_turn(run_dir: str, turns: int) -> dict:
    """Per turn over the whole run: what the environment said about the programs written then."""
    evals = []
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("evaluations-rank") and name.endswith(".jsonl"):
            evals += _jsonl(os.path.join(run_dir, name))
    eval_s: dict[int, float] = defaultdict(float)
    for r in _jsonl(os.path.join(run_dir, "rollouts-rank0.jsonl")):
        for t, s in enumerate(r.get("evaluation_s", []), start=1):
            eval_s[t] += s
    out = {}
    for t in range(1, turns + 1):
        es = [e for e in evals if e.get("turn") == t]
        n = len(es)
        out[str(t)] = {
            "judged": n,
            "pass_rate": sum(e["correct"] for e in es) / n if n else None,
            "faster_than_eager": sum(e["reward"] >= 2 for e in es) / n if n else None,
            "faster_than_compile": sum(e["reward"] >= 3 for e in es) / n if n else None,
            "reached_environment": sum(e["reason"] != "no_code" for e in es) / n if n else None,
            "by_reason": dict(Counter(e["reason"].split(":")[0] for e in es).most_common()),
            "evaluation_s": round(eval_s.get(t, 0.0), 2),
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", required=True, help="generated shards (a folder in the Hub layout)")
    p.add_argument("--policy", default="smoke", help="'smoke' or a local model folder")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--episode-reward", default="last", choices=["last", "best", "discounted"])
    p.add_argument("--num-generations", type=int, default=4, help="episodes per task (GRPO group)")
    p.add_argument("--tasks-per-step", type=int, default=2)
    p.add_argument("--max-completion-length", type=int, default=256, help="tokens per turn")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--limit-tasks", type=int, default=64)
    p.add_argument("--warm-start-tasks", type=int, default=8, help="smoke policy: tasks it is warm-started on")
    p.add_argument("--budget-s", type=float, default=240.0, help="stop after the step that ends past this")
    p.add_argument("--reward-workers", type=int, default=None, help="candidates built at once (default: the reward's)")
    p.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "train_multiturn_h200"))
    args = p.parse_args(argv)

    import torch
    import transformers
    import trl

    from opsynth.train.policy import PolicyConfig, SmokePolicyConfig
    from opsynth.train.trainer import TrainSettings, train

    device = _device()
    on_gpu = device != "cpu"
    os.makedirs(args.out, exist_ok=True)
    run_dir = os.path.join(args.out, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    smoke = args.policy == "smoke"
    settings = TrainSettings(
        shards=args.shards, output_dir=run_dir, split="train", limit_tasks=args.limit_tasks,
        policy=PolicyConfig(name_or_path=args.policy, dtype="float32" if smoke or not on_gpu else "bfloat16",
                            chat=False if smoke else "auto", smoke=SmokePolicyConfig(warm_start_tasks=args.warm_start_tasks)),
        reward_workers=args.reward_workers, turns=args.turns, episode_reward=args.episode_reward,
        trainer=dict(steps=args.steps, learning_rate=args.lr, beta=0.0, num_generations=args.num_generations,
                     per_device_train_batch_size=args.num_generations * args.tasks_per_step,
                     max_completion_length=args.max_completion_length, temperature=1.0, save_steps=10_000,
                     loss_type="dapo", bf16=on_gpu and not smoke, gradient_checkpointing=False),
    )
    t0 = time.time()
    summary: dict = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__,
                     "trl": trl.__version__, "policy": args.policy, "settings": vars(args)}
    try:
        result = train(settings, callbacks=[_budget_callback(args.budget_s)])
        summary.update(ok=True, global_step=result.get("global_step"), tasks=result.get("tasks"),
                       evaluations=result.get("evaluations"), train_runtime_s=result.get("train_runtime_s"))
    except Exception as exc:  # keep whatever the run wrote
        import traceback

        traceback.print_exc()
        summary.update(ok=False, error=repr(exc)[:500])
    summary["wall_s"] = round(time.time() - t0, 1)
    recipe = os.path.join(run_dir, "smoke_policy", "smoke_recipe.json")
    if os.path.exists(recipe):
        with open(recipe) as f:
            summary["warm_start"] = json.load(f).get("warm_start")

    steps = per_step(run_dir, args.turns) if os.path.isdir(run_dir) else []
    turns = per_turn(run_dir, args.turns) if os.path.isdir(run_dir) else {}
    summary["time_split_s"] = {k: round(sum(r[k] or 0 for r in steps), 2) for k in ("generation_s", "evaluation_s", "update_s")}
    with open(os.path.join(args.out, "per_step.jsonl"), "w") as f:
        for r in steps:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(args.out, "per_turn.json"), "w") as f:
        json.dump(turns, f, indent=2)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    if os.path.isdir(run_dir):  # keep logs and plots, not checkpoints or weights
        for sub in os.listdir(run_dir):
            path = os.path.join(run_dir, sub)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)

    def fmt(v, spec=".2f"):
        return format(v, spec) if isinstance(v, (int, float)) else "-"

    print(f"\ntrain_multiturn on {device}: policy {args.policy}, {args.turns} turns, "
          f"{args.tasks_per_step} tasks x {args.num_generations} episodes a step")
    print(f"{'step':>4} {'reward':>7} {'pass':>5} {'>eager':>6} {'>comp':>6}  {'reward after turn':<20} {'improved':>8} "
          f"{'gen s':>6} {'eval s':>7} {'upd s':>6}")
    for r in steps:
        by_turn = " ".join(fmt(x) for x in r["reward_after_turn"])
        print(f"{r['step']:>4} {fmt(r['reward']):>7} {fmt(r['pass_rate']):>5} {fmt(r['faster_than_eager']):>6} "
              f"{fmt(r['faster_than_compile']):>6}  {by_turn:<20} {fmt(r['improved']):>8} {fmt(r['generation_s'], '.1f'):>6} "
              f"{fmt(r['evaluation_s'], '.1f'):>7} {fmt(r['update_s'], '.1f'):>6}")
    for t, s in turns.items():
        print(f"turn {t}: judged {s['judged']}, pass {fmt(s['pass_rate'])}, >eager {fmt(s['faster_than_eager'])}, "
              f">compile {fmt(s['faster_than_compile'])}, eval {s['evaluation_s']} s, reasons {s['by_reason']}")
    print(f"ok={summary.get('ok')} steps={summary.get('global_step')} wall={summary['wall_s']} s "
          f"split={summary['time_split_s']}  -> {args.out}")
    return summary


if __name__ == "__main__":
    main()
