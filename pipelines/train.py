"""`python -m pipelines.train`: GRPO on opsynth shards, rewarded by the reward environment.

Thin Hydra entry point: conf/train.yaml (groups policy/ and trainer/) -> `opsynth.train.trainer.train`.
A bad setting or shards that give no tasks is one line on stderr, exit 2; Ctrl-C says what was
kept and how to resume, exit 130 (the project's CLI contract, `opsynth.cli.entry`).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from opsynth import cli


def settings() -> dict:
    """The dataclass the settings build (imported on demand: it imports torch and TRL)."""
    from opsynth.train.trainer import TrainSettings

    return {"": TrainSettings}


def interrupted(cfg: DictConfig) -> str:
    return (f"interrupted: the checkpoints saved so far are in {cfg.output_dir}; "
            f"the same command with resume=true continues from the newest one")


def quiet_training_libraries() -> None:
    """Silence what transformers and TRL print that a user cannot act on: a deprecation warning TRL
    itself triggers (it reads `model.is_gradient_checkpointing`) and the bar every checkpoint save
    draws ("Writing model shards"). The per-step line is the run's progress."""
    import warnings

    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    hf_logging.disable_progress_bar()


def run(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """Train with plain values taken from the config; returns the run summary."""
    from opsynth.train.data import TrainDataError
    from opsynth.train.trainer import (OutputDirInUse, TrainSettings, grpo_config, reward_env_config,
                                       rewards_in_process, train)

    values = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    values.pop("hydra", None)
    try:
        train_settings = TrainSettings.from_dict(values)
        grpo_config(train_settings)  # trainer.* keys GRPOConfig lacks, before any model loads
        if rewards_in_process(train_settings):  # rewards computed here
            reward_env_config(train_settings).check_device()
    except (TypeError, ValueError) as e:  # a bad setting: say which, without a traceback
        raise cli.UsageError(f"invalid configuration: {e}") from None
    quiet_training_libraries()
    try:
        summary = train(train_settings)
    except TrainDataError as e:  # shards=... gives no tasks: the caller's input
        raise cli.UsageError(f"shards={train_settings.shards}: {e}") from None
    except OutputDirInUse as e:  # an earlier run's folder without resume=true
        raise cli.UsageError(str(e)) from None
    if summary:
        print(f"[train] steps {summary['global_step']}  reward first {summary['first_reward']} "
              f"last {summary['last_reward']}  -> {summary['output_dir']}")
    return summary



def _isolation_unavailable():
    from opsynth.runtime.sandbox import IsolationUnavailable  # the refusal is one line, exit 2

    return IsolationUnavailable


@cli.entry("train", fields=settings, interrupted=interrupted, usage_errors=(_isolation_unavailable(),))
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
