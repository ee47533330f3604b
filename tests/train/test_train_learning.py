"""GRPO with the real reward environment in the loop moves the policy toward correct programs.

The policy is `tests/train/bandit.py`'s one-token Qwen2: token `A`, `B` or `C` picks one of three
known C++ `load_inline` candidates for one task (correct and fast, correct and slow, wrong); any
other token is an answer without code. The reward environment compiles and runs each candidate for
real on the CPU backend. What is asserted is what the environment said (the pass rate per step, read
from the evaluation log, not the reward the trainer logged) and what the final model would do (its
probability of a correct answer, from about 1/3 to above 0.9), beside a `learning_rate=0` control
run that must not move. Whether the fast candidate also beats eager by 5 % on a loaded 2-core
machine is timing noise, so the test is about correct answers, not fast ones.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

# Two children in flight (one times while the other starts); no separate build children (the three
# candidates share one extension, built once into the cache). One torch thread each: with two, every
# parallel op of the harness around a timed call (fresh inputs, fingerprints) waits at its barrier for
# a thread the other child has preempted, rounds stall by ~50 ms on a 2-core machine, and the
# wall-clock check rightly cannot tell that from a clock that hides work.
REWARD_ENV = {"device": "cpu", "prebuild": False, "measure_workers": 2, "cpu_threads": 1}


def _pass_rate_by_step(out: str) -> dict[int, float]:
    by_step: dict[int, list[bool]] = defaultdict(list)
    with open(os.path.join(out, "evaluations-rank0.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            by_step[e["step"]].append(e["correct"])
    return {s: sum(v) / len(v) for s, v in sorted(by_step.items())}


@pytest.mark.slow
def test_grpo_moves_the_policy_to_correct_programs_and_a_zero_learning_rate_does_not(tmp_path):
    from bandit import correct_probability, one_token_policy, task_source, train_bandit, write_task_shards

    shards = write_task_shards(str(tmp_path / "shards"), task_source(), n=4)

    policy = one_token_policy(seed=0)
    before = correct_probability(*policy)
    out = str(tmp_path / "run")
    summary = train_bandit(shards, out, device="cpu", policy=policy, steps=4, num_generations=32,
                           learning_rate=0.08, reward_env=REWARD_ENV)
    after = correct_probability(*policy)
    assert summary["global_step"] == 4
    with open(os.path.join(out, "evaluations-rank0.jsonl")) as f:
        evals = [json.loads(line) for line in f]
    # The environment really judged the programs: the wrong one fails its comparison, the correct
    # ones pass, and its timings tell the fast one from the slow one.
    assert any(e["reason"] == "incorrect" for e in evals) and any(e["correct"] for e in evals)
    speedups = [e["speedup_eager"] for e in evals if e["correct"]]
    assert max(speedups) > 10 * min(speedups), speedups
    rate = _pass_rate_by_step(out)
    assert 0.25 < before < 0.45 and after > 0.9, (before, after)
    assert rate[1] < 0.55 and rate[4] > 0.7, rate

    control = one_token_policy(seed=0)
    c_before = correct_probability(*control)
    c_out = str(tmp_path / "control")
    train_bandit(shards, c_out, device="cpu", policy=control, steps=2, num_generations=32, learning_rate=0.0,
                 reward_env=REWARD_ENV)
    c_rate = _pass_rate_by_step(c_out)
    assert correct_probability(*control) == pytest.approx(c_before, abs=1e-6) and c_before == pytest.approx(before)
    assert max(c_rate.values()) < 0.55, c_rate
