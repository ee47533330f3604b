"""The rounds protocol over a real channel (a socketpair, the parent's handler in a thread, as
`sandbox.run_child` serves it) and the pacer's early end of a main pass, without children.

What a user relies on: a child learns a round's seed only with the previous round's report and
runs exactly the rounds the parent sends seeds for; the parent's clock around the call holds the
call, so a patched clock is still caught; the reference's unclocked rounds give the fingerprints
the clocked ones would; a clear candidate's main pass ends after `min_timed_calls`, a close one's
does not, and the rounds compared in full are always among those that ran.
"""

from __future__ import annotations

import random
import socket
import statistics
import threading
import time

import torch

from opsynth.reward import RewardConfig, timed_inputs
from opsynth.reward.baselines import Pacer
from opsynth.reward.confidence import EARLY_MARGIN
from opsynth.reward.rounds import Channel, RoundSession, TimingPlan, plausible, run_rounds, session_handler, untimed_rounds
from opsynth.runtime.sandbox import _serve_builds
from opsynth.runtime.timing import Timer
from fake_baselines import FakeBaselines, FakeServer  # noqa: E402 - tests/reward, on sys.path (conftest)


def _trials(k=5, shape=(32, 64)):
    g = torch.Generator().manual_seed(3)
    return [[torch.randn(*shape, generator=g)] for _ in range(k)]


class _Served:
    """A session answered by the parent's channel loop in a thread; `chan` is the child's end."""

    def __init__(self, session: RoundSession):
        self.session = session
        self.parent, child = socket.socketpair()
        self.child = child
        self.seen: list[str] = []

        def handler(req):
            self.seen.append(req.get("kind"))
            return session_handler(session, None)(req)

        threading.Thread(target=_serve_builds, args=(self.parent, handler), daemon=True).start()
        self.chan = Channel(child.fileno())

    def close(self):
        self.child.close()


def _play(session: RoundSession, fn, trials, first=0, timer=None, own_work=None):
    """One pass in this thread as a child runs it; returns (kept, fps, the served channel)."""
    served = _Served(session)
    buffers = [trials[0][0].clone()]
    stacked = timed_inputs.stack_trials(trials)
    try:
        kept, fps = run_rounds(fn, buffers, stacked, timer or Timer("cpu"), served.chan, first, own_work=own_work)
        served.chan.request({"kind": "timing_done"})
    finally:
        served.close()
    return kept, fps, served


def _sleepy(ms: float):
    def fn(x):
        time.sleep(ms / 1e3)
        return x * 2.0 + 1.0

    return fn


def test_a_child_runs_exactly_the_rounds_it_gets_seeds_for_one_at_a_time():
    plan = TimingPlan.draw(2, 6, 1e-2, 1e-2)
    s = RoundSession(plan)
    kept, fps, served = _play(s, _sleepy(0), _trials())
    assert sorted(fps) == list(range(plan.main)) and s.done and s.next_round == plan.main
    assert sorted(kept) == plan.keep  # the kept rounds' outputs, and no other
    # one seed request per pass; then per round: ready, returned, done (answered with the next seed)
    assert served.seen == ["round_start"] + ["round_ready", "round_returned", "round_done"] * plan.main + ["timing_done"]
    # a seed ahead of its turn is refused, and the refusal is final
    s = RoundSession(plan)
    assert s.handle({"kind": "round_start", "j": 0})["seed"] == plan.seeds[0]
    assert not s.handle({"kind": "round_start", "j": 1})["ok"] and s.error
    assert not s.handle({"kind": "round_ready", "j": 0})["ok"]


def test_each_round_reports_the_device_clock_beside_its_claim_and_the_host_share_is_their_difference():
    """The timer's device-clock time travels with each claim (diagnostic: the claim's host part is what
    load stretches); on the CPU backend both are the host's clock, so the host share is 0. A device
    time above the claim cannot be and is dropped."""
    plan = TimingPlan.draw(1, 4, 1e-2, 1e-2)
    s = RoundSession(plan)
    _play(s, _sleepy(1.0), _trials())
    assert sorted(s.device_ms) == list(range(plan.main)) and s.host_shares() == [0.0] * (plan.main - plan.warmup)
    s = RoundSession(TimingPlan.draw(0, 2, 1e-2, 1e-2))
    s.handle({"kind": "round_start", "j": 0})
    for j, dev in ((0, 0.75), (1, 2.0)):
        s.handle({"kind": "round_ready", "j": j})
        s.handle({"kind": "round_returned", "j": j, "ms": 1.0, "device_ms": dev})
        s.handle({"kind": "round_done", "j": j, "fp": [], "key": 1})
    assert s.device_ms == {0: 0.75} and s.host_shares() == [0.25]


def test_the_next_seed_comes_only_with_the_previous_report():
    plan = TimingPlan.draw(0, 3, 1e-2, 1e-2)
    s = RoundSession(plan)
    assert s.handle({"kind": "round_start", "j": 0}) == {"ok": True, "seed": plan.seeds[0]}
    assert s.handle({"kind": "round_ready", "j": 0}) == {"ok": True}
    assert "seed" not in s.handle({"kind": "round_returned", "j": 0, "ms": 1.0})
    rep = s.handle({"kind": "round_done", "j": 0, "fp": [], "key": 1})
    assert rep["seed"] == plan.seeds[1] and rep["keep"] == (0 in plan.keep)
    for j in (1, 2):
        s.handle({"kind": "round_ready", "j": j})
        s.handle({"kind": "round_returned", "j": j, "ms": 1.0})
        rep = s.handle({"kind": "round_done", "j": j, "fp": [], "key": 1})
    assert "seed" not in rep  # the pass is over: no seed for a round beyond it
    assert not s.handle({"kind": "round_start", "j": 3})["ok"]


def test_the_parents_clock_around_the_call_still_holds_the_call():
    """`round_ready` and `round_returned` are each answered before the child goes on: the parent's
    call window starts before the call and ends after it. A timer that claims a tenth of the call is
    caught against an honest reference run over the same channel code (control: the honest timer passes)."""
    trials = _trials()
    ref = RoundSession(TimingPlan.draw(1, 8, 1e-2, 1e-2))
    _play(ref, _sleepy(20.0), trials)
    honest = RoundSession(TimingPlan.draw(1, 8, 1e-2, 1e-2))
    _play(honest, _sleepy(20.0), trials)
    assert all(honest.call_wall[j] >= honest.claims[j] >= 20.0 for j in honest.claims)
    assert plausible(honest, ref)[0]

    class Patched(Timer):
        def time_call(self, fn, args):
            ms, out = super().time_call(fn, args)
            return ms / 10, out

    patched = RoundSession(TimingPlan.draw(1, 8, 1e-2, 1e-2))
    _play(patched, _sleepy(20.0), trials, timer=Patched("cpu"))
    ok, why = plausible(patched, ref)
    assert not ok and "around the call" in why


def test_only_the_references_session_takes_its_own_work_out_of_the_round():
    """The reference's tolerances (its own work) are out of its rounds' clock, so the wall-clock
    check's yardstick stays the harness's overhead. A candidate that claims `own_ms` for work it
    hides before its report gains nothing; were its session to honour it (the control), the hidden
    work would pass the check."""
    trials = _trials()
    plan = TimingPlan.draw(1, 8, 1e-2, 1e-2)
    hide = lambda j, outs: time.sleep(0.03)  # noqa: E731 - 30 ms of work outside the timed call
    ref = RoundSession(plan, own_work=True)
    _play(ref, _sleepy(0.5), trials, own_work=lambda j, outs: None)
    plain = RoundSession(plan, own_work=True)
    _play(plain, _sleepy(0.5), trials, own_work=hide)
    assert statistics.median(plain.overheads()) < 10.0  # 30 ms in every round, taken out
    for trusted, caught in ((False, True), (True, False)):
        cand = RoundSession(plan, own_work=trusted)
        _play(cand, _sleepy(0.5), trials, own_work=hide)
        ok, why = plausible(cand, ref)
        assert ok is not caught, why
        if caught:
            assert "over the round" in why


def test_the_references_unclocked_rounds_give_the_clocked_fingerprints():
    trials = _trials()
    plan = TimingPlan.draw(1, 4, 1e-2, 1e-2)
    fn = _sleepy(0)
    s = RoundSession(plan)
    _, fps, _ = _play(s, fn, trials)
    buffers = [trials[0][0].clone()]
    seen = {}
    more, keys = untimed_rounds(fn, buffers, timed_inputs.stack_trials(trials), {j: plan.seeds[j] for j in range(plan.main)},
                                after=lambda j, outs: seen.setdefault(j, len(outs)))
    assert more == fps and keys == s.keys and sorted(seen) == list(range(plan.main))


# ---- the pacer's early end of a main pass (fake baseline children) -------------------------------


def _paced(tmp_path, cand_ms: float, min_timed: int | None, compile_baseline: bool = False, wrong_from: int | None = None,
           cached: dict | None = None, servers: dict | None = None, reference_ms: float | None = None, device: str = "cpu",
           between_passes=None, **ms):
    """A candidate's timing as its child drives it (10 warm-up, 30 repeats, blocks of 10, cap 90),
    each round claiming about `cand_ms`; from round `wrong_from` on, outputs unlike the reference's."""
    cfg = RewardConfig(device="cpu", timing_block=10, compile_baseline=compile_baseline)
    plan = TimingPlan.draw(10, 30, 1e-2, 1e-2, extra=60, min_timed=min_timed)
    ref_fps = {j: {"fp": [[float(j), 0.0]], "scale": [1e-3]} for j in range(len(plan.seeds))}
    pacer = Pacer(FakeBaselines(cached, servers, **ms), cfg, device, str(tmp_path / "device.lock"), plan.warmup, plan.main + plan.extra,
                  reference=(ref_fps, {j: "k" for j in ref_fps}), reference_ms=reference_ms)
    s = RoundSession(plan, pacer=pacer)
    rng = random.Random(7)
    assert s.handle({"kind": "timing_lock"})["ok"]
    first = 0
    while True:
        assert s.handle({"kind": "round_start", "j": first})["ok"], s.error
        j = first
        while True:
            fp = [[float(j) + (5.0 if wrong_from is not None and j >= wrong_from else 0.0), 0.0]]
            s.handle({"kind": "round_ready", "j": j})
            s.handle({"kind": "round_returned", "j": j, "ms": cand_ms * rng.lognormvariate(0.0, 0.03)})
            rep = s.handle({"kind": "round_done", "j": j, "fp": fp, "key": "k"})
            assert rep["ok"], s.error
            if "seed" not in rep:
                break
            j += 1
        first = j + 1
        again = s.handle({"kind": "timing_done"})["again"]
        if not again:
            break
        if between_passes is not None:
            between_passes()
    s.handle({"kind": "timing_unlock"})
    return s, pacer


def test_a_rounds_period_ends_at_its_report_not_after_the_pass_boundary(tmp_path):
    """A period spanning a pass's end held the wait at `timing_done` and the pacer's decision (the
    longest round read that as its own). Here 0.2 s pass between passes of a near-threshold candidate:
    no round's period holds it."""
    s, _ = _paced(tmp_path, 0.95, 10, eager=1.0, between_passes=lambda: time.sleep(0.2))
    assert s.main_end > 40, "no pass boundary: the test did not test it"
    periods = s.periods_by_round()
    assert set(periods) == set(range(s.next_round)) and max(periods.values()) < 100, max(periods.values())


def test_a_clear_candidate_ends_its_main_pass_after_min_timed_calls(tmp_path):
    for ms in (0.5, 2.0):  # well below eager and well above it
        s, pacer = _paced(tmp_path, ms, 10, eager=1.0)
        assert s.done and s.main_end == 20 and s.next_round == 20 and s.main_cut == 20
        assert all(j < 20 for j in s.plan.keep)  # the rounds compared in full are among those that ran
        d = pacer.decision(s)
        assert d["reward"] == (2 if ms < 1 else 1) and d["undecided"] == [] and d["timed_calls"]["candidate"] == 10
        assert pacer.baselines.servers["eager"].blocks == [10, 10, 10]  # warm-up, before and after the one block
    s, _ = _paced(tmp_path, 0.5, None, eager=1.0)  # control: without a minimum the plan's 30 run
    assert s.main_end == 40 and s.main_cut is None


def test_the_candidate_whose_samples_become_the_cached_baseline_runs_the_whole_main_pass(tmp_path):
    s, pacer = _paced(tmp_path, 0.5, 10, cached={"eager_ms": None, "compile_ms": None}, eager=1.0)
    assert s.main_cut is None and s.main_end == 40
    assert sum(pacer.baselines.servers["eager"].blocks) >= 30  # the entry is a median of the whole pass's blocks


def test_a_candidate_near_a_threshold_runs_the_whole_main_pass_and_more(tmp_path):
    s, pacer = _paced(tmp_path, 0.95, 10, eager=1.0)
    assert s.main_cut is None and s.main_end > 40 and pacer.capped
    # just outside the early margin of 0.95 (ratio 0.93): clear of it at the end, but not early
    s, pacer = _paced(tmp_path, 0.95 * (1 - EARLY_MARGIN / 2), 10, eager=1.0)
    assert s.main_cut is None


def test_wrong_outputs_end_the_main_pass_at_the_first_look(tmp_path):
    s, pacer = _paced(tmp_path, 0.95, 10, wrong_from=12, eager=1.0)  # near a threshold, but already wrong
    assert s.main_cut == 20 and s.main_end == 20 and not pacer.correct_so_far(s)


def test_a_fast_candidate_ends_early_and_compile_joins_after(tmp_path):
    s, pacer = _paced(tmp_path, 0.3, 10, compile_baseline=True, eager=1.0, compile=0.6)
    assert s.main_cut == 20 and s.main_end == 30  # one block paired with compile after the early end
    d = pacer.decision(s)
    assert d["reward"] == 3 and d["compile"]["n_candidate"] == 10 and d["timed_calls"]["candidate"] == 20


def test_kept_rounds_are_drawn_among_the_rounds_every_main_pass_runs():
    for _ in range(50):
        plan = TimingPlan.draw(10, 30, 1e-2, 1e-2, extra=60, min_timed=10)
        assert len(plan.keep) == 2 and all(10 <= j < 20 for j in plan.keep)
    assert RewardConfig(device="cpu", repeats=30).resolved_min_timed("cpu") == 10
    assert RewardConfig(device="cpu", repeats=6).resolved_min_timed("cpu") == 6  # never beyond the plan


class _BusyServer(FakeServer):
    """A baseline child beside work a stopped candidate left on the device: every block reads
    `factor` slow, and (with the child's quiet wait, `report`) says the device never went idle."""

    def __init__(self, ms: float, seed: int, factor: float, report: bool):
        super().__init__(ms, seed)
        self.factor, self.report, self.last_quiet, self.caps = factor, report, None, []

    def block(self, n: int, quiet_cap_ms: float | None = None) -> list[float]:
        self.caps.append(quiet_cap_ms)  # the child waits that long, then says the device never went idle
        self.last_quiet = {"quiet": False, "waited_ms": quiet_cap_ms, "probes": 900, "fastest_ms": 0.05, "slowest_ms": 2.1,
                           "threshold_ms": 0.3, "device_fastest_ms": 0.03, "device_slowest_ms": 0.07} if self.report else None
        return [x * self.factor for x in super().block(n)]


def test_baselines_timed_on_a_busy_device_cannot_show_a_speed_up(tmp_path):
    """A 1.3x-eager candidate whose queued kernel halves the baseline's share of the device reads
    0.65x eager. The baseline child's report that it never saw the device idle sets those blocks
    aside: the candidate is held to the reference child's eager time (1.0 ms here: reward 1; none
    known: 1 too) and the blocks stay out of the cached baseline. Without the report (the wait switched
    off, the control) the inflated blocks decide: 2. A candidate really faster than the reference's
    eager time (a device another process keeps busy all along) keeps its 2."""
    for report, cand, reference_ms, want in ((True, 1.3, 1.0, 1), (True, 1.3, None, 1), (False, 1.3, 1.0, 2),
                                             (True, 0.5, 1.0, 2)):
        s, pacer = _paced(tmp_path, cand, 10, cached={"eager_ms": 1.0, "compile_ms": None}, reference_ms=reference_ms,
                          servers={"eager": _BusyServer(1.0, 0, 2.0, report)})
        d = pacer.decision(s)
        assert d["reward"] == want, (report, cand, reference_ms, d)
        assert pacer.disturbed == (len(pacer.baselines.servers["eager"].blocks) if report else 0)
        if report:
            assert d["disturbed_blocks"] == pacer.disturbed and d["undisturbed_basis"]["eager_ms"] == reference_ms
            # one wait budget per candidate: the first block waits the whole cap, the later ones probe only
            caps = pacer.baselines.servers["eager"].caps
            assert caps[0] == 3000.0 and set(caps[1:]) == {0.0} and pacer.quiet_wait_ms == 3000.0, caps
            assert pacer.probe_ms == {"host": [0.05, 2.1], "device": [0.03, 0.07]}
            if want < 2:
                assert "busy device" in d["note"], d


def test_on_cuda_the_device_is_probed_idle_before_the_first_timed_round(tmp_path):
    """A block of no calls (the baseline child's quiet wait alone) before round 0 on CUDA: what
    another child left running is not timed into this candidate's rounds. Not on the CPU backend."""
    for device, first in (("cuda", [0, 10, 10]), ("cpu", [10, 10])):
        s, pacer = _paced(tmp_path, 0.5, 10, eager=1.0, device=device)
        assert pacer.baselines.servers["eager"].blocks[:len(first)] == first, (device, pacer.baselines.servers["eager"].blocks)
        assert pacer.decision(s)["reward"] == 2
