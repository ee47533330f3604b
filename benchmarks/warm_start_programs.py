"""Are the programs the smoke policy is warm-started on judged correct by the real reward on this
device? The learning benchmark's tasks (sampler seeds, kept to those `warm_start` lowers), the
first `--n` training tasks' programs, judged by `evaluate_many`: reward, reason and the log's tail
of each. A warm start on programs the reward rejects teaches the policy nothing GRPO can use.

    python benchmarks/warm_start_programs.py --device cuda --n 24 --out $OUT/warm_start_programs.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--sample-seeds", type=int, default=800)
    ap.add_argument("--heldout-fraction", type=float, default=0.15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from opsynth.graph.sampler import Sampler, SamplerConfig
    from opsynth.render.parse import task_id
    from opsynth.render.source import render_task
    from opsynth.reward import RewardConfig, evaluate_many
    from opsynth.train.data import split_rows
    from opsynth.train.warm_start import lower_task

    sampler = Sampler(SamplerConfig(scale=1.0 if args.device == "cuda" else 0.25))
    rows, seen = [], set()
    for seed in range(args.sample_seeds):
        code = render_task(sampler.sample(seed).graph)
        tid = task_id(code)
        if tid not in seen and lower_task(code, args.device) is not None:
            seen.add(tid)
            rows.append({"code": code, "task_id": tid})
    train = split_rows(rows, "train", args.heldout_fraction)[: args.n]
    t0 = time.time()
    results = evaluate_many([(r["code"], lower_task(r["code"], args.device)) for r in train],
                            RewardConfig(device=args.device))
    wall = time.time() - t0
    per = [{"task_id": r["task_id"], "reward": res.reward, "reason": res.reason,
            "speedup_vs_eager": getattr(res, "speedup_vs_eager", None), "log_tail": (res.log or "")[-800:]}
           for r, res in zip(train, results)]
    out = {"device": args.device, "n": len(per), "wall_s": round(wall, 1),
           "rewards": dict(collections.Counter(p["reward"] for p in per)),
           "reasons": dict(collections.Counter(p["reason"] for p in per)), "programs": per}
    try:
        import torch

        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        pass
    print(f"{'task':<18} {'reward':>6} reason")
    for p in per:
        print(f"{p['task_id'][:18]:<18} {p['reward']:>6} {p['reason']}")
    print(f"rewards {out['rewards']} reasons {out['reasons']} in {out['wall_s']} s")
    for p in per:
        if p["reward"] < 1:
            print("--- first failure:", p["task_id"], p["reason"], "\n", p["log_tail"])
            break
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return out


if __name__ == "__main__":
    main()
