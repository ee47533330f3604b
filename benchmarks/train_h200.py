"""Short GRPO runs on the GPU with rewards from real CUDA evaluations.

Two runs, both through `opsynth.train.trainer.train` (TRL's GRPOTrainer, reward = the reward env):

1. `shards`: the policy (`--policy smoke` or a local model folder) trains a few steps on the
   generated shards given by --shards. With the smoke policy most completions carry no code (it is
   a random model), so this run shows the loop end to end on the GPU: generation, rewards, updates,
   checkpoints. With a real local model, its fenced code is compiled and timed on the GPU.
2. `bandit`: a one-token policy choosing among three known CUDA `load_inline` candidates (fast,
   slow, wrong; see tests/train/bandit.py). Every completion is compiled, run and timed on the
   GPU by the reward environment, so this run shows rewards from real CUDA evaluations and that
   GRPO raises them.

    python benchmarks/train_h200.py --shards data/run1 [--policy smoke|/path/to/model] [--steps 4]

Writes under --out (default benchmarks/results/train_h200/): `metrics.jsonl` (per-step rows of
both runs, tagged with `run`), `summary.json`, and each run's own folder (metrics.png included).
Imports only what TRL needs (torch, transformers, accelerate, datasets, trl, pyarrow, matplotlib).
On a bare H200 image, carry wheels for trl, datasets and their pure-Python deps that the image
lacks: pandas (+ python-dateutil), dill, multiprocess, xxhash, fsspec.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _rows(path: str, run: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [{"run": run, **json.loads(line)} for line in f if line.strip()]


def _eval_stats(run_dir: str) -> dict:
    """Counts over every evaluation the run made: by reward, by reason, and candidate timings."""
    evals = []
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("evaluations-rank") and name.endswith(".jsonl"):
            with open(os.path.join(run_dir, name)) as f:
                evals += [json.loads(line) for line in f if line.strip()]
    by_reward, by_reason = {}, {}
    for e in evals:
        by_reward[str(int(e["reward"]))] = by_reward.get(str(int(e["reward"])), 0) + 1
        key = e["reason"].split(":")[0]
        by_reason[key] = by_reason.get(key, 0) + 1
    return {"evaluations": len(evals), "by_reward": by_reward, "by_reason": by_reason,
            "judged_by_env": sum(1 for e in evals if e["reason"] not in ("no_code",))}


def run_shards(args, out_dir: str) -> dict:
    from opsynth.train.policy import PolicyConfig
    from opsynth.train.trainer import TrainSettings, train

    on_gpu = _device() != "cpu"
    settings = TrainSettings(
        shards=args.shards,
        output_dir=out_dir,
        split="train",
        limit_tasks=args.limit_tasks,
        curriculum=True,
        policy=PolicyConfig(name_or_path=args.policy, dtype="bfloat16" if on_gpu and args.policy != "smoke" else "float32",
                            chat="auto" if args.policy != "smoke" else False),
        reward_workers=args.build_workers,
        turns=1,  # single-turn, as this benchmark has always measured (multi-turn: train_multiturn_h200.py)
        trainer=dict(
            steps=args.steps, learning_rate=args.lr, beta=0.0, num_generations=args.num_generations,
            per_device_train_batch_size=args.num_generations, max_completion_length=args.max_completion_length,
            temperature=1.0, save_steps=args.steps, loss_type="dapo",
            bf16=on_gpu and args.policy != "smoke", gradient_checkpointing=False,
        ),
    )
    return train(settings)


def run_bandit(args, out_dir: str) -> dict:
    # The bandit is a test fixture (tests/train/bandit.py), not library code: this benchmark runs
    # from a checkout, where it imports the fixture by path.
    sys.path.insert(0, os.path.join(REPO, "tests", "train"))
    from bandit import task_source, train_bandit, write_task_shards

    device = "cuda" if _device() != "cpu" else "cpu"
    # On the GPU the task is made big enough for launch overhead not to hide the kernels' speed.
    dim = args.bandit_dim or (1 << 20 if device == "cuda" else 16384)
    shards = write_task_shards(os.path.join(out_dir, "shards"), task_source(dim), n=4)
    return train_bandit(shards, out_dir, device=device, steps=args.bandit_steps,
                        num_generations=args.bandit_generations,
                        reward_env={"build_workers": args.build_workers})


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", help="generated shards (folder in the Hub layout); omit to run the bandit only")
    p.add_argument("--policy", default="smoke", help="'smoke' or a local model folder")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--limit-tasks", type=int, default=64)
    p.add_argument("--bandit-steps", type=int, default=6)
    p.add_argument("--bandit-generations", type=int, default=6)
    p.add_argument("--bandit-dim", type=int, default=None)
    p.add_argument("--skip-bandit", action="store_true")
    p.add_argument("--build-workers", type=int, default=8)
    p.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "train_h200"))
    args = p.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    device = _device()
    import torch
    import transformers
    import trl

    summary = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__,
               "trl": trl.__version__, "policy": args.policy, "runs": {}}
    runs = []
    if args.shards:
        runs.append(("shards", run_shards))
    if not args.skip_bandit:
        runs.append(("bandit", run_bandit))
    metrics = []
    for name, fn in runs:
        run_dir = os.path.join(args.out, name)
        shutil.rmtree(run_dir, ignore_errors=True)
        t0 = time.time()
        try:
            s = fn(args, run_dir)
            s = {k: v for k, v in s.items() if k != "output_dir"}
            s["ok"] = True
        except Exception as exc:  # record the failure and go on to the next run
            import traceback

            traceback.print_exc()
            s = {"ok": False, "error": repr(exc)[:500]}
        s["wall_s"] = round(time.time() - t0, 1)
        if os.path.isdir(run_dir):
            s.update(_eval_stats(run_dir))
            metrics += _rows(os.path.join(run_dir, "metrics.jsonl"), name)
            # Keep metrics, plot and summary; drop checkpoints and model files from the results folder.
            for sub in os.listdir(run_dir):
                path = os.path.join(run_dir, sub)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
        summary["runs"][name] = s

    with open(os.path.join(args.out, "metrics.jsonl"), "w") as f:
        for row in metrics:
            f.write(json.dumps(row, default=float) + "\n")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)

    print(f"\ntrain_h200 on {device}")
    print(f"{'run':<8} {'step':>4} {'reward':>7} {'pass':>6} {'>eager':>7} {'>compile':>8}")
    for r in metrics:
        if "reward" not in r:
            continue
        fmt = lambda k: f"{r.get(k):.2f}" if isinstance(r.get(k), (int, float)) else "-"  # noqa: E731
        print(f"{r['run']:<8} {r['step']:>4} {fmt('reward'):>7} {fmt('kernel/pass_rate'):>6} "
              f"{fmt('kernel/faster_than_eager'):>7} {fmt('kernel/faster_than_compile'):>8}")
    for name, s in summary["runs"].items():
        print(f"{name}: ok={s.get('ok')} steps={s.get('global_step')} first={s.get('first_reward')} "
              f"last={s.get('last_reward')} evals={s.get('evaluations')} by_reason={s.get('by_reason')} "
              f"wall={s['wall_s']}s")
    print(f"wrote {os.path.join(args.out, 'summary.json')}")
    return summary


if __name__ == "__main__":
    main()
