"""A pool of warm verifier workers, and the per-task procedure that drives them.

Usage::

    from opsynth.verify import VerifyConfig, WorkerPool

    with WorkerPool(VerifyConfig(device="cuda", n_workers=8)) as pool:
        result = pool.verify(task_source)          # one task
        results = pool.verify_many(task_sources)   # spread over the workers, results in order
        future = pool.submit(task_source)          # concurrent.futures.Future[VerifyResult]

Every task runs in a worker subprocess (``opsynth.verify.worker``); the parent never executes task
code, never raises because of a task, and never unpickles anything a worker sends. The parent
enforces the wall-clock timeout (kill, replace the worker), watches the worker's host memory, and
replaces workers that died, reported a CUDA fault, or served ``max_tasks_per_worker`` tasks.

Per task: an eager request (checks + timing; a timing near an edge of the acceptance window is
repeated in the worker and the median decides), accepted when the eager median is inside
``cfg.accept_window`` (the band less its edge margin; not asked with ``check_band=false``), then
one compile request checks torch.compile in the mode the eager request chose (``result.mode``). Sizes are the caller's (the generate pipeline picks them with the cost model); only
with ``calibrate=true`` is the eager request repeated while ``batch_size`` is rescaled from timings.

With ``verify.sandbox`` on (by default for sources the sampler did not generate: ``sampled=False``)
each worker confines itself before it runs anything (``confine.py``): it writes only its scratch
folder and the pool's compile caches, has no network and no secrets in its environment.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable

from opsynth.runtime import supervise
from opsynth.runtime.device_lock import LOCK_DIR_ENV, PHASES_ENV, device_lock_path, lock_files, resolve_lock_dir

from . import protocol
from .calibrate import draw_target_ms, next_batch_size, read_batch_size, set_batch_size
from .config import CUDA_CONTEXT_MB, CUDA_USABLE, VerifyConfig
from .result import ACCEPTED, TIMING_SKIPPED, VerifyResult
from .stages import device_sections, gpu_sections, stage_seconds

log = logging.getLogger("opsynth.verify")

_TAIL_BYTES = 16 * 1024


def _summed(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Key-wise sums of the replies' number dicts (a task's `compile_split`)."""
    out: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = round(out.get(k, 0.0) + float(v), 4)
    return out


class WorkerGone(Exception):
    """The worker did not answer: it died, ran past its timeout, or outgrew its memory."""

    def __init__(self, reason: str, message: str, **evidence: Any):
        super().__init__(message)
        self.reason = reason
        self.evidence = {"message": message, **evidence}


def detect_device(requested: str) -> str:
    """"cuda" or "cpu": what `requested` ("auto", "cpu", "cuda[:N]") means in this process."""
    if requested != "auto":
        return "cuda" if requested.startswith("cuda") else "cpu"
    if "torch" in sys.modules:
        return "cuda" if sys.modules["torch"].cuda.is_available() else "cpu"
    gpus = Path("/proc/driver/nvidia/gpus")
    return "cuda" if gpus.is_dir() and any(gpus.iterdir()) else "cpu"


def usable_cpus() -> int:
    """CPUs this process may run on: a Slurm job (or taskset) gets fewer than the node has, and
    sizing thread pools by the node's count would oversubscribe the job's share."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class WorkerProcess:
    """One worker subprocess: its pipes, its output tail, and request/response with a deadline."""

    def __init__(self, cfg: VerifyConfig, device: str, env: dict[str, str], cwd: str, host_limit_bytes: int,
                 sandbox: dict[str, Any] | None = None, rss_watch: supervise.RssWatch | None = None):
        """`rss_watch`: the pool's one reader of its workers' memory (None: this process lists its
        own tree at each check, fine for one worker, a core's worth of GIL for sixteen)."""
        self.cfg = cfg
        self._rss_watch = rss_watch
        self.confined = sandbox is not None
        self.device = device
        self.host_limit_bytes = host_limit_bytes
        self.tasks_done = 0
        self.ready: dict[str, Any] | None = None
        self._tail = bytearray()
        self._tail_lock = threading.Lock()
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        cmd = [sys.executable, "-m", "opsynth.verify.worker", "--req-fd", str(req_r), "--resp-fd", str(resp_w),
               "--config", _config_json(cfg, device)]
        if sandbox is not None:
            cmd += ["--sandbox", json.dumps(sandbox)]
        self.proc = subprocess.Popen(
            cmd, pass_fds=(req_r, resp_w), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True,
        )
        os.close(req_r)
        os.close(resp_w)
        self._reader = protocol.Reader(self._resp_r)
        self._drain = threading.Thread(target=self._drain_output, daemon=True)
        self._drain.start()
        self._base_rss = 0

    def _drain_output(self) -> None:
        """Read the task's stdout/stderr to the end, keeping only the last few KB: a flood costs
        the parent some reads, never memory, and never blocks the worker."""
        out = self.proc.stdout
        assert out is not None
        while True:
            try:
                chunk = out.read1(1 << 16)
            except (OSError, ValueError):
                return
            if not chunk:
                return
            with self._tail_lock:
                self._tail += chunk
                if len(self._tail) > _TAIL_BYTES:
                    del self._tail[: len(self._tail) - _TAIL_BYTES]

    def output_tail(self, n: int = 4000) -> str:
        time.sleep(0.05)  # let the drain thread catch the last words of a dying process
        with self._tail_lock:
            return bytes(self._tail[-n:]).decode(errors="replace")

    def clear_tail(self) -> None:
        with self._tail_lock:
            self._tail.clear()

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        if self.ready is None:
            try:
                msg = self._wait(timeout, watch_memory=False)
            except WorkerGone as gone:
                raise RuntimeError(f"verifier worker failed to start: {gone} "
                                   f"(exit code {gone.evidence.get('exit_code')}): {gone.evidence.get('output_tail', '')[-1500:]}") from None
            if msg.get("event") != "ready":
                raise RuntimeError(f"verifier worker failed to start: {msg.get('error', msg)}")
            self.ready = msg
            self._base_rss = supervise.tree_rss_bytes(self.proc.pid)
            if self._rss_watch is not None:
                self._rss_watch.watch(self.proc.pid)
        return self.ready

    def request(self, msg: dict[str, Any], timeout: float,
                on_ask: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        self.clear_tail()
        try:
            protocol.send(self._req_w, msg)
        except (BrokenPipeError, OSError):
            raise self._gone("crashed", "worker pipe closed before the request") from None
        return self._wait(timeout, watch_memory=True, on_ask=on_ask)

    def _answer(self, msg: dict[str, Any], on_ask) -> None:
        """A worker's `ask` (an eager request's facts before its timing, `WorkerPool.verify`'s
        go_timing): the caller's answer, or go on when there is no caller to ask (a caller that
        fails says go: stopping is an optimisation, never a verdict)."""
        go = True
        if on_ask is not None:
            try:
                go = bool(on_ask({k: v for k, v in msg.items() if k != "event"}))
            except Exception as e:  # noqa: BLE001
                log.info("the go_timing callback failed (%s: %s); timing the task", type(e).__name__, e)
        try:
            protocol.send(self._req_w, {"op": "go", "go": go})
        except (BrokenPipeError, OSError):
            raise self._gone("crashed", "worker pipe closed before the answer to its ask") from None

    def _wait(self, timeout: float, watch_memory: bool, on_ask=None) -> dict[str, Any]:
        """Wait for a reply. Time the worker reports as paused (waiting for the timing lock,
        importing the compiler) is not counted, nor the time an `ask` takes to answer; an import
        pause is itself bounded by startup_timeout_s. Raises WorkerGone (after killing the worker)
        on death, timeout or memory."""
        since = time.monotonic()
        deadline = since + timeout
        paused_at: float | None = None
        pause_kind = ""
        next_mem = 0.0
        while True:
            try:
                msg = self._reader.poll(0.1)
            except protocol.ProtocolClosed:
                msg = None
                if self.proc.poll() is None:  # pipe closed but alive: hand it a moment to exit
                    try:
                        self.proc.wait(2.0)
                    except subprocess.TimeoutExpired:
                        pass
                raise self._gone("crashed", "worker closed its protocol pipe") from None
            now = time.monotonic()
            if msg is not None:
                event = msg.get("event")
                if event == "pause":
                    paused_at, pause_kind = now, msg.get("kind", "")
                elif event == "resume":
                    if paused_at is not None:
                        deadline += now - paused_at
                    paused_at = None
                elif event == "ask":
                    self._answer(msg, on_ask)
                    deadline += time.monotonic() - now
                else:
                    return msg
                continue
            if self.proc.poll() is not None:
                raise self._gone("crashed", "worker process exited")
            if paused_at is None and now > deadline:
                self.kill()
                raise self._gone("timeout", f"no reply within {timeout:.0f} s", timeout_s=timeout)
            if paused_at is not None and pause_kind == "import" and now - paused_at > self.cfg.startup_timeout_s:
                self.kill()
                raise self._gone("worker_error", "importing the compiler stack took longer than startup_timeout_s")
            if watch_memory and now >= next_mem:
                rss = self._rss(since)
                next_mem = now + (0.0 if self._rss_watch is not None else 0.25)  # a reading costs nothing there
                if rss is not None and rss - self._base_rss > self.host_limit_bytes:
                    self.kill()
                    raise self._gone("oom", f"host memory grew by {(rss - self._base_rss) / 2**30:.1f} GB, "
                                     f"above the {self.host_limit_bytes / 2**30:.1f} GB limit")

    def _rss(self, since: float) -> int | None:
        """The worker's tree memory (confined: the work is the pid's child), read at or after `since`
        (None: no such reading yet)."""
        if self._rss_watch is None:
            return supervise.tree_rss_bytes(self.proc.pid)
        return self._rss_watch.rss(self.proc.pid, since)

    def _gone(self, reason: str, message: str, **evidence: Any) -> WorkerGone:
        code = self.proc.poll()
        sig = supervise.exit_signal(code, self.confined)
        if sig is not None:
            try:
                evidence["signal"] = signal.Signals(sig).name
            except ValueError:
                evidence["signal"] = sig
        evidence["exit_code"] = code
        evidence["output_tail"] = self.output_tail()
        return WorkerGone(reason, message, **evidence)

    def kill(self) -> None:
        if self._rss_watch is not None:
            self._rss_watch.unwatch(self.proc.pid)
        if self.proc.poll() is None:
            supervise.kill_group(self.proc.pid)  # the worker, confined or not, and anything it spawned (cc)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def close(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None and self.ready is not None:  # one still importing: just kill
            try:
                protocol.send(self._req_w, {"op": "exit"})
                self.proc.wait(grace)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for fd in (self._req_w, self._resp_r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stdout is not None:
            try:
                self.proc.stdout.close()
            except OSError:
                pass


def _config_json(cfg: VerifyConfig, device: str) -> str:
    d = cfg.to_dict()
    d["device"] = device
    return json.dumps(d)


class MemoryGate:
    """The device memory that the requests in flight on one GPU have reserved (`VerifyConfig.
    sizing_split`, `split_by_source`): a candidate sized against a fixed share of the device, not a
    1/n split among its workers, waits here until its predicted request fits beside the others'. One
    that needs more than the gate holds waits for the gate to be empty. Waiting is counted
    (`memory_gate` stage).

    A request that has waited PRIORITY_AFTER_S goes first: no later request is let in before it, so the
    requests already in drain and it fits. Without that, a wide request (a single operator sized
    against a quarter of the card) could wait for as long as smaller ones keep coming."""

    PRIORITY_AFTER_S = 0.5

    def __init__(self, capacity_mb: float):
        self.capacity_mb = max(0.0, float(capacity_mb))
        self.used_mb = 0.0
        self._urgent = 0  # requests waiting longer than PRIORITY_AFTER_S: later ones wait behind them
        self._cond = threading.Condition()

    def _fits(self, mb: float) -> bool:
        return self.used_mb + mb <= self.capacity_mb or self.used_mb == 0

    @contextmanager
    def reserve(self, mb: float):
        """Hold `mb` of the device for the body; yields the seconds it waited."""
        mb = max(0.0, float(mb))
        t0 = time.monotonic()
        with self._cond:
            urgent = False
            while not (self._fits(mb) and (urgent or self._urgent == 0)):
                left = self.PRIORITY_AFTER_S - (time.monotonic() - t0)
                if not urgent and left <= 0:
                    urgent = True
                    self._urgent += 1
                    continue
                self._cond.wait(None if urgent else left)
            if urgent:
                self._urgent -= 1
                self._cond.notify_all()  # the later ones may go once no one urgent is left
            self.used_mb += mb
        try:
            yield time.monotonic() - t0
        finally:
            with self._cond:
                self.used_mb -= mb
                self._cond.notify_all()


class WorkerPool:
    """Warm workers that verify tasks; see the module docstring."""

    def __init__(self, cfg: VerifyConfig | None = None, sampled: bool = False):
        """`sampled`: the sources are graphs the sampler generated (our own code), which
        `verify.sandbox=auto` runs unconfined; anything else (a user's files) is confined."""
        self.cfg = cfg or VerifyConfig()
        self.sandboxed = self.cfg.sandboxed(sampled)
        self.device = detect_device(self.cfg.device)
        n = self.cfg.n_workers or (usable_cpus() if self.device == "cpu" else 8)
        self.n_workers = max(1, n)
        self.limits = self.cfg.limits(self.device)
        self.device_name: str | None = None
        self.torch_version: str | None = None
        self.device_mem_mb: float | None = None  # the GPU's memory, as the workers report it
        self._slots: list[WorkerProcess | None] = [None] * self.n_workers
        self._idle: queue.Queue[int] = queue.Queue()
        self._executor: ThreadPoolExecutor | None = None
        self._tmp: str | None = None
        self._box = None  # confine.Box when sandboxed
        self._rss_watch: supervise.RssWatch | None = None  # while started: one memory reader for all workers
        self._gates: dict[int, MemoryGate] = {}  # per device index, with sizing_split (started pools only)
        self._closed = True
        self.restarts = 0

    # --- lifecycle ------------------------------------------------------------------------------
    def _env(self, index: int) -> dict[str, str]:
        env = self._box.env(index) if self._box is not None else dict(os.environ)
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # parallelism comes from the workers
        env["MALLOC_ARENA_MAX"] = "2"  # fewer glibc arenas: less virtual memory under RLIMIT_AS
        env["PYTHONFAULTHANDLER"] = "1"
        env[LOCK_DIR_ENV] = resolve_lock_dir()  # named here: a confined worker's temp folder is its scratch
        if PHASES_ENV in os.environ:  # a benchmark's control (the lock without timings as a phase): every worker alike
            env[PHASES_ENV] = os.environ[PHASES_ENV]
        if self.device == "cpu":
            threads = self.cfg.cpu_threads_per_worker or max(1, usable_cpus() // self.n_workers)
            for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPSYNTH_VERIFY_THREADS"):
                env[k] = str(threads)
        elif self.cfg.cuda_devices:
            env["CUDA_VISIBLE_DEVICES"] = str(self.cfg.cuda_devices[index % len(self.cfg.cuda_devices)])
        return env

    def _spawn(self, index: int) -> WorkerProcess:
        host_gb = self.limits.mem_limit_gb if self.device == "cpu" else self.cfg.cuda_host_mem_limit_gb
        assert self._tmp is not None
        env, cfg, request = self._env(index), self.cfg, None
        if self._box is not None:
            cfg, readable = self._lock_for(env)
            request = self._box.request(index, readable)
        return WorkerProcess(cfg, self.device, env, self._tmp, int(host_gb * 2**30), request, self._rss_watch)

    def _lock_for(self, env: dict[str, str]) -> tuple[VerifyConfig, list[str]]:
        """A confined worker's config and the lock file it must reach. Its TMPDIR is its scratch,
        so the pool names the lock folder, and creates the file: the worker sees that folder
        read-only and locks the file opened for reading (flock needs no write access)."""
        if not self.cfg.serialize_timing:
            return self.cfg, []
        path = device_lock_path(self.device, 0, env[LOCK_DIR_ENV], env)
        paths = lock_files(path)  # the timing lock and the memory lock's three files
        for p in paths:
            os.close(os.open(p, os.O_RDWR | os.O_CREAT, 0o644))
        return self.cfg, paths

    def start(self) -> "WorkerPool":
        if not self._closed:
            return self
        self._tmp = tempfile.mkdtemp(prefix="opsynth-verify-")
        if self.sandboxed:
            from .confine import Box

            self._box = Box.prepare(self._tmp, self.n_workers)
        self._rss_watch = supervise.RssWatch()
        self._slots = [self._spawn(i) for i in range(self.n_workers)]  # all start importing at once
        try:
            for w in self._slots:
                assert w is not None
                ready = w.wait_ready(self.cfg.startup_timeout_s)
                self.device_name = ready["device_name"]
                self.torch_version = ready["torch_version"]
                self.device_mem_mb = ready.get("device_mem_mb")
        except BaseException:
            self._closed = False
            self.close()
            raise
        if self.device == "cuda" and (self.cfg.sizing_split or self.cfg.split_by_source) and self.device_mem_mb:
            devices = self.cfg.cuda_devices or [0]
            usable = CUDA_USABLE * float(self.device_mem_mb) - self.sharers * CUDA_CONTEXT_MB
            self._gates = {d: MemoryGate(usable) for d in range(len(devices))}
        for i in range(self.n_workers):
            self._idle.put(i)
        self._executor = ThreadPoolExecutor(self.n_workers, thread_name_prefix="opsynth-verify")
        self._closed = False
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        for w in self._slots:
            if w is not None:
                w.close()
        self._slots = [None] * self.n_workers
        self._idle = queue.Queue()
        if self._rss_watch is not None:
            self._rss_watch.close()
            self._rss_watch = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
            self._box = None

    def __enter__(self) -> "WorkerPool":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _replace(self, index: int) -> None:
        """Kill the worker in this slot and start its successor (it warms up in the background;
        the next task on this slot waits for it)."""
        old = self._slots[index]
        if old is not None:
            old.close(grace=0.0)
        self._slots[index] = self._spawn(index)
        self.restarts += 1

    def _worker(self, index: int) -> WorkerProcess:
        w = self._slots[index]
        if w is None or w.proc.poll() is not None:
            self._replace(index)
            w = self._slots[index]
        assert w is not None
        try:
            w.wait_ready(self.cfg.startup_timeout_s)
        except Exception as exc:  # noqa: BLE001
            raise WorkerGone("worker_error", f"replacement worker failed to start: {exc}") from None
        return w

    # --- public API -----------------------------------------------------------------------------
    @property
    def sharers(self) -> int:
        """Workers of this pool on one device: on CUDA they take ``cuda_devices`` round-robin and
        hold their checks at once (`device_share`); on CPU each has its own address-space limit."""
        if self.device != "cuda":
            return 1
        return -(-self.n_workers // len(self.cfg.cuda_devices or [0]))

    @property
    def task_mem_budget_mb(self) -> float:
        """The memory one request may use here (`VerifyConfig.task_memory_budget_mb`): what sizing
        admits candidates against (opsynth.verify.sizing), so none is sent that cannot fit."""
        return self.cfg.task_memory_budget_mb(self.device, self.device_mem_mb, self.sharers)

    @property
    def budgets_mb(self) -> dict[str, float]:
        """The request budget of each source in `split_by_source` that it widens (none on CPU, or where
        the workers' own split is already that wide), and `task_mem_budget_mb` under "*": what sizing
        admits each candidate against (`budget_for`), and what the card names as wider."""
        out = {"*": self.task_mem_budget_mb}
        for source in self.cfg.split_by_source:
            mb = self.cfg.task_memory_budget_mb(self.device, self.device_mem_mb, self.sharers, source)
            if mb > out["*"]:
                out[source] = mb
        return out

    def alive(self) -> int:
        """How many worker processes are running now (a health check for callers and tests)."""
        return sum(1 for w in self._slots if w is not None and w.proc.poll() is None)

    def verify(self, source: str, go_compile: Callable[[dict[str, Any]], bool] | None = None,
               reserve_mb: float | None = None,
               go_timing: Callable[[dict[str, Any]], bool] | None = None) -> VerifyResult:
        """Verify one task; blocks until a worker is free. Never raises because of the task.

        reserve_mb: the device memory its requests are predicted to hold (sizing's prediction times
        the safety factor); with `sizing_split` the task waits until that fits beside the others'.

        go_compile: asked with the eager request's facts (`mode`, `signature`, `calls`, `eager_ms`)
        once the task passed its eager checks and band, before torch.compile; False stops the task
        there (`compile_skipped`, with those facts), so a caller that will reject it anyway (the
        generate pipeline: a semantic duplicate of a committed row) pays no compile for it.

        go_timing: asked the same way with the eager checks' facts (`mode`, `signature`, `calls`)
        once the checks passed, before the task's first timing (the part that holds the device to
        itself), from inside the worker's request; False stops the task there (`timing_skipped`,
        with those facts): a duplicate the caller can already name costs neither timing nor
        compile. Asked once per task (calibration's later timings do not ask again)."""
        if self._closed:
            raise RuntimeError("WorkerPool is not started; use it as a context manager")
        index = self._idle.get()
        try:
            gate = self._gates.get(index % max(1, len(self.cfg.cuda_devices or [0]))) if reserve_mb else None
            if gate is None:
                return self._verify_task(index, source, go_compile, go_timing)
            with gate.reserve(reserve_mb) as waited:
                result = self._verify_task(index, source, go_compile, go_timing)
            result.stage_s["memory_gate"] = waited
            return result
        finally:
            self._idle.put(index)

    def submit(self, source: str) -> "Future[VerifyResult]":
        if self._executor is None:
            raise RuntimeError("WorkerPool is not started; use it as a context manager")
        return self._executor.submit(self.verify, source)

    def measure_peaks(self) -> dict[str, Any]:
        """The device's measured peak rates (see ``Worker.peaks``); raises RuntimeError when the
        worker could not measure them."""
        if self._closed:
            raise RuntimeError("WorkerPool is not started; use it as a context manager")
        index = self._idle.get()
        try:
            reply = self._request(index, {"op": "peaks"})
        finally:
            self._idle.put(index)
        if not reply.get("ok"):
            raise RuntimeError(f"measuring the device's peak rates failed: {reply.get('evidence', {}).get('message')}")
        return {k: reply[k] for k in ("device", "tflops", "gbps", "gelems", "kernel_us")}

    def verify_many(self, sources: Iterable[str]) -> list[VerifyResult]:
        """Verify tasks concurrently, one per worker at a time; results in input order."""
        futures = [self.submit(s) for s in sources]
        return [f.result() for f in futures]

    # --- one task -------------------------------------------------------------------------------
    def _request(self, index: int, msg: dict[str, Any], *, on_ask=None) -> dict[str, Any]:
        """Send one request; replace the worker if it is gone or asked to be recycled. An
        out-of-memory reply on CUDA is retried once holding the device lock for the whole
        request, since other workers' allocations may have been the cause."""
        asked = time.time()
        w = self._worker(index)
        ready_wait = time.time() - asked  # a replacement worker still starting (stages.py: worker_restart)
        sent = time.monotonic()
        try:
            reply = w.request(msg, self.cfg.timeout_s, on_ask)
        except WorkerGone:
            self._replace(index)
            raise
        reply["ready_wait_s"], reply["round_trip_s"] = ready_wait, time.monotonic() - sent  # stages.py: pipes
        if reply.get("recycle"):
            self._replace(index)
        if (not reply.get("ok") and reply.get("reason") == "oom" and self.device == "cuda"
                and not msg.get("exclusive")):
            retry = self._request(index, {**msg, "exclusive": True}, on_ask=on_ask)
            for k in ("lock_wait_s", "ready_wait_s", "handle_s", "round_trip_s"):  # the stage accounting keeps both attempts
                retry[k] = float(retry.get(k) or 0.0) + float(reply.get(k) or 0.0)
            retry["sections"] = [*(reply.get("sections") or []), *(retry.get("sections") or [])]
            retry["graphs"] = int(retry.get("graphs") or 0) + int(reply.get("graphs") or 0)
            retry["compile_split"] = _summed([reply.get("compile_split") or {}, retry.get("compile_split") or {}])
            return retry
        return reply

    def _result(self, reason: str, source: str, t0: float, replies: list | None = None, **kw: Any) -> VerifyResult:
        elapsed = time.monotonic() - t0
        return VerifyResult(accepted=reason == ACCEPTED, reason=reason, source=source, device=self.device_name,
                            torch_version=self.torch_version, elapsed_s=elapsed,
                            stage_s=stage_seconds(replies or [], elapsed), gpu_sections=gpu_sections(replies or []),
                            device_sections=device_sections(replies or []),
                            timed=[t for _, rep in replies or () for t in rep.get("timed") or ()],
                            compiles=sum(op == "compile" for op, _ in replies or ()),
                            graphs=sum(int(rep.get("graphs") or 0) for _, rep in replies or ()),
                            compile_split=_summed([rep.get("compile_split") or {} for _, rep in replies or ()]), **kw)

    def _verify_task(self, index: int, source: str, go_compile=None, go_timing=None) -> VerifyResult:
        t0 = time.monotonic()
        first: WorkerGone | None = None
        for attempt in range(2 if self.cfg.retry_crashed else 1):
            try:
                result = self._run_checks(index, source, t0, go_compile, go_timing)
                break
            except WorkerGone as gone:
                if gone.reason == "crashed" and attempt == 0 and self.cfg.retry_crashed:
                    first = gone
                    continue
                evidence = dict(gone.evidence)
                if first is not None:
                    evidence["first_attempt"] = first.evidence
                result = self._result(gone.reason, getattr(gone, "source", source), t0, getattr(gone, "replies", None),
                                      calib_steps=getattr(gone, "calib_steps", 0), evidence=evidence,
                                      **getattr(gone, "facts", {}))
                break
            except Exception as exc:  # noqa: BLE001 - a verifier bug must not take the pipeline down
                import traceback

                result = self._result("worker_error", source, t0, evidence={
                    "message": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]})
                break
        w = self._slots[index]
        if w is not None:
            w.tasks_done += 1
            if w.tasks_done >= self.cfg.max_tasks_per_worker:
                self._replace(index)
        return result

    def _run_checks(self, index: int, source: str, t0: float, go_compile=None, go_timing=None) -> VerifyResult:
        cfg, lim = self.cfg, self.limits
        lo_ms, hi_ms = cfg.accept_window(self.device)
        cap = lim.mem_cap_gb * 2**30
        src, steps, target = source, 0, None
        history: list[dict[str, Any]] = []
        replies: list[tuple[str, dict[str, Any]]] = []  # what each request took (stages.stage_seconds)
        facts: dict[str, Any] = {}  # the eager checks' facts, once they passed (also on a compile request's death)

        answered = go_timing is None  # asked once: calibration's later eager requests time without asking

        def on_ask(f: dict[str, Any]) -> bool:
            nonlocal answered
            answered = True
            return go_timing(f)

        def ask(op: str, **extra: Any) -> dict[str, Any]:
            asking = op == "eager" and not answered
            try:
                msg = {"op": op, "source": src, **extra}
                rep = (self._request(index, {**msg, "ask": True}, on_ask=on_ask) if asking
                       else self._request(index, msg))
            except WorkerGone as gone:
                gone.evidence.update(stage=op, history=history)
                gone.source, gone.calib_steps, gone.replies = src, steps, replies  # type: ignore[attr-defined]
                gone.facts = facts  # type: ignore[attr-defined]
                raise
            replies.append((op, rep))
            return rep

        def reject(reason: str, evidence: dict[str, Any], **kw: Any) -> VerifyResult:
            evidence = {**evidence, "history": history}
            if target is not None:
                evidence["target_ms"] = target
            return self._result(reason, src, t0, replies, calib_steps=steps, evidence=evidence, **kw)

        while True:
            rep = ask("eager")
            batch = read_batch_size(src)
            if not rep["ok"] and rep["reason"] == TIMING_SKIPPED:  # go_timing said stop: its facts, untimed
                ev = rep["evidence"]
                return reject(TIMING_SKIPPED, {"stage": "timing", "message": ev.get("message")},
                              **{k: ev.get(k) for k in ("mode", "signature", "calls")})
            if not rep["ok"]:
                ev = {"stage": "eager", **rep["evidence"]}
                peak = rep["evidence"].get("peak_mem_mb")
                # Too big for the memory cap: shrink the batch (calibration applies to memory too).
                if (rep["reason"] == "mem_cap" and cfg.calibrate and batch and batch > 1 and peak
                        and steps < cfg.max_calib_steps):
                    new = max(1, min(batch - 1, int(batch * 0.8 * cap / (peak * 2**20))))
                    history.append({"batch_size": batch, "peak_mem_mb": peak, "reason": "mem_cap"})
                    src, steps = set_batch_size(src, new), steps + 1
                    continue
                return reject(rep["reason"], ev, peak_mem_mb=peak, **facts)  # facts: an earlier batch size passed the checks
            eager_ms, peak_mb = rep["eager_ms"], rep["peak_mem_mb"]
            # The checks passed: the forward's facts go with a band rejection too (the generate committer
            # decides semantic duplicates before the band's verdict, as go_timing does).
            facts.update(mode=rep.get("mode"), signature=rep.get("signature"), calls=rep.get("calls"))
            history.append({"batch_size": batch, "eager_ms": eager_ms, "peak_mem_mb": peak_mb,
                            "request_peak_mem_mb": rep.get("request_peak_mem_mb"), "timings": rep.get("timings")})
            if lo_ms <= eager_ms <= hi_ms or not cfg.check_band:
                break
            band = "too_fast" if eager_ms < lo_ms else "too_slow"
            ev = {"stage": "band", "eager_ms": eager_ms,
                  "message": f"eager {eager_ms:.4g} ms outside the acceptance window [{lo_ms:.4g}, {hi_ms:.4g}] ms "
                             f"(band [{lim.min_ms}, {lim.max_ms}] ms less its edge margins)"}
            if not cfg.calibrate:
                return reject(band, ev, eager_ms=eager_ms, peak_mem_mb=peak_mb, **facts)
            if batch is None:
                return reject(band, {**ev, "calibration": "no module-level batch_size to rescale"},
                              eager_ms=eager_ms, peak_mem_mb=peak_mb, **facts)
            if steps >= cfg.max_calib_steps:
                return reject(band, {**ev, "calibration": f"still outside after {steps} steps"},
                              eager_ms=eager_ms, peak_mem_mb=peak_mb, **facts)
            if target is None:
                target = draw_target_ms(source, cfg, lim.min_ms, lim.max_ms)
            new = next_batch_size(batch, eager_ms, target, peak_mb * 2**20, cap)
            if new == batch:
                why = "batch_size is 1" if band == "too_slow" else "the memory cap allows no larger batch_size"
                return reject(band, {**ev, "calibration": why}, eager_ms=eager_ms, peak_mem_mb=peak_mb, **facts)
            src, steps = set_batch_size(src, new), steps + 1

        evidence: dict[str, Any] = {"history": history, "outputs": rep.get("outputs"),
                                    "timed_runs": rep.get("timed_runs"), "timings": rep.get("timings"),
                                    "clock": rep.get("clock")}
        if target is not None:
            evidence["target_ms"] = target
        compile_ms = None
        facts.update(mode=rep.get("mode"), signature=rep.get("signature"), calls=rep.get("calls"))
        if cfg.check_compile and go_compile is not None and not go_compile({**facts, "eager_ms": eager_ms}):
            return reject("compile_skipped", {"stage": "compile", "message": "the caller stopped it before torch.compile"},
                          eager_ms=eager_ms, peak_mem_mb=peak_mb, **facts)
        if cfg.check_compile:
            crep = ask("compile", mode=facts["mode"])
            if not crep["ok"]:
                return reject(crep["reason"], {"stage": "compile", **crep["evidence"]},
                              eager_ms=eager_ms, peak_mem_mb=peak_mb, **facts)
            compile_ms = crep["compile_ms"]
            evidence["compile_s"] = crep["compile_s"]
            evidence["compile_backend"] = cfg.compile_backend
        return self._result(ACCEPTED, src, t0, replies, eager_ms=eager_ms, compile_ms=compile_ms, peak_mem_mb=peak_mb,
                            calib_steps=steps, evidence=evidence, **facts)
