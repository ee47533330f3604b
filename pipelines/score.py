"""`python -m pipelines.score --shards DIR --split heldout (--candidates DIR | --policy PATH_OR_ID) [--turns 3]`:
score a policy, or a folder of candidate files, on a split of generated shards (opsynth.train.score),
with the KernelBench-style table. The Hydra spelling of the same is
`python -m pipelines.evaluate mode=score shards=DIR policy=PATH` (keys `score.*` in conf/evaluate.yaml).
"""

from __future__ import annotations

import argparse
from typing import Any

from opsynth import cli
from opsynth.train import score as score_mod
from opsynth.train.data import TrainDataError


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line; a bad argument or shards without tasks: one `error:` line, exit 2."""
    p = argparse.ArgumentParser(description=score_mod.__doc__.splitlines()[0])
    p.add_argument("--shards", required=True)
    p.add_argument("--split", default="heldout", choices=["train", "heldout", "all"])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--candidates")
    g.add_argument("--policy")
    p.add_argument("--heldout-fraction", type=float, default=0.1)
    p.add_argument("--limit", type=int)
    p.add_argument("--build-workers", type=int, help="parallel candidate builds (default: half the cores)")
    p.add_argument("--samples-per-task", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--turns", type=int, default=3, help="turns per episode for a policy (1: single-turn only)")
    p.add_argument("--out")
    a = p.parse_args(argv)
    s = score_mod.ScoreSettings(shards=a.shards, split=a.split, policy=a.policy, candidates=a.candidates,
                                heldout_fraction=a.heldout_fraction, limit=a.limit, turns=a.turns,
                                samples_per_task=a.samples_per_task, max_new_tokens=a.max_new_tokens,
                                temperature=a.temperature, out=a.out)
    try:
        s.check()
    except ValueError as e:
        cli.fail(str(e))
    try:
        return score_mod.run_settings(s, build_workers=a.build_workers)
    except (TrainDataError, OSError) as e:  # shards that give no tasks, a policy that does not load: one line
        cli.fail(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)


if __name__ == "__main__":
    main()
