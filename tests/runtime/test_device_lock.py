"""One folder for the device locks, asked for in one place (`opsynth.runtime.device_lock`) by the
verifier's pool and the reward environment: with a non-default folder, one GPU still has one lock."""

from __future__ import annotations

import os

from opsynth.runtime import device_lock
from opsynth.runtime.device_lock import LOCK_DIR_ENV, device_lock_path, resolve_lock_dir


def test_the_folder_is_the_setting_else_the_temp_folder(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.delenv(LOCK_DIR_ENV, raising=False)
    assert resolve_lock_dir() == tempfile.gettempdir()
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    assert resolve_lock_dir() == str(tmp_path)
    assert resolve_lock_dir("/elsewhere") == "/elsewhere"  # an explicit folder (tests, a pool handing it on)


def test_verifier_and_reward_lock_the_same_file_in_a_non_default_folder(tmp_path, monkeypatch):
    from opsynth.reward.eval_types import device_lock_file
    from opsynth.reward.eval_types import RewardConfig
    from opsynth.verify import VerifyConfig, WorkerPool

    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    pool = WorkerPool(VerifyConfig(device="cpu", n_workers=1))
    env = pool._env(0)  # what the pool's workers are started with
    assert env[LOCK_DIR_ENV] == str(tmp_path)
    for device in ("cpu", "cuda"):
        verifier = device_lock_path(device, 0, env[LOCK_DIR_ENV], env)
        reward = device_lock_file(RewardConfig(device="cpu", device_index=0), device)
        assert verifier == reward and os.path.dirname(reward) == str(tmp_path), (verifier, reward)


def test_the_childs_lock_function_is_bound_where_the_harness_snapshot_sees_it():
    """`child.device_lock` takes the flock from its defaults (watched by the reward's harness
    snapshot), not from a module global a candidate could rebind unseen."""
    from opsynth.runtime import child

    assert child.device_lock.__defaults__ == (device_lock.timing_section,)
    assert child.device_checks.__defaults__ == (device_lock.checks_share,)


# --- the memory lock: one verifier request can have the GPU to itself (its out-of-memory retry) -----

def _hold(path: str, kind, hold_s: float, log: str, name: str, ready=None) -> None:
    """Hold the device lock of `kind` (True/False: the memory lock whole/shared; "checks", "timing",
    "timing_lock_only") for hold_s, logging when it got in and out."""
    import time

    from opsynth.runtime.device_lock import checks_share, device_share, file_lock, timing_section

    cm = ({"checks": checks_share, "timing": timing_section, "timing_lock_only": file_lock}[kind](path)
          if isinstance(kind, str) else device_share(path, kind))
    with cm:
        with open(log, "a") as f:
            f.write(f"{name} in {time.monotonic():.4f}\n")
        if ready is not None:
            ready.set()
        time.sleep(hold_s)
        with open(log, "a") as f:
            f.write(f"{name} out {time.monotonic():.4f}\n")


def _spans(log) -> dict[str, tuple[float, float]]:
    spans: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        name, what, t = line.split()
        spans.setdefault(name, [0.0, 0.0])[0 if what == "in" else 1] = float(t)
    return {k: (a, b) for k, (a, b) in spans.items()}


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_sharers_overlap_and_an_exclusive_holder_runs_alone_before_later_sharers(tmp_path):
    """Two sharers run together; an exclusive request waits for them and then runs alone; a sharer
    arriving while it waits does not overtake it (flock alone would let a stream of sharers starve it)."""
    import multiprocessing as mp
    import time

    ctx = mp.get_context("spawn")
    path, log = str(tmp_path / "cuda0.lock"), tmp_path / "log"
    ready = [ctx.Event(), ctx.Event()]
    first = [ctx.Process(target=_hold, args=(path, False, 1.0, str(log), f"s{i}", ready[i])) for i in range(2)]
    for p in first:
        p.start()
    for r in ready:
        assert r.wait(60)
    whole = ctx.Process(target=_hold, args=(path, True, 0.5, str(log), "x"))
    whole.start()
    time.sleep(0.3)  # the exclusive one is waiting at the share lock, holding the gate
    late = ctx.Process(target=_hold, args=(path, False, 0.1, str(log), "late"))
    late.start()
    for p in [*first, whole, late]:
        p.join(60)
        assert p.exitcode == 0
    spans = _spans(log)
    assert _overlap(spans["s0"], spans["s1"]), spans  # ordinary requests share the device
    for other in ("s0", "s1", "late"):
        assert not _overlap(spans["x"], spans[other]), (other, spans)
    assert spans["late"][0] >= spans["x"][1], spans  # the exclusive request was not starved


def test_without_the_gate_a_late_sharer_overtakes_the_waiting_exclusive_holder(tmp_path, monkeypatch):
    """The control: with the share lock alone (no gate), a sharer that arrives while the exclusive
    request waits gets in first, which is how a steady stream of sharers starves it."""
    import fcntl
    import multiprocessing as mp
    import time

    ctx = mp.get_context("spawn")
    share = str(tmp_path / "share")
    fd = os.open(share, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a sharer inside
    order = tmp_path / "order"
    whole = ctx.Process(target=_flock_and_log, args=(share, fcntl.LOCK_EX, str(order), "x"))
    whole.start()
    time.sleep(0.3)
    late = ctx.Process(target=_flock_and_log, args=(share, fcntl.LOCK_SH, str(order), "late"))
    late.start()
    late.join(30)
    assert order.read_text().split() == ["late"]  # it got in while the exclusive request still waits
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    whole.join(30)
    assert order.read_text().split() == ["late", "x"]


def _flock_and_log(path: str, op: int, log: str, name: str) -> None:
    import fcntl

    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, op)
    with open(log, "a") as f:
        f.write(name + "\n")
    fcntl.flock(fd, fcntl.LOCK_UN)


# --- checks share the device, timing has it to itself ---------------------------------------------

def _checks_then(tmp_path, timer_kind: str) -> dict:
    """Two checkers hold the device for 1 s; a timer of `timer_kind` arrives while they do, and a
    third checker arrives while the timer waits or runs. The spans of all four."""
    import multiprocessing as mp
    import time

    ctx = mp.get_context("spawn")
    path, log = str(tmp_path / "cuda0.lock"), tmp_path / f"log_{timer_kind}"
    device_lock.create_lock_files(path)
    ready = [ctx.Event(), ctx.Event()]
    first = [ctx.Process(target=_hold, args=(path, "checks", 1.0, str(log), f"c{i}", ready[i])) for i in range(2)]
    for p in first:
        p.start()
    for r in ready:
        assert r.wait(60)
    timer = ctx.Process(target=_hold, args=(path, timer_kind, 0.5, str(log), "t"))
    timer.start()
    time.sleep(0.3)
    late = ctx.Process(target=_hold, args=(path, "checks", 0.1, str(log), "late"))
    late.start()
    for p in [*first, timer, late]:
        p.join(60)
        assert p.exitcode == 0
    return _spans(log)


def test_a_timing_section_runs_alone_and_checks_share_the_device(tmp_path):
    """The reward's timed rounds (`timing_section`) wait for the checks in progress and no check
    starts beside them; checks run together. Control: the timing lock alone (what the reward's
    children held before, and the verifier's timing still holds) runs beside the checks."""
    spans = _checks_then(tmp_path, "timing")
    assert _overlap(spans["c0"], spans["c1"]), spans
    for other in ("c0", "c1", "late"):
        assert not _overlap(spans["t"], spans[other]), (other, spans)
    control = _checks_then(tmp_path, "timing_lock_only")
    assert _overlap(control["t"], control["c0"]) or _overlap(control["t"], control["late"]), control


def _ask_and_hold(path: str, kind: str, hold_s: float, log: str, name: str, asking) -> None:
    """`_hold`, saying just before it asks for the lock (so a test can order the arrivals)."""
    asking.set()
    _hold(path, kind, hold_s, log, name)


def test_timings_queued_while_checks_drain_run_back_to_back_before_later_checks(tmp_path):
    """Timings are a phase: a checker holds the device; one timing asks, then a checker, then a second
    timing. Both timings run (alone, one after the other) before the late checker enters, which
    waited since before the second timing asked. Control (run by hand with `exclusive_first=False`:
    failed 7 of 7): without the queue the late checker wins the gate when the first timing ends, and
    the second timing waits for its whole checks (`benchmarks/lock_phases.py` measures the cost)."""
    import multiprocessing as mp
    import time

    ctx = mp.get_context("spawn")
    path, log = str(tmp_path / "cuda0.lock"), tmp_path / "log"
    device_lock.create_lock_files(path)
    ready = ctx.Event()
    procs = [ctx.Process(target=_hold, args=(path, "checks", 3.0, str(log), "c0", ready))]
    procs[0].start()
    assert ready.wait(60)
    for name, kind, hold in (("t1", "timing", 0.4), ("late", "checks", 0.1), ("t2", "timing", 0.4)):
        asking = ctx.Event()
        procs.append(ctx.Process(target=_ask_and_hold, args=(path, kind, hold, str(log), name, asking)))
        procs[-1].start()
        assert asking.wait(60)
        time.sleep(0.2)  # it is waiting for the lock now (the arrivals are in this order)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    spans = _spans(log)
    assert spans["t1"][0] >= spans["c0"][1], spans  # every arrival came while c0 held the device
    for a, b in (("t1", "t2"), ("t1", "c0"), ("t2", "c0"), ("t1", "late"), ("t2", "late")):
        assert not _overlap(spans[a], spans[b]), (a, b, spans)
    assert spans["late"][0] >= max(spans["t1"][1], spans["t2"][1]), spans


# --- the verifier's timing inside a request's memory share (HeldShare) ------------------------------

def _share_then_time(path: str, log: str, quiet: bool, got_share) -> None:
    """A verifier request: its memory share (HeldShare), then a timed call inside it, quiet (the
    share let go for a timing section) or not (the timing lock only, as before); logs the timing."""
    import time

    from opsynth.runtime.device_lock import HeldShare, file_lock

    with HeldShare(path) as share:
        got_share.set()
        time.sleep(0.2)
        with (share.timing() if quiet else file_lock(path)):
            with open(log, "a") as f:
                f.write(f"t in {time.monotonic():.4f}\n")
            time.sleep(0.5)
            with open(log, "a") as f:
                f.write(f"t out {time.monotonic():.4f}\n")
        assert share.held  # the share is taken again for the rest of the request
        with open(log, "a") as f:
            f.write(f"after in {time.monotonic():.4f}\nafter out {time.monotonic():.4f}\n")


def _request_beside_checks(tmp_path, quiet: bool) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    path, log = str(tmp_path / "cuda0.lock"), tmp_path / f"log_{quiet}"
    device_lock.create_lock_files(path)
    ready, got = ctx.Event(), ctx.Event()
    checker = ctx.Process(target=_hold, args=(path, "checks", 1.2, str(log), "c", ready))
    checker.start()
    assert ready.wait(60)
    request = ctx.Process(target=_share_then_time, args=(path, str(log), quiet, got))
    request.start()
    assert got.wait(60)  # the request shares the device with the checker
    for p in (checker, request):
        p.join(60)
        assert p.exitcode == 0
    return _spans(log)


def test_a_verifier_request_times_alone_although_it_holds_a_share(tmp_path):
    """flock cannot upgrade a shared lock, so a request holding its memory share lets it go, times
    in a timing section (after the other worker's checks), and takes the share again. Control: the
    timing lock alone inside the share (the verifier before) times beside the checks."""
    spans = _request_beside_checks(tmp_path, quiet=True)
    assert not _overlap(spans["t"], spans["c"]), spans
    assert spans["after"][0] >= spans["t"][1]
    control = _request_beside_checks(tmp_path, quiet=False)
    assert _overlap(control["t"], control["c"]), control


def _share_and_release(path: str, log: str, got_share, released) -> None:
    """A compile request: its share, then the compile call with the share let go (HeldShare.released)."""
    import time

    from opsynth.runtime.device_lock import HeldShare

    with HeldShare(path) as share:
        got_share.set()
        with share.released():
            assert not share.held
            released.set()
            with open(log, "a") as f:
                f.write(f"r in {time.monotonic():.4f}\n")
            time.sleep(1.0)
            with open(log, "a") as f:
                f.write(f"r out {time.monotonic():.4f}\n")
        assert share.held


def test_a_timing_section_does_not_wait_for_a_share_let_go_for_a_compile(tmp_path):
    """While a request's share is released (the verifier's torch.compile call), a timing section
    gets in; control: the same request holding its share makes the timing wait for it."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    path, log, control_log = str(tmp_path / "cuda0.lock"), tmp_path / "log", tmp_path / "control"
    device_lock.create_lock_files(path)

    def timed_beside(first, ready, log) -> dict:
        """Start `first`, and a 0.2 s timing section once `ready` is set; both spans."""
        first.start()
        assert ready.wait(60)
        timer = ctx.Process(target=_hold, args=(path, "timing", 0.2, str(log), "t"))
        timer.start()
        for p in (first, timer):
            p.join(60)
            assert p.exitcode == 0
        return _spans(log)

    got, released = ctx.Event(), ctx.Event()
    spans = timed_beside(ctx.Process(target=_share_and_release, args=(path, str(log), got, released)), released, log)
    assert _overlap(spans["t"], spans["r"]), spans
    ready = ctx.Event()  # a share kept
    control = timed_beside(ctx.Process(target=_hold, args=(path, False, 1.0, str(control_log), "r", ready)), ready,
                           control_log)
    assert not _overlap(control["t"], control["r"]), control


def _compile_request(path: str, log: str, armed: bool, in_codegen, codegen_s: float = 1.5, run_s: float = 1.0) -> None:
    """A verifier compile request: its share, then a torch.compile'd first call whose backend
    "generates code" for codegen_s (logged "g") and whose graph "runs on the device" for run_s
    (logged "x"), with the share let go by `CompileAside` while armed."""
    import time

    import torch

    from opsynth.runtime.device_lock import HeldShare
    from opsynth.verify.compile_aside import CompileAside

    def log_span(name, secs, held):
        with open(log, "a") as f:
            f.write(f"{name} in {time.monotonic():.4f}\n")
        held.append(share.held)
        if name == "g":
            in_codegen.set()
        time.sleep(secs)
        with open(log, "a") as f:
            f.write(f"{name} out {time.monotonic():.4f}\n")

    held_codegen: list = []
    held_run: list = []

    def backend(gm, example_inputs):
        log_span("g", codegen_s, held_codegen)

        def run(*args):
            log_span("x", run_s, held_run)
            return gm(*args)

        return run

    torch._dynamo.reset()  # clears Dynamo's callbacks: the verifier resets, then arms (install)
    aside = CompileAside()
    assert aside.install()
    f = torch.compile(lambda x: x * 2 + 1, backend=backend)
    with HeldShare(path) as share:
        with (aside.armed(share) if armed else _null()):
            f(torch.ones(4))
        assert share.held
    assert held_run == [True], held_run  # the graph's launches always run under the share
    assert held_codegen == [not armed], held_codegen
    assert aside.let_go_count == (1 if armed else 0)


def _null():
    from contextlib import nullcontext

    return nullcontext()


def _timing_during_codegen(tmp_path, armed: bool) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    path, log = str(tmp_path / f"cuda0-{armed}.lock"), tmp_path / f"log-{armed}"
    device_lock.create_lock_files(path)
    in_codegen = ctx.Event()
    request = ctx.Process(target=_compile_request, args=(path, str(log), armed, in_codegen))
    request.start()
    assert in_codegen.wait(120)
    timer = ctx.Process(target=_hold, args=(path, "timing", 0.3, str(log), "t"))
    timer.start()
    for p in (request, timer):
        p.join(120)
        assert p.exitcode == 0
    return _spans(log)


def test_a_compile_lets_its_share_go_for_code_generation_only(tmp_path):
    """Armed, a compile request's share is let go while Dynamo's backend generates code, so a timing
    section gets in then, and held while the compiled graph runs, so no launch of it lands beside
    the timing. Control: unarmed, the timing waits for the whole compile and run."""
    spans = _timing_during_codegen(tmp_path, armed=True)
    assert _overlap(spans["t"], spans["g"]), spans  # the timing did not wait for code generation
    assert not _overlap(spans["t"], spans["x"]), spans  # nor did the graph run beside it
    control = _timing_during_codegen(tmp_path, armed=False)
    assert not _overlap(control["t"], control["g"]) and not _overlap(control["t"], control["x"]), control
    assert control["t"][0] >= control["x"][1], control
