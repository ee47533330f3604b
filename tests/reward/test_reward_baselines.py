"""Baselines that hold and decisions with a stated confidence (issue 28), on the CPU backend.

Units first (no children): the ratio's interval and the decision, the cache's re-validation, and the
pacer that interleaves baseline blocks with a candidate's rounds (fake baseline children). Then end
to end, sharing one module cache whose extension is built once: the same candidate in two fresh
baseline caches, one of them while another candidate builds (the build is stopped whenever anything
is timed); a poisoned cache entry replaced by re-validation, with the control that the entry used as
stored gives the wrong reward.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from opsynth.reward import RewardConfig, baseline_cache, evaluate, quiet
from opsynth.reward.baselines import Pacer, revalidate
from opsynth.reward.confidence import ABOVE, BELOW, UNCLEAR, decide, open_thresholds, ratio_interval, side
from opsynth.reward.rounds import RoundSession, TimingPlan
from fake_baselines import FakeBaselines, FakeServer  # noqa: E402 - tests/reward, on sys.path (conftest)

CANDS = Path(__file__).parent / "candidates"
PRELUDE = (CANDS / "cpu" / "ext_prelude.py").read_text()
CHAIN = (CANDS / "tasks" / "chain.py").read_text()


def _noisy(ms: float, n: int, seed: int, sd: float = 0.03) -> list[float]:
    rng = random.Random(seed)
    return [ms * rng.lognormvariate(0.0, sd) for _ in range(n)]


# ---- the interval and the decision ---------------------------------------------------------------


def test_the_interval_clears_a_threshold_only_when_it_lies_on_one_side():
    base = _noisy(1.0, 30, 1)
    fast, slow, at = (ratio_interval(_noisy(r, 20, 2), base) for r in (0.8, 1.2, 0.95))
    assert fast.lo <= fast.ratio <= fast.hi and 0.75 < fast.ratio < 0.85
    assert side(fast, 0.95) == BELOW and side(slow, 0.95) == ABOVE and side(at, 0.95) == UNCLEAR
    assert side(slow, 1.0) == ABOVE and side(at, 1.0) == BELOW  # 0.95 is clear of eager itself
    assert ratio_interval(_noisy(0.8, 20, 2), base) == fast  # a fixed seed: the same times, the same interval
    assert ratio_interval([], base) is None and side(None, 0.95) == UNCLEAR
    one = ratio_interval([0.5], base)
    assert (one.lo, one.hi) == (0.0, float("inf"))  # no spread to resample: clears nothing


def test_the_decision_follows_the_rule_and_names_what_is_undecided():
    base, comp = _noisy(1.0, 30, 3), _noisy(0.6, 30, 4)
    iv = lambda r, b: ratio_interval(_noisy(r, 20, 5), b)  # noqa: E731
    assert decide(iv(0.5, base), iv(0.5, comp), 0.95, True)["reward"] == 3  # 0.5 x eager, 0.83 x compile
    d = decide(iv(0.57, base), iv(0.57, comp), 0.95, True, capped=True)  # at 0.95 x compile: across it
    assert d["reward"] == 2 and d["undecided"] == ["compile x0.95"] and d["near_threshold"] and d["capped"]
    d = decide(iv(0.95, base), None, 0.95, True, capped=True)  # at the eager threshold, cap reached
    assert d["reward"] == 1 and "eager x0.95" in d["undecided"] and d["near_threshold"]
    assert d["eager"]["side"] == UNCLEAR and "not counted as faster" in d["note"]
    d = decide(iv(1.0, base), None, 0.95, True)  # at eager itself: told, but it decides no reward
    assert d["reward"] == 1 and d["eager"]["side_vs_1"] == UNCLEAR and not d["near_threshold"]
    assert decide(iv(1.2, base), None, 0.95, True)["undecided"] == []
    assert open_thresholds(iv(1.2, base), None, 0.95, True) == []  # compile is asked for only once eager is beaten


def test_revalidation_replaces_only_an_entry_outside_the_fresh_noise():
    fresh = {"eager": _noisy(1.0, 30, 6, sd=0.1), "compile": []}
    for cached, expect in ((1.3, "agrees"), (0.6, "agrees"), (100.0, "replaced"), (0.01, "replaced"), (None, "stored")):
        entry, status = revalidate({"eager_ms": cached, "compile_ms": 0.5}, fresh, drift=2.0)
        assert status["eager"] == expect, (cached, status)
        if expect == "agrees":
            assert entry == {"eager_ms": cached, "compile_ms": 0.5}
        else:
            assert 0.9 < entry["eager_ms"] < 1.1
    _, status = revalidate({"eager_ms": 100.0, "compile_ms": 50.0}, fresh, drift=2.0)
    assert status["compile"] == "dropped"  # timed with the same bad entry, and not re-measured now


# ---- the pacer between a candidate's rounds (fake baseline children) ---------------------------------


def _session(tmp_path, cand_ms: float, compile_baseline: bool = False, **ms):
    cfg = RewardConfig(device="cpu", timing_block=5, compile_baseline=compile_baseline)
    plan = TimingPlan.draw(2, 10, 1e-2, 1e-2, extra=20)
    bl = FakeBaselines(**ms)
    pacer = Pacer(bl, cfg, "cpu", str(tmp_path / "device.lock"), plan.warmup, plan.main + plan.extra)
    s = RoundSession(plan, pacer=pacer)
    rng = random.Random(7)
    assert s.handle({"kind": "timing_lock"})["ok"]
    first, count = 0, plan.main
    while count:
        for j in range(first, first + count):
            for kind, extra in (("round_start", {}), ("round_ready", {}),
                                ("round_returned", {"ms": cand_ms * rng.lognormvariate(0.0, 0.03)}),
                                ("round_done", {"fp": [], "key": "k"})):
                if kind == "round_start" and s.step != kind:
                    continue  # only a pass's first round asks for its seed
                assert s.handle({"kind": kind, "j": j, **extra})["ok"], s.error
        first += count
        count = s.handle({"kind": "timing_done"})["again"]
    s.handle({"kind": "timing_unlock"})
    return s, pacer, bl


def test_the_pacer_interleaves_blocks_and_stops_once_the_ratio_is_clear(tmp_path):
    s, pacer, bl = _session(tmp_path, 0.8, eager=1.0)
    assert s.done and s.main_end == s.plan.main  # clear after the main pass: no more rounds
    eager = bl.servers["eager"]
    assert eager.blocks == [2, 5, 5, 5]  # its warm-up, then one block before, between and after the two candidate blocks
    d = pacer.decision(s)
    assert d["reward"] == 2 and d["undecided"] == [] and d["timed_calls"] == {"candidate": 10, "eager": 15}
    assert bl.started.count("compile") == 0


def test_near_a_threshold_the_pacer_takes_blocks_up_to_the_cap_and_says_so(tmp_path):
    s, pacer, _ = _session(tmp_path, 0.95, eager=1.0)
    assert s.main_end == s.plan.main + s.plan.extra and pacer.capped  # 30 timed calls: the cap
    d = pacer.decision(s)
    assert d["reward"] == 1 and "eager x0.95" in d["undecided"] and d["near_threshold"] and d["capped"]
    assert d["timed_calls"]["candidate"] == 30


def test_compile_joins_once_eager_is_beaten_and_decides_reward_3(tmp_path):
    s, pacer, bl = _session(tmp_path, 0.3, compile_baseline=True, eager=1.0, compile=0.5)
    d = pacer.decision(s)
    assert d["reward"] == 3 and d["compile"]["n_candidate"] >= 5 and d["compile"]["side"] == BELOW
    assert bl.servers["compile"].blocks[:2] == [2, 5]  # warmed up, then a block before the candidate's next
    s, pacer, _ = _session(tmp_path, 0.48, compile_baseline=True, eager=1.0, compile=0.5)
    d = pacer.decision(s)
    assert d["reward"] == 2 and d["undecided"] == ["compile x0.95"] and pacer.capped


@pytest.mark.parametrize("compiled", [True, False])
def test_a_compiled_baseline_joins_without_letting_the_device_go(tmp_path, monkeypatch, compiled):
    """Letting the lock go to wait for a compile child that is ready already queued the candidate
    behind every other one waiting for the device (3-7 s on the H200). Not compiled yet, the lock is
    let go while it compiles (the control: the same session takes the lock twice)."""
    takes = []
    real = Pacer._take_lock
    monkeypatch.setattr(Pacer, "_take_lock", lambda self: (takes.append(1), real(self))[1])
    monkeypatch.setattr(FakeServer, "ready", compiled)
    s, pacer, bl = _session(tmp_path, 0.3, compile_baseline=True, eager=1.0, compile=0.5)
    assert pacer.decision(s)["reward"] == 3 and "compile" in pacer.active
    assert len(takes) == (1 if compiled else 2), takes


def test_rounds_outside_the_timing_lock_are_refused(tmp_path):
    """Baseline blocks run only while the parent holds the device for the candidate: rounds before
    the lock, or a pass ended after the child let it go, end its timing (`timing_protocol`)."""
    cfg = RewardConfig(device="cpu")
    plan = TimingPlan.draw(1, 4, 1e-2, 1e-2)
    s = RoundSession(plan, pacer=Pacer(FakeBaselines(eager=1.0), cfg, "cpu", str(tmp_path / "l"), 1, plan.main))
    assert not s.handle({"kind": "round_start", "j": 0})["ok"] and "timing lock" in s.error
    s = RoundSession(plan, pacer=Pacer(FakeBaselines(eager=1.0), cfg, "cpu", str(tmp_path / "l"), 1, plan.main))
    s.handle({"kind": "timing_lock"})
    for j in range(plan.main):
        for kind, extra in (("round_start", {}), ("round_ready", {}), ("round_returned", {"ms": 0.5}), ("round_done", {"fp": [], "key": "k"})):
            if kind == "round_start" and s.step != kind:
                continue
            assert s.handle({"kind": kind, "j": j, **extra})["ok"]
    s.handle({"kind": "timing_unlock"})
    assert not s.handle({"kind": "timing_done"})["ok"] and "let go" in s.error


# ---- the baseline child's call (in this process: no child) --------------------------------------


def _baseline_job(tmp_path: Path, task: str) -> dict:
    from opsynth.render.task_file import task_kind

    (tmp_path / "task.py").write_text(task)
    kind = task_kind(task)
    return {"task_path": str(tmp_path / "task.py"), "device": "cpu", "init_seed": 7, "trial_seeds": [11, 12],
            "task_mode": "eval", "task_kind": {"dtype": kind.dtype, "task_pass": kind.task_pass}}


def test_a_backward_tasks_baseline_times_forward_and_gradients(tmp_path):
    """The baseline child times the call the task's kind defines (`task_call`, as the reference and
    the candidate): for a backward task the forward and its gradients, on arguments that carry the
    grad_output after the inputs. Control: the same Model as a forward task times the forward alone."""
    import torch

    from opsynth.reward import baseline_runner

    task = (CANDS / "kinds" / "scale_relu_backward.py").read_text()
    model, call, step, buffers, stacked = baseline_runner._model_and_inputs(_baseline_job(tmp_path, task))
    assert len(buffers) == 2 and len(stacked) == 2  # x, then the grad_output of the one output
    with torch.no_grad():  # as the child times it: the step turns gradients on itself
        out = call(*buffers)
    x, g = buffers
    w = model.weight.detach()
    mask = (x * w > 0).to(x.dtype)
    assert len(out) == 3  # the output, x's gradient, the weight's gradient
    torch.testing.assert_close(out[0], torch.relu(x * w))
    torch.testing.assert_close(out[1], g * mask * w)
    torch.testing.assert_close(out[2], (g * mask * x).sum(0))
    assert not isinstance(baseline_runner._compiled(model, step), torch.nn.Module)  # compiled Model inside the step

    forward = task.replace('task_pass = "backward"\n', "")
    model, call, step, buffers, _ = baseline_runner._model_and_inputs(_baseline_job(tmp_path, forward))
    assert call is model and len(buffers) == 1
    with torch.no_grad():
        assert isinstance(call(*buffers), torch.Tensor)


# ---- end to end -----------------------------------------------------------------------------------


def _cfg(cache, **kw) -> RewardConfig:
    base = dict(device="cpu", cache_dir=str(cache), compile_baseline=False, static_check=False, warmup=5, repeats=21,
                cpu_threads=1, prebuild=False)
    base.update(kw)
    return RewardConfig(**base)


def _candidate(name: str, prelude: str = PRELUDE) -> str:
    return prelude + "\n" + (CANDS / "cpu" / f"{name}.py").read_text()


@pytest.fixture(scope="module")
def cache_a(tmp_path_factory):
    """A cache whose extension is built, and the fast candidate's result in it (its first evaluation)."""
    cache = tmp_path_factory.mktemp("baselines_a")
    return cache, evaluate(CHAIN, _candidate("fast"), _cfg(cache))


def _fresh_copy(cache: Path, dest: Path) -> Path:
    """A cache with the built extensions (no build to wait for) and no baselines: a fresh baseline cache."""
    for d in ("ext", "ccache", "bin"):
        if (cache / d).is_dir():
            shutil.copytree(cache / d, dest / d, symlinks=True)
    return dest


@pytest.mark.alone  # times cache_a's eager baseline, which the next two tests compare with later timings
@pytest.mark.slow
def test_the_result_carries_the_ratio_and_its_interval(cache_a):
    _, r = cache_a
    assert r.reason == "ok" and r.reward == 2, r.log[-3000:]
    t, d = r.times, r.details["decision"]
    assert t["eager_ratio_lo"] <= t["eager_ratio"] <= t["eager_ratio_hi"] < 0.95
    assert d["eager"]["side"] == BELOW and d["undecided"] == [] and d["timed_calls"]["eager"] >= 15
    assert abs(t["eager_ratio"] - t["candidate_ms"] / t["eager_ms"]) < 1e-3  # the ratio of the two medians
    assert r.details["baseline"]["eager"] == "stored"


@pytest.mark.alone  # two caches' eager baselines timed minutes apart must agree (see the docstring)
@pytest.mark.slow
def test_two_fresh_caches_one_beside_another_build_agree(cache_a, tmp_path, monkeypatch):
    """The issue's failure: baselines timed while the shared PCH and a candidate's extension built read
    100x high, and the same candidate scored 2 in one cache and 3 in the other. Here cache B evaluates
    the same candidate while another candidate builds its own extension with flags that have no PCH
    yet (so the PCH builds too): every build is stopped while anything is timed, the reward is the
    same and the two caches' eager baselines agree within 2x. Why 2x and not the issue's 10 % (the
    H200's check): this shared 2-core machine drifts between minutes (the same eager block read
    1.38-1.85 ms in five runs within ten minutes, and 0.88 vs 1.33 ms once beside two other
    processes' test runs); the failure being guarded against was 100x."""
    cache, first = cache_a
    b = _fresh_copy(cache, tmp_path / "cache_b")
    other_prelude = PRELUDE.replace('extra_cflags=["-O3"]', 'extra_cflags=["-O2"]')  # no PCH and no library for -O2 yet
    seen: list[dict] = []
    real_window = quiet.window

    def spying_window():
        win = real_window()

        class Spy:
            def __enter__(self):
                win.__enter__()
                import psutil

                states = {}
                for pid, what in quiet.registered().items():
                    try:
                        states[pid] = (what, psutil.Process(pid).status())
                    except psutil.Error:
                        pass
                seen.append(states)

            def __exit__(self, *exc):
                return win.__exit__(*exc)

        return Spy()

    monkeypatch.setattr(quiet, "window", spying_window)
    other: dict = {}
    builder = threading.Thread(target=lambda: other.setdefault("r", evaluate(CHAIN, _candidate("fast", other_prelude), _cfg(b))))
    builder.start()
    deadline = time.time() + 300
    while "build" not in quiet.registered().values() and time.time() < deadline and builder.is_alive():
        time.sleep(0.2)
    assert "build" in quiet.registered().values(), "the other candidate's build never started"
    second = evaluate(CHAIN, _candidate("fast"), _cfg(b))
    builder.join(timeout=900)
    assert second.reason == "ok" and second.reward == first.reward == 2, second.log[-3000:]
    builds_seen = [st for states in seen for st in states.values() if st[0] in ("build", "pch")]
    assert builds_seen, "no build was running during the timed windows: the test did not test it"
    # Stopped, or already exited and not yet reaped (a zombie runs nothing): what stop_tree waits for.
    assert all(st[1] in ("stopped", "zombie", "dead") for st in builds_seen), builds_seen
    ea, eb = (baseline_cache.lookup(_cfg(c), CHAIN, "cpu")["eager_ms"] for c in (cache, b))
    assert 1 / 2 < ea / eb < 2, (ea, eb)
    assert other["r"].reason == "ok", other["r"].log[-3000:]


@pytest.mark.alone  # the re-validated baseline against cache_a's, timed minutes apart
@pytest.mark.slow
def test_a_poisoned_cache_entry_is_replaced_and_the_reward_is_the_clean_one(cache_a, tmp_path):
    """A correct candidate about twice as slow as eager scores 1. Its baselines multiplied by 100 in
    the cache, through the cache's own signed API: re-validation sees the entry outside the fresh
    samples' noise, replaces it and the reward is still 1. Control: with the entry used as stored
    (`baselines="cached"`) the same poisoned cache scores it 2."""
    cache, _ = cache_a
    clean = evaluate(CHAIN, _candidate("slow_chain"), _cfg(cache))
    assert clean.reason == "ok" and clean.reward == 1, (clean.times, clean.log[-3000:])
    assert clean.details["baseline"]["eager"] == "agrees"
    poisoned = _fresh_copy(cache, tmp_path / "poisoned")
    good = baseline_cache.lookup(_cfg(cache), CHAIN, "cpu")["eager_ms"]
    baseline_cache.store(_cfg(poisoned), CHAIN, "cpu", good * 100, None)
    assert baseline_cache.lookup(_cfg(poisoned), CHAIN, "cpu")["eager_ms"] == good * 100  # it verifies: signed
    control = evaluate(CHAIN, _candidate("slow_chain"), _cfg(poisoned, baselines="cached"))
    assert control.reward == 2 and control.details["baseline"]["mode"] == "cached", control.times  # the wrong reward
    checked = evaluate(CHAIN, _candidate("slow_chain"), _cfg(poisoned))
    assert checked.reward == clean.reward == 1, checked.times
    assert checked.details["baseline"]["eager"] == "replaced"
    now = baseline_cache.lookup(_cfg(poisoned), CHAIN, "cpu")["eager_ms"]
    assert 1 / 2 < now / good < 2, (now, good)


def test_the_ratio_and_its_interval_reach_the_training_metrics():
    from opsynth.reward.eval_types import EvalResult
    from opsynth.train.records import record_from_result
    from opsynth.train.reward_fn import log_record_metrics

    base = _noisy(1.0, 30, 8)
    d = decide(ratio_interval(_noisy(0.95, 30, 9), base), None, 0.95, False, capped=True)
    times = {"candidate_ms": 0.95, "eager_ms": 1.0, "eager_ratio": d["eager"]["ratio"],
             "eager_ratio_lo": d["eager"]["lo"], "eager_ratio_hi": d["eager"]["hi"]}
    rec = record_from_result(EvalResult(reward=1, correct=True, reason="ok", times=times, details={"decision": d}))
    assert rec.eager_ratio_lo < rec.eager_ratio < rec.eager_ratio_hi and rec.near_threshold is True
    logged: dict = {}
    log_record_metrics([rec], lambda k, v: logged.setdefault(k, v))
    assert logged["kernel/near_threshold"] == 1.0 and 0 < logged["kernel/eager_ratio_log_width"] < 0.5


def test_the_pacer_holds_the_device_shared_for_checks_and_whole_for_timing(tmp_path):
    """The child's checked calls run under the checks' share (another process's checks may run, a
    timing may not); its timed rounds have the device to itself; nothing stays held after unlock."""
    import fcntl
    import os

    from opsynth.runtime.device_lock import create_lock_files, share_lock_paths

    path = str(tmp_path / "device.lock")
    create_lock_files(path)
    share_file = share_lock_paths(path)[1]

    def free(op: int) -> bool:  # can another holder take the memory lock now (shared or whole)?
        fd = os.open(share_file, os.O_RDWR)
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    pacer = Pacer(None, RewardConfig(device="cpu"), "cpu", path, 1, 5)
    assert pacer.share() is None and pacer.shared
    assert free(fcntl.LOCK_SH) and not free(fcntl.LOCK_EX)  # other checks yes, a timing no
    assert pacer.lock() is None and pacer.locked and not pacer.shared
    assert not free(fcntl.LOCK_SH)  # no checks beside the timed rounds
    assert pacer.share() is not None  # the share after the lock: refused
    pacer.unlock()
    assert free(fcntl.LOCK_EX)
    pacer = Pacer(None, RewardConfig(device="cpu"), "cpu", path, 1, 5)
    pacer.share()
    pacer.close()  # a child killed during its checks
    assert free(fcntl.LOCK_EX)


def test_the_timing_lock_cannot_be_asked_for_twice_nor_kept_after_close(tmp_path):
    """A child asking twice would block the parent's channel on its own lock; a lock taken after the
    child was killed must not stay held (every later timing would wait on it)."""
    import fcntl
    import os

    cfg = RewardConfig(device="cpu")
    path = str(tmp_path / "device.lock")
    pacer = Pacer(None, cfg, "cpu", path, 1, 5)
    assert pacer.lock() is None and pacer.locked
    assert pacer.lock() == "the timing lock was asked for twice"
    pacer.close()
    pacer._take_lock()  # the wait ended after close
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free
    os.close(fd)
