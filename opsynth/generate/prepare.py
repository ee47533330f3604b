"""The candidate stages before verification (sample, size, render, the KernelBench check) in
processes of their own (`opsynth.generate.prepare_server`); this module is the asking side.

Why: `process_candidate` runs in a Dask worker's threads, which share one GIL with everything else
that process does for its candidates (the verify pool's pipes and memory watch, Dask itself). On a
GPU most sampled candidates are rejected at sizing (`predicted_oom`, `too_fast`: 56 % with an H200
shared by 16 verifier workers, `benchmarks/parent_stages.py`), so 200 accepted rows a minute ask that
process to sample and size 450 to 1,700 candidates a minute at about 27 ms of CPU each: most of its
one core. On the 2026-12-06 H100 windows, sizing per accepted row doubled from 14 to 16 verifier
workers (0.47 -> 0.94 s) while the rate moved 1.5 %.

Subprocesses and the verifier's pipe protocol (`opsynth.verify.protocol`) rather than
multiprocessing, for the reason the verifier's workers give: Dask's worker processes are daemonic
and may not have multiprocessing children. These processes run trusted code only (our sampler and
the cost model on meta tensors, never a task), need no GPU, and send back the plain fields the later
stages read (`candidate.PREPARED`, handed in as `fields`: this module imports no stage, so the stages
may import it), the same whichever process prepared them: a candidate a
preparing process could not serve (it died, or did not answer in time) is prepared in the asking
process instead, so rows never depend on where they were prepared.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from opsynth.runtime import supervise
from opsynth.verify import protocol

# Seconds one candidate may take to prepare before its process is replaced (sampling and sizing take
# milliseconds; a replay that hangs is a bug, and the candidate is then prepared in the asking process).
PREPARE_TIMEOUT_S = 300.0
# Seconds a preparing process may take to import torch, the catalog and the KernelBench index.
STARTUP_TIMEOUT_S = 600.0
# Preparing processes that failed to start, one after another, before the asking process stops
# starting them and prepares every candidate itself (a broken environment would otherwise cost a
# process start per candidate).
MAX_FAILED_STARTS = 3


def default_processes(device: str) -> int:
    """Preparing processes when `prepare_processes` is unset: 2 on CUDA (two cores take what one GIL
    could not; the machine's other cores serve the verifier), none on CPU, where the verifier's
    workers already use every core and candidates come slowly."""
    return 2 if device == "cuda" else 0


class SizingPool:
    """What the `size` stage reads of the verify pool (its device and the memory one request may use,
    by source: `WorkerPool.budgets_mb`), for a process that sizes without one: a preparing process, a benchmark."""

    def __init__(self, device: str, budget_mb: float, budgets_mb: dict[str, float] | None = None):
        self.device, self.task_mem_budget_mb = device, budget_mb
        self.budgets_mb = {"*": budget_mb, **(budgets_mb or {})}


def budget_for(pool, source: str | None) -> float:
    """The memory one request of a candidate from `source` may use on `pool` (its `budgets_mb`)."""
    return float(pool.budgets_mb.get(source, pool.budgets_mb["*"]))


class _Process:
    """One preparing process and its pipes."""

    def __init__(self, config: dict[str, Any]):
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        env = dict(os.environ)
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["CUDA_VISIBLE_DEVICES"] = ""  # meta tensors only: no CUDA context, no GPU memory
        env["OMP_NUM_THREADS"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "opsynth.generate.prepare_server", "--req-fd", str(req_r), "--resp-fd", str(resp_w),
             "--config", json.dumps(config)],
            pass_fds=(req_r, resp_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
            start_new_session=True)
        os.close(req_r)
        os.close(resp_w)
        self.reader = protocol.Reader(self.resp_r)
        self.ready = False

    def wait(self, timeout: float) -> dict[str, Any]:
        """The next message, or ProtocolClosed / ProtocolTimeout."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.reader.poll(min(1.0, max(0.0, deadline - time.monotonic())))
            if msg is not None:
                return msg
            if self.proc.poll() is not None:
                raise protocol.ProtocolClosed(f"preparing process exited with code {self.proc.returncode}")
            if time.monotonic() >= deadline:
                raise protocol.ProtocolTimeout(f"no answer within {timeout:.0f} s")

    def close(self) -> None:
        supervise.kill_group(self.proc.pid)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self.req_w, self.resp_r):
            try:
                os.close(fd)
            except OSError:
                pass


class Preparers:
    """`n` preparing processes shared by a Dask worker's threads (see the module docstring)."""

    def __init__(self, n: int, sampler_cfg: dict, verify_cfg: dict, dedup_cfg: dict, kb_check: bool, device: str,
                 fields: tuple[str, ...]):
        """`fields`: the candidate fields an answer fills (`candidate.PREPARED`)."""
        if n < 1:
            raise ValueError(f"prepare_processes must be >= 1 here, got {n}")
        self.config = {"sampler": sampler_cfg, "verify": verify_cfg, "dedup": dedup_cfg, "kb_check": kb_check,
                       "device": device}
        self.n, self.fields = n, tuple(fields)
        self.replaced = 0
        self.fallbacks = 0
        self.failed_starts = 0  # in a row; MAX_FAILED_STARTS of them turn the processes off
        self.disabled = False
        self._lock = threading.Lock()
        self._slots = [_Process(self.config) for _ in range(n)]  # they import while the verify pool starts
        self._idle: queue.Queue[int] = queue.Queue()
        for i in range(n):
            self._idle.put(i)

    def prepare(self, cand, budgets_mb: dict[str, float], here: Callable[[], bool]) -> bool:
        """Run the stages before verification for `cand` in a preparing process and fill its plain
        fields from the answer; on a process that fails, replace it and call `here` (the same stages
        in the asking process) instead. False when a stage rejected the candidate."""
        if self.disabled:
            return here()
        t0 = time.perf_counter()
        i = self._idle.get()
        waited = time.perf_counter() - t0
        answer = None
        try:
            answer = self._ask(i, {"index": cand.index, "seed": cand.seed, "budgets_mb": budgets_mb})
        finally:
            self._idle.put(i)
        if answer is None:  # the process failed (replaced): prepare here, the same way
            with self._lock:
                self.fallbacks += 1
            return here()
        if "error" in answer:  # a stage raised there: it would have raised here too
            raise RuntimeError(f"preparing candidate {cand.index} (seed {cand.seed}) failed: {answer['error']}")
        for name in self.fields:
            if name == "stage_s":
                cand.stage_s.update(answer[name])  # beside the asking process's worker_start
            else:
                setattr(cand, name, answer[name])
        # The round trip less the stages' own time: waiting for a free process, the pipes, the JSON.
        inner = sum(answer["stage_s"].values())
        cand.stage_s["prepare_wait"] = waited + max(0.0, time.perf_counter() - t0 - waited - inner)
        return answer["reason"] is None

    def _ask(self, i: int, msg: dict[str, Any]) -> dict[str, Any] | None:
        p = self._slots[i]
        try:
            if not p.ready:
                try:
                    got = p.wait(STARTUP_TIMEOUT_S)
                except (protocol.ProtocolClosed, protocol.ProtocolTimeout) as e:
                    got = {"event": "failed", "error": str(e)}
                if got.get("event") != "ready":
                    with self._lock:
                        self.failed_starts += 1
                        if self.failed_starts >= MAX_FAILED_STARTS and not self.disabled:
                            self.disabled = True
                            sys.stderr.write(f"opsynth.generate.prepare: {self.failed_starts} preparing processes failed "
                                             f"to start (last: {got.get('error', got)}); candidates are prepared in "
                                             "the Dask worker's threads from now on\n")
                    raise protocol.ProtocolClosed(f"preparing process failed to start: {got.get('error', got)}")
                p.ready = True
                with self._lock:
                    self.failed_starts = 0
            protocol.send(p.req_w, msg)
            return p.wait(PREPARE_TIMEOUT_S)
        except (protocol.ProtocolClosed, protocol.ProtocolTimeout, OSError) as e:
            sys.stderr.write(f"opsynth.generate.prepare: replacing a preparing process ({e})\n")
            p.close()
            if not self.disabled:
                self._slots[i] = _Process(self.config)
            with self._lock:
                self.replaced += 1
            return None

    def close(self) -> None:
        for p in self._slots:
            try:
                protocol.send(p.req_w, {"op": "exit"})
            except OSError:
                pass
            p.close()
