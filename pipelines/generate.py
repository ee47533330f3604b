"""python -m pipelines.generate [n_tasks=N] [output_dir=DIR] [cluster=local|local_cuda|slurm|scheduler]
[verify=auto|cpu|cuda] [sampler=ops6k|small] [dedup=offline|default] [seed=S] ...

Generate an Ops-6K-style dataset: Parquet shards under DIR/data/, DIR/README.md (dataset card),
DIR/report.json and DIR/plots/. Rerunning with the same output_dir resumes the run.
"""

from __future__ import annotations

import copy
import json
import sys

from omegaconf import DictConfig

from opsynth import cli


def settings() -> dict:
    """The dataclasses the settings build (imported on demand: they import torch)."""
    from opsynth.generate.config import GenerateConfig

    return {"": GenerateConfig}


def interrupted(cfg: DictConfig) -> str:
    """What a Ctrl-C leaves: the rows on disk (every committed row) and how to go on."""
    from opsynth.shards import count_rows

    try:
        rows = count_rows(cfg.output_dir)
    except Exception:  # no folder yet, or a shard being replaced at that instant
        rows = None
    kept = f"kept {rows} row(s) in {cfg.output_dir}" if rows is not None else f"kept what {cfg.output_dir} holds"
    return f"interrupted: {kept}; run the same command again to resume from there"


@cli.entry("generate", fields=settings, interrupted=interrupted)
def main(cfg: DictConfig) -> None:
    import distributed  # noqa: F401  (sets its loggers' levels on import: import first, then quiet them)

    from opsynth.dedup.kernelbench import KernelBenchUnavailable
    from opsynth.generate.config import generate_config
    from opsynth.generate.driver import run
    from opsynth.shards.writer import FolderLocked

    cli.quiet_libraries()
    try:
        gen_cfg = generate_config(cfg)
        copy.deepcopy(gen_cfg).validate()
        gen_cfg.check_machine()
    except (TypeError, ValueError) as e:  # a bad setting: say which, without a traceback
        raise cli.UsageError(f"invalid configuration: {e}") from None
    from opsynth.cluster import ClusterError, ClusterLost
    from opsynth.generate.state import DatasetFolderError

    try:
        summary = run(gen_cfg)
    except (KernelBenchUnavailable, FolderLocked, ClusterError) as e:  # they name what to change: one line, exit 2
        raise cli.UsageError(str(e)) from None
    except DatasetFolderError as e:  # a damaged output folder: which file, and what to do; exit 2
        raise cli.UsageError(str(e)) from None
    except ClusterLost as e:  # no worker left mid-run (Slurm): one line, exit 2
        raise cli.UsageError(str(e)) from None
    keep = ("n_tasks", "accepted", "num_rejected", "acceptance_rate", "candidates_per_minute", "wall_time_s",
            "device", "rejected")
    print(json.dumps({k: summary.get(k) for k in keep}, default=str))
    if summary.get("generated", True):  # a finished folder said "nothing to generate" already
        print(f"wrote {len(summary['files'])} shard(s) to {cfg.output_dir}", file=sys.stderr)
    if summary["rows"] < gen_cfg.n_tasks:  # scripts chaining generate && push must see the shortfall
        print(f"error: only {summary['rows']} of n_tasks={gen_cfg.n_tasks} rows after max_candidates "
              f"candidates; raise max_candidates or look at the rejection reasons in report.json", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
