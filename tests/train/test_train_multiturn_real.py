"""A multi-turn episode against the real reward environment (CPU backend, C++ candidates).

The policy is scripted (turn 1 writes the bandit's wrong program, which forgets the relu; later
turns write the correct one), so what is tested is the environment's side: each turn's programs go
to `evaluate_many` together, and the verdict that comes back as the next turn is the real one,
parsed from the real child log (which output, on which input set, by how much; then the timings).
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_real_verdicts_come_back_as_the_next_turn():
    from opsynth.reward.eval_types import RewardConfig
    from bandit import candidates, task_source
    from opsynth.train.episodes import EpisodeConfig, TurnCodec, run_episodes
    from opsynth.train.feedback import format_feedback
    from opsynth.train.policy import train_smoke_tokenizer
    from opsynth.train.reward_fn import KernelReward
    from opsynth.train.warm_start import answer

    task, cands = task_source(), candidates("cpu")
    tok = train_smoke_tokenizer([task, answer(cands["A"]), answer(cands["C"])], 400)
    eos = tok.eos_token_id
    prompts = [tok(f"episode {name}", add_special_tokens=False)["input_ids"] for name in ("one", "two")]
    script = [["C", "A"], ["A", "A"]]  # episode -> program per turn: the first starts wrong
    turn_of = [0, 0]

    def generate(batch):
        out = []
        for ctx in batch:
            e = next(i for i, p in enumerate(prompts) if ctx[: len(p)] == p)
            out.append(tok(answer(cands[script[e][turn_of[e]]]), add_special_tokens=False)["input_ids"] + [eos])
            turn_of[e] += 1
        return out, None

    reward = KernelReward(RewardConfig(device="cpu", prebuild=False, measure_workers=2))
    calls = []

    def judge(codes, texts, ids):
        calls.append(len(codes))
        return reward.judge(codes, texts, ids)

    eps = run_episodes(prompts, [task, task], ["wrong_first", "right_first"], generate, judge,
                       decode=lambda ids: tok.decode(ids, skip_special_tokens=True), codec=TurnCodec(tok, chat=False),
                       cfg=EpisodeConfig(turns=2))
    wrong_first, right_first = eps
    assert calls[0] == 2  # both episodes' first programs in one environment call
    assert wrong_first.turns[0].record.reason == "incorrect" and wrong_first.turns[1].record.correct
    feedback = wrong_first.turns[0].feedback
    assert "rejected your program: incorrect (reward -1)" in feedback
    assert "Mismatch: output 0 on input set" in feedback and "max abs error" in feedback, feedback
    assert right_first.turns[0].record.correct
    # A correct program that is not the top reward gets its timings back.
    first = right_first.turns[0]
    if first.record.reward < 3:
        assert len(right_first.turns) == 2 and "Timings (median of the timed calls): your ModelNew" in first.feedback
        assert "eager PyTorch" in first.feedback and "torch.compile" in first.feedback
    else:
        assert len(right_first.turns) == 1 and first.feedback is None
    assert len(calls) == 2
    # The timed verdict's wording, from the real result, names both baselines either way.
    timed = format_feedback(first.result)
    assert "your ModelNew" in timed and "eager PyTorch" in timed and "torch.compile" in timed
