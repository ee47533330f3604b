"""Baselines that hold: eager and torch.compile timed beside the candidate, in the same quiet seconds.

Why: a baseline timed once and cached is only as good as the minute it was timed in. Timed while
the shared PCH and a candidate's extension were building, the chain task's cached eager baseline
read 75 ms against 0.67 ms, and the same candidate scored 2 in one cache and 3 in another.

How, for each correct candidate (`Pacer`, driven by the candidate's `rounds.RoundSession`):

- the parent holds the device lock for the candidate's timed section (the child asks for it over
  its channel and cannot release it), and opens a quiet window (`quiet`): builds, the PCH compiler
  and idle baseline children are stopped until the section ends;
- the candidate's timed rounds come in blocks; before the first, between each two and after the
  last, the candidate is stopped and the task's baseline child times a block of the same number of
  calls (`baseline_runner`: fresh inputs per call, the same timer). Blocks alternate, so drift
  moves both samples alike; `confidence` turns them into the ratio and its interval;
- once `min_timed_calls` timed calls ran, at each block boundary of the main pass, the pacer ends
  the pass when the rest could not change the verdict (`ends_main_pass`: every threshold clear of
  the ratio's interval by `confidence.EARLY_MARGIN`, or an output already wrong);
- while a threshold that decides the reward is not cleared, the pacer asks the candidate for one
  more block (up to `max_timed_calls`); when eager is beaten, a compile baseline child joins (the
  task's one torch.compile in the batch, run with the device lock released and the candidate
  stopped) and its blocks interleave with the candidate's next ones.

The baseline cache (`baseline_cache`) is re-validated against every candidate's fresh samples
(`TaskBaselines.record`): an entry outside the fresh median's interval widened by
`baseline_drift` is replaced, never used. With `baselines="cached"` a complete cached entry
decides as stored, without fresh blocks (the behaviour before; tests use it as the control).
"""

from __future__ import annotations

import queue
import secrets
from collections import OrderedDict
import shutil
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

BLOCK_TIMEOUT_S = 600.0  # one block of the task's own Model (trusted code): generous


class BaselineFailed(RuntimeError):
    """A baseline child could not start or time: the task's failure, not the candidate's."""


class BaselineServer:
    """One baseline child (eager or compile) for one task in one batch, timing blocks on request."""

    def __init__(self, kind: str, task_code: str, ref_job: dict, cfg, device: str):
        from opsynth.reward.eval_types import device_env

        self.kind, self.cfg, self.device = kind, cfg, device
        self._parked = None  # an eager child forked and started ahead (`ready_children`), or None
        if kind == "eager":  # a compile child reads its task's compile cache, bound at its fork: never parked
            from opsynth.reward import ready_children

            self._parked = ready_children.take(cfg, device, "baseline")
        self.scratch = self._parked.scratch if self.parked else Path(tempfile.mkdtemp(prefix=f"opsynth_base_{kind}_"))
        (self.scratch / "task.py").write_text(task_code)
        self.job = {
            "kind": kind,
            "task_path": str(self.scratch / "task.py"),
            "task_mode": ref_job.get("task_mode"),
            "task_kind": ref_job.get("task_kind"),  # the step it times: the task's precision and pass
            "device": device,
            "init_seed": ref_job["init_seed"],
            "trial_seeds": ref_job["trial_seeds"],
            "seed": secrets.randbelow(2**62),
            "cpu_threads": cfg.resolved_cpu_threads(device),
            "flush_l2": cfg.flush_l2,
            "memory_limit_gb": cfg.memory_limit_gb,
            "result_path": str(self.scratch / "baseline_result.json"),
            "quiet_device": "quiet_device" not in cfg.disabled_guards,  # wait for an idle device before each block
        }
        self.env = device_env(cfg, device)
        self.store = None  # opsynth.reward.compile_cache: the task's torch.compile caches of earlier batches
        if kind == "compile" and getattr(cfg, "compile_cache", True):
            from opsynth.reward.compile_cache import store_for

            self.store = store_for(cfg.resolved_cache_dir(), task_code, device)
            self.job["compile_cache"] = str(self.store)
        self._harvest: threading.Thread | None = None
        self.pid: int | None = None
        self.info: dict = {}
        self.error: str | None = None
        self.warmed = False
        self.last_quiet: dict | None = None  # the child's wait for an idle device before the last block (CUDA)
        self.log = ""
        self._ready = threading.Event()
        self._orders: queue.Queue = queue.Queue()
        self._replies: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"baseline-{kind}")
        self._thread.start()

    def _handle(self, req: dict) -> dict:
        kind = req.get("kind") if isinstance(req, dict) else None
        if kind == "baseline_ready":
            self.info = {k: v for k, v in req.items() if k != "kind"}
            if self.store is not None:  # what this compile wrote, kept for the next batch's (in the background)
                from opsynth.reward.compile_cache import harvest

                self._harvest = threading.Thread(target=harvest, args=(self.scratch, self.store), daemon=True, name="compile-cache")
                self._harvest.start()
            self._ready.set()
        elif kind == "block_done":
            q = req.get("quiet")
            self._replies.put(([float(x) for x in req.get("ms") or []], q if isinstance(q, dict) else None))
        elif kind == "baseline_failed":
            self.error = str(req.get("error"))[-2000:]
            self._ready.set()
            return {"ok": False, "stop": True}
        else:
            return {"ok": False, "error": f"unexpected message {kind!r}"}
        return {"ok": True, **self._orders.get()}

    def _run(self) -> None:
        from opsynth.reward import quiet
        from opsynth.reward.eval_types import RUNNERS
        from opsynth.runtime.sandbox import run_child

        timeout = 7 * 24 * 3600.0  # it lives as long as its batch; `close` ends it
        try:
            with quiet.tracked("baseline") as on_start:
                if self._parked is not None:
                    res = self._parked.child.run(self.job, timeout, build_handler=self._handle, on_start=self._started(on_start))
                else:
                    res = run_child("opsynth.reward.baseline_runner", self.job, self.scratch, timeout, self.cfg, warm=RUNNERS,
                                    build_handler=self._handle, env_extra=self.env, on_start=self._started(on_start),
                                    readable=[str(self.store)] if self.store is not None else [])
            self.log = res.log
            if res.reason != "ok" and self.error is None:
                self.error = f"{res.reason}: {res.log[-1500:]}"
        except Exception as e:  # noqa: BLE001 - reported as the task's failure
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.error = self.error or ("the baseline child ended" if not self._ready.is_set() else self.error)
            self._ready.set()
            self._replies.put(None)

    def _started(self, on_start):
        def started(pid: int) -> None:
            self.pid = pid
            on_start(pid)

        return started

    @property
    def parked(self) -> bool:
        """Whether this child was forked and started ahead (`ready_children`, role "baseline")."""
        return self._parked is not None

    def is_ready(self) -> bool:
        """Ready to time now (for compile: compiled), without waiting."""
        return self._ready.is_set() and (self.error is None or bool(self.info))

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until the child is ready to time (for compile: compiled); raises BaselineFailed."""
        timeout = timeout if timeout is not None else self.cfg.reference_timeout_s
        if not self._ready.wait(timeout):
            raise BaselineFailed(f"the {self.kind} baseline child was not ready after {timeout:.0f} s")
        if self.error is not None and not self.info:
            raise BaselineFailed(f"the {self.kind} baseline child failed: {self.error}")

    def block(self, calls: int, quiet_cap_ms: float | None = None) -> list[float]:
        """Milliseconds of `calls` timed calls (the caller holds the device and a quiet window);
        `quiet_cap_ms`: the longest the child may wait for an idle device first (its default cap)."""
        from opsynth.reward import quiet

        self.wait_ready()
        with quiet.running(self.pid):
            self._orders.put({"calls": int(calls), **({} if quiet_cap_ms is None else {"quiet_cap_ms": float(quiet_cap_ms)})})
            try:
                reply = self._replies.get(timeout=BLOCK_TIMEOUT_S)
            except queue.Empty:
                reply = None
        ms, self.last_quiet = reply if reply is not None else (None, None)
        if ms is None or len(ms) != calls:
            raise BaselineFailed(f"the {self.kind} baseline child stopped mid-block: {self.error or 'no reply'}")
        return ms

    def close(self) -> None:
        self._orders.put({"stop": True})
        self._thread.join(timeout=30)
        if self._harvest is not None:  # the store gets this compile's files before its scratch goes
            self._harvest.join(timeout=60)
        if not self.cfg.keep_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def decides_as_stored(cfg, entry: dict | None) -> bool:
    """`baselines="cached"` and an entry with every figure the rule needs: it decides as stored."""
    return (cfg.baselines == "cached" and entry is not None and entry.get("eager_ms") is not None
            and (entry.get("compile_ms") is not None or not cfg.compile_baseline))


COMPILE_POOL = 4  # compiled baseline children kept alive per process: the most recently used tasks
_pool: "OrderedDict[tuple, BaselineServer]" = OrderedDict()
_pool_lock = threading.Lock()


def prestarts_compile(cfg, device: str, tasks: int) -> bool:
    """Whether a batch of `tasks` tasks starts their compile children with their eager children
    (`RewardConfig.compile_prestart`; None: on cuda when they all fit in the pool)."""
    if not cfg.compile_baseline or cfg.baselines == "cached":
        return False
    if cfg.compile_prestart is not None:
        return bool(cfg.compile_prestart)
    return device == "cuda" and tasks <= COMPILE_POOL


def compile_server(task_code: str, mode: str | None, ref_job: dict, cfg, device: str) -> BaselineServer:
    """The task's compile child, kept across batches: torch.compile costs seconds to a minute per
    task, and a task comes back in the next batch (a multi-turn episode, a benchmark, GRPO steps on
    the same rows). Keyed by everything the child's timing depends on; the least recently used goes
    when more than COMPILE_POOL are alive."""
    import hashlib

    key = (hashlib.sha256(task_code.encode()).hexdigest(), mode, device, cfg.resolved_device_index(),
           cfg.resolved_cpu_threads(device), cfg.flush_l2, cfg.isolation)
    with _pool_lock:
        srv = _pool.get(key)
        if srv is not None and (srv.error is None or not srv.info):
            _pool.move_to_end(key)
            return srv
        srv = _pool[key] = BaselineServer("compile", task_code, ref_job, cfg, device)
        while len(_pool) > COMPILE_POOL:
            _, old = _pool.popitem(last=False)
            threading.Thread(target=old.close, daemon=True).start()  # it is stopped after its block, never mid-block
    return srv


class TaskBaselines:
    """One task's baselines in one batch: the cached entry, the eager child (started at once), the
    compile child (started when a candidate first beats eager: at most one torch.compile)."""

    def __init__(self, task_code: str, mode: str | None, ref_job: dict, cfg, device: str):
        from opsynth.reward import baseline_cache

        self.task_code, self.mode, self.ref_job, self.cfg, self.device = task_code, mode, ref_job, cfg, device
        self.cached = baseline_cache.lookup(cfg, task_code, device, mode)
        self._lock = threading.Lock()
        self._servers: dict[str, BaselineServer] = {}
        if not self.uses_cache():
            self.server("eager")

    def uses_cache(self) -> bool:
        return decides_as_stored(self.cfg, self.cached)

    def prestart_compile(self) -> None:
        """Start the compile child now (`RewardConfig.compile_prestart`): its torch.compile runs beside the
        builds and checks (stopped in every quiet window, like a build), so a candidate that beats eager
        finds it ready instead of waiting for it with the device released (7 s on the H200's cold first)."""
        if not self.uses_cache():  # whether at all is `prestarts_compile`'s
            self.server("compile")

    def started(self, kind: str) -> BaselineServer | None:
        """The child of `kind` if one was started (none is started here)."""
        with self._lock:
            return self._servers.get(kind)

    def server(self, kind: str) -> BaselineServer:
        """This batch's eager child; the compile child from the process's pool (`compile_server`)."""
        with self._lock:
            srv = self._servers.get(kind)
            if srv is None or srv.error is not None and srv.info:  # one that died after it was ready: a new one
                srv = compile_server(self.task_code, self.mode, self.ref_job, self.cfg, self.device) if kind == "compile" else \
                    BaselineServer(kind, self.task_code, self.ref_job, self.cfg, self.device)
                self._servers[kind] = srv
            return srv

    def record(self, fresh: dict[str, list[float]]) -> dict:
        """Re-validate the cached entry against one candidate's fresh samples (`revalidate`), store
        what changed; returns what happened to each figure."""
        from opsynth.reward import baseline_cache

        entry, status = revalidate(self.cached, fresh, self.cfg.baseline_drift, self.cfg.confidence)
        if any(status.get(k) in ("stored", "replaced", "dropped") for k in ("eager", "compile")) and entry["eager_ms"] is not None:
            baseline_cache.store(self.cfg, self.task_code, self.device, entry["eager_ms"], entry["compile_ms"], self.mode)
            self.cached = {**(self.cached or {}), **entry}
        return status

    def close(self) -> None:
        for kind, srv in list(self._servers.items()):
            if kind != "compile":  # the pool keeps it for the task's next batch
                srv.close()


class Pacer:
    """One candidate's timed section, on the parent's side: the device lock, the quiet window, the
    baseline blocks between the candidate's blocks of rounds, and when to ask for more rounds."""

    def __init__(self, baselines: TaskBaselines | None, cfg, device: str, lock_path: str | None, warmup: int, cap_end: int,
                 reference: tuple[list, dict] | None = None, reference_ms: float | None = None, pending=None):
        """`pending`: a callable that returns {"baselines", "reference", "reference_ms"} or why not (a
        string), called once, at the timing lock: for a candidate started before its reference was
        whole (`evaluate._measure_one`); nothing before the lock reads them."""
        self._pending_ref = pending
        self.cfg, self.device, self.lock_path = cfg, device, lock_path
        self._bind(baselines, reference, reference_ms)
        self.warmup, self.cap_end = warmup, cap_end
        self.block_calls = cfg.resolved_timing_block(device)
        self.pid: int | None = None
        self.samples: dict[str, list[float]] = {"eager": [], "compile": []}
        self.since: dict[str, int] = {"eager": warmup}  # the first candidate round each baseline pairs with
        self.pending: set[str] = set()
        self.dirty = True  # candidate rounds ran since the last baseline blocks
        self.next_boundary = warmup
        self.looked: int | None = None  # the round before which baseline blocks last ran
        self.failed: str | None = None
        self.capped = False
        self._lock = ExitStack()
        self._share = ExitStack()  # the checks' share of the device, held for the child's checked calls
        self.shared = False
        self._window = ExitStack()
        self._state = threading.Lock()
        self.locked = False
        self.closed = False
        self.blocks_s = 0.0  # wall time of the baseline blocks (inside the candidate's locked window)
        self.settle_s = 0.0  # the probe for an idle device before the first timed round, the candidate stopped
        self.window_s = 0.0  # opening the quiet window (builds and idle baseline children stopped), inside it too
        self.compile_wait_s = 0.0  # waiting for the compile child (lock released meanwhile)
        self.intervals_s = 0.0  # computing the ratio intervals (bootstrap) at each look, inside the window too
        # The baseline children's waits for an idle device before each block (CUDA; timing.QuietDevice):
        # ms waited in all, blocks timed without it after the cap (work the stopped candidate left
        # running, or another process's), and the probes' fastest and slowest reading
        self.quiet_wait_ms = 0.0
        self.disturbed = 0
        # Where the blocks' wall goes: the baseline's timed calls, the rest of each block beyond them
        # (and beyond the quiet wait), and stopping and continuing the candidate around them
        self.calls_s = 0.0
        self.block_overhead_s = 0.0
        self.stop_s = 0.0
        self.probe_ms: dict = {}  # {"host"|"device": [fastest, slowest]}

    def _bind(self, baselines, reference, reference_ms) -> None:
        self.baselines = baselines if baselines is not None and not baselines.uses_cache() else None
        self.reference = reference  # (the reference's rounds: fingerprints and scale; its input keys)
        self.reference_ms = reference_ms  # the median of the reference child's timed rounds: the task's eager time before any candidate
        self.active = ["eager"] if self.baselines is not None else []

    # -- the child's requests ------------------------------------------------------------------

    def set_pid(self, pid: int) -> None:
        self.pid = pid

    def share(self) -> str | None:
        """The child's `timing_share`: the device shared with other checks for its checked calls
        (`opsynth.runtime.device_lock.checks_share`), held here until `unshare` or `lock`."""
        with self._state:
            if self.locked or self.shared or self.closed:
                return "the checks' share was asked for twice, or after the timing lock"
        self._take(self._share_cm, "shared")
        return None

    def unshare(self) -> None:
        self._share.close()
        self.shared = False

    def lock(self) -> str | None:
        """The child's `timing_lock`: the eager child made ready first (under the checks' share: its
        start-up runs on the device too), then the device to itself, held here in the trusted parent
        for the whole timed section. None, or why not."""
        with self._state:
            if self.locked or self.closed:
                return "the timing lock was asked for twice"
        if self._pending_ref is not None:  # started before its reference was whole: wait for it, holding nothing
            got, self._pending_ref = self._pending_ref(), None
            if isinstance(got, str):
                return got
            self._bind(**got)
        if self.baselines is not None:
            if not self.shared:
                self._take(self._share_cm, "shared")
            try:
                self.baselines.server("eager").wait_ready()
            except BaselineFailed as e:
                self.failed = str(e)
        self.unshare()
        self._take_lock()
        return None

    def unlock(self) -> None:
        self._window.close()
        self._lock.close()
        self.locked = False
        self.unshare()

    def _share_cm(self):
        from opsynth.runtime.device_lock import checks_share

        return checks_share(self.lock_path)

    def _lock_cm(self):
        from opsynth.runtime.device_lock import timing_section

        return timing_section(self.lock_path)

    def _take(self, make, flag: str) -> None:
        """Enter a hold on the device (blocking) and keep it in `_share` or `_lock`. Taken after
        `close` (the child was killed while this waited), it is let go at once: a hold the parent
        forgot would stop every later timing."""
        stack = ExitStack()
        stack.enter_context(make())
        with self._state:
            if self.closed:
                stack.close()
                return
            if flag == "shared":
                self._share, self.shared = stack, True
            else:
                self._lock, self.locked = stack, True

    def _take_lock(self) -> None:
        """The device to itself (blocking; see `_take`)."""
        self._take(self._lock_cm, "locked")

    # -- the rounds ----------------------------------------------------------------------------

    def before_round(self, session, j: int) -> str | None:
        """Called as round j's seed is asked for; None, or why timing cannot go on."""
        if not self.locked:
            return "timed rounds began before the timing lock was asked for"
        if j == 0:
            t0 = time.perf_counter()
            self._window.enter_context(_quiet_window())
            self.window_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            self._settle_device()
            self.settle_s += time.perf_counter() - t0
        if j < self.warmup:
            return None
        if j == self.next_boundary or self.pending:
            self._baseline_blocks()
            self.next_boundary = j + self.block_calls
            self.looked = j
        self.dirty = True
        return None

    def ends_main_pass(self, session, j: int) -> bool:
        """Whether the main pass ends before round j (a block boundary, its baseline blocks just run)
        rather than at the plan's end: when the task's baseline is in the cache already, after
        `plan.first_look` timed calls, once the rest of it could
        not change the verdict, i.e. every threshold `after_pass` would sample for lies outside the
        ratio's interval by EARLY_MARGIN (compile not yet timed: eager's alone; `after_pass` then
        starts it), or an output already differs from the reference's (it will be rejected)."""
        from opsynth.reward.confidence import EARLY_MARGIN, open_thresholds

        plan = session.plan
        if (self.baselines is None or self.looked != j or session.main_cut is not None or session.main_extra
                or not plan.warmup + plan.first_look <= j < plan.main):
            return False
        if (self.baselines.cached or {}).get("eager_ms") is None:
            # No entry yet: this candidate's eager samples become the task's cached baseline, which
            # every later candidate is re-validated against; it gets the whole main pass's blocks
            # (an early end left 10-15 samples and two caches' entries read 2.1x apart on 2 cores).
            return False
        end = bool(self.failed) or not self.correct_so_far(session)
        if not end:
            eager, comp = self.intervals(session)
            timing_compile = self.cfg.compile_baseline and "compile" in self.active
            end = not open_thresholds(eager, comp, self.cfg.margin, timing_compile, by=EARLY_MARGIN)
        if end:
            self.dirty = False  # round j will not run: the blocks just run are the trailing ones
        return end

    def after_pass(self, session) -> int:
        """At the end of a pass of the main rounds: the trailing baseline blocks, then how many more
        rounds to ask for (0: the decision is made or the cap reached)."""
        from opsynth.reward.confidence import BELOW, open_thresholds, side

        if self.baselines is None or self.failed:
            return 0
        if self.dirty:
            self._baseline_blocks()
        eager, comp = self.intervals(session)
        margin = self.cfg.margin
        if self.failed or not self.correct_so_far(session):
            return 0  # a candidate that will be rejected gets no more rounds and no torch.compile
        more = min(self.block_calls, self.cap_end - session.main_end)
        if self.cfg.compile_baseline and "compile" not in self.active and side(eager, margin) == BELOW:
            if more <= 0:
                self.capped = True
                return 0
            self._start_compile(session)
            return 0 if self.failed else more
        if open_thresholds(eager, comp, margin, self.cfg.compile_baseline):
            if more > 0:
                self.next_boundary = session.main_end + more
                return more
            self.capped = True
        return 0

    def _baseline_blocks(self) -> None:
        kinds = (set(self.active) if self.dirty else set()) | self.pending
        self.pending = set()
        self.dirty = False
        if not kinds or self.failed:
            return
        from opsynth.reward import quiet

        t0 = time.perf_counter()
        try:
            self._run_blocks(quiet, kinds)
        finally:
            self.blocks_s += time.perf_counter() - t0

    def _run_blocks(self, quiet, kinds: set) -> None:
        t0 = time.perf_counter()
        with quiet.paused(self.pid):
            self.stop_s += time.perf_counter() - t0
            self._blocks_of(kinds)
            t0 = time.perf_counter()
        self.stop_s += time.perf_counter() - t0

    def _settle_device(self) -> None:
        """Before the candidate's first timed round, the device idle (CUDA): a kernel another child
        left running after it let go of the lock (a sibling saving its outputs before it exits; a
        neighbour's set-up) would be timed into this candidate's rounds. The eager baseline child
        probes (a block of no calls), the candidate stopped meanwhile; a device busy past the wait
        budget counts as a disturbed block."""
        if self.baselines is None or self.device != "cuda" or self.failed:
            return
        from opsynth.reward import quiet

        with quiet.paused(self.pid):
            try:
                self._block(self.baselines.server("eager"), 0)
            except BaselineFailed as e:
                self.failed = str(e)

    def _blocks_of(self, kinds: set) -> None:
        for kind in [k for k in self.active if k in kinds]:
            srv = self.baselines.server(kind)
            try:
                if not srv.warmed:
                    self._block(srv, max(1, self.warmup))  # its first calls: caches, allocator, lazy init
                    srv.warmed = True
                self.samples[kind].extend(self._block(srv, self.block_calls))
            except BaselineFailed as e:
                self.failed = str(e)
                return

    def _block(self, srv, calls: int) -> list[float]:
        """One block, accounted for: its timed calls' ms, and the rest of its wall beyond them and
        the wait for an idle device (the baseline child's fresh inputs, flushes, syncs, the channel,
        continuing and stopping it)."""
        from opsynth.runtime.timing import QUIET_CAP_MS

        t0 = time.perf_counter()
        # the wait for an idle device is one budget per candidate: a kernel it leaves running costs
        # its evaluation at most QUIET_CAP_MS, not that much per block
        ms = srv.block(calls, quiet_cap_ms=max(0.0, QUIET_CAP_MS - self.quiet_wait_ms))
        wall = time.perf_counter() - t0
        waited = self._quiet(srv.last_quiet) / 1e3
        self.calls_s += sum(ms) / 1e3
        self.block_overhead_s += max(0.0, wall - sum(ms) / 1e3 - waited)
        return ms

    def _undisturbed(self, session, reward: int) -> dict:
        """The decision when baseline blocks were timed on a busy device (never idle within the cap):
        beside a kernel the stopped candidate left running they read slow, so they decide nothing.
        The candidate is held instead to the eager time its task's reference child measured before it
        (its timed rounds, the same Timer) and to a compile figure cached from quiet blocks, and never
        gets more than the blocks gave. On a device another process keeps busy all along the
        reference read slow too, so honest candidates keep a fair eager ratio there."""
        from opsynth.reward.eval_types import reward_from_times

        eager = self.reference_ms
        comp = (self.baselines.cached or {}).get("compile_ms") if self.cfg.compile_baseline else None
        held = reward_from_times(session.median(main=not session.again), eager, comp, self.cfg.margin) if eager else 1
        out = {"disturbed_blocks": self.disturbed, "undisturbed_basis": {"eager_ms": eager, "compile_ms": comp, "reward": held}}
        if held < reward:
            out["reward"] = held
            out["note"] = (f"{self.disturbed} baseline block(s) were timed on a busy device (work left running by the "
                           f"stopped candidate, or another process's) after waiting {self.quiet_wait_ms / 1e3:.1f} s: "
                           f"decided on the reference's eager time {eager} ms and the cached compile time {comp} ms "
                           f"instead (reward {held})")
        return out

    def _quiet(self, report: dict | None) -> float:
        """Account for a baseline child's wait for an idle device before a block; the ms it waited."""
        if not report:
            return 0.0
        waited = float(report.get("waited_ms") or 0.0)
        self.quiet_wait_ms += waited
        self.disturbed += 0 if report.get("quiet") else 1
        for key, lo, hi in (("host", "fastest_ms", "slowest_ms"), ("device", "device_fastest_ms", "device_slowest_ms")):
            if report.get(lo) is not None:
                seen = self.probe_ms.get(key)
                self.probe_ms[key] = [min(report[lo], seen[0]), max(report[hi], seen[1])] if seen else [report[lo], report[hi]]
        return waited

    def _start_compile(self, session) -> None:
        """The compile child joins; its first block comes before the candidate's next. Not compiled yet:
        waited for with the device lock and the window released (other timings go on), the candidate
        stopped meanwhile."""
        from opsynth.reward import quiet

        srv = self.baselines.server("compile")
        t0 = time.perf_counter()
        if srv.is_ready():
            # Compiled already (started with the batch, or by an earlier candidate): the lock is kept.
            # Letting it go for nothing queued this candidate behind every other one waiting for the
            # device: 3-7 s of its timing section on the H200 with 8 in flight (2026-12-04b).
            self.compile_wait_s += time.perf_counter() - t0
        else:
            self._release_for_compile(quiet, srv, t0)
        if self.failed:
            return
        self.active.append("compile")
        self.since["compile"] = session.main_end
        self.pending.add("compile")
        self.next_boundary = session.main_end + self.block_calls

    def _release_for_compile(self, quiet, srv, t0: float) -> None:
        """Wait for the compile child with the device lock and the window released, the candidate stopped."""
        with quiet.paused(self.pid):
            self._window.close()
            self._lock.close()
            self.locked = False
            try:
                # Nothing held meanwhile: torch.compile takes seconds, mostly on the CPU, and holding
                # the device (even shared) would keep every timing on it waiting for that long.
                srv.wait_ready()
            except BaselineFailed as e:
                self.failed = str(e)
            finally:
                self.compile_wait_s += time.perf_counter() - t0
                self._take_lock()
                self._window.enter_context(_quiet_window())

    def correct_so_far(self, session) -> bool:
        """Every round reported so far matches the reference's fingerprints for its inputs (the
        full judgement, `rounds.judge_rounds`, comes after the child)."""
        from opsynth.reward.timed_inputs import fingerprints_match

        if self.reference is None:
            return True
        rounds, keys = self.reference
        for j, fp in session.fps.items():
            try:
                if session.keys.get(j) != keys.get(j) or not fingerprints_match(fp, rounds[j]["fp"], rounds[j]["scale"])[0]:
                    return False
            except (TypeError, ValueError, IndexError, KeyError):
                return False
        return True

    # -- the decision --------------------------------------------------------------------------

    def candidate_samples(self, session, kind: str) -> list[float]:
        """The candidate's timed calls that pair with a baseline, as decided (`RoundSession.decided`:
        the claims, held to the parent's clock): those of the main pass from the round that baseline
        joined (the re-measure pass instead, when there was one)."""
        rounds = session.timed(main=not session.again)
        first = self.since.get(kind, self.warmup) if not session.again else rounds.start
        decided = session.decided(main=not session.again)
        return [decided[j] for j in rounds if j >= first and j in decided]

    def intervals(self, session):
        from opsynth.reward.confidence import ratio_interval

        t0 = time.perf_counter()
        out = []
        for kind in ("eager", "compile"):
            c, b = self.candidate_samples(session, kind), self.samples[kind]
            out.append(ratio_interval(c, b, self.cfg.confidence) if c and b else None)
        self.intervals_s += time.perf_counter() - t0
        return out

    def decision(self, session) -> dict:
        from opsynth.reward.confidence import decide

        eager, comp = self.intervals(session)
        d = decide(eager, comp, self.cfg.margin, self.cfg.compile_baseline, capped=self.capped)
        if self.disturbed:
            d.update(self._undisturbed(session, d["reward"]))
        d["timed_calls"] = {"candidate": len(list(session.timed(main=not session.again))),
                            **{k: len(v) for k, v in self.samples.items() if v}}
        return d

    def close(self) -> None:
        with self._state:
            self.closed = True
        self._window.close()
        self._lock.close()
        self.locked = False
        self.unshare()


def revalidate(cached: dict | None, fresh: dict[str, list[float]], drift: float, confidence: float = 0.95) -> tuple[dict, dict]:
    """(the entry to keep, what happened to each figure) for a cached entry and fresh samples. A
    cached figure outside the fresh median's interval widened by `drift` either way is replaced by
    the fresh median (and with eager replaced, a compile figure not measured now is dropped: it was
    timed with the same bad entry); a missing one is stored; one not measured now is kept."""
    from opsynth.reward.confidence import median_interval

    entry = {k: (cached or {}).get(k) for k in ("eager_ms", "compile_ms")}
    status: dict = {"cached": dict(entry), "drift_allowed": drift}
    for kind in ("eager", "compile"):
        key = f"{kind}_ms"
        m = median_interval(fresh.get(kind) or [], confidence)
        if m is None:
            status[kind] = "kept" if entry[key] is not None else "not_measured"
            continue
        med, lo, hi = m
        status[f"fresh_{kind}"] = {"median": round(med, 6), "lo": round(lo, 6), "hi": round(hi, 6), "n": len(fresh[kind])}
        old = entry[key]
        if old is None:
            status[kind], entry[key] = "stored", med
        elif lo / drift <= old <= hi * drift:
            status[kind] = "agrees"
        else:
            status[kind], entry[key] = "replaced", med
    if status["eager"] == "replaced" and status["compile"] == "kept":
        status["compile"], entry["compile_ms"] = "dropped", None
    return entry, status


def _quiet_window():
    from opsynth.reward import quiet

    return quiet.window()


def fresh_medians(samples: dict[str, list[float]]) -> dict[str, float | None]:
    import statistics

    return {f"{k}_ms": (float(statistics.median(v)) if v else None) for k, v in samples.items()}


