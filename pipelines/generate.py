"""python -m pipelines.generate [n_tasks=N] [output_dir=DIR] [cluster=local|local_cuda|slurm|scheduler]
[verify=auto|cpu|cuda] [sampler=ops6k|small] [dedup=offline|default] [seed=S] ...

Generate an Ops-6K-style dataset: Parquet shards under DIR/data/, DIR/README.md (dataset card),
DIR/report.json and DIR/plots/. Rerunning with the same output_dir resumes the run.
"""

from __future__ import annotations

import copy
import json
import logging
import sys

import hydra
from omegaconf import DictConfig

from opsynth.cluster import ClusterError, ClusterLost
from opsynth.config import generate_config
from opsynth.pipeline import run


@hydra.main(config_path="../conf", config_name="generate", version_base=None)
def main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import distributed  # noqa: F401  (sets its loggers' levels on import: import first, then quiet them)

    for noisy in ("distributed", "tornado", "asyncio"):  # the progress bar says what matters
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        gen_cfg = generate_config(cfg)
        copy.deepcopy(gen_cfg).validate()
    except (TypeError, ValueError) as e:  # a bad setting: say which, without a traceback
        print(f"error: invalid configuration: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        summary = run(gen_cfg)
    except (ClusterError, ClusterLost) as e:  # e.g. Slurm refused the job, no worker in time: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    keep = ("n_tasks", "accepted", "num_rejected", "acceptance_rate", "candidates_per_minute", "wall_time_s",
            "device", "rejected")
    print(json.dumps({k: summary.get(k) for k in keep}, default=str))
    print(f"wrote {len(summary['files'])} shard(s) to {cfg.output_dir}", file=sys.stderr)
    if summary["rows"] < gen_cfg.n_tasks:  # scripts chaining generate && push must see the shortfall
        print(f"error: only {summary['rows']} of n_tasks={gen_cfg.n_tasks} rows after max_candidates "
              f"candidates; raise max_candidates or look at the rejection reasons in report.json", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
