"""`python -m pipelines.evaluate task=PATH candidate=PATH`: reward of one candidate for one task.

Thin Hydra entry point over `run(cfg)`; prints one JSON object (reward, correct, reason, times, ...)
on its last line. `mode` selects what to do, so other modes (e.g. scoring a policy) slot in beside.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from opsynth import cli

UsageError = cli.UsageError  # the caller's mistake (a missing file, a task that cannot be read or run): one line, exit 2


def _readable(cfg: Any, key: str, what: str) -> Path:
    value = cfg.get(key)
    if value in (None, "", "???"):
        raise UsageError(f"{key}= is required: the path of {what}")
    path = Path(str(value))
    if not path.exists():
        raise UsageError(f"{key}={value}: no such file or folder ({what})")
    return path


def _check_task(task: str, path: Path) -> None:
    """A task the reward cannot even load is the caller's error, not a reward of -1."""
    import ast

    from opsynth.render.task_file import REQUIRED_NAMES

    try:
        tree = ast.parse(task, str(path))
    except SyntaxError as e:
        raise UsageError(f"task={path}: SyntaxError: {e.msg} (line {e.lineno})") from None
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    missing = [n for n in REQUIRED_NAMES if n not in names]
    if missing:
        raise UsageError(f"task={path}: not a KernelBench-format task (missing {', '.join(missing)})")


def _is_task_failure(reason: str) -> bool:
    """The environment could not run the task (kind "environment" in the reasons table), as opposed
    to a verdict on the candidate, which is a reward of -1 and not the caller's error."""
    from opsynth.reward.reasons import lookup

    entry = lookup(reason)[1]
    return entry is not None and entry.kind == "environment"


def _reward(cfg: Any) -> dict:
    from opsynth.reward.eval_types import RewardConfig  # no torch yet: the fork servers start first

    try:
        rcfg = RewardConfig.from_dict(dict(cfg.get("reward") or {}))
    except (TypeError, ValueError) as e:
        raise UsageError(f"invalid configuration: {e}") from None
    task_path = _readable(cfg, "task", "a task file in the KernelBench format")
    cand_path = _readable(cfg, "candidate", "a ModelNew .py file, a workspace folder or a completion")
    from opsynth.reward.servers import prestart

    prestart(rcfg)  # the fork servers start while this process imports torch and the evaluator
    task = task_path.read_text()
    _check_task(task, task_path)
    quiet = bool(cfg.get("quiet"))
    from opsynth.reward.evaluate import RewardSetupError, evaluate

    try:
        result = evaluate(task, cand_path, rcfg, progress=None if quiet else (lambda m: print(m, file=sys.stderr, flush=True)))
    except RewardSetupError as e:
        raise UsageError(str(e)) from None
    if _is_task_failure(result.reason):  # the task itself failed to run: the caller's problem
        first = [ln for ln in result.log.strip().splitlines() if ln.strip()][-1:] or [result.reason]
        raise UsageError(f"task={task_path}: the task does not run ({result.reason}): {first[0][:300]}")
    if cfg.get("show_log"):
        print(result.log, file=sys.stderr)
    out = result.to_dict()
    out.pop("log")
    return out


MODES = {"reward": _reward}


# --- mode=score (training stage, opsynth.train.score) -------------------------------------------
# python -m pipelines.evaluate mode=score shards=DIR policy=PATH [split=heldout] [turns=3] [out=DIR]
#     (or candidates=DIR; the keys live under score.: score.shards=..., conf/evaluate.yaml)
# Prints the KernelBench-style table, then (as every mode) one JSON object: the summary.
SCORE_ALIASES = {k: f"score.{k}" for k in ("shards", "split", "policy", "candidates", "heldout_fraction", "limit",
                                           "turns", "samples_per_task", "max_new_tokens", "temperature", "out")}


def _score(cfg: Any) -> dict:
    from opsynth.config import build
    from opsynth.reward.eval_types import RewardConfig
    from opsynth.train.data import TrainDataError
    from opsynth.train.score import ScoreSettings, run_settings

    # plain dicts (tests, scripts) may give the score keys at the top level, as the command line does
    values = {**dict(cfg.get("score") or {}), **{k: cfg[k] for k in SCORE_ALIASES if k in cfg}}
    try:
        settings = build(ScoreSettings, values, "score")
        settings.check()
        eval_cfg = RewardConfig.from_dict(dict(cfg.get("reward") or {}))
    except ValueError as e:  # a bad setting
        raise UsageError(str(e)) from None
    try:
        return run_settings(settings, eval_cfg=eval_cfg)
    except (TrainDataError, OSError) as e:  # shards that give no tasks, a policy that does not load
        raise UsageError(_first_line(e)) from None


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


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


def _fields() -> dict:
    from opsynth.reward.eval_types import RewardConfig
    from opsynth.train.score import ScoreSettings

    return {"reward": RewardConfig, "score": ScoreSettings}



def _isolation_unavailable():
    from opsynth.runtime.sandbox import IsolationUnavailable  # the refusal is one line, exit 2

    return IsolationUnavailable


@cli.entry("evaluate", fields=_fields, required={"task": None, "candidate": None}, usage_errors=(_isolation_unavailable(),), aliases=SCORE_ALIASES,
           interrupted=lambda cfg: "interrupted: nothing is kept from an unfinished evaluation")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
