"""The timing guards' pieces, without children: fresh inputs, fingerprints, the round protocol, the
parent's wall-clock check, the harness snapshot's code and native checks, the physical floor."""

from __future__ import annotations

import ctypes
import time

import pytest
import torch

from opsynth.reward import RewardConfig, floor, guards, timed_inputs
from opsynth.reward.rounds import RoundSession, TimingPlan, judge_rounds, plausible, session_handler


def _trials(k=5, shape=(64, 32)):
    g = torch.Generator().manual_seed(0)
    return [[torch.randn(*shape, generator=g), torch.randint(0, 16, shape, generator=g), 3] for _ in range(k)]


# ---- fresh inputs -----------------------------------------------------------------------------------

def test_fresh_inputs_keep_each_position_from_some_trial_and_differ_every_call():
    trials = _trials()
    stacked = timed_inputs.stack_trials(trials)
    buffers = [t.clone() if isinstance(t, torch.Tensor) else t for t in trials[0]]
    keys = set()
    for seed in range(1, 21):
        timed_inputs.fresh_inputs(buffers, stacked, seed)
        x, idx, n = buffers
        assert x.dtype == torch.float32 and idx.dtype == torch.int64 and n == 3
        # every element is one of the trials' values at that position (so the value set is theirs)
        assert bool((stacked[0] == x.unsqueeze(0)).any(0).all()) and bool((stacked[1] == idx.unsqueeze(0)).any(0).all())
        assert int(idx.min()) >= 0 and int(idx.max()) < 16
        # inputs of one shape take the same trial at each position: element-wise pairs stay together
        assert bool(((stacked[0] == x.unsqueeze(0)) & (stacked[1] == idx.unsqueeze(0))).any(0).all())
        assert not any(torch.equal(x, t[0]) for t in trials)
        keys.add(timed_inputs.input_key(buffers))
    assert len(keys) == 20
    before = [b.clone() for b in buffers[:2]]
    timed_inputs.fresh_inputs(buffers, stacked, 20)  # the same seed, the same inputs: the reference's
    assert all(torch.equal(a, b) for a, b in zip(before, buffers[:2]))


def test_fresh_inputs_leave_what_every_trial_shares():
    pos = torch.arange(32)
    trials = [[torch.randn(4, 32), pos.clone()] for _ in range(5)]
    buffers = [trials[0][0].clone(), pos.clone()]
    timed_inputs.fresh_inputs(buffers, timed_inputs.stack_trials(trials), 7)
    assert torch.equal(buffers[1], pos)


# ---- fingerprints -----------------------------------------------------------------------------------

def test_fingerprints_accept_errors_within_tolerance_and_reject_stale_outputs():
    g = torch.Generator().manual_seed(1)
    ref, prev = torch.randn(256, 512, generator=g), torch.randn(256, 512, generator=g)
    fp, scale = timed_inputs.fingerprint([ref]), timed_inputs.tolerance([ref], 1e-2, 1e-2)
    tol = 1e-2 + 1e-2 * ref.abs()
    worst = ref + tol * torch.where(torch.rand(ref.shape, generator=g) < 0.5, -1.0, 1.0)  # full tolerance everywhere
    assert timed_inputs.fingerprints_match(timed_inputs.fingerprint([worst]), fp, scale)[0]
    assert timed_inputs.fingerprints_match(timed_inputs.fingerprint([ref + 0.9 * tol]), fp, scale)[0]  # aligned errors
    assert not timed_inputs.fingerprints_match(timed_inputs.fingerprint([prev]), fp, scale)[0]
    half = ref.clone()
    half[:128] = prev[:128]  # half of it stale
    assert not timed_inputs.fingerprints_match(timed_inputs.fingerprint([half]), fp, scale)[0]
    nan = ref.clone()
    nan[3, 4] = float("nan")
    ok, _, why = timed_inputs.fingerprints_match(timed_inputs.fingerprint([nan]), fp, scale)
    assert not ok and "NaN" in why
    ints = torch.randint(0, 9, (100,), generator=g)
    fi = timed_inputs.fingerprint([ints])
    assert timed_inputs.fingerprints_match(timed_inputs.fingerprint([ints.clone()]), fi, [0.0])[0]
    assert not timed_inputs.fingerprints_match(timed_inputs.fingerprint([ints.flip(0)]), fi, [0.0])[0]


def test_fingerprints_of_outputs_larger_than_a_chunk(monkeypatch):
    monkeypatch.setattr(timed_inputs, "_CHUNK", 1000)
    g = torch.Generator().manual_seed(2)
    ref, prev = torch.randn(5500, generator=g), torch.randn(5500, generator=g)
    fp, scale = timed_inputs.fingerprint([ref]), timed_inputs.tolerance([ref], 1e-2, 1e-2)
    tol = 1e-2 + 1e-2 * ref.abs()
    assert timed_inputs.fingerprints_match(timed_inputs.fingerprint([ref + tol]), fp, scale)[0]
    assert not timed_inputs.fingerprints_match(timed_inputs.fingerprint([prev]), fp, scale)[0]


# ---- the parent's side of the rounds ----------------------------------------------------------------

def _reference(plan, outs):
    return {"rounds": [{"fp": timed_inputs.fingerprint(o), "scale": timed_inputs.tolerance(o, 1e-2, 1e-2)}
                       for j, o in enumerate(outs)],
            "round_outputs": {j: outs[j] for j in plan.keep}}


def _round(session, j, out, ms=1.0):
    if session.step == "round_start":  # the first round of a pass asks for its seed; the others got it with the last report
        assert session.handle({"kind": "round_start", "j": j})["ok"]
    assert session.handle({"kind": "round_ready", "j": j})["ok"]
    assert session.handle({"kind": "round_returned", "j": j, "ms": ms})["ok"]
    rep = session.handle({"kind": "round_done", "j": j, "fp": timed_inputs.fingerprint(out), "key": j})
    assert rep["ok"]


def _play(session, outs, ms=1.0, first=0):
    for j, o in enumerate(outs, start=first):
        _round(session, j, o, ms)
    return session.handle({"kind": "timing_done"})


def test_round_protocol_reveals_one_seed_at_a_time_and_judges_every_call():
    plan = TimingPlan.draw(2, 6, 1e-2, 1e-2)
    assert len(plan.seeds) == 8 + 5 and len(plan.keep) == 2 and all(2 <= j < 8 for j in plan.keep)
    outs = [[torch.randn(16, 16)] for _ in range(len(plan.seeds))]
    ref = _reference(plan, outs)
    s = RoundSession(plan)
    assert not s.handle({"kind": "round_start", "j": 1})["ok"]  # a later seed before its turn: refused, and final
    assert s.error and not s.handle({"kind": "round_start", "j": 0})["ok"]
    s = RoundSession(plan)
    s.handle({"kind": "round_start", "j": 0})
    assert not s.handle({"kind": "round_returned", "j": 0, "ms": 0.1})["ok"]  # a step skipped
    s = RoundSession(plan)
    assert _play(s, outs[:8]) == {"ok": True, "again": 0}
    kept = {j: outs[j] for j in plan.keep}
    keys = {j: j for j in range(len(plan.seeds))}
    assert judge_rounds(ref, s, kept, RewardConfig(), keys) == ("ok", "")
    assert judge_rounds(ref, s, kept, RewardConfig(), {**keys, 3: -1})[0] == "input_mutated"
    stale = RoundSession(plan)
    _play(stale, [outs[0], *outs[0:7]])  # from call 1 on, the previous call's output
    assert judge_rounds(ref, stale, kept, RewardConfig(), keys)[0] == "output_cached"
    nan = RoundSession(plan)
    _play(nan, [outs[0], [torch.full((16, 16), float("nan"))], *outs[2:8]])
    assert judge_rounds(ref, nan, kept, RewardConfig(), keys)[0] == "stale_output"
    wrong_kept = {j: [outs[j][0] + 1] for j in plan.keep}
    assert judge_rounds(ref, s, wrong_kept, RewardConfig(), keys)[0] == "incorrect_under_timing"
    assert judge_rounds(ref, s, {}, RewardConfig(), keys)[0] == "timing_protocol"


def test_a_median_below_the_floor_gets_a_second_pass():
    plan = TimingPlan.draw(1, 4, 1e-2, 1e-2)
    outs = [[torch.randn(4)] for _ in range(len(plan.seeds))]
    s = RoundSession(plan, floor_ms=0.5)
    assert _play(s, outs[:5], ms=0.1) == {"ok": True, "again": 5}
    assert _play(s, outs[5:10], ms=0.7, first=5) == {"ok": True, "again": 0}
    assert s.done and s.median(main=True) == 0.1 and s.median(main=False) == 0.7


def test_session_handler_routes_timing_messages_and_builds():
    s = RoundSession(TimingPlan.draw(1, 2, 1e-2, 1e-2))
    h = session_handler(s, lambda req: {"ok": True, "built": req["name"]})
    assert h({"kind": "inline", "name": "ext"}) == {"ok": True, "built": "ext"}
    assert "seed" in h({"kind": "round_start", "j": 0})


def _clocked(claim, call_ms, round_ms, n=5):
    s = RoundSession(TimingPlan.draw(0, n, 1e-2, 1e-2))
    for j in range(n):
        s.claims[j], s.call_wall[j], s.wall[j] = claim, call_ms, round_ms
    return s


def test_wall_clock_check_sees_a_clock_that_hides_the_forward():
    ref = _clocked(1.0, 1.2, 8.0)  # the reference: 0.2 ms around the call, 7 ms of harness work per round
    ok, why = plausible(_clocked(0.01, 20.0, 27.0), ref)  # claims 10 us, the parent saw 20 ms around the call
    assert not ok and "around the call" in why and "not the real one" in why
    ok, why = plausible(_clocked(0.01, 0.3, 60.0), ref)  # work hidden before the call, while inputs are made
    assert not ok and "over the round" in why
    assert plausible(_clocked(0.5, 0.9, 9.0), ref)[0]  # honest and fast
    assert plausible(_clocked(30.0, 33.0, 45.0), ref)[0]  # honest and slow on a loaded machine


def _gapped(claim, before, after, settle, n=13):
    s = _clocked(claim, claim + 0.2, claim + before + after + 0.2, n=n)
    for j in range(n):
        s.before[j], s.after[j], s.settle[j] = before, after, settle
    return s


def test_work_in_the_harnesss_own_time_is_held_to_the_references_stretches():
    """Outputs computed between the inputs being written and the clock (a hook), filled after the
    return before the fingerprint, or device work left queued for the timer's settling: each
    stretch against the reference's, in the rounds that set the median."""
    ref = _gapped(1.0, 0.3, 0.4, 0.1)
    assert plausible(_gapped(0.3, 0.4, 0.5, 0.12), ref)[0]  # honest and fast
    ok, why = plausible(_gapped(0.3, 6.0, 0.5, 0.12), ref)  # 6 ms of work before the call: the round allows it
    assert not ok and "before the call" in why and "outside the timed call" in why
    ok, why = plausible(_gapped(0.3, 0.4, 6.0, 0.12), ref)
    assert not ok and "after the call" in why
    ok, why = plausible(_gapped(0.3, 0.4, 0.5, 1.5), ref)  # 1.4 ms of device work finished in the settling
    assert not ok and "settling" in why
    # Load from outside in some rounds only is no hidden work: one undisturbed round clears it.
    loaded = _gapped(0.3, 0.4, 0.5, 0.12)
    for j in range(0, 13, 2):
        loaded.before[j], loaded.after[j], loaded.settle[j] = 9.0, 9.0, 3.0
    assert plausible(loaded, ref)[0]


# ---- the harness snapshot -----------------------------------------------------------------------------

def test_snapshot_sees_code_swapped_under_an_unchanged_function():
    from opsynth.runtime import timing

    snap = guards.HarnessSnapshot(extra_modules=[timing])
    assert snap.changed() is None
    orig = timing.Timer.time_call.__code__

    def fast(self, fn, args):
        return 0.001, fn(*args)

    try:
        timing.Timer.time_call.__code__ = fast.__code__
        assert snap.changed() == "harness_patched:opsynth.runtime.timing.Timer.time_call.__code__"
    finally:
        timing.Timer.time_call.__code__ = orig
    assert snap.changed() is None


def test_snapshot_sees_a_harness_classs_method_replaced():
    """`Timer.time_call = fast` (plain Python: no module name rebound, the old function's code as it
    was) would claim any time the parent's wall-clock slack lets through."""
    from opsynth.reward import rounds
    from opsynth.runtime import timing

    snap = guards.HarnessSnapshot(extra_modules=[timing, rounds])
    assert snap.changed() is None

    def fast(self, fn, args):
        ms, out = orig(self, fn, args)
        return ms * 0.5, out

    for owner, name in ((timing.Timer, "time_call"), (rounds.Channel, "request"), (rounds.TimingPlan, "draw"),
                        (rounds.RoundSession, "pass_end")):
        orig = vars(owner)[name]
        try:
            setattr(owner, name, fast)
            assert snap.changed() == f"harness_patched:{owner.__module__}.{owner.__qualname__}.{name}"
        finally:
            setattr(owner, name, orig)
        assert snap.changed() is None


def test_snapshot_sees_a_harness_classs_attribute_added_and_a_watched_instances_class_swapped():
    """Beyond the methods a harness class had: an attribute added to it (`__getattribute__`, which
    sends every lookup elsewhere and leaves the methods in place), and a watched instance moved to
    another class (`timer.__class__ = Sub`: the instance's attributes and Timer's methods as they
    were; tests/reward/candidates/cpu/class_swap.py does it from forward). With class_methods off
    (the control's switch) neither is seen."""
    from opsynth.runtime import timing

    snap = guards.HarnessSnapshot(extra_modules=[timing])
    blind = guards.HarnessSnapshot(extra_modules=[timing], class_methods=False)
    timer = timing.Timer("cpu")
    snap.watch("timer", timer)
    blind.watch("timer", timer)
    assert snap.changed() is None and blind.changed() is None

    def getattribute(self, name):
        return object.__getattribute__(self, name)

    timing.Timer.__getattribute__ = getattribute
    try:
        assert snap.changed() == "harness_patched:opsynth.runtime.timing.Timer.__getattribute__"
        assert blind.changed() is None
    finally:
        del timing.Timer.__getattribute__
    assert snap.changed() is None

    class Sub(timing.Timer):
        def time_call(self, fn, args):
            ms, out = timing.Timer.time_call(self, fn, args)
            return ms * 0.35, out

    timer.__class__ = Sub
    try:
        assert snap.changed() == "timer_patched:timer.__class__"
        assert blind.changed() is None
    finally:
        timer.__class__ = timing.Timer
    assert snap.changed() is None


def test_the_snapshots_check_bound_before_the_candidate_sees_its_own_methods_rebound():
    """The candidate child binds `changed` before the candidate runs (candidate_runner._harness_checker):
    rebinding HarnessSnapshot.changed then changes nothing that still runs, and is itself reported."""
    from opsynth.reward import candidate_runner

    snap = guards.HarnessSnapshot(extra_modules=[guards])
    check = candidate_runner._harness_checker(snap, set())
    orig = vars(guards.HarnessSnapshot)["changed"]
    guards.HarnessSnapshot.changed = lambda self: None
    try:
        with pytest.raises(candidate_runner.Reject) as e:
            check("test")
        assert e.value.reason == "harness_patched"
        assert "opsynth.reward.guards.HarnessSnapshot.changed" in e.value.detail
    finally:
        guards.HarnessSnapshot.changed = orig
    check("test")


def test_snapshot_sees_a_rewritten_builtin_timer_and_a_patched_timer_instance():
    from opsynth.runtime import timing

    snap = guards.HarnessSnapshot()
    # What native code does in a static initialiser: point time.thread_time's C function elsewhere.
    f = time.thread_time
    ml = ctypes.c_void_p.from_address(id(f) + 16)
    orig = ml.value
    other = ctypes.c_void_p.from_address(id(time.monotonic) + 16).value
    try:
        ml.value = other
        assert snap.changed() == "timer_patched:time.thread_time (native)"
    finally:
        ml.value = orig
    assert snap.changed() is None
    timer = timing.Timer("cpu")
    snap.watch("timer", timer)
    timer.settled[0] = 0.5  # what each call does: the attribute keeps its identity
    assert snap.changed() is None
    timer.cuda = True
    assert snap.changed() == "timer_patched:timer"


def test_snapshot_sees_hooks_that_run_code_in_the_harnesss_own_time():
    import gc
    import signal

    snap = guards.HarnessSnapshot()
    assert snap.hooks_changed() is None and snap.changed() is None

    def cb(phase, info):
        pass

    gc.callbacks.append(cb)
    try:
        assert snap.hooks_changed() == "harness_patched:gc.callbacks" == snap.changed()
    finally:
        gc.callbacks.remove(cb)
    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        assert snap.hooks_changed() == "harness_patched:gc.set_threshold"
    finally:
        gc.set_threshold(*old)
    signal.setitimer(signal.ITIMER_PROF, 10.0)
    try:
        assert snap.hooks_changed() == "harness_patched:signal.setitimer"
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    assert snap.hooks_changed() is None


# ---- the physical floor --------------------------------------------------------------------------------

def test_physical_floor_is_the_outputs_at_peak_bandwidth():
    meta = [[[1024, 65536], "float32"], [[8], "int64"]]
    assert floor.output_bytes(meta) == 1024 * 65536 * 4 + 64
    assert floor.floor_ms(meta, "cuda") == pytest.approx((1024 * 65536 * 4 + 64) / 4.8e12 * 1e3)
    assert floor.flop_bound_ms(67e9, meta, "cuda") == pytest.approx(1.0)
    assert floor.flop_bound_ms(None, meta, "cuda") is None


def test_disabled_guards_are_named():
    with pytest.raises(ValueError, match="unknown guard"):
        RewardConfig(disabled_guards=["fresh_input"])


def test_wall_clock_check_clears_an_honest_candidate_that_other_processes_delayed():
    """Load from outside only inflates the parent's windows: seven of thirteen honest rounds 55 ms late
    (another child compiling on a 2-core machine) is no patched clock."""
    ref = _clocked(0.2, 0.4, 3.6, n=13)
    honest = _clocked(0.26, 0.3, 5.0, n=13)
    for j in range(7):
        honest.call_wall[j], honest.wall[j] = 5.6, 56.0
    assert plausible(honest, ref)[0]


def test_wall_clock_check_sees_a_clock_patched_only_in_the_calls_that_set_the_median():
    """Honest in the rest, so that a look at the least delayed round alone would clear it: the rounds
    claiming no more than the median each hide 6 ms."""
    ref = _clocked(0.2, 0.4, 3.6, n=13)
    s = _clocked(6.3, 6.5, 10.0, n=13)  # honest rounds: 6.3 ms of work, claimed as such
    for j in range(7):
        s.claims[j] = 0.3  # the work still runs, the clock says 0.3 ms
    ok, why = plausible(s, ref)
    assert not ok and "around the call" in why, why


def test_claims_are_decided_on_the_parents_clock_around_the_call():
    """A report of 52% of a 14 ms call hides less than it claims, so the rejection bound lets it pass
    (issue 28); the time decided is the parent's clock less the reference's overhead and the slack,
    so the forgery gains the slack (0.5 ms of 14) and no more. An honest child is left as it claimed,
    load in most of its rounds included; with the floor off (the control) the forged claim stands."""
    from opsynth.reward.rounds import CALL_FLOOR_SLACK_MS, call_floor, call_margin

    s_ = CALL_FLOOR_SLACK_MS
    ref = _clocked(10.0, 10.4, 20.0, n=13)  # the reference's overhead around the call: 0.4 ms
    forged = _clocked(7.28, 14.4, 30.0, n=13)
    for j in range(13):  # true times 13.4 .. 14.6 ms, each reported at 52%, the parent's window 0.4 ms more
        t = 13.4 + 0.1 * j
        forged.claims[j], forged.call_wall[j] = 0.52 * t, t + 0.4
    forged.reference = ref
    assert plausible(forged, ref)[0]  # it hides less than it claims: within the rejection bound
    scale, shift = forged.floor()
    assert scale == pytest.approx((13.4 - s_) / (0.52 * 13.4)) and shift == pytest.approx(0.48 * 13.4 - s_)
    assert forged.median() == pytest.approx(14.0 * (1 - s_ / 13.4))  # the true median 14.0, less ~the slack
    assert min(forged.decided().values()) == pytest.approx(13.4 - s_)
    forged.call_floor = False  # the control: the forged claims stand
    assert forged.floor() == (1.0, 0.0) and forged.median() == pytest.approx(0.52 * 14.0)
    # A constant shave (6 ms off each call), and claims of 0, are undone by the shift
    shaved = _clocked(8.0, 14.4, 30.0, n=13)
    shaved.reference = ref
    assert shaved.median() == pytest.approx(14.0 - s_)
    zero = _clocked(0.0, 2.9, 30.0, n=13)
    assert call_floor(zero, ref, range(13)) == (1.0, pytest.approx(2.5 - s_))
    # Honest: as claimed, also with seven of thirteen rounds 40 ms late (another process on the core),
    # with jitter within the slack, and with no reference to hold it to (the wall clock off)
    honest = _clocked(14.0, 14.4, 30.0, n=13)
    honest.reference = ref
    for j in range(0, 13, 2):
        honest.call_wall[j] = 54.4
    assert honest.floor() == (1.0, 0.0) and honest.median() == 14.0
    jitter = _clocked(14.0, 14.4, 30.0, n=13)
    for j in range(13):
        jitter.claims[j], jitter.call_wall[j] = 14.0 + 0.1 * j, 14.4 + 0.1 * j + (0.3 if j % 3 else 0.0)
    assert call_floor(jitter, ref, range(13)) == (1.0, 0.0)
    assert _clocked(7.28, 14.4, 30.0).floor() == (1.0, 0.0)
    # The margin reported per evaluation: the forger's shave in full, the honest child's 0 (its least
    # round as the reference's typical one), the jittery one's within the slack
    assert call_margin(forged, ref, range(13)) == pytest.approx(0.48 * 13.4)
    assert call_margin(honest, ref, range(13)) == pytest.approx(0.0)
    assert call_margin(jitter, ref, range(13)) <= s_


def test_a_pass_whose_claims_fall_short_of_the_parents_clock_is_timed_again():
    """Every round of the lower half late beyond the slack (a stall from outside, or a forged report):
    the pass gets a second one and is decided on it, so an honest child stalled once keeps its time."""
    plan = TimingPlan.draw(0, 6, 1e-2, 1e-2)
    ref = _clocked(0.2, 0.4, 3.6, n=len(plan.seeds))
    s = RoundSession(plan, reference=ref)
    for j in range(plan.main):
        _report(s, j, 5.0, 6.5, 8.0)  # 1.5 ms beyond each claim around the call, the reference's 0.2
    rep = s.handle({"kind": "timing_done"})
    assert rep["again"] == len(plan.seeds) - plan.main and s.floor(main=True)[1] > 0
    for j in range(plan.main, len(plan.seeds)):
        _report(s, j, 5.0, 5.2, 8.0)
    assert s.handle({"kind": "timing_done"})["ok"] and s.done
    assert s.floor(main=False) == (1.0, 0.0) and s.median(main=False) == 5.0


def _report(s, j, claim, call_ms, round_ms):
    """Drive one round through the session's handler with a fake parent clock: its seed sent at t
    (now, or with the last round's report), ready 1 us later, returned `call_ms` after that, reported
    `round_ms` after t."""
    import opsynth.reward.rounds as rounds_mod

    clock = {"now": 1000.0 + j}
    real = rounds_mod.time.perf_counter
    rounds_mod.time.perf_counter = lambda: clock["now"]
    try:
        if s.step == "round_start":
            assert s.handle({"kind": "round_start", "j": j})["ok"]
        t = clock["now"] = s.started[j]
        for kind, at, extra in (("round_ready", 0.001, {}), ("round_returned", 0.001 + call_ms / 1e3, {"ms": claim}),
                                ("round_done", round_ms / 1e3, {"fp": [], "key": "k"})):
            clock["now"] = t + at
            assert s.handle({"kind": kind, "j": j, **extra})["ok"]
    finally:
        rounds_mod.time.perf_counter = real


def test_a_pass_that_looks_patched_is_timed_again_and_judged_on_the_second_pass():
    """Every round of a short pass can be stalled from outside (a CPU quota's throttling): such a pass
    gets a second one, and the verdict is the second pass's; a clock patched in both stays caught."""
    plan = TimingPlan.draw(0, 6, 1e-2, 1e-2)
    ref = _clocked(0.2, 0.4, 3.6, n=len(plan.seeds))
    for stalled_again, expect in ((False, True), (True, False)):
        s = RoundSession(plan, reference=ref)
        for j in range(plan.main):
            _report(s, j, 0.26, 0.3, 56.0)  # stalled: 56 ms over a round that claims 0.26 ms
        rep = s.handle({"kind": "timing_done"})
        assert rep["again"] == len(plan.seeds) - plan.main
        for j in range(plan.main, len(plan.seeds)):
            _report(s, j, 0.26, 0.3, 56.0 if stalled_again else 4.0)
        assert s.handle({"kind": "timing_done"})["ok"] and s.done
        ok, why = plausible(s, ref)
        assert ok is expect, why
    quiet = RoundSession(plan, reference=ref)
    for j in range(plan.main):
        _report(quiet, j, 0.26, 0.3, 4.0)
    assert quiet.handle({"kind": "timing_done"})["again"] == 0


@pytest.mark.parametrize("owner_path,name", [("json", "dumps"), ("builtins", "float"),
                                             ("json.encoder.JSONEncoder", "encode")])
def test_snapshot_sees_what_the_reply_goes_through_rebound(owner_path, name):
    """The child's reply passes json.dumps (rounds.Channel.request) and float(ms) (run_rounds): a
    candidate rebinding either from C++ can shave the time it reports without touching a harness
    module. The snapshot compares their identities; put back, nothing is reported."""
    import builtins
    import importlib
    import json  # noqa: F401 - json.encoder below

    owner = (importlib.import_module(owner_path) if owner_path != "json.encoder.JSONEncoder"
             else importlib.import_module("json.encoder").JSONEncoder)
    snap = guards.HarnessSnapshot()
    assert snap.changed() is None
    real = getattr(owner, name)

    def shaved(*a, **k):
        return real(*a, **k)

    setattr(owner, name, shaved)
    try:
        got = snap.changed()
    finally:
        setattr(owner, name, real)
    assert got is not None and got.startswith("harness_patched:") and got.endswith(f".{name}")
    assert snap.changed() is None
    assert builtins.float is float
