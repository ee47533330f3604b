"""Episodes inside TRL's GRPOTrainer: a `rollout_func` with `env_mask`, and the episode reward.

Which TRL mechanism, and why. TRL 1.16 offers three ways to put an environment in the loop:
`tools` (the model calls Python functions through its chat template's tool-call syntax),
`environment_factory` (the same, with one environment object per rollout) and `rollout_func`
(the caller generates, TRL trains on what it returns). The first two fit an agent that *decides*
to call a tool: TRL parses tool calls out of each completion and runs them one completion at a
time. Here the environment answers after *every* program, no tool-call syntax is involved (the
smoke policy has no chat template at all), and each turn's programs across the whole batch must
be judged by one `evaluate_many` call so that builds run in parallel and timings take the device
in turn. `rollout_func` gives exactly that: we generate turn by turn for the batch (through the
trainer's own `_generate_single_turn`, so `use_vllm` and transformers generation both work), judge
each turn's programs together, append the feedback tokens, and return the whole episode as one
completion with `env_mask` (TRL's name for the mask it multiplies into the loss mask, as it does
for tool results): 1 on the policy's tokens, 0 on the feedback. The episode's reward and per-turn
outcomes travel as extra fields, which TRL hands to the reward function.

With one turn this is plain single-turn GRPO (one generation, one evaluation per completion), so
one code path serves both. The TRL internals this needs (`_generate_single_turn`,
`_tokenize_prompts`, `_log_metric`) go through `opsynth.train.trl_internals`, which pins the TRL
versions they were read against; `tests/train/test_train_multiturn.py` runs them for real.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from opsynth.train import trl_internals
from opsynth.train.feedback import format_feedback
from opsynth.train.episodes import EpisodeConfig, Episode, TurnCodec, TurnTiming, improved, run_episodes, scored_turn
from opsynth.train.prompts import completion_text
from opsynth.train.records import EvalRecord
from opsynth.train.reward_fn import KernelReward, log_record_metrics

# TRL warns on every run that rollout_func is experimental; we chose it knowingly (see above).
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def prompt_key(prompt: Any) -> str:
    """The text that identifies a prompt (a string, or the last user message of a chat prompt).

    TRL hands `rollout_func` only the prompts, so the task behind each is found by this key; the
    prompt holds the task's code verbatim, so two prompts share a key only for the same task."""
    if isinstance(prompt, str):
        return prompt
    return completion_text([m for m in prompt if isinstance(m, dict) and m.get("role") == "user"][-1:])


def after_turn(records: list[EvalRecord], t: int) -> EvalRecord:
    """The episode's program after `t` turns: the one written at turn t, or the last one if it
    stopped earlier (having reached the top reward)."""
    return records[min(t, len(records)) - 1]


@dataclass
class StepRollout:
    """What one rollout call did: the time split and the per-turn evaluation counts."""

    step: int
    episodes: int
    generation_s: list[float] = field(default_factory=list)
    evaluation_s: list[float] = field(default_factory=list)
    evaluated: list[int] = field(default_factory=list)  # programs judged per turn
    turn_rewards: list[list[float]] = field(default_factory=list)  # per episode

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "episodes": self.episodes, "generation_s": [round(x, 3) for x in self.generation_s],
                "evaluation_s": [round(x, 3) for x in self.evaluation_s], "evaluated": self.evaluated,
                "turn_rewards": self.turn_rewards}


class MultiTurnRollout:
    """TRL `rollout_func`: runs one episode per prompt (see `opsynth.train.episodes`).

    `tasks` maps `prompt_key(prompt)` to the task row (`code`, `task_id`). `generate` replaces the
    trainer's generation (tests), as `(trainer, batch_ids) -> (ids, logprobs)`; `feedback(result,
    attempt)` words a verdict (default `format_feedback`).
    """

    def __init__(self, reward: KernelReward, cfg: EpisodeConfig, chat: bool, tasks: dict[str, dict[str, Any]],
                 generate: Callable[[Any, list[list[int]]], tuple[list[list[int]], Any]] | None = None,
                 feedback: Callable[[Any, int], str] | None = None):
        self.reward = reward
        self.feedback = feedback or format_feedback
        self.cfg = cfg
        self.chat = chat
        self.tasks = tasks
        self._generate = generate
        self.history: list[StepRollout] = []

    def _generate_with(self, trainer):
        if self._generate is not None:
            return lambda batch: self._generate(trainer, batch)
        # One completion per context: the prompts TRL gives us already repeat each task num_generations times.
        return lambda batch: trl_internals.generate_single_turn(trainer, batch)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        try:
            rows = [self.tasks[prompt_key(p)] for p in prompts]
        except KeyError:
            raise KeyError("rollout_func got a prompt that is not in the training set") from None
        prompt_ids = trl_internals.tokenize_prompts(trainer, prompts)
        tok = trainer.processing_class
        codec = TurnCodec(tok, self.chat, trl_internals.eos_token_ids(trainer))
        step = int(trainer.state.global_step) + 1  # the step these completions train
        timing = TurnTiming()
        evaluated: list[int] = []

        def log_turn(turn: int, active: list[int], episodes: list[Episode]) -> None:
            evaluated.append(len(active))
            records = [episodes[i].turns[-1].record for i in active]
            extra = [{"turn": turn, "episode": i} for i in active]
            self.reward.append_log(records, step, extra)

        lockstep = getattr(getattr(trainer, "accelerator", None), "num_processes", 1) > 1
        mode_of = {r.get("task_id"): r.get("mode") for r in rows}  # each task runs in its row's mode

        def judge(codes, texts, task_ids):
            if not any(mode_of.values()):
                return self.reward.judge(codes, texts, task_ids)
            return self.reward.judge(codes, texts, task_ids, modes=[mode_of.get(t) for t in task_ids])

        episodes = run_episodes(
            [list(p) for p in prompt_ids], [r["code"] for r in rows], [r.get("task_id") for r in rows],
            generate=self._generate_with(trainer), judge=judge,
            decode=lambda ids: tok.decode(ids, skip_special_tokens=True), codec=codec, cfg=self.cfg,
            lockstep=lockstep, timing=timing, on_turn=log_turn, feedback=self.feedback,
        )
        record = StepRollout(step, len(episodes), timing.generation_s, timing.evaluation_s, evaluated,
                             [e.rewards for e in episodes])
        self.history.append(record)
        trl_internals.log_metric(trainer, "time/generation_s", sum(timing.generation_s))
        trl_internals.log_metric(trainer, "time/evaluation_s", sum(timing.evaluation_s))
        logprobs = [e.logprobs for e in episodes]
        return {
            "prompt_ids": [list(p) for p in prompt_ids],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": logprobs if all(lp is not None for lp in logprobs) else None,
            "env_mask": [e.loss_mask(self.cfg) for e in episodes],
            "episode_reward": [e.reward(self.cfg) for e in episodes],
            "episode_records": [[t.record.to_dict() for t in e.turns] for e in episodes],
        }


class EpisodeReward:
    """The GRPO reward of an episode, computed by the rollout (which already judged every turn);
    logs the outcome of the program each episode is scored by (`kernel/*`: the final one, or the
    best turn's under `episode_reward=best`, so `kernel/pass_rate` and `reward` describe the same
    programs), the outcome after each turn (`turn/<t>/*`), and how often a later turn improved on
    the earlier ones (`episode/improved`)."""

    __name__ = "kernel_reward"

    def __init__(self, turns: int, cfg: EpisodeConfig | None = None):
        self.turns = turns
        self.cfg = cfg or EpisodeConfig(turns=turns)

    def __call__(self, prompts: list[Any], completions: list[Any], episode_reward: list[float] | None = None,
                 episode_records: list[list[dict[str, Any]]] | None = None,
                 log_metric: Callable[[str, float], None] | None = None, **_: Any) -> list[float]:
        if episode_reward is None or episode_records is None:
            raise ValueError("EpisodeReward needs the rollout's episode_reward and episode_records fields")
        if log_metric is not None:
            episodes = [[EvalRecord(**r) for r in recs] for recs in episode_records]
            log_record_metrics([recs[scored_turn([r.reward for r in recs], self.cfg)] for recs in episodes if recs],
                               log_metric)
            for t in range(1, self.turns + 1):
                view = [after_turn(recs, t) for recs in episodes]
                for r in view:
                    log_metric(f"turn/{t}/reward", float(r.reward))
                log_record_metrics(view, lambda k, v: log_metric(k.replace("kernel/", f"turn/{t}/"), v)
                                   if not k.startswith(("kernel/reward_frac", "kernel/log_")) else None)
            for recs in episodes:
                log_metric("episode/turns", float(len(recs)))
                up = improved([r.reward for r in recs])
                if up is not None:
                    log_metric("episode/improved", float(up))
        return [float(r) for r in episode_reward]
