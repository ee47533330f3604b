"""`python -m pipelines.evaluate task=PATH candidate=PATH`: reward of one candidate for one task.

Thin Hydra entry point over `run(cfg)`; prints one JSON object (reward, correct, reason, times, ...)
on its last line. `mode` selects what to do, so other modes (e.g. scoring a policy) slot in beside.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf


def _reward(cfg: Any) -> dict:
    from opsynth.reward.eval_types import RewardConfig
    from opsynth.reward.evaluate import evaluate

    rcfg = RewardConfig.from_dict(dict(cfg.get("reward") or {}))
    task = Path(str(cfg["task"])).read_text()
    result = evaluate(task, Path(str(cfg["candidate"])), rcfg)
    if cfg.get("show_log"):
        print(result.log, file=sys.stderr)
    out = result.to_dict()
    out.pop("log")
    return out


MODES = {"reward": _reward}


# --- mode=score (training stage, opsynth.train.score) -------------------------------------------
# python -m pipelines.evaluate mode=score +shards=DIR [+split=heldout] (+candidates=DIR | +policy=PATH)
#     [+heldout_fraction=0.1] [+limit=N] [+out=DIR] [reward.device=...]
# Prints the KernelBench-style table, then (as every mode) one JSON object: the summary.
def _score(cfg: Any) -> dict:
    from opsynth.reward.eval_types import RewardConfig
    from opsynth.train.score import score

    return score(
        str(cfg["shards"]), split=cfg.get("split", "heldout"), candidates=cfg.get("candidates"),
        policy=cfg.get("policy"), heldout_fraction=float(cfg.get("heldout_fraction", 0.1)),
        limit=cfg.get("limit"), out=cfg.get("out"), eval_cfg=RewardConfig.from_dict(dict(cfg.get("reward") or {})),
        samples_per_task=int(cfg.get("samples_per_task", 1)), max_new_tokens=int(cfg.get("max_new_tokens", 1024)),
    )


MODES["score"] = _score
# --- end mode=score ---------------------------------------------------------------------------


def run(cfg: Any) -> dict:
    """Plain entry (tests call it with a dict or DictConfig): dispatches on cfg['mode'] and prints JSON."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    mode = cfg.get("mode", "reward")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {sorted(MODES)}")
    out = MODES[mode](cfg)
    print(json.dumps(out, default=str), flush=True)
    return out


@hydra.main(config_path="../conf", config_name="evaluate", version_base=None)
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
