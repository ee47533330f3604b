"""GRPO training of a kernel-writing policy against the reward environment (TRL's GRPOTrainer).

`train(settings)` takes plain values (no Hydra), so `pipelines/train.py`, tests and the H200
benchmark share it: shards -> split/curriculum -> prompts -> policy -> GRPOTrainer whose rollouts
are episodes of up to `turns` turns judged by the reward environment (`opsynth.train.rollout`; one
turn is plain single-turn GRPO) -> checkpoints, `metrics.jsonl`, `metrics.png`, `summary.json`,
`evaluations-rank<r>.jsonl` (every verdict, by step, turn and episode), `rollouts.jsonl` (the time
split of each step) and a model card naming the policy, the dataset and the reward.
Under `accelerate launch` every rank runs this same function; TRL shards generation and rewards.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from opsynth.train.data import select_tasks
from opsynth.train.episodes import EpisodeConfig
from opsynth.train.policy import PolicyConfig, load_policy
from opsynth.train.prompts import kernel_brief, prompt_record

# GRPOConfig values we set unless the trainer config says otherwise. Asymmetric clipping
# (0.2 / 0.28) follows CUDA-Agent (and DAPO's clip-higher); logging every step keeps the curve.
GRPO_DEFAULTS: dict[str, Any] = {
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "logging_steps": 1,
    "report_to": "none",
    "save_strategy": "steps",
    "save_steps": 50,
    "save_total_limit": 3,
    "use_vllm": False,
    "log_completions": False,
}


@dataclass
class TrainSettings:
    """Everything one training run needs, as plain values (Hydra's conf/train.yaml maps onto it)."""

    shards: str
    # Not under outputs/train/, where Hydra writes every train command's log folder.
    output_dir: str = "runs/train"
    hub_split: str = "train"
    split: str = "train"
    heldout_fraction: float = 0.1
    curriculum: bool = False
    max_num_ops: int | None = None
    limit_tasks: int | None = None
    resume: bool | str = False
    seed: int = 0
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # GRPOConfig keyword arguments; `steps` is accepted for `max_steps`.
    trainer: dict[str, Any] = field(default_factory=dict)
    reward_workers: int | None = None  # candidates built in parallel per process (None: RewardConfig's default)
    reward_env: dict[str, Any] = field(default_factory=dict)  # RewardConfig fields, if any
    # Where the rewards are computed: kind "none" in this process (each rank on its own GPU); else a
    # Dask cluster with generate's settings (opsynth.cluster.ClusterConfig: local, local_cuda, slurm,
    # scheduler + address), whose GPU workers measure, each under its own device lock.
    reward_cluster: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    turns: int = 3  # turns per episode: the policy revises its program after each verdict (1: single-turn)
    episode_reward: str = "last"  # last | best | discounted (sum of turn_discount**(t-1) * reward_t)
    turn_discount: float = 0.4
    print_steps: bool = True  # one line per step on stdout

    def __post_init__(self):
        self.episode()  # validates turns, episode_reward, turn_discount

    def episode(self) -> EpisodeConfig:
        return EpisodeConfig(turns=self.turns, reward=self.episode_reward, discount=self.turn_discount)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainSettings":
        """From a plain mapping (conf/train.yaml as a dict): unknown keys and mistyped values are an
        error naming the setting (the shared config builder)."""
        from opsynth.config import build

        d = dict(d)
        d["policy"] = PolicyConfig.from_dict(d.get("policy"))
        return build(cls, d, "train")


def grpo_config(settings: TrainSettings, use_cpu: bool | None = None):
    """A `trl.GRPOConfig` from the trainer settings, rejecting keys GRPOConfig does not have."""
    import torch
    from trl import GRPOConfig

    kwargs = {**GRPO_DEFAULTS, **dict(settings.trainer)}
    if "steps" in kwargs:
        kwargs["max_steps"] = kwargs.pop("steps")
    if use_cpu if use_cpu is not None else not torch.cuda.is_available():
        # GRPOConfig defaults to bf16 and gradient checkpointing, both meant for GPUs.
        kwargs.setdefault("bf16", False)
        kwargs.setdefault("gradient_checkpointing", False)
        kwargs["use_cpu"] = True
    kwargs.setdefault("shuffle_dataset", not settings.curriculum)
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    # transformers 5 renamed gradient_checkpointing* to activation_checkpointing* (the old names
    # warn on every run): the configs keep the name users know; pass the one the installed version reads.
    for old, new in (("gradient_checkpointing", "activation_checkpointing"),
                     ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
        if old in kwargs and new in names:
            kwargs.setdefault(new, kwargs.pop(old))
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise ValueError(f"GRPOConfig has no field(s) {unknown}")
    return GRPOConfig(output_dir=settings.output_dir, seed=settings.seed, **kwargs)


def reward_env_config(settings: TrainSettings):
    """The reward environment's `RewardConfig`; `reward_workers` sets how many candidates build at once."""
    from opsynth.reward.eval_types import RewardConfig

    values = dict(settings.reward_env)
    if settings.reward_workers:
        values.setdefault("build_workers", settings.reward_workers)
    cfg = RewardConfig.from_dict(values)  # unknown keys are an error
    if settings.reward_workers and "measure_workers" not in values and not cfg.resolved_prebuild(cfg.resolved_device()):
        cfg.measure_workers = settings.reward_workers  # without prebuild, candidates build in the measuring children
    return cfg


def reward_cluster_evaluator(settings: TrainSettings):
    """evaluate_many bound to the Dask cluster `reward_cluster` names (None: in this process).

    The cluster lives as long as this process (closed at exit)."""
    spec = dict(settings.reward_cluster or {})
    if spec.get("kind", "none") in ("none", None):
        return None
    import atexit

    from opsynth.cluster import ClusterConfig, start_cluster
    from opsynth.config import build
    from opsynth.reward.evaluate import evaluate_many

    handle = start_cluster(build(ClusterConfig, spec, "reward_cluster"))
    atexit.register(handle.close)
    return lambda pairs, cfg: evaluate_many(pairs, cfg, client=handle.client)


class OutputDirInUse(ValueError):
    """output_dir holds an earlier run and `resume` is off: a new run would mix its checkpoints and
    metrics with that one's (and rotate its checkpoints away)."""


RUN_MARKS = ("metrics.jsonl", "summary.json", "final")  # besides checkpoint-*: what a training run leaves


def check_output_dir(settings: TrainSettings) -> None:
    """Refuse to start a fresh run in a folder that holds an earlier one (one line, no model loaded)."""
    if settings.resume or not os.path.isdir(settings.output_dir):
        return
    found = sorted(n for n in os.listdir(settings.output_dir) if n.startswith("checkpoint-") or n in RUN_MARKS)
    if found:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise OutputDirInUse(f"output_dir={settings.output_dir} holds an earlier training run ({shown}); resume=true "
                             "continues it, or give another output_dir")


def resume_checkpoint(settings: TrainSettings) -> str | None:
    """The checkpoint to resume from: an explicit path, or the newest one under the output dir."""
    if not settings.resume:
        return None
    if isinstance(settings.resume, str) and settings.resume.lower() not in ("true", "last"):
        return settings.resume
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(settings.output_dir) if os.path.isdir(settings.output_dir) else None


def _checkpoint_step(path: str | None) -> int | None:
    if not path:
        return None
    with open(os.path.join(path, "trainer_state.json")) as f:
        return int(json.load(f)["global_step"])


def train(
    settings: TrainSettings,
    completion_to_candidate: Callable[[str], str] | None = None,
    model_and_tokenizer: tuple[Any, Any] | None = None,
    prompt_fn: Callable[[dict[str, Any]], Any] | None = None,
    evaluate_many_fn: Callable[[list[tuple[str, str]], Any], list[Any]] | None = None,
    feedback_fn: Callable[[Any, int], str] | None = None,
    callbacks: list[Any] | None = None,
) -> dict[str, Any]:
    """Run GRPO; return the summary (also written to `<output_dir>/summary.json`).

    `model_and_tokenizer` and `prompt_fn` let a caller bring its own policy and prompt layout (the
    learning tests do: a one-token policy picking among known candidates via
    `completion_to_candidate`). By default the policy comes from `settings.policy`.
    `evaluate_many_fn` stands in for the reward environment's `evaluate_many` (tests), and
    `feedback_fn(result, attempt)` for the feedback turn's wording (`opsynth.train.feedback`);
    `callbacks` are extra `transformers.TrainerCallback`s (a benchmark's time budget, say).
    """
    from datasets import Dataset

    from opsynth.train.metrics import MetricsJsonl, StepPrinter, read_metrics
    from opsynth.train.model_card import write_model_card
    from opsynth.train.reward_fn import KernelReward
    from opsynth.train.rollout import EpisodeReward, MultiTurnRollout, prompt_key

    rows = select_tasks(  # first: shards that give no tasks leave no output folder behind
        settings.shards, split=settings.split, heldout_fraction=settings.heldout_fraction,
        curriculum=settings.curriculum, max_num_ops=settings.max_num_ops, limit=settings.limit_tasks,
        hub_split=settings.hub_split,
    )
    check_output_dir(settings)
    os.makedirs(settings.output_dir, exist_ok=True)
    brief = kernel_brief(reward_env_config(settings).quoted_settings())  # the tolerance the reward applies
    if model_and_tokenizer is not None:
        model, tokenizer = model_and_tokenizer
        chat = False
    else:
        from accelerate import PartialState

        from opsynth.train.policy import SMOKE_NAME
        from opsynth.train.warm_start import smoke_examples

        examples = []
        if settings.policy.name_or_path == SMOKE_NAME:  # its programs are C++ or CUDA, as the reward runs them
            device = reward_env_config(settings).resolved_device()
            examples = smoke_examples(rows, settings.policy.smoke.warm_start_tasks, device)
            if settings.policy.smoke.warm_start_tasks:
                print(f"[train] smoke policy: warm start on {len(examples)} of {len(rows)} tasks' "
                      f"{'CUDA' if device == 'cuda' else 'C++'} programs"
                      + ("" if examples else " (none of these tasks is one opsynth.train.warm_start can write; "
                         "the smoke policy will not write programs)"), flush=True)
        # Rank 0 builds (or downloads) the policy first; the others then read it from the cache.
        with PartialState().main_process_first():
            model, tokenizer, chat = load_policy(
                settings.policy, settings.output_dir, corpus=[brief] + [r["code"] for r in rows],
                warm_start_examples=examples,
            )
    records = [prompt_fn(r) if prompt_fn else prompt_record(r, chat, brief) for r in rows]
    dataset = Dataset.from_list(records)
    tasks = {prompt_key(rec["prompt"]): row for rec, row in zip(records, rows)}

    args = grpo_config(settings)
    rank = int(os.environ.get("RANK", "0"))
    if evaluate_many_fn is None:
        evaluate_many_fn = reward_cluster_evaluator(settings)
    reward_fn = KernelReward(
        reward_env_config(settings),
        completion_to_candidate=completion_to_candidate,
        log_path=os.path.join(settings.output_dir, f"evaluations-rank{rank}.jsonl"),
        evaluate_many_fn=evaluate_many_fn,
    )
    episode = settings.episode()
    rollout = MultiTurnRollout(reward_fn, episode, chat, tasks, feedback=feedback_fn)
    checkpoint = resume_checkpoint(settings)
    metrics_path = os.path.join(settings.output_dir, "metrics.jsonl")
    rollouts_path = os.path.join(settings.output_dir, f"rollouts-rank{rank}.jsonl")
    if not checkpoint and rank == 0:
        for path in (metrics_path, rollouts_path, reward_fn.log_path):
            if os.path.exists(path):
                os.remove(path)  # a fresh run starts a fresh curve
    card = dict(policy=settings.policy.name_or_path, shards=settings.shards, split=settings.split,
                tasks=len(rows), reward_env=reward_fn.eval_cfg, episode=episode, trainer=settings.trainer)
    trainer_cls = _card_writing_trainer(lambda out: write_model_card(out, **card))
    trainer = trainer_cls(
        model=model,
        reward_funcs=[EpisodeReward(episode.turns)],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=[MetricsJsonl(metrics_path, resume_step=_checkpoint_step(checkpoint),
                                rollouts=rollout, rollouts_path=rollouts_path), *(callbacks or [])],
    )
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)  # both print each step's whole log dict (some 40 keys)
    trainer.remove_callback(PrinterCallback)
    if settings.print_steps:
        trainer.add_callback(StepPrinter(episode.turns))
    result = trainer.train(resume_from_checkpoint=checkpoint)
    final_dir = os.path.join(settings.output_dir, "final")
    trainer.save_model(final_dir)
    summary: dict[str, Any] = {}
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(final_dir)
        steps = read_metrics(metrics_path) if os.path.exists(metrics_path) else []
        summary = {
            "output_dir": settings.output_dir,
            "policy": settings.policy.name_or_path,
            "tasks": len(rows),
            "turns": episode.turns,
            "episode_reward": episode.reward,
            "global_step": trainer.state.global_step,
            "resumed_from": checkpoint,
            "train_runtime_s": result.metrics.get("train_runtime"),
            "first_reward": steps[0]["reward"] if steps else None,
            "last_reward": steps[-1]["reward"] if steps else None,
            "reward_by_step": [(s["step"], s["reward"]) for s in steps],
            "evaluations": len(reward_fn.history),
        }
        with open(os.path.join(settings.output_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        write_model_card(final_dir, **card, summary=summary)
        write_model_card(settings.output_dir, **card, summary=summary)
    return summary


def _card_writing_trainer(write: Callable[[str], None]):
    """GRPOTrainer whose model card (written with every checkpoint) is ours: TRL's names the base
    model from `config._name_or_path`, which is empty for a policy built in memory ("[None]")."""
    from trl import GRPOTrainer

    class OpsynthGRPOTrainer(GRPOTrainer):
        def create_model_card(self, model_name=None, dataset_name=None, tags=None):
            if self.is_world_process_zero():
                write(self.args.output_dir)

    return OpsynthGRPOTrainer
