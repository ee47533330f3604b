"""Multi-turn episodes: what the policy reads after each verdict, the loss mask, early stopping,
one environment call per turn, the episode reward, and a tiny policy that learns to read the fix.

Generation is scripted and the environment is a fake with the real verdict layout (reason, log
lines as the candidate child and the comparison write them, times, details), so these run in
seconds; `test_train_multiturn_real.py` runs an episode against the real CPU environment.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from opsynth.reward.eval_types import EvalResult
from opsynth.reward.reasons import REASONS, RULES
from opsynth.train.episodes import EpisodeConfig, TurnCodec, episode_reward, improved, run_episodes, scored_turn
from opsynth.train.feedback import format_feedback
from opsynth.train.records import record_from_result
from opsynth.train.rollout import EpisodeReward, after_turn

BUILD_LOG = """\
[candidate] building extension opsynth_x
RuntimeError: Error building extension 'opsynth_x': [1/2] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=opsynth_x -O3 -c main.cpp -o main.o
FAILED: main.o
main.cpp: In function 'at::Tensor fused(at::Tensor)':
main.cpp:12:5: error: 'fused_kernel' was not declared in this scope
   12 |     fused_kernel(x.data_ptr<float>(), n);
      |     ^~~~~~~~~~~~
ninja: build stopped: subcommand failed."""

INCORRECT_LOG = """[candidate] copied 2/2 reference weights
[candidate] setup 1.20 s, checks and timing 0.80 s
trial 2: output 0: max abs error 3.02 (atol=0.01, rtol=0.01)"""


def _result(reason, reward=-1, log="", times=None, details=None):
    r = EvalResult(reward=reward, correct=reward > 0, reason=reason, times=dict(times or {}), log=log, device="cpu")
    if details is not None:
        r.details = details
    return r


# ---- the feedback text for each kind of verdict -------------------------------------------------


def test_build_error_feedback_carries_the_trimmed_compiler_errors():
    text = format_feedback(_result("build_error", log=BUILD_LOG), attempt=1)
    assert "build_error" in text and RULES["builds"] in text
    assert "main.cpp:12:5: error: 'fused_kernel' was not declared in this scope" in text
    assert "fused_kernel(x.data_ptr<float>(), n);" in text  # the line after the error: the code
    assert "-DTORCH_EXTENSION_NAME" not in text  # the compiler command line is trimmed away
    assert text.rstrip().endswith("fenced ```python block.")


def test_incorrect_feedback_names_the_output_the_input_and_the_error():
    text = format_feedback(_result("incorrect", log=INCORRECT_LOG))
    assert "output 0 on input set 2" in text and "max abs error 3.02" in text and RULES["match"] in text
    # With the environment's structured details, those win (and carry the relative error too).
    text = format_feedback(_result("incorrect", log=INCORRECT_LOG,
                                   details={"output": 1, "trial": 4, "max_abs_error": 0.5, "max_rel_error": 2.0}))
    assert "output 1 on input set 4" in text and "max abs error 0.5" in text and "max rel error 2" in text
    second = "trial 0: ...\nsecond shape (batch_size changed): incorrect: output 0: max abs error 1.5 (atol=0.01)"
    text = format_feedback(_result("shape_hardcoded", log=second))
    assert "the second shape (batch_size changed)" in text and RULES["any_size"] in text


@pytest.mark.parametrize("name", sorted(n for n, r in REASONS.items() if r.kind == "anti_hacking"))
def test_each_anti_hacking_reason_names_the_rule_and_what_was_seen(name):
    reason = "forbidden_op:aten.relu" if name == "forbidden_op:" else (
        "forbidden_import:ctypes" if name == "forbidden_import:" else name)
    detail = f"trial 0: the detail of {name}"
    text = format_feedback(_result(reason, log=f"[candidate] copied 1/1 reference weights\n"
                                               f"[candidate] rejected: {reason}: {detail}"))
    assert f"rejected your program: {reason} (reward -1)" in text
    assert REASONS[name].what in text and RULES[REASONS[name].rule] in text
    if name not in ("uninitialized_output", "incorrect_under_timing", "output_cached"):
        assert detail in text
    # A static-check rejection carries its detail as the whole log.
    text = format_feedback(_result(reason, log="line 14: torch.relu in forward"))
    assert "line 14: torch.relu in forward" in text or name in ("uninitialized_output", "incorrect_under_timing",
                                                                "output_cached")


def test_timed_feedback_gives_the_timings_the_kernels_and_the_target():
    times = {"candidate_ms": 2.0, "eager_ms": 4.0, "compile_ms": 1.6}
    kernels = [{"name": "fused_relu_kernel", "ms": 1.5}, {"name": "reduce_kernel", "ms": 0.5}]
    text = format_feedback(_result("ok", reward=2, times=times, details={"kernels": kernels}))
    assert "correct and faster than eager PyTorch" in text and "(reward 2)" in text
    assert "your ModelNew 2 ms" in text and "eager PyTorch 4 ms (you are 2.00x as fast)" in text
    assert "torch.compile 1.6 ms (you are 0.80x as fast)" in text
    assert "fused_relu_kernel 1.5 ms (75%)" in text and text.index("fused_relu") < text.index("reduce_kernel")
    assert "To score 3, get under 1.52 ms" in text
    # Without details: the kernel names the candidate child printed from its profiler run.
    log = "[candidate] own kernels seen by the profiler: ['fused_relu_kernel', 'reduce_kernel']"
    text = format_feedback(_result("ok", reward=1, times={"candidate_ms": 5.0, "eager_ms": 4.0}, log=log))
    assert "Your kernels by device time: fused_relu_kernel, reduce_kernel." in text
    assert "To score 2, get under 3.8 ms" in text


def test_feedback_quotes_the_settings_the_verdict_was_reached_with():
    """Not a fixed "of 5 random input sets" / "atol = rtol = 1e-2" / "5%": the environment records
    its settings with every verdict (details["settings"]) and the feedback says those."""
    settings = {"num_trials": 2, "atol": 5e-2, "rtol": 2e-2, "margin": 0.9}
    text = format_feedback(_result("incorrect", log=INCORRECT_LOG, details={"settings": settings}))
    assert "on input set 2 (of 2 random input sets)" in text, text
    assert "atol = 0.05, rtol = 0.02" in text and "1e-2" not in text and "of 5 " not in text, text
    text = format_feedback(_result("ok", reward=1, times={"candidate_ms": 5.0, "eager_ms": 4.0},
                                   details={"settings": settings}))
    assert "To score 2, get under 3.6 ms (more than 10% faster than eager PyTorch)" in text, text
    assert "5%" not in text
    # Without recorded settings: the environment's defaults, in the table's own words.
    text = format_feedback(_result("incorrect", log=INCORRECT_LOG))
    assert "(of 5 random input sets)" in text and "atol = rtol = 1e-2" in text and RULES["match"] in text


def test_no_code_and_environment_failures_are_worded_for_what_they_are():
    text = format_feedback(_result("no_code"))
    assert RULES["format"] in text
    text = format_feedback(_result("task_timeout", log="[sandbox] killed after 600 s"))
    assert "not your program's" in text and "killed after 600 s" in text


# ---- episodes: what the policy receives, masks, stopping, one environment call per turn ----------


@pytest.fixture(scope="module")
def tokenizer():
    from opsynth.train.policy import train_smoke_tokenizer

    return train_smoke_tokenizer(["def forward(self, x): return x  # the environment rejected your program"] * 5, 300)


class ScriptedEnv:
    """Judge: each episode's verdict per turn from a script; records every call."""

    def __init__(self, script):
        self.script = script  # task code -> [result for turn 1, turn 2, ...]
        self.calls: list[list[str]] = []
        self.turn_of: dict[str, int] = {}

    def __call__(self, codes, texts, ids):
        self.calls.append(list(codes))
        out = []
        for code in codes:
            t = self.turn_of.get(code, 0)
            self.turn_of[code] = t + 1
            res = self.script[code][t]
            out.append((record_from_result(res), res))
        return out


def _run(tokenizer, script, turns=3, lockstep=False):
    codes = list(script)
    answers = {c: tokenizer(f" answer for {c}", add_special_tokens=False)["input_ids"] for c in codes}
    eos = tokenizer.eos_token_id
    generated: list[int] = []

    def generate(batch):
        generated.append(len(batch))
        out = []
        for ctx in batch:
            code = next(c for c in codes if ctx[:len(prompts[c])] == prompts[c])
            out.append(answers[code] + [eos])
        return out, None

    prompts = {c: tokenizer(f"task {c}:", add_special_tokens=False)["input_ids"] for c in codes}
    env = ScriptedEnv(script)
    eps = run_episodes([prompts[c] for c in codes], codes, codes, generate, env,
                       decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                       codec=TurnCodec(tokenizer, chat=False), cfg=EpisodeConfig(turns=turns), lockstep=lockstep)
    return eps, env, generated, answers


def test_the_policy_receives_the_feedback_and_only_its_own_tokens_are_trained(tokenizer):
    build = _result("build_error", log=BUILD_LOG)
    wrong = _result("incorrect", log=INCORRECT_LOG)
    fast = _result("ok", reward=3, times={"candidate_ms": 1.0, "eager_ms": 2.0, "compile_ms": 2.0})
    (ep,), env, _, answers = _run(tokenizer, {"T": [build, wrong, fast]})
    assert [t.record.reward for t in ep.turns] == [-1, -1, 3] and ep.done
    ids, mask = ep.completion_ids, ep.env_mask
    assert len(ids) == len(mask)
    # Split the completion into its runs of policy (1) and environment (0) tokens.
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], ids[start:i]))
            start = i
    assert [m for m, _ in runs] == [1, 0, 1, 0, 1]
    eos = tokenizer.eos_token_id
    assert all(r == answers["T"] + [eos] for m, r in runs if m == 1)  # the policy's tokens, as generated
    # What the policy reads between its turns is exactly the formatted verdict.
    for (m, r), verdict, turn in zip([x for x in runs if x[0] == 0], (build, wrong), (1, 2)):
        expected = format_feedback(verdict, attempt=turn)
        assert tokenizer.decode(r) == f"\n\nFeedback from the environment:\n{expected}\n\nRevised program:\n"
    assert ep.turns[0].feedback == format_feedback(build, attempt=1) and ep.turns[-1].feedback is None


def test_an_episode_stops_at_reward_3_and_each_turn_is_one_environment_call(tokenizer):
    fast = _result("ok", reward=3, times={"candidate_ms": 1.0, "eager_ms": 2.0, "compile_ms": 2.0})
    slow = _result("ok", reward=1, times={"candidate_ms": 3.0, "eager_ms": 2.0, "compile_ms": 2.0})
    wrong = _result("incorrect", log=INCORRECT_LOG)
    script = {"T1": [fast], "T2": [wrong, fast], "T3": [wrong, slow, slow], "T4": [slow, wrong, wrong]}
    eps, env, generated, _ = _run(tokenizer, script)
    assert [len(e.turns) for e in eps] == [1, 2, 3, 3]
    # One judge call per turn, holding every episode still running, never one at a time.
    assert env.calls == [["T1", "T2", "T3", "T4"], ["T2", "T3", "T4"], ["T3", "T4"]]
    assert generated == [4, 3, 2]
    assert eps[0].env_mask == [1] * len(eps[0].completion_ids)  # stopped: no feedback appended
    # Several ranks: everyone generates every turn (the backends synchronise), only the unfinished are judged.
    env_calls = _run(tokenizer, script, lockstep=True)
    assert env_calls[2] == [4, 4, 4] and env_calls[1].calls[2] == ["T3", "T4"]


def _policy_runs(ids, mask):
    """The completion split into runs of (mask value, token ids)."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], ids[start:i]))
            start = i
    return runs


def test_scored_credit_trains_the_turns_up_to_the_best_one_only(tokenizer):
    slow = _result("ok", reward=1, times={"candidate_ms": 3.0, "eager_ms": 2.0, "compile_ms": 2.0})
    wrong = _result("incorrect", log=INCORRECT_LOG)
    (ep,), _, _, answers = _run(tokenizer, {"T": [wrong, slow, wrong]})
    eos = tokenizer.eos_token_id
    best = EpisodeConfig(turns=3, reward="best", credit="scored")
    # credit=all (the default): the broken third turn after the correct second one is trained too.
    assert ep.loss_mask(EpisodeConfig(turns=3, reward="best")) == ep.env_mask
    assert [m for m, _ in _policy_runs(ep.completion_ids, ep.env_mask)] == [1, 0, 1, 0, 1]
    mask = ep.loss_mask(best)
    assert len(mask) == len(ep.completion_ids)
    runs = _policy_runs(ep.completion_ids, mask)
    # turns 1 and 2 trained, the feedback and the third turn not
    assert [m for m, _ in runs] == [1, 0, 1, 0]
    assert [r for m, r in runs if m == 1] == [answers["T"] + [eos]] * 2
    assert sum(mask) == 2 * len(answers["T"] + [eos])
    # the scored turn is the last one under `last`: nothing is cut
    assert ep.loss_mask(EpisodeConfig(turns=3, reward="last", credit="scored")) == ep.env_mask
    # a first turn that is already the best: only it is trained
    (ep1,), _, _, _ = _run(tokenizer, {"T": [slow, wrong, wrong]})
    assert [m for m, _ in _policy_runs(ep1.completion_ids, ep1.loss_mask(best))] == [1, 0]


def test_turn_credit_is_checked():
    with pytest.raises(ValueError, match="turn_credit must be one of"):
        EpisodeConfig(credit="first")


def test_an_unfinished_turn_is_closed_by_an_environment_token(tokenizer):
    wrong = _result("incorrect", log=INCORRECT_LOG)
    prompt = tokenizer("task:", add_special_tokens=False)["input_ids"]
    env = ScriptedEnv({"T": [wrong, wrong]})
    (ep,) = run_episodes([prompt], ["T"], ["T"], lambda b: ([[5, 6]] * len(b), [[-0.1, -0.2]] * len(b)), env,
                         decode=lambda ids: "x", codec=TurnCodec(tokenizer, chat=False), cfg=EpisodeConfig(turns=2))
    eos = tokenizer.eos_token_id
    assert ep.completion_ids[:3] == [5, 6, eos] and ep.env_mask[:3] == [1, 1, 0]
    assert ep.logprobs[:2] == [-0.1, -0.2] and all(x != x for x in ep.logprobs[2:-2])  # NaN on environment tokens
    assert ep.completion_ids[-2:] == [5, 6] and ep.env_mask[-2:] == [1, 1]


def test_chat_feedback_is_a_user_turn_of_the_template():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<|im_start|>", "<|im_end|>", "user", "assistant", "x", "y", "verdict", "\n"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="x"))
    tok.pre_tokenizer = pre_tokenizers.Split("\n", behavior="isolated")
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="x")
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    hf.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    ids = TurnCodec(hf, chat=True).feedback_ids("verdict")
    # What follows the policy's `<|im_end|>`: the rest of its turn, the user's, the next assistant header.
    assert hf.convert_ids_to_tokens(ids) == ["\n", "<|im_start|>", "user", "\n", "verdict", "<|im_end|>", "\n",
                                             "<|im_start|>", "assistant", "\n"]


# ---- the episode's reward and its metrics -------------------------------------------------------


def test_episode_reward_modes_and_improvement():
    assert episode_reward([-1, 2, 1], EpisodeConfig(reward="last")) == 1
    assert episode_reward([-1, 2, 1], EpisodeConfig(reward="best")) == 2
    assert episode_reward([-1, 2, 1], EpisodeConfig(reward="discounted", discount=0.5)) == pytest.approx(-1 + 1 + 0.25)
    assert improved([-1, 2, 1]) is True and improved([2, 1]) is False and improved([3]) is None
    with pytest.raises(ValueError, match="episode_reward"):
        EpisodeConfig(reward="mean")
    with pytest.raises(ValueError, match="turns"):
        EpisodeConfig(turns=0)


def test_episode_metrics_per_turn_and_improvement_rate():
    def rec(r):
        return record_from_result(SimpleNamespace(reward=r, correct=r > 0, reason="ok" if r > 0 else "incorrect",
                                                  times={"candidate_ms": 1.0, "eager_ms": 2.0, "compile_ms": 2.0}))
    episodes = [[rec(3)], [rec(-1), rec(3)], [rec(1), rec(-1)], [rec(-1), rec(-1)]]
    logged: dict[str, list[float]] = {}
    out = EpisodeReward(turns=2)(prompts=[None] * 4, completions=[None] * 4, episode_reward=[3, 3, -1, -1],
                                 episode_records=[[r.to_dict() for r in e] for e in episodes],
                                 log_metric=lambda k, v: logged.setdefault(k, []).append(v))
    assert out == [3, 3, -1, -1]
    mean = {k: sum(v) / len(v) for k, v in logged.items()}
    assert mean["turn/1/reward"] == pytest.approx((3 - 1 + 1 - 1) / 4)
    assert mean["turn/2/reward"] == pytest.approx((3 + 3 - 1 - 1) / 4)  # a stopped episode keeps its program
    assert mean["turn/1/pass_rate"] == 0.5 and mean["turn/2/pass_rate"] == 0.5
    assert mean["episode/improved"] == pytest.approx(1 / 3)  # of the three that took a second turn
    assert mean["kernel/pass_rate"] == 0.5 and mean["episode/turns"] == pytest.approx(7 / 4)
    assert after_turn(episodes[0], 2).reward == 3
    # Scored by the best turn: kernel/* describes the programs the reward does ([3], [-1, 3], [1, -1], [-1, -1]).
    best: dict[str, list[float]] = {}
    EpisodeReward(turns=2, cfg=EpisodeConfig(turns=2, reward="best"))(
        prompts=[None] * 4, completions=[None] * 4, episode_reward=[3, 3, 1, -1],
        episode_records=[[r.to_dict() for r in e] for e in episodes], log_metric=lambda k, v: best.setdefault(k, []).append(v))
    assert sum(best["kernel/pass_rate"]) / 4 == 0.75 and sum(best["turn/2/pass_rate"]) / 4 == 0.5
    assert scored_turn([1, -1], EpisodeConfig(reward="best")) == 0 and scored_turn([1, -1], EpisodeConfig()) == 1
    assert scored_turn([1, 3, 3], EpisodeConfig(reward="best")) == 1


# ---- training: a tiny policy learns to read the fix ---------------------------------------------


@pytest.mark.slow
def test_training_raises_the_second_turn_reward_when_the_feedback_names_the_fix(tmp_path):
    from bandit import (ANSWERS, answer_probabilities, hidden_answer_policy, hidden_answer_tasks,
                                      train_hidden_answer, write_task_shards)

    shards = write_task_shards(str(tmp_path / "shards"), hidden_answer_tasks())
    policy = hidden_answer_policy(seed=0)
    before = {a: answer_probabilities(*policy, f"go D <eos> fix{a}")[a] for a in ANSWERS}
    summary = train_hidden_answer(shards, str(tmp_path / "run"), steps=10, policy=policy)
    assert summary["global_step"] == 10 and summary["turns"] == 2
    evals = [json.loads(line) for line in (tmp_path / "run" / "evaluations-rank0.jsonl").read_text().splitlines()]

    def correct(turn, steps):
        xs = [e["correct"] for e in evals if e["turn"] == turn and e["step"] in steps]
        return sum(xs) / len(xs)

    # The first answer cannot be known (one time in three at best); the second, after the fix, can.
    assert correct(1, range(1, 11)) < 0.5
    assert correct(2, (1, 2)) < 0.35 and correct(2, (9, 10)) > 0.75, [correct(2, (s,)) for s in range(1, 11)]
    after = {a: answer_probabilities(*policy, f"go D <eos> fix{a}")[a] for a in ANSWERS}
    assert max(before.values()) < 0.2 and sum(p > 0.9 for p in after.values()) >= 2, (before, after)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert steps[-1]["turn/2/reward"] > steps[0]["turn/2/reward"] + 1.5
    assert all("time/generation_s" in r and "time/evaluation_s" in r and "episode/improved" in r for r in steps)
    # TRL took our env_mask: it counts only the policy's tokens (one a turn here), not the feedback's.
    assert all(r["completions/mean_length"] == pytest.approx(r["episode/turns"]) for r in steps)
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts-rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rollouts] == list(range(1, 11)) and all(len(r["evaluation_s"]) == 2 for r in rollouts)

    # Scoring plays the same episodes (greedy) and puts single-turn and multi-turn side by side.
    from bandit import hidden_answer_candidates, hidden_answer_env, hidden_prompt_fn, hint_feedback
    from opsynth.train.data import load_rows
    from opsynth.train.reward_fn import KernelReward
    from opsynth.train.score import format_table, score_episodes, summarize_episodes

    model, tok = policy
    rows = load_rows(shards)
    table = hidden_answer_candidates()
    judge = KernelReward(completion_to_candidate=lambda t: table.get(t.strip(), t), evaluate_many_fn=hidden_answer_env)
    prompt_ids = [tok(hidden_prompt_fn(r)["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
    episodes = score_episodes(model, tok, rows, chat=False, turns=2, max_new_tokens=1, reward=judge,
                              feedback=hint_feedback, prompt_ids=prompt_ids)
    s = summarize_episodes(episodes, turns=2)
    first, second = s["by_turn"]
    assert first["pass_rate"] <= 1 / 3 + 1e-9 and second["pass_rate"] >= 2 / 3, (first, second)
    text = format_table(s)
    assert "single-turn" in text and "after turn 2" in text
