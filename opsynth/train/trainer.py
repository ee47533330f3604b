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

from opsynth.cluster import ClusterConfig
from opsynth.config import build, to_plain
from opsynth.reward.eval_types import RewardConfig
from opsynth.train.data import select_tasks
from opsynth.train.episodes import EpisodeConfig
from opsynth.train.policy import PolicyConfig, load_policy
from opsynth.train.prompts import kernel_brief, prompt_record
from opsynth.train.recipe import VLLM_FIELDS, LoraSettings, VllmSettings, build_block, peft_config, vllm_grpo_kwargs

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
    "log_completions": False,
}
IN_PROCESS = "none"  # reward_cluster.kind: rewards computed in this process, no cluster


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
    # Candidates in flight per process: the default of reward_env.build_workers, and (prebuild off:
    # candidates then build in the measuring children) the measure_workers, which reward_env may then
    # not set to another number. None: the reward's defaults.
    reward_workers: int | None = None
    reward_env: RewardConfig = field(default_factory=RewardConfig)  # the reward environment's settings
    # Where the rewards are computed: kind "none" in this process (each rank on its own GPU); else a
    # Dask cluster with generate's settings (opsynth.cluster.ClusterConfig: local, local_cuda, slurm,
    # scheduler + address), whose GPU workers measure, each under its own device lock.
    reward_cluster: ClusterConfig = field(default_factory=lambda: ClusterConfig(kind=IN_PROCESS))
    turns: int = 3  # turns per episode: the policy revises its program after each verdict (1: single-turn)
    episode_reward: str = "last"  # last | best | discounted (sum of turn_discount**(t-1) * reward_t)
    turn_discount: float = 0.4
    turn_credit: str = "all"  # all | scored (no advantage for the turns after the one episode_reward scores)
    print_steps: bool = True  # one line per step on stdout
    # The recipe for a real model (opsynth.train.recipe): LoRA adapters through peft, and TRL's vLLM
    # generation; gradient checkpointing (None: on with a GPU, off on the CPU) trades compute for memory.
    lora: LoraSettings = field(default_factory=LoraSettings)
    vllm: VllmSettings = field(default_factory=VllmSettings)
    gradient_checkpointing: bool | None = None

    def __post_init__(self):
        self.episode()  # validates turns, episode_reward, turn_discount, turn_credit
        self.lora = build_block(LoraSettings, self.lora, "lora")
        self.vllm = build_block(VllmSettings, self.vllm, "vllm")
        owned = sorted(k for k in self.trainer if k in VLLM_FIELDS)
        if owned:
            raise ValueError(f"trainer.{owned[0]} is set by vllm.{VLLM_FIELDS[owned[0]]} (the vllm block of "
                             "conf/train.yaml); set it there")
        for key in ("gradient_checkpointing", "activation_checkpointing"):
            if self.gradient_checkpointing is not None and key in self.trainer \
                    and bool(self.trainer[key]) != self.gradient_checkpointing:
                raise ValueError(f"gradient_checkpointing={self.gradient_checkpointing} and trainer.{key}="
                                 f"{self.trainer[key]} disagree; set gradient_checkpointing only")
        if not isinstance(self.reward_env, RewardConfig):  # a mapping (a caller's dict, a YAML block)
            self.reward_env = RewardConfig.from_dict(self.reward_env)
        if not isinstance(self.reward_cluster, ClusterConfig):
            spec = dict(to_plain(self.reward_cluster) or {})
            if spec.get("kind") is None:
                spec["kind"] = IN_PROCESS
            self.reward_cluster = build(ClusterConfig, spec, "reward_cluster")
        if self.reward_cluster.kind != IN_PROCESS:
            self.reward_cluster.validate()
        self.reward_env = _with_reward_workers(self.reward_env, self.reward_workers)

    def episode(self) -> EpisodeConfig:
        return EpisodeConfig(turns=self.turns, reward=self.episode_reward, discount=self.turn_discount,
                             credit=self.turn_credit)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainSettings":
        """From a plain mapping (conf/train.yaml as a dict): unknown keys and mistyped values are an
        error naming the setting (the shared config builder)."""
        d = dict(d)
        d["policy"] = PolicyConfig.from_dict(d.get("policy"))
        return build(cls, d, "train")


def _with_reward_workers(cfg: RewardConfig, workers: int | None) -> RewardConfig:
    """`cfg` with `reward_workers` folded in once, as a new (validated) RewardConfig.

    `reward_workers` is the default of `reward_env.build_workers` (an explicit build_workers wins).
    Without prebuild it is also the number of measuring children (candidates build in them): that
    value has one knob, so a `reward_env.measure_workers` set to another number is refused."""
    if not workers:
        return cfg
    values = {"build_workers": cfg.build_workers or workers}
    if not cfg.resolved_prebuild(cfg.resolved_device()):
        if cfg.measure_workers not in (None, 0, workers):
            raise ValueError(f"reward_workers={workers} and reward_env.measure_workers={cfg.measure_workers} both set "
                             "the measuring children in flight (prebuild=false); set reward_workers only")
        values["measure_workers"] = workers
    return dataclasses.replace(cfg, **values)


def grpo_config(settings: TrainSettings, use_cpu: bool | None = None):
    """A `trl.GRPOConfig` from the trainer settings, rejecting keys GRPOConfig does not have."""
    import torch
    from trl import GRPOConfig

    kwargs = {**GRPO_DEFAULTS, **dict(settings.trainer), **vllm_grpo_kwargs(settings.vllm)}
    if "steps" in kwargs:
        kwargs["max_steps"] = kwargs.pop("steps")
    if settings.gradient_checkpointing is not None:
        kwargs["gradient_checkpointing"] = settings.gradient_checkpointing
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


def reward_env_config(settings: TrainSettings) -> RewardConfig:
    """The reward environment's `RewardConfig` (`reward_workers` already folded in)."""
    return settings.reward_env


def rewards_in_process(settings: TrainSettings) -> bool:
    return settings.reward_cluster.kind == IN_PROCESS


def reward_cluster_evaluator(settings: TrainSettings):
    """evaluate_many bound to the Dask cluster `reward_cluster` names (None: in this process).

    The cluster lives as long as this process (closed at exit)."""
    if rewards_in_process(settings):
        return None
    import atexit

    from opsynth.cluster import start_cluster
    from opsynth.reward.evaluate import evaluate_many

    handle = start_cluster(settings.reward_cluster)
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
    from opsynth.train import trl_internals

    trl_internals.check()  # a TRL whose internals moved stops here, before any model loads
    rows = select_tasks(  # first: shards that give no tasks leave no output folder behind
        settings.shards, split=settings.split, heldout_fraction=settings.heldout_fraction,
        curriculum=settings.curriculum, max_num_ops=settings.max_num_ops, limit=settings.limit_tasks,
        hub_split=settings.hub_split,
    )
    check_output_dir(settings)
    os.makedirs(settings.output_dir, exist_ok=True)
    brief = kernel_brief(reward_env_config(settings).quoted_settings())  # the tolerance the reward applies
    if model_and_tokenizer is not None:
        (model, tokenizer), chat = model_and_tokenizer, False
    else:
        model, tokenizer, chat = _load_policy(settings, rows, brief)
    run = _RunFiles(settings, resume_checkpoint(settings))
    trainer, reward_fn, card, episode = _grpo_trainer(
        settings, rows, model, tokenizer, chat, brief, run, prompt_fn=prompt_fn,
        completion_to_candidate=completion_to_candidate, evaluate_many_fn=evaluate_many_fn,
        feedback_fn=feedback_fn, callbacks=callbacks)
    result = trainer.train(resume_from_checkpoint=run.checkpoint)
    summary = _finish(settings, trainer, tokenizer, result, run, reward_fn, card, episode, tasks=len(rows))
    _end_distributed(trainer)
    return summary


def _end_distributed(trainer) -> None:
    """Under `accelerate launch`: every rank waits here until rank 0 has written final/ and the
    summary (no rank returns, or exits, while another still talks to it), and the process group is
    destroyed at exit, while the interpreter is still whole. A gloo group left to interpreter
    shutdown can abort the process (SIGABRT, "terminate called without an active exception": its
    worker threads outlive Python). Destroyed at exit rather than here, so a caller may still use the
    group after `train` returns (a second run, its own collectives)."""
    import atexit

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    trainer.accelerator.wait_for_everyone()
    global _DESTROY_AT_EXIT
    if not _DESTROY_AT_EXIT:
        _DESTROY_AT_EXIT = True
        atexit.register(_destroy_process_group)


_DESTROY_AT_EXIT = False  # the exit handler is registered once per process


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():  # a caller may have destroyed it already
        dist.destroy_process_group()


def _load_policy(settings: TrainSettings, rows: list[dict[str, Any]], brief: str):
    """The policy of `settings.policy` (the smoke policy warm-started on these tasks' programs, at
    the trainer's sampling temperature); rank 0 builds or downloads it first, the other ranks then
    read it from the cache."""
    from accelerate import PartialState

    from opsynth.train.policy import SMOKE_NAME
    from opsynth.train.warm_start import passages, revision_examples, size_variant_examples, smoke_examples

    examples: list[tuple[str, str]] = []
    variants: list[tuple[str, str]] = []
    revisions: list[tuple[str, str, str, str]] = []
    device = reward_env_config(settings).resolved_device()
    n = settings.policy.smoke.warm_start_tasks
    if settings.policy.name_or_path == SMOKE_NAME and n != 0:  # its programs are C++ or CUDA, as the reward runs them
        examples = smoke_examples(rows, n, device, brief=brief)
        variants = size_variant_examples(rows, n, settings.policy.smoke.warm_start_size_variants, device, brief=brief)
        if settings.turns > 1 and settings.policy.smoke.warm_start_revisions:
            revisions = revision_examples(examples, seed=settings.policy.smoke.seed)
        print(f"[train] smoke policy: warm start on {len(examples)} of {len(rows)} tasks' "
              f"{'CUDA' if device == 'cuda' else 'C++'} programs"
              + (" (every one opsynth.train.warm_start can write)" if n is None and examples else "")
              + ("" if examples else " (none of these tasks is one opsynth.train.warm_start can write; "
                 "the smoke policy will not write programs)"), flush=True)
    with PartialState().main_process_first():
        return load_policy(settings.policy, settings.output_dir, corpus=[brief] + [r["code"] for r in rows],
                           warm_start_examples=examples, passages=passages(device, brief),
                           temperature=grpo_sampling_temperature(settings), warm_start_variants=variants,
                           warm_start_revisions=revisions)


def grpo_sampling_temperature(settings: TrainSettings) -> float:
    """The temperature GRPO samples completions at (the trainer's `temperature`, else GRPOConfig's)."""
    if "temperature" in settings.trainer:
        return float(settings.trainer["temperature"])
    from trl import GRPOConfig

    return float(next(f.default for f in dataclasses.fields(GRPOConfig) if f.name == "temperature"))


@dataclass
class _RunFiles:
    """Where this rank's run writes, and the checkpoint it resumes from (None: a fresh run)."""

    settings: TrainSettings
    checkpoint: str | None
    rank: int = field(default_factory=lambda: int(os.environ.get("RANK", "0")))

    @property
    def metrics(self) -> str:
        return os.path.join(self.settings.output_dir, "metrics.jsonl")

    @property
    def rollouts(self) -> str:
        return os.path.join(self.settings.output_dir, f"rollouts-rank{self.rank}.jsonl")

    @property
    def evaluations(self) -> str:
        return os.path.join(self.settings.output_dir, f"evaluations-rank{self.rank}.jsonl")

    def start_fresh(self) -> None:
        """A fresh run starts a fresh curve: rank 0 removes an earlier run's logs."""
        if not self.checkpoint and self.rank == 0:
            for path in (self.metrics, self.rollouts, self.evaluations):
                if os.path.exists(path):
                    os.remove(path)


def _grpo_trainer(settings: TrainSettings, rows, model, tokenizer, chat: bool, brief: str, run: _RunFiles, *,
                  prompt_fn, completion_to_candidate, evaluate_many_fn, feedback_fn, callbacks):
    """The GRPOTrainer of this run: prompts, the reward environment behind a multi-turn rollout,
    our model card, the metrics callbacks. Returns (trainer, reward function, card fields, episode)."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from opsynth.train.metrics import MetricsJsonl, StepPrinter
    from opsynth.train.model_card import write_model_card
    from opsynth.train.reward_fn import KernelReward
    from opsynth.train.rollout import EpisodeReward, MultiTurnRollout, prompt_key

    records = [prompt_fn(r) if prompt_fn else prompt_record(r, chat, brief) for r in rows]
    tasks = {prompt_key(rec["prompt"]): row for rec, row in zip(records, rows)}
    args = grpo_config(settings)
    evaluator = evaluate_many_fn if evaluate_many_fn is not None else reward_cluster_evaluator(settings)
    reward_fn = KernelReward(
        reward_env_config(settings),
        completion_to_candidate=completion_to_candidate,
        log_path=run.evaluations,
        evaluate_many_fn=evaluator,
    )
    if evaluator is None:  # rewards in this process: its fork servers start while the first completions are sampled
        from opsynth.reward.servers import prestart

        prestart(reward_fn.eval_cfg)
    episode = settings.episode()
    rollout = MultiTurnRollout(reward_fn, episode, chat, tasks, feedback=feedback_fn)
    run.start_fresh()
    card = dict(policy=settings.policy.name_or_path, shards=settings.shards, split=settings.split,
                tasks=len(rows), reward_env=reward_fn.eval_cfg, episode=episode, trainer=settings.trainer)
    trainer_cls = _card_writing_trainer(lambda out: write_model_card(out, **card))
    trainer = trainer_cls(
        model=model,
        reward_funcs=[EpisodeReward(episode.turns, episode)],
        args=args,
        train_dataset=Dataset.from_list(records),
        processing_class=tokenizer,
        rollout_func=rollout,
        peft_config=peft_config(settings.lora),
        callbacks=[MetricsJsonl(run.metrics, resume_step=_checkpoint_step(run.checkpoint),
                                rollouts=rollout, rollouts_path=run.rollouts), *(callbacks or [])],
    )
    trainer.remove_callback(ProgressCallback)  # both print each step's whole log dict (some 40 keys)
    trainer.remove_callback(PrinterCallback)
    if settings.print_steps:
        trainer.add_callback(StepPrinter(episode.turns))
    return trainer, reward_fn, card, episode


def _finish(settings: TrainSettings, trainer, tokenizer, result, run: _RunFiles, reward_fn, card, episode,
            tasks: int) -> dict[str, Any]:
    """Save the final policy; on rank 0 write `summary.json` and the model cards; the summary."""
    from opsynth.train.metrics import read_metrics
    from opsynth.train.model_card import write_model_card

    final_dir = os.path.join(settings.output_dir, "final")
    lora = settings.lora.enabled
    trainer.save_model(os.path.join(final_dir, "adapter") if lora else final_dir)
    if not trainer.is_world_process_zero():
        return {}
    if lora:  # final/ is a whole model (scored, served or trained on like any checkpoint); final/adapter the adapter
        trainer.accelerator.unwrap_model(trainer.model).merge_and_unload().save_pretrained(final_dir)
    tokenizer.save_pretrained(final_dir)
    steps = read_metrics(run.metrics) if os.path.exists(run.metrics) else []
    summary: dict[str, Any] = {
        "output_dir": settings.output_dir,
        "policy": settings.policy.name_or_path,
        "tasks": tasks,
        "turns": episode.turns,
        "episode_reward": episode.reward,
        "global_step": trainer.state.global_step,
        "resumed_from": run.checkpoint,
        "train_runtime_s": result.metrics.get("train_runtime"),
        "first_reward": steps[0]["reward"] if steps else None,
        "last_reward": steps[-1]["reward"] if steps else None,
        "reward_by_step": [(s["step"], s["reward"]) for s in steps],
        "evaluations": len(reward_fn.history),
        "lora": settings.lora.enabled,
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
