"""The compile child started with the eager child (`reward.compile_prestart`): a candidate that beats
eager then finds torch.compile done instead of waiting for it with the device released (7 s on the
H200's cold first evaluation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsynth.reward import RewardConfig, evaluate
from opsynth.reward import baselines

CANDS = Path(__file__).parent / "candidates"
CHAIN = (CANDS / "tasks" / "chain.py").read_text()
WRONG = (CANDS / "cpu" / "ext_prelude.py").read_text() + "\n" + (CANDS / "cpu" / "wrong.py").read_text()


def test_auto_prestarts_on_cuda_for_a_few_tasks_only():
    pre, cfg = baselines.prestarts_compile, RewardConfig(device="cpu")
    assert pre(cfg, "cuda", 1) and pre(cfg, "cuda", baselines.COMPILE_POOL)
    assert not pre(cfg, "cuda", baselines.COMPILE_POOL + 1)  # it would evict its own children
    assert not pre(cfg, "cpu", 1)  # two cores: the compile would share them with the checks
    assert pre(RewardConfig(compile_prestart=True), "cpu", 50)
    assert not pre(RewardConfig(compile_prestart=False), "cuda", 1)
    assert not pre(RewardConfig(compile_prestart=True, compile_baseline=False), "cuda", 1)


def _pool_for_chain():
    return [s for s in list(baselines._pool.values()) if Path(s.job["task_path"]).read_text() == CHAIN]


@pytest.fixture
def empty_pool():
    def clear():
        with baselines._pool_lock:
            old = list(baselines._pool.values())
            baselines._pool.clear()
        for s in old:
            s.close()

    clear()
    yield
    clear()


@pytest.mark.slow
@pytest.mark.parametrize("prestart", [True, False])
def test_a_prestarted_compile_child_is_compiled_before_any_candidate_beats_eager(reward_cache, empty_pool, prestart):
    cfg = RewardConfig(device="cpu", cache_dir=reward_cache, static_check=False, cpu_threads=1,
                       prebuild=False, warmup=3, repeats=10, compile_prestart=prestart)
    r = evaluate(CHAIN, WRONG, cfg)  # incorrect: it never reaches the timing, never beats eager
    assert r.reason.startswith("incorrect"), r.log[-2000:]
    started = _pool_for_chain()
    if not prestart:  # the control: the compile child waits for a candidate that beats eager
        assert started == []
        return
    assert len(started) == 1
    srv = started[0]
    srv.wait_ready()  # a real torch.compile child, compiled and ready to time
    assert srv.info and srv.error is None
    assert len(srv.block(3)) == 3  # it times: the child a candidate that beats eager will use


class _Rounds:
    done = False


def test_the_baselines_start_once_the_references_timed_rounds_are_done_not_before():
    from opsynth.reward.evaluate import _once_timed

    rounds, calls, job = _Rounds(), [], {"trial_seeds": [1]}
    handle = _once_timed(lambda req: {"ok": True, "req": req}, rounds, calls.append, job)
    assert handle("round_start")["req"] == "round_start"  # the inner handler's answer, unchanged
    assert calls == []  # the timed rounds still run: nothing may start beside them
    rounds.done = True
    handle("timing_done")
    handle("anything after")
    assert calls == [job]  # once, with the seeds the baselines need


@pytest.mark.slow
def test_a_tasks_baselines_start_before_its_reference_hands_its_data_over(reward_cache, empty_pool):
    cfg = RewardConfig(device="cpu", cache_dir=reward_cache, static_check=False, cpu_threads=1,
                       prebuild=False, warmup=3, repeats=10, compile_prestart=True)
    r = evaluate(CHAIN, WRONG, cfg)
    assert r.reason.startswith("incorrect"), r.log[-2000:]
    t = r.times
    # started from the reference's channel once its timed rounds were over, before it was done
    assert t["reference_baselines_at_s"] < t["reference_at_s"], t
    assert t["reference_child_s"] > 0 and t["reference_read_s"] >= 0 and t["reference_facts_s"] >= 0
    assert len(_pool_for_chain()) == 1  # the compile child those early baselines prestarted
