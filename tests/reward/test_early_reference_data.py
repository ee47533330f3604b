"""A task's candidates start measuring on its reference's data, before the reference's timed rounds
(`evaluate._with_data`, `_measure_one`): their setup and checked calls overlap the reference, their
timing and judging wait for it whole, and a reference that fails after handing its data over still
decides its candidates' verdicts, as when they waited for it."""

from __future__ import annotations

import pytest
from test_reward_cpu import CHAIN
from test_reward_cpu import _cfg as cpu_cfg
from test_reward_cpu import cpu_candidate as cand

from opsynth.reward import evaluate_many
from opsynth.reward.evaluate import EARLY_DATA_ENV

pytestmark = pytest.mark.timeout(1200)

# The chain task whose forward fails once the trials and the second shape have run: in the reference's
# timed rounds, after its data was handed over (num_trials=2 below: 2 trials, then the second shape)
FAILS_LATE = CHAIN.replace(
    "    def forward(self, x):\n",
    "    def forward(self, x):\n"
    "        self.calls = getattr(self, 'calls', 0) + 1\n"
    "        if self.calls > 3:\n"
    "            raise RuntimeError('the task fails after its data was handed over')\n",
)


def _run(cache, task, monkeypatch, early: bool):
    if not early:
        monkeypatch.setenv(EARLY_DATA_ENV, "0")
    else:
        monkeypatch.delenv(EARLY_DATA_ENV, raising=False)
    cfg = cpu_cfg(cache, measure_workers=2, num_trials=2)
    return evaluate_many([(task, cand("fast"))], cfg)[0]


def test_a_candidate_starts_on_the_reference_data_and_gets_the_same_verdict(reward_cache, monkeypatch):
    early = _run(reward_cache, CHAIN, monkeypatch, early=True)
    late = _run(reward_cache, CHAIN, monkeypatch, early=False)
    assert (early.reason, early.correct) == (late.reason, late.correct) == ("ok", True), (early.log[-2000:], late.log[-2000:])
    assert early.times.get("early_data") is True and "early_data" not in late.times
    # Started on the data, before the reference was whole; the control only after it
    assert early.times["measure_at_s"] < early.times["reference_at_s"], early.times
    assert late.times["measure_at_s"] >= late.times["reference_at_s"], late.times
    assert early.times["reference_handed_at_s"] <= early.times["measure_at_s"]
    # Its timed rounds ran against the whole reference: fresh baselines, their ratio and interval
    assert early.times["eager_ms"] and early.times.get("eager_ratio_lo") is not None, early.times


def test_a_reference_that_fails_after_handing_its_data_over_decides_the_verdict(reward_cache, monkeypatch):
    early = _run(reward_cache, FAILS_LATE, monkeypatch, early=True)
    late = _run(reward_cache, FAILS_LATE, monkeypatch, early=False)
    assert early.reason.startswith("task_") and early.reward == -1, (early.reason, early.log[-2000:])
    assert (early.reason, early.reward) == (late.reason, late.reward)
