"""Push a generated dataset folder to the Hugging Face Hub: `python -m pipelines.push output_dir=... repo_id=...`.

Dry run by default (prints the plan); `upload=true` creates the dataset repo if needed and uploads.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from opsynth import cli
from opsynth.shards.push import PushError, UploadError, UploadPlan, plan_upload, push

log = logging.getLogger(__name__)

REQUIRED = {"output_dir": "add output_dir=<the folder pipelines.generate wrote>, e.g. output_dir=data/my_run",
            "repo_id": "add repo_id=<user or org>/<name> of the Hub dataset repo, e.g. repo_id=you/opsynth-ops"}


def run(cfg: DictConfig) -> UploadPlan:
    """Plan the upload, print it, and upload when `cfg.upload` is true. Returns the plan."""
    plan = plan_upload(
        cfg.output_dir,
        cfg.repo_id,
        private=bool(cfg.private),
        revision=cfg.revision,
        commit_message=cfg.commit_message,
    )
    print(plan.describe())
    if not cfg.upload:
        print("dry run: nothing uploaded; add upload=true to upload")
        return plan
    info = push(plan)
    print(f"uploaded: {getattr(info, 'commit_url', info)}")
    return plan


@cli.entry("push", required=REQUIRED)
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except UploadError as e:  # the Hub refused or the network failed: not the caller's setting
        cli.fail(str(e), code=1)
    except PushError as e:  # no token, no such folder, an unfinished run, a bad repo_id
        raise cli.UsageError(str(e)) from None


if __name__ == "__main__":
    main()
