"""Push a generated dataset folder to the Hugging Face Hub: `python -m pipelines.push output_dir=... repo_id=...`.

Dry run by default (prints the plan); `upload=true` creates the dataset repo if needed and uploads.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from opsynth.shards.push import UploadPlan, plan_upload, push

log = logging.getLogger(__name__)


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


@hydra.main(config_path="../conf", config_name="push", version_base=None)
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
