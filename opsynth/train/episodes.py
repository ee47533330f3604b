"""Multi-turn episodes: the policy writes a program, reads the environment's verdict, and revises it.

Turn 1 is the task prompt (`opsynth.train.prompts`). After each candidate the verdict goes back as
the next user turn (`opsynth.train.feedback`) and the policy answers with a revised program, up to
`turns` turns; an episode stops early once a program scores 3. Each turn's candidates across the
whole batch are judged together, in one `evaluate_many` call.

The episode is one completion for GRPO: every turn's policy tokens and the feedback tokens between
them, concatenated after the prompt, with `env_mask` 1 on policy tokens and 0 on feedback (and on
any end-of-turn token the environment had to add). The loss sees only the policy's own tokens; the
feedback stays in the context the policy was conditioned on.

This module is free of TRL: generation and judging come in as callables, so tests drive it with
scripted policies and fake environments. `opsynth.train.rollout` connects it to GRPOTrainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from opsynth.train.feedback import format_feedback
from opsynth.train.records import EvalRecord

STOP_REWARD = 3.0  # the top reward: nothing left to improve, the episode ends
EPISODE_REWARDS = ("last", "best", "discounted")
TURN_CREDITS = ("all", "scored")

# (batch of token-id lists) -> (generated ids per sequence, their sampling log-probs or None)
GenerateFn = Callable[[list[list[int]]], tuple[list[list[int]], list[list[float]] | None]]
# (task codes, completion texts, task ids) -> [(EvalRecord, EvalResult-like)], one environment call
JudgeFn = Callable[[list[str], list[str], list[str | None]], list[tuple[EvalRecord, Any]]]


@dataclass
class EpisodeConfig:
    """How an episode runs and what it scores.

    `reward`: `last` (the last program's reward), `best` (the best turn's) or `discounted`
    (sum over turns t = 1.. of `discount`**(t-1) * reward_t: earlier success is worth more).
    `credit`: which turns' tokens the episode's advantage trains. `all`: every turn's. `scored`: the
    turns up to the one the reward describes (`scored_turn`); under `best` the turns after the best
    program produced nothing the reward counts, and with `all` a correct first turn also rewards a
    broken revision after it (the H200 run of 2026-12-03: turn 2 scored -1 in 890 of 896 episodes).
    Under `last` and `discounted` the scored turn is the last, so both settings train every turn.
    """

    turns: int = 3
    reward: str = "last"
    discount: float = 0.4
    credit: str = "all"

    def __post_init__(self):
        if not isinstance(self.turns, int) or isinstance(self.turns, bool) or self.turns < 1:
            raise ValueError(f"turns must be an integer >= 1, got {self.turns!r}")
        if self.reward not in EPISODE_REWARDS:
            raise ValueError(f"episode_reward must be one of {EPISODE_REWARDS}, got {self.reward!r}")
        if not (0.0 < float(self.discount) <= 1.0):
            raise ValueError(f"turn_discount must be in (0, 1], got {self.discount!r}")
        if self.credit not in TURN_CREDITS:
            raise ValueError(f"turn_credit must be one of {TURN_CREDITS}, got {self.credit!r}")


@dataclass
class Turn:
    """One program and its verdict."""

    text: str
    record: EvalRecord
    feedback: str | None = None  # the user turn that followed it (None if the episode ended here)
    result: Any = field(default=None, repr=False)  # the environment's verdict (EvalResult) it came from


@dataclass
class Episode:
    """One rollout: the prompt, then turns of policy tokens and feedback tokens."""

    task_code: str
    task_id: str | None
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1: the policy's token; 0: the environment's
    logprobs: list[float] | None = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    turn_starts: list[int] = field(default_factory=list)  # where each turn's policy tokens begin in completion_ids

    def context(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def add(self, ids: Sequence[int], policy: bool, logprobs: Sequence[float] | None = None) -> None:
        ids = list(ids)
        self.completion_ids += ids
        self.env_mask += [1 if policy else 0] * len(ids)
        if self.logprobs is not None:
            if policy and logprobs is not None and len(logprobs) == len(ids):
                self.logprobs += [float(x) for x in logprobs]
            elif policy:
                self.logprobs = None  # a turn without sampling log-probs: none for the episode
            else:
                self.logprobs += [math.nan] * len(ids)  # TRL leaves NaN positions out of its IS correction

    @property
    def rewards(self) -> list[float]:
        return [t.record.reward for t in self.turns]

    def reward(self, cfg: EpisodeConfig) -> float:
        return episode_reward(self.rewards, cfg)

    def loss_mask(self, cfg: EpisodeConfig) -> list[int]:
        """`env_mask` with, under `credit=scored`, the tokens after the scored turn masked too."""
        if cfg.credit == "all" or not self.turns:
            return list(self.env_mask)
        t = scored_turn(self.rewards, cfg)
        if t + 1 >= len(self.turn_starts):
            return list(self.env_mask)
        cut = self.turn_starts[t + 1]
        return self.env_mask[:cut] + [0] * (len(self.env_mask) - cut)


def episode_reward(rewards: Sequence[float], cfg: EpisodeConfig) -> float:
    """The episode's scalar reward from its per-turn rewards."""
    if not rewards:
        return -1.0
    if cfg.reward == "last":
        return float(rewards[-1])
    if cfg.reward == "best":
        return float(max(rewards))
    return float(sum(r * cfg.discount**t for t, r in enumerate(rewards)))


def scored_turn(rewards: Sequence[float], cfg: EpisodeConfig) -> int:
    """The index of the turn whose program the episode's reward describes: the best one (the
    first of equals) for `best`, else the last (for `discounted` the program the episode ends with)."""
    if cfg.reward == "best" and rewards:
        return max(range(len(rewards)), key=lambda t: (rewards[t], -t))
    return len(rewards) - 1


def improved(rewards: Sequence[float]) -> bool | None:
    """Whether a later turn beat every earlier one (None for a one-turn episode)."""
    if len(rewards) < 2:
        return None
    return any(r > max(rewards[:t]) for t, r in enumerate(rewards) if t > 0)


class TurnCodec:
    """The tokens of the environment's side of the conversation, for a chat or a plain-text policy.

    Chat: the feedback is a user message in the tokenizer's own chat template, followed by the
    assistant header, found as the difference between the template rendered with and without it
    (as TRL does for tool results). Plain text: a labelled paragraph, then a cue for the revision.
    """

    def __init__(self, tokenizer: Any, chat: bool, eos_token_ids: Sequence[int] | None = None):
        self.tokenizer = tokenizer
        self.chat = chat
        ids = list(eos_token_ids or [])
        if not ids and getattr(tokenizer, "eos_token_id", None) is not None:
            ids = [tokenizer.eos_token_id]
        self.eos_token_ids = ids

    def end_of_turn(self) -> list[int]:
        """What closes a turn the policy left unfinished (it hit the length limit)."""
        return self.eos_token_ids[:1]

    def feedback_ids(self, text: str) -> list[int]:
        if not self.chat:
            body = f"\n\nFeedback from the environment:\n{text}\n\nRevised program:\n"
            return list(self.tokenizer(body, add_special_tokens=False)["input_ids"])
        tok = self.tokenizer
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        prefix = tok.apply_chat_template(base, tokenize=True, add_generation_prompt=False, return_dict=False)
        full = tok.apply_chat_template(base + [{"role": "user", "content": text}], tokenize=True,
                                       add_generation_prompt=True, return_dict=False)
        prefix, full = _ids(prefix), _ids(full)
        ends = [i for i, t in enumerate(prefix) if t in self.eos_token_ids]
        if ends:  # the generated turn ends at its end-of-turn token; the template may add a newline after
            prefix = prefix[: ends[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError("chat template: the conversation without feedback is not a prefix of the one with it")
        return full[len(prefix):]


def _ids(x: Any) -> list[int]:
    if isinstance(x, dict):
        x = x["input_ids"]
    if x and isinstance(x[0], list):
        x = x[0]
    return list(x)


@dataclass
class TurnTiming:
    """Seconds spent generating and judging, per turn (the rollout's time split)."""

    generation_s: list[float] = field(default_factory=list)
    evaluation_s: list[float] = field(default_factory=list)


def run_episodes(
    prompt_ids: list[list[int]],
    task_codes: list[str],
    task_ids: list[str | None],
    generate: GenerateFn,
    judge: JudgeFn,
    decode: Callable[[list[int]], str],
    codec: TurnCodec,
    cfg: EpisodeConfig,
    lockstep: bool = False,
    timing: TurnTiming | None = None,
    on_turn: Callable[[int, list[int], list[Episode]], None] | None = None,
    feedback: Callable[[Any, int], str] = format_feedback,
) -> list[Episode]:
    """Run one episode per prompt, turn by turn, the whole batch at once.

    Per turn: one `generate` call for every unfinished episode, one `judge` call for all their
    programs, then feedback tokens for those that go on. `lockstep` (several ranks) keeps every
    rank's calls in step: all `turns` turns run and every episode is generated for (the finished
    ones' output is dropped), since the generation backends synchronise ranks.
    `on_turn(turn, indices, episodes)` is called after each turn is judged; `feedback(result,
    attempt)` words a verdict (default: `opsynth.train.feedback.format_feedback`).
    """
    import time

    episodes = [Episode(task_code=c, task_id=t, prompt_ids=list(p)) for p, c, t in zip(prompt_ids, task_codes, task_ids)]
    for turn in range(1, cfg.turns + 1):
        active = [i for i, e in enumerate(episodes) if not e.done]
        if not active and not lockstep:
            break
        asked = list(range(len(episodes))) if lockstep else active
        t0 = time.perf_counter()
        gen_ids, gen_logps = generate([episodes[i].context() for i in asked]) if asked else ([], None)
        t1 = time.perf_counter()
        by_index = {i: (gen_ids[k], gen_logps[k] if gen_logps is not None else None) for k, i in enumerate(asked)}
        texts = [decode(by_index[i][0]) for i in active]
        verdicts = judge([episodes[i].task_code for i in active], texts, [episodes[i].task_id for i in active]) if active else []
        t2 = time.perf_counter()
        if timing is not None:
            timing.generation_s.append(t1 - t0)
            timing.evaluation_s.append(t2 - t1)
        for i, text, (record, result) in zip(active, texts, verdicts):
            e = episodes[i]
            ids, logps = by_index[i]
            e.turn_starts.append(len(e.completion_ids))
            e.add(ids, policy=True, logprobs=logps)
            e.turns.append(Turn(text=text, record=record, result=result))
            if record.reward >= STOP_REWARD or turn == cfg.turns:
                e.done = True
                continue
            if not ids or ids[-1] not in codec.eos_token_ids:
                e.add(codec.end_of_turn(), policy=False)
            fb = feedback(result, turn)
            e.turns[-1].feedback = fb
            e.add(codec.feedback_ids(fb), policy=False)
        if on_turn is not None:
            on_turn(turn, active, episodes)
    return episodes
