"""Measuring children ready before their candidate arrives (opsynth.reward.ready_children,
`reward.ready_children`).

A user turning the pool on (the default on CUDA) relies on: the same verdicts as children forked per
candidate, honest and adversarial alike; every measured candidate in a child of its own that ran no
other candidate; parked children stopped in timing windows like builds; a dead parked child never
handed out; clear errors for a bad setting.
"""

from __future__ import annotations

import time

import pytest
from test_reward_cpu import CHAIN
from test_reward_cpu import _cfg as cpu_cfg
from test_reward_cpu import cpu_candidate as cand

from opsynth.reward import RewardConfig, evaluate_many, quiet, ready_children

pytestmark = pytest.mark.timeout(1800)


def _cfg(cache: str, **kw) -> RewardConfig:
    return cpu_cfg(cache, prebuild=True, **kw)  # the batch's usual path: builds first, then the measuring children


@pytest.fixture
def fresh_pools():
    ready_children.shutdown()
    yield
    ready_children.shutdown()


# Honest, broken and adversarial candidates (the static check off: only the runtime guards judge them).
CASES = {"fast": "ok", "wrong": "incorrect", "crash": "crashed", "cached": "stale_output", "timer_patch": "timer_patched",
         "freed_memory": "uninitialized_output", "memo": None}


def test_ready_children_give_the_verdicts_of_children_forked_per_candidate(reward_cache, fresh_pools, monkeypatch):
    names = list(CASES)
    pairs = [(CHAIN, cand(n)) for n in names]
    forked = evaluate_many(pairs, _cfg(reward_cache, ready_children=0))
    handed: list = []
    real_take = ready_children.ReadyChildren.take

    def take(self):
        p = real_take(self)
        if p is not None and self.role == "measure":
            handed.append(p)
        return p

    monkeypatch.setattr(ready_children.ReadyChildren, "take", take)
    cfg = _cfg(reward_cache, ready_children=2)
    parked = evaluate_many(pairs, cfg)
    for n, a, b in zip(names, forked, parked):
        assert (a.reason, a.reward) == (b.reason, b.reward), (n, a.reason, b.reason, b.log[-2000:])
        if CASES[n] is not None:
            assert a.reason.startswith(CASES[n]), (n, a.reason)
        assert not a.times.get("ready_child")
    measured = [b for b in parked if "ready_child" in b.times]
    assert measured and all(b.times["ready_child"] for b in measured), [b.times.get("ready_child") for b in parked]
    # One child per candidate, each handed out once: a process that ran a candidate never gets another.
    assert len(handed) == len(measured) and len({id(p.child) for p in handed}) == len(handed)
    assert all(p.child.used for p in handed)
    pool = ready_children.pool(cfg, "cpu")
    assert pool.taken == len(measured) and pool.forked >= pool.taken and pool.failed == 0
    # The task's reference and eager baseline children came parked too (one task: one of each)
    for role in ("reference", "baseline"):
        side = ready_children.pool(cfg, "cpu", role)
        assert side.size == 2 and side.taken == 1 and side.failed == 0, (role, side.taken, side.last_error)
    assert all(b.times.get("ready_reference") is True for b in measured), [b.times.get("ready_reference") for b in measured]
    assert all(b.times.get("ready_eager") is True for b in measured), [b.times.get("ready_eager") for b in measured]
    assert not any(a.times.get("ready_reference") or a.times.get("ready_eager") for a in forked)


def test_parked_children_are_paused_in_timing_windows_until_taken(reward_cache, fresh_pools):
    cfg = _cfg(reward_cache, ready_children=2)
    pool = ready_children.pool(cfg, "cpu")
    assert pool.wait_ready(2, 120), pool.last_error
    parked_pids = {pid for pid, what in quiet.registered().items() if what == "parked"}
    assert len(parked_pids) == 2
    p = pool.take()
    assert p.child.pid in parked_pids and p.child.pid not in quiet.registered()  # about to be timed itself
    p.discard()
    assert pool.wait_ready(2, 120)  # refilled


def test_a_parked_child_that_died_is_never_handed_out(reward_cache, fresh_pools):
    from opsynth.runtime.supervise import kill_group

    cfg = _cfg(reward_cache, ready_children=1)
    pool = ready_children.pool(cfg, "cpu")
    assert pool.wait_ready(1, 120), pool.last_error
    dead = pool._ready[0]
    kill_group(dead.child.pid)
    deadline = time.time() + 10
    while dead.child.alive() and time.time() < deadline:
        time.sleep(0.05)
    got = pool.take()
    assert got is None or got is not dead
    if got is not None:
        got.discard()


def test_ready_children_setting():
    assert RewardConfig(device="cpu").resolved_ready_children("cpu") == 0
    assert RewardConfig().resolved_ready_children("cuda") == min(4, RewardConfig().resolved_measure_workers("cuda"))
    assert RewardConfig(measure_workers=2).resolved_ready_children("cuda") == 2
    assert RewardConfig(ready_children=3).resolved_ready_children("cpu") == 3
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="ready_children"):
            RewardConfig(ready_children=bad)
    assert ready_children.pool(RewardConfig(device="cpu"), "cpu") is None
    assert ready_children.pool(RewardConfig(device="cpu"), "cpu", "reference") is None
    assert [ready_children.side_size(n) for n in (0, 1, 2, 4, 12)] == [0, 1, 2, 2, 2]
    with pytest.raises(ValueError, match="role"):
        ready_children.ReadyChildren(RewardConfig(device="cpu"), "cpu", 1, "compile")
