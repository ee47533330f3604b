"""`python -m pipelines.train`: GRPO on opsynth shards, rewarded by the reward environment.

Thin Hydra entry point: conf/train.yaml (groups policy/ and trainer/) -> `opsynth.train.trainer.train`.
"""

from __future__ import annotations

from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf


def run(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """Train with plain values taken from the config; returns the run summary."""
    from opsynth.train.trainer import TrainSettings, train

    values = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    values.pop("hydra", None)
    summary = train(TrainSettings.from_dict(values))
    if summary:
        print(f"[train] steps {summary['global_step']}  reward first {summary['first_reward']} "
              f"last {summary['last_reward']}  -> {summary['output_dir']}")
    return summary


@hydra.main(config_path="../conf", config_name="train", version_base=None)
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
