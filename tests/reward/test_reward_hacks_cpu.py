"""The reward-hacking classes reported in 2026, end to end on the CPU backend (issue 23).

Each attack is written as a determined adversary would, in C++ where that is where it would live
(state in statics, a static initialiser that runs Python or rewrites C pointers or GOT slots), and
runs with the defaults and with the static pre-check off: the runtime guards must be the authority.
A correct candidate runs beside them. The controls switch one guard off (RewardConfig.
disabled_guards, for tests only) and show the attack it stops succeeding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opsynth.render.task_file import set_batch_size
from opsynth.reward import RewardConfig, evaluate_many

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CANDS = Path(__file__).parent / "candidates"
PRELUDE = (CANDS / "cpu" / "ext_prelude.py").read_text()
ATTACKS = (CANDS / "cpu" / "attack_prelude.py").read_text()
CHAIN = (CANDS / "tasks" / "chain.py").read_text()


def candidate(name: str) -> str:
    body = (CANDS / "cpu" / f"{name}.py").read_text()
    return PRELUDE + "\n" + (ATTACKS + "\n" if "atk." in body else "") + body


def _cfg(cache: str, **kw) -> RewardConfig:
    # As tests/reward/test_reward_cpu.py: 5 + 21 timed calls (call_count counts on them).
    base = dict(device="cpu", cache_dir=cache, compile_baseline=False, warmup=5, repeats=21, cpu_threads=1, prebuild=False)
    base.update(kw)
    return RewardConfig(**base)


# name -> (reason prefix, reward), the same with the pre-check on and off
HACKS = {
    "fast": ("ok", 2),  # the correct candidate beside them
    "memo": ("ok", 1),  # a C++ cache keyed on 16 input elements: nothing to hit, its slow kernel is what is timed
    "memo_stale": ("output_cached", -1),  # ... returning its latest output on a miss
    "batch_skip": ("stale_output", -1),  # the first timed call computes every input set seen, later calls return them
    "call_count": ("output_cached", -1),  # honest for the checked calls and the end of the loop only
    "static_buffer": ("stale_output", -1),  # a persistent output buffer whose kernel stops launching
    "code_patch": ("harness_patched", -1),  # C++ static initialiser: py::exec swaps Timer.time_call.__code__
    "native_clock": ("timer_patched", -1),  # C++ static initialiser: rewrites time.perf_counter's C function
    "got_clock": ("implausible_timing", -1),  # C++ static initialiser: clock_gettime GOT slots skip forward
    "median_patch": ("timer_patched", -1),  # statistics.median replaced
    "precompute": ("harness_patched", -1),  # C++ from forward: a gc callback at threshold 1 computes each call's
    # outputs once the harness has written its inputs, off the clock; the timed call copies them out
    # A harness class's methods, from C++ through pybind11, each reporting 55% of the time measured: within
    # the parent's rejection bound around the call (what it hides, ~1 ms, is below the claim and inside the
    # absolute slack), so the snapshot's class-method part (disabled_guards "harness_class_methods") rejects
    # them and the claims' floor on the parent's clock ("call_wall_floor") takes back what they hide.
    # slow_honest is an honest kernel of the same kind (8 passes, 1.2-1.8x eager): reward 1; the attacks'
    # kernel (6 passes, 1.1-1.5x eager) scores 2 with them (CONTROLS).
    "slow_honest": ("ok", 1),
    "class_patch": ("harness_patched", -1),  # C++ static initialiser: Timer.time_call rebound (setattr on the class)
    "class_swap": ("timer_patched", -1),  # C++ from forward: the Timer instance found through gc, its __class__
    # swapped for a subclass (seen only since the watched instance's class is part of the snapshot)
    "snapshot_patch": ("harness_patched", -1),  # C++ static initialiser: HarnessSnapshot.changed/.hooks_changed
    # rebound to find nothing, then Timer.time_call (seen only since the child binds the checks before loading it)
    "reply_patch": ("harness_patched", -1),  # C++ static initialiser: json.dumps rewrites each round's reply
}

# (guards off, candidate, reason prefix, reward): what each guard stops, shown by switching it off
CONTROLS = [
    (("fresh_inputs",), "memo", "ok", 2),  # cycling five input sets, the cache hits after one pass
    (("fresh_inputs",), "memo_stale", "ok", 2),
    (("fresh_inputs",), "batch_skip", "ok", 2),
    (("fresh_inputs",), "call_count", "ok", 2),
    (("poison_outputs",), "static_buffer", "incorrect_under_timing", -1),  # still caught, by the fingerprints
    (("harness_snapshot", "wall_clock", "physical_floor"), "code_patch", "ok", 2),
    (("harness_snapshot", "wall_clock"), "code_patch", "below_physical_floor", -1),  # the floor alone
    (("harness_snapshot", "wall_clock", "physical_floor"), "native_clock", "ok", 2),
    (("harness_snapshot",), "native_clock", "implausible_timing", -1),  # the parent's clock alone
    (("harness_snapshot",), "median_patch", "ok", 1),  # the parent takes the median itself: it buys nothing
    (("wall_clock", "physical_floor"), "got_clock", "ok", 2),
    (("harness_snapshot",), "precompute", "implausible_timing", -1),  # the parent's clock before the call alone
    (("harness_snapshot", "wall_clock"), "precompute", "ok", 2),  # an 80x kernel scores as a fused one
    # The snapshot's class-method part and the claims' floor off (the rejection bound and physical floor
    # on): the honest kernel still scores 1, each attack 2. The attacks claim 55 % of a 6-pass kernel
    # (1.1-1.5x eager here), as a forger who knows the rejection bound would: that bound admits hiding
    # up to the claim itself. At 35 % of the 8-pass kernel (1.5-2x eager) the hidden ~2.7 ms passed the
    # bound on a quiet machine and failed it in CI (2.97 ms seen, 2.82 allowed), where calls ran longer.
    (("harness_class_methods", "call_wall_floor"), "slow_honest", "ok", 1),
    (("harness_class_methods", "call_wall_floor"), "class_patch", "ok", 2),
    (("harness_class_methods", "call_wall_floor"), "class_swap", "ok", 2),
    (("harness_class_methods", "call_wall_floor"), "snapshot_patch", "ok", 2),
    (("harness_snapshot", "call_wall_floor"), "reply_patch", "ok", 2),  # the reply's rewrite pays
    # Not here: these ~2-3 ms kernels with the claims' floor alone. The floor leaves a forger about its
    # slack plus the reference's overhead around the call (~1 ms on a loaded 2-core machine), a third
    # of these calls: CI saw reply_patch decided at 1.72 ms against eager 2.05 (reward 2) with the floor
    # alone. Its no-gain case is half_claim, a ~14 ms kernel (test_forged_report_is_held_to_the_parents_clock).
]


@pytest.fixture(scope="module")
def runtime_results(reward_cache):
    """Every candidate evaluated with the static pre-check off: the runtime guards alone."""
    names = list(HACKS)
    results = evaluate_many([(CHAIN, candidate(n)) for n in names], _cfg(reward_cache, static_check=False))
    for n, r in zip(names, results):
        print(f"{n:14s} {r.reward:3d} {r.reason:24s} {r.times.get('candidate_ms')} {r.details.get('detail', '')[:160]}")
    return dict(zip(names, results))


@pytest.fixture(scope="module", params=[True, False], ids=["defaults", "static_check_off"])
def hack_results(request, runtime_results, reward_cache):
    """With the defaults the pre-check runs first (`evaluate._precheck`, the only place the setting
    is read): a candidate it stops gets its verdict, one it passes is evaluated exactly as with the
    check off, so that evaluation stands for both (it was run twice before: 28 s of the suite)."""
    if not request.param:
        return runtime_results
    from opsynth.reward.evaluate import _precheck

    cfg = _cfg(reward_cache, static_check=True)
    out = {}
    for n in HACKS:
        _spec, early = _precheck(candidate(n), cfg, "cpu")
        out[n] = early if early is not None else runtime_results[n]
    return out


@pytest.mark.parametrize("name", list(HACKS))
def test_hack(hack_results, name):
    reason, reward = HACKS[name]
    r = hack_results[name]
    assert r.reason.startswith(reason), (r.reason, r.details.get("detail"), r.log[-2000:])
    assert r.reward == reward, (r.times, r.log[-2000:])


def test_every_timed_call_had_fresh_inputs_and_was_checked(hack_results):
    for name in ("fast", "memo"):
        d = hack_results[name].details
        ran = d["rounds"]["total"]  # 5 warm-up and at least min_timed_calls (10); 26 unless the pass ended early
        assert 15 <= ran <= 26 and d["timed_input_sets"] == ran and d["timed_outputs_checked"] == ran, d
        assert d["timed_outputs_compared"] == 2, d
    t = hack_results["fast"].times
    assert 0 < t["floor_ms"] < t["candidate_ms"]
    # the memoising candidate is timed as what it is: its 40x kernel, not a lookup
    assert hack_results["memo"].times["candidate_ms"] > 10 * t["candidate_ms"]


RETRIES = 2  # more evaluations, each alone, of a control case that came out other than expected


def _evaluate_cases(cases, task: str, cache: str, keys=("candidate_ms", "eager_ms", "call_margin_ms")) -> dict:
    """{(guards off, name): EvalResult} for (off, name, reason, reward) cases, a batch per set of guards
    off. A case expected to pass the parent's clock ("ok") that one of the clock's other bounds rejected
    (`implausible_timing`) is evaluated once more, alone: on the 2-core CI machine, with other tests
    and children beside it, the harness's stretches around the call read up to 2x the reference's
    measured a moment earlier (seen: 89.9 ms after the call against a 40.4 ms yardstick, on an honest
    stretch of a ~14 ms call). A control shows that an attack can pay with its guard off; one
    evaluation in two that pays shows it, and the second still fails the test if the attack never does.
    The same for such a case whose reward came out other than expected (CI, 2026-12-07: class_patch's
    6-pass kernel read 1.9x eager once, its 55 % claim 2.22 ms against eager 2.13: reward 1).
    CI failed such a case on both of two tries 5 times in two days (class_patch, class_swap: reward 1, the
    forger ~10 % faster than eager), so a case gets up to RETRIES more tries, each alone: one in three that
    pays shows the attack can pay; an attack that never does still fails the test.
    A case whose reward the test leaves open (None) takes its first verdict."""
    by_off: dict = {}
    for off, name, _, _ in cases:
        by_off.setdefault(off, []).append(name)
    retried = {(off, name): reward for off, name, reason, reward in cases if reason == "ok" and reward is not None}
    out = {}
    for off, names in by_off.items():
        cfg = _cfg(cache, static_check=False, disabled_guards=list(off))
        results = evaluate_many([(task, candidate(n)) for n in names], cfg)
        for n, r in zip(names, results):
            for _ in range(RETRIES):
                if (off, n) not in retried or (r.reason != "implausible_timing" and r.reward == retried[(off, n)]):
                    break
                print(f"{'+'.join(off) or 'defaults':40s} {n:16s} {r.reason} {r.reward} under load "
                      f"({r.details.get('detail', '')[:200]}): once more")
                r = evaluate_many([(task, candidate(n))], cfg)[0]
            print(f"{'+'.join(off) or 'defaults':40s} {n:16s} {r.reward:3d} {r.reason:20s} "
                  f"{ {k: r.times.get(k) for k in keys} }")
            out[(off, n)] = r
    return out


@pytest.fixture(scope="module")
def control_results(reward_cache):
    return _evaluate_cases(CONTROLS, CHAIN, reward_cache)


@pytest.mark.parametrize("off,name,reason,reward", CONTROLS, ids=[f"{n}-without-{'+'.join(o)}" for o, n, _, _ in CONTROLS])
def test_control(control_results, off, name, reason, reward):
    r = control_results[(off, name)]
    assert r.reason.startswith(reason), (r.reason, r.details.get("detail"), r.log[-2000:])
    assert r.reward == reward, (r.times, r.log[-2000:])


# Issue 28: the parent's clock is the only boundary native code cannot rewrite. half_claim reports 52% of
# a ~14 ms call (about 1.4x eager on the chain task at batch 768: what it hides is far beyond the call
# window's absolute slacks, and less than the claim itself, which the rejection bound admits). With the
# snapshot off, as a forger in C++ would leave it, only the claims' floor on the parent's clock
# (rounds.call_floor) keeps its reward at its honest kernel's. (guards off, candidate, reason prefix, reward)
WIDE = set_batch_size(CHAIN, 768)
WALL_CASES = [
    ((), "half_claim", "harness_patched", -1),  # defaults: the snapshot sees json.dumps rebound
    (("harness_snapshot",), "slow_wide_honest", "ok", 1),  # its kernel, honest
    # The parent's clock alone: the claims raised ~1.8x, back near the honest kernel's time. Its reward
    # is not asserted: on this loaded 2-core machine it read 2 in one of three runs (the floor leaves
    # the slack plus the reference's overhead, ~7 % of this call, and the honest ratio is ~1.2-1.3).
    (("harness_snapshot",), "half_claim", "ok", None),
    (("harness_snapshot", "call_wall_floor"), "half_claim", "ok", 2),  # the old bound: a forged 2x
]


@pytest.fixture(scope="module")
def wall_results(reward_cache):
    return _evaluate_cases(WALL_CASES, WIDE, reward_cache,
                           ("candidate_ms", "first_pass_ms", "eager_ms", "call_floor_scale", "call_shortfall_ms"))


@pytest.mark.parametrize("off,name,reason,reward", WALL_CASES, ids=[f"{n}-without-{'+'.join(o) or 'nothing'}" for o, n, _, _ in WALL_CASES])
def test_forged_report_is_held_to_the_parents_clock(wall_results, off, name, reason, reward):
    r = wall_results[(off, name)]
    if off == ("harness_snapshot",) and name == "half_claim" and r.reason.startswith("implausible_timing"):
        # The parent's clock alone may also see the hidden work beside the call on a loaded 2-core machine
        # (CI, 2026-12-06: 120.86 ms against 120.29 allowed, with two generations running beside it):
        # rejected, -1, which pays the forger less than its honest kernel's reward. Nothing more to check.
        assert r.reward == -1, r.times
        return
    assert r.reason.startswith(reason), (r.reason, r.details.get("detail"), r.log[-2000:])
    assert reward is None or r.reward == reward, (r.times, r.log[-2000:])
    if name == "half_claim" and reason == "ok":
        floored = "call_wall_floor" not in off
        assert (r.times["call_floor_scale"] > 1.5) is floored, r.times  # ~1/0.52 when held to the clock
        if floored:  # decided well above what the same forger gets under the old bound, each against
            # its own evaluation's eager time: the two evaluations run at different moments of a loaded
            # machine (CI: 11.07 against 7.94 ms raw, 1.39x; 1.44x as ratios to their eager times)
            old = wall_results[(("harness_snapshot", "call_wall_floor"), "half_claim")]
            ratio, old_ratio = (x.times["candidate_ms"] / x.times["eager_ms"] for x in (r, old))
            assert ratio > 1.25 * old_ratio, (r.times, old.times)
