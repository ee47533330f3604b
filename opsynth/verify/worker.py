"""A warm verifier worker: ``python -m opsynth.verify.worker --req-fd R --resp-fd W --config JSON``.

Started by :class:`opsynth.verify.pool.WorkerPool` with ``subprocess.Popen`` (not
``multiprocessing``: the pool lives inside daemonic Dask workers, which may not fork
multiprocessing children). It imports torch once, initialises CUDA once, then serves requests one
at a time over the protocol pipes; fd 1 and 2 belong to task code (the parent drains them and
keeps only a tail), so printing cannot corrupt the protocol.

Requests: ``{"op": "eager", "source": ...}`` runs the eager checks and times the task;
``{"op": "compile", "source": ...}`` compiles it and compares and times the compiled model;
``{"op": "peaks"}`` measures the device's peak rates (recorded by the pipeline, once per run).
Replies: ``{"event": "reply", "ok": bool, "reason": ..., "evidence": {...}, "recycle": bool,
"graphs": int (graphs Dynamo compiled for the request), "compile_split": {dynamo_s, backend_s,
share_wait_s}, ...}``;
``{"event": "pause", "kind": "lock" | "import"}`` and ``{"event": "resume"}`` bracket time the
worker spends waiting for the shared timing lock or importing the compiler stack, which does not
count against the task's timeout. An eager request with ``"ask": true`` sends
``{"event": "ask", "mode", "signature", "calls"}`` once its checks passed and reads
``{"op": "go", "go": bool}`` before it times the task; ``go`` false ends it as ``timing_skipped``
(the parent's caller can already name it a duplicate).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

from . import protocol
from .compile_aside import CompileAside
from .config import CUDA_USABLE, VerifyConfig
from .result import TIMING_SKIPPED
from opsynth.runtime.device_lock import HeldShare
from opsynth.runtime.timing import cpu_clock, device_lock_path, file_lock, timed_median

# Reasons after which the worker's state cannot be trusted (a poisoned CUDA context, a task that
# meant to exit, a verifier bug): the parent replaces the worker. A failed allocation leaves the
# process intact (RLIMIT_AS or the CUDA caching allocator refused it), so "oom" does not recycle.
RECYCLE_REASONS = {"cuda_error", "exit_called", "worker_error"}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _freeze_survivors() -> None:
    """Collect, then move every surviving object into the permanent generation (`gc.freeze`), so
    later collections traverse only what tasks created. With torch's compiler stack imported a full
    collection walks ~400,000 objects (0.6 s on a loaded 2-core machine), and the worker collects
    after every request; frozen, it takes milliseconds. Called at start-up and once after the first
    compile (which imports inductor's code generators): both leave only long-lived module state,
    never a task's objects, which are dropped and collected before the freeze."""
    gc.collect()
    gc.freeze()


def _graphs_compiled() -> int:
    """Graphs Dynamo compiled in this process so far (its `unique_graphs` counter, which
    `torch._dynamo.reset()` leaves alone): a compile request's difference says how many graphs one
    candidate cost (graph breaks and recompiles each add one)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _compile_seconds() -> tuple[float, float]:
    """Seconds Dynamo spent compiling frames in this process so far, and the part of them its backend
    took (AOTAutograd and inductor: lowering, code generation, kernel builds), from torch's own
    `compilation_time_metrics`: what a compile request's section spent compiling, apart from its
    reference forwards, compiled calls, comparisons and the wait for its memory share."""
    if "torch._dynamo" not in sys.modules:
        return 0.0, 0.0
    from torch._dynamo.utils import compilation_time_metrics as m

    return sum(m.get("_compile.compile_inner", ())), sum(m.get("OutputGraph.call_user_compiler", ()))


def _watch_parent(req_fd: int) -> None:
    """Exit when the parent goes away, even if task code is spinning in the main thread: it is
    reparented, or the request pipe's other end closed (all a confined worker can see: it is PID 1
    of its own namespace and its parent, outside it, reads as pid 0)."""
    import select

    parent = os.getppid()
    hangup = select.poll()
    hangup.register(req_fd, 0)  # no events asked: only POLLHUP / POLLERR / POLLNVAL come back
    while True:
        if hangup.poll(1000) or os.getppid() != parent:
            os._exit(3)


class MemoryProbe:
    """Peak memory a task adds: CUDA allocator peak on the GPU, RSS high-water mark on CPU (reset
    through /proc/self/clear_refs, so each task is measured on its own)."""

    def __init__(self, device: str):
        self.device = device
        self.base = 0

    def start(self) -> None:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            # Hand freed heap pages back to the kernel first: otherwise a task reuses memory the
            # previous (larger) one left in malloc's free lists and its growth reads as zero.
            gc.collect()
            _malloc_trim()
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass
            self.base = _status_kb("VmRSS") * 1024

    def peak_bytes(self) -> int:
        import torch

        if self.device.startswith("cuda"):
            return max(0, torch.cuda.max_memory_allocated() - self.base)
        return max(0, _status_kb("VmHWM") * 1024 - self.base)


class Worker:
    def __init__(self, cfg: VerifyConfig, resp_fd: int, req_fd: int | None = None):
        import torch

        self.torch = torch
        self.cfg = cfg
        self.resp_fd, self.req_fd = resp_fd, req_fd
        self._ask = False  # this request asks the parent before timing (its "ask")
        want = cfg.device
        if want == "auto":
            want = "cuda" if torch.cuda.is_available() else "cpu"
        if want == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but no GPU is visible")
        self.device = "cuda" if want.startswith("cuda") else "cpu"
        self.limits = cfg.limits(self.device)
        if self.device == "cuda":
            torch.cuda.init()
            torch.zeros(1, device="cuda")
            total = torch.cuda.get_device_properties(0).total_memory
            frac = min(CUDA_USABLE, self.limits.mem_limit_gb * 2**30 / total)
            self.device_mem_mb = total / 2**20
            torch.cuda.set_per_process_memory_fraction(frac)
            self.device_name = torch.cuda.get_device_name(0)
        else:
            threads = cfg.cpu_threads_per_worker or int(os.environ.get("OPSYNTH_VERIFY_THREADS", "1"))
            torch.set_num_threads(max(1, threads))
            self.device_name = "cpu"
            self.device_mem_mb = None
        self.lock_file = device_lock_path(self.device, 0) if cfg.serialize_timing else None  # the pool set its folder
        self._lock_depth = 0
        self._share: HeldShare | None = None
        # What this request spent where: [kind, start, end] in wall-clock seconds (comparable across
        # the processes of one host), kinds "checks", "compile", "timing"; and the lock wait.
        self.sections: list[list] = []
        self.lock_wait_s = 0.0
        self.timed: list[dict] = []  # each timing of this request: runs, why it stopped (the reply's `timed`)
        self._compiling = False
        self._aside = CompileAside()
        if cfg.preload_compiler:  # once per worker, rather than inside the first task's timeout
            import torch._dynamo  # noqa: F401
            import torch._inductor.compile_fx  # noqa: F401

        if self.device == "cpu":
            self._limit_address_space()
        self._frozen_after_compile = False
        self._compile_base = (0.0, 0.0)  # _compile_seconds() at the start of this request's compiles
        _freeze_survivors()

    def _limit_address_space(self) -> None:
        """RLIMIT_AS = what torch already maps + the per-worker limit. (Not on CUDA: the driver
        reserves a huge virtual range; there the device cap and the parent's RSS watchdog hold.)"""
        import resource

        limit = _status_kb("VmSize") * 1024 + int(self.limits.mem_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    # --- the shared timing lock (re-entrant within this process) ------------------------------
    @contextmanager
    def timing_lock(self) -> Iterator[None]:
        if self._lock_depth or self.lock_file is None:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        with file_lock(self.lock_file, **self._lock_wait_events()):
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1

    def memory_share(self, exclusive: bool):
        """On CUDA, the device's memory for this request: shared with the other workers' requests,
        or whole for a request retried after running out of GPU memory beside them
        (`opsynth.runtime.device_lock.HeldShare`, kept as `self._share` so that timing can let it
        go). Off on CPU (each worker has its own address-space limit) and without the shared lock folder."""
        if self.device != "cuda" or self.lock_file is None:
            return nullcontext()
        self._share = HeldShare(self.lock_file, exclusive, **self._lock_wait_events())
        return self._share

    def _timing_hold(self):
        """What a timed call holds: with a shared memory share (CUDA), the device to itself
        (`HeldShare.timing`: no other worker's checks beside it, `verify.quiet_timing`); else the
        timing lock (re-entrant: a request holding the memory whole holds it already)."""
        share = self._quiet_share()
        return share.timing() if share is not None else self.timing_lock()

    def _compiling_aside(self):
        """The first torch.compile'd call with the memory share let go while Dynamo and inductor
        generate code, and held for every launch (`opsynth.verify.compile_aside`), with quiet
        timing on: otherwise every timing section waits for the compiles in progress."""
        share = self._quiet_share()
        if share is None or not self._aside.install():
            return nullcontext()
        return self._aside.armed(share)

    def _quiet_share(self) -> HeldShare | None:
        """This request's memory share when quiet timing may let it go (held, and not whole)."""
        share = self._share
        if self.cfg.quiet_timing and share is not None and share.held and not share.exclusive:
            return share
        return None

    def _lock_wait_events(self) -> dict:
        """Tell the parent when a lock wait starts and ends, so the wait does not count against the
        request's timeout (either lock: timing or memory)."""
        return {"on_wait": lambda: protocol.send(self.resp_fd, {"event": "pause", "kind": "lock"}),
                "on_acquired": lambda: protocol.send(self.resp_fd, {"event": "resume"})}

    def _time(self, fn, since: float, far: tuple[float, float] | None = None) -> tuple[float, int]:
        """Median of ``fn`` and its timed runs (`opsynth.runtime.timing.timed_median`: repeats stop
        once the median is precise to ``timing_rel_tol``, or at the cap or the time budget; with
        ``far``, after ``far_samples`` that all read beyond it). The time from ``since`` to here is
        recorded as the request's checks (or compile) section, the timed runs as its timing section,
        and what the timing took in ``self.timed`` (the reply's ``timed``)."""
        c = self.cfg
        asked = time.time()
        self.sections.append(["compile" if self._compiling else "checks", since, asked])
        with self._timing_hold():
            start = time.time()
            self.lock_wait_s += start - asked
            try:
                t = timed_median(fn, self.device, c.warmup, c.repeats, c.min_repeats, c.timing_budget_ms,
                                 c.timing_rel_tol, far if c.far_samples > 0 else None, c.far_samples)
            finally:
                self.sections.append(["timing", start, time.time()])
        self.timed.append({"op": "compile" if self._compiling else "eager", "ms": t.ms, "runs": t.runs,
                           "warmup": t.warmup, "stop": t.stop, "spent_ms": round(t.spent_ms, 3)})
        return t.ms, t.runs

    def _time_eager(self, fn, since: float) -> tuple[float, int, list[float]]:
        """The eager median; one that lands within ``recheck_zone`` of an edge of the acceptance
        window is timed again, ``recheck_timings`` timings in all, and their median is the answer
        (one unlucky timing does not decide a row near an edge). Beyond that zone the row is
        rejected whatever the median's precision, so a timing whose first samples all read there
        stops on them (`_time`'s ``far``; not with ``check_band`` off)."""
        import statistics

        lo, hi = self.cfg.accept_window(self.device)
        z = self.cfg.recheck_zone
        far = (lo / z, hi * z) if self.cfg.check_band else None
        t, n = self._time(fn, since, far=far)
        timings = [t]
        if lo / z <= t <= lo * z or hi / z <= t <= hi * z:
            for _ in range(self.cfg.recheck_timings - 1):
                timings.append(self._time(fn, time.time(), far=far)[0])
        return statistics.median(timings), n, timings

    # --- requests -------------------------------------------------------------------------------
    def eager(self, source: str) -> dict[str, Any]:
        from opsynth.render.task_file import gradient_labels, grad_outputs, parameter_names, task_step

        from . import checks as C

        torch, dev, c = self.torch, self.device, self.cfg
        t_request = time.time()
        kind = C.read_kind(source)
        tol = C.kind_tolerance(kind, c)
        mod = C.load_task(source)
        probe = MemoryProbe(dev)
        probe.start()
        model = C.build_model(mod, dev)
        inputs = C.make_inputs(mod, dev, C.SEED_INPUTS)
        out1 = C.flat_tensors(C.forward(model, inputs, dev))
        step = labels = None
        if kind.backward:  # the step's memory (saved activations, gradients) counts toward the cap
            names = parameter_names(model)
            step, labels = task_step(model, kind, len(inputs), names), gradient_labels(inputs, names)
            n_out = len(out1)
            g1 = grad_outputs(out1, C.SEED_INPUTS)
            step1 = C.run_step(step, [*inputs, *g1], dev)
        peak = probe.peak_bytes()
        C.check_outputs_exist(out1)
        cap = self.limits.mem_cap_gb * 2**30
        if peak > cap:
            raise C.Reject("mem_cap", f"peak memory {peak / 2**30:.2f} GB above cap {self.limits.mem_cap_gb} GB",
                           peak_mem_mb=peak / 2**20)
        if kind.dtype != "float32":
            C.check_precision(model, inputs, out1, kind)
        C.check_finite(out1, "first")
        C.check_not_constant(out1)
        inputs_b = C.make_inputs(mod, dev, C.SEED_INPUTS_ALT)
        C.check_inputs_vary(inputs, inputs_b)
        # The task's mode, and what its forward reads and calls in that mode (two watched forwards).
        mode, trace = C.choose_mode(model, inputs, tol.atol, tol.rtol)
        C.check_state_used(model, trace)
        if mode != "train":  # out1 ran as constructed (train mode): the checks below are the mode's
            del out1
            out1 = C.flat_tensors(C.forward(model, inputs, dev))
            C.check_finite(out1, "first")
            C.check_not_constant(out1)
        out2 = C.flat_tensors(C.forward(model, inputs, dev))
        C.check_deterministic(out1, out2, tol.det_atol, tol.det_rtol)
        del out2
        out_b = C.flat_tensors(C.forward(model, inputs_b, dev))
        C.check_finite(out_b, "second")
        C.check_input_sensitive(out1, out_b, tol.atol, tol.rtol)
        args = inputs
        if kind.backward:  # gradients exist, are finite, deterministic and input-sensitive (in the mode)
            if mode != "train":
                step1 = C.run_step(step, [*inputs, *g1], dev)
            grads1 = C.check_gradients(step1[n_out:], labels, "first")
            grads2 = C.run_step(step, [*inputs, *g1], dev)[n_out:]
            C.check_deterministic(grads1, C.check_gradients(grads2, labels, "first"), tol.det_atol, tol.det_rtol)
            args = [*inputs, *g1]
            grads_b = C.check_gradients(C.run_step(step, [*inputs_b, *grad_outputs(out_b, C.SEED_INPUTS_ALT)], dev)[n_out:],
                                        labels, "second")
            C.check_gradients_sensitive(grads1, grads_b, labels, tol.atol, tol.rtol)
            del step1, grads1, grads2, grads_b
        spec = C.output_spec(out1)
        del out_b, inputs_b, out1
        call = step if step is not None else model

        def run() -> None:
            with torch.no_grad():
                call(*args)

        signature, calls = C.kind_signature(trace.signature(), kind), trace.op_names()
        if self._ask:
            self._go_timing(mode=mode, signature=signature, calls=calls)
        try:
            eager_ms, n, timings = self._time_eager(run, t_request)
        except BaseException as exc:  # noqa: BLE001
            raise C.classify(exc, "eager_error") from None
        clock = "cuda_events" if dev == "cuda" else cpu_clock()[0]
        # The whole request's high-water mark (checks and timing: both input sets, the outputs the
        # checks keep, the clones): what a memory limit meets, against `peak` (the first forward,
        # the acceptance cap's measure). Sizing's admission is checked against it (verify/sizing.py).
        request_peak = max(peak, probe.peak_bytes())
        return {"eager_ms": eager_ms, "timed_runs": n, "timings": timings, "clock": clock,
                "peak_mem_mb": peak / 2**20, "request_peak_mem_mb": request_peak / 2**20, "outputs": spec, "mode": mode,
                "signature": signature, "calls": calls}

    def _go_timing(self, **facts: Any) -> None:
        """Ask the parent whether to time this task (the eager checks passed; `facts` name its
        forward); raise `timing_skipped` with the facts when it says no."""
        from . import checks as C

        self._ask = False
        protocol.send(self.resp_fd, {"event": "ask", **facts})
        answer = protocol.recv(self.req_fd)
        if answer.get("op") != "go":
            raise RuntimeError(f"expected the parent's answer to an ask, got {answer.get('op')!r}")
        if not answer.get("go", True):
            raise C.Reject(TIMING_SKIPPED, "the caller stopped it before its first timing", **facts)

    def compile(self, source: str, mode: str | None = None) -> dict[str, Any]:
        from opsynth.render.task_file import grad_outputs, parameter_names, set_mode, task_step

        from . import checks as C

        torch, dev, c = self.torch, self.device, self.cfg
        if "torch._inductor.compile_fx" not in sys.modules:
            protocol.send(self.resp_fd, {"event": "pause", "kind": "import"})
            import torch._dynamo  # noqa: F401
            import torch._inductor.compile_fx  # noqa: F401

            protocol.send(self.resp_fd, {"event": "resume"})
        t_request = time.time()
        torch._dynamo.reset()
        self._compile_base = _compile_seconds()
        kind = C.read_kind(source)
        tol = C.kind_tolerance(kind, c)
        mod = C.load_task(source)
        model = C.build_model(mod, dev)
        set_mode(model, mode)  # the mode the eager request chose
        inputs = C.make_inputs(mod, dev, C.SEED_INPUTS)
        inputs_b = C.make_inputs(mod, dev, C.SEED_INPUTS_ALT)
        ref = C.flat_tensors(C.forward(model, inputs, dev))
        ref_b = C.flat_tensors(C.forward(model, inputs_b, dev))
        if kind.backward:  # forward and gradients, eager against compiled, on the same grad_outputs
            names, n_in = parameter_names(model), len(inputs)
            inputs = [*inputs, *grad_outputs(ref, C.SEED_INPUTS)]
            inputs_b = [*inputs_b, *grad_outputs(ref_b, C.SEED_INPUTS_ALT)]
            eager_step = task_step(model, kind, n_in, names)
            ref, ref_b = C.run_step(eager_step, inputs, dev), C.run_step(eager_step, inputs_b, dev)
        try:
            compiled = torch.compile(model, backend=c.compile_backend, mode=c.compile_mode)
            call = task_step(compiled, kind, n_in, names, owner=model) if kind.backward else compiled
        except BaseException as exc:  # noqa: BLE001
            raise C.classify(exc, "compile_error") from None

        def outputs(args):
            if kind.backward:
                return C.run_step(call, args, dev, default="compile_error")
            return C.flat_tensors(C.forward(call, args, dev, default="compile_error"))

        t0 = time.perf_counter()
        with self._compiling_aside():
            out = outputs(inputs)
            compile_s = time.perf_counter() - t0  # not the wait to take the share again
        for label, got, want in (("first", out, ref), ("second", None, ref_b)):
            if got is None:
                got = outputs(inputs_b)
            if not C.close(got, want, tol.atol, tol.rtol):
                raise C.Reject("compile_mismatch", f"compiled output differs from eager on {label} inputs",
                               max_abs_diff=C.max_diff(got, want), atol=tol.atol, rtol=tol.rtol)
        del out, ref, ref_b, inputs_b

        def run() -> None:
            with torch.no_grad():
                call(*inputs)

        try:
            compile_ms, n = self._time(run, t_request)
        except BaseException as exc:  # noqa: BLE001
            raise C.classify(exc, "compile_error") from None
        return {"compile_ms": compile_ms, "compile_s": compile_s, "timed_runs": n}

    def peaks(self) -> dict[str, Any]:
        """What this device does per second, in the cost model's units (opsynth.graph.cost.Rates):
        an fp32 matmul (FLOP/s), a copy (bytes/s), exp over a large tensor (elements/s) and a
        one-element add (the fixed cost of one eager kernel call). Measured once per run and
        recorded next to the reference rates; sizes do not depend on it."""
        torch, dev = self.torch, self.device
        big = dev == "cuda"
        n_mm = 4096 if big else 512
        n_copy = (1 << 28) if big else (1 << 24)  # elements: 1 GB on the GPU, 64 MB on the CPU
        with torch.device(dev):
            a, b = torch.randn(n_mm, n_mm), torch.randn(n_mm, n_mm)
            src = torch.randn(n_copy)
            dst = torch.empty_like(src)
            one = torch.zeros(1)
        with torch.no_grad():
            mm_ms = self._time(lambda: torch.mm(a, b), time.time())[0]
            copy_ms = self._time(lambda: dst.copy_(src), time.time())[0]
            exp_ms = self._time(lambda: torch.exp(src, out=dst), time.time())[0]
            calls = 100

            def tiny() -> None:
                for _ in range(calls):
                    one.add_(1.0)

            tiny_ms = self._time(tiny, time.time())[0]
        return {"device": self.device_name, "tflops": 2 * n_mm**3 / (mm_ms * 1e-3) / 1e12,
                "gbps": 2 * src.numel() * 4 / (copy_ms * 1e-3) / 1e9,
                "gelems": src.numel() / (exp_ms * 1e-3) / 1e9, "kernel_us": tiny_ms * 1e3 / calls}

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        from . import checks as C

        op = msg.get("op")
        reply: dict[str, Any]
        self.sections, self.lock_wait_s, self._compiling = [], 0.0, op == "compile"
        self.timed = []
        self._ask = bool(msg.get("ask")) and self.req_fd is not None
        self._share = None  # memory_share sets it for this request
        started = entered = time.time()
        graphs_before, wait_before = _graphs_compiled(), self._aside.wait_s
        self._compile_base = _compile_seconds()  # compile() takes it again after torch._dynamo.reset(), which clears them
        try:
            exclusive = bool(msg.get("exclusive"))
            with self.memory_share(exclusive), (self.timing_lock() if exclusive else nullcontext()):
                waited = time.time() - started  # the memory lock's wait, and the timing lock's when exclusive
                self.lock_wait_s, started = waited, time.time()
                if op == "eager":
                    data = self.eager(msg["source"])
                elif op == "compile":
                    data = self.compile(msg["source"], msg.get("mode"))
                elif op == "peaks":
                    data = self.peaks()
                else:
                    raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, "reason": None, "evidence": {}, **data}
        except C.Reject as rej:
            reply = {"ok": False, "reason": rej.reason, "evidence": rej.evidence}
        except BaseException as exc:  # noqa: BLE001 - a bug in the verifier, reported, not raised
            rej = C.classify(exc, "worker_error")
            reply = {"ok": False, "reason": rej.reason, "evidence": rej.evidence}
        if not any(k != "timing" for k, _, _ in self.sections):  # rejected before timing
            self.sections.insert(0, ["compile" if self._compiling else "checks", started, time.time()])
        t_clean = time.time()
        # On CPU the memory limit is RLIMIT_AS, and a request that ran out of it leaves its heap mapped
        # (glibc keeps freed chunks in its arenas): the next one would start with less room than the
        # limit promises and could fail where a fresh worker does not (CI saw a 23 MB allocation fail
        # there, after an oom). A fresh worker then.
        oom_heap = reply["reason"] == "oom" and self.device != "cuda"
        reply["recycle"] = reply["reason"] in RECYCLE_REASONS or oom_heap or not self._healthy()
        if self._compiling and not self._frozen_after_compile:
            self._frozen_after_compile = True
            _freeze_survivors()
        self.sections.append(["cleanup", t_clean, time.time()])
        reply["sections"], reply["lock_wait_s"], reply["timed"] = self.sections, self.lock_wait_s, self.timed
        reply["graphs"] = _graphs_compiled() - graphs_before
        spent = [b - a for a, b in zip(self._compile_base, _compile_seconds())]
        reply["compile_split"] = {"dynamo_s": round(spent[0], 4), "backend_s": round(spent[1], 4),
                                  "share_wait_s": round(self._aside.wait_s - wait_before, 4)}
        reply["event"] = "reply"
        reply["handle_s"] = time.time() - entered  # the parent's stages: worker_gaps, pipes
        return reply

    def _healthy(self) -> bool:
        """Free what the task left and check that the CUDA context still works."""
        sys.modules.pop("opsynth_verify_task", None)
        gc.collect()
        if self.device != "cuda":
            return True
        try:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
            return True
        except BaseException:  # noqa: BLE001
            return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--req-fd", type=int, required=True)
    ap.add_argument("--resp-fd", type=int, required=True)
    ap.add_argument("--config", required=True, help="VerifyConfig as JSON")
    ap.add_argument("--sandbox", help="the pool's sandbox request (JSON, confine.Box.request): confine first")
    args = ap.parse_args(argv)
    if args.sandbox:  # before any thread, torch or task code
        try:
            from .confine import enter

            enter(json.loads(args.sandbox))
        except BaseException as exc:  # noqa: BLE001 - reported to the pool, which refuses to go on
            protocol.send(args.resp_fd, {"event": "failed", "error": (
                f"sandbox_failed: cannot confine the worker here ({type(exc).__name__}: {exc}); "
                "set verify.sandbox=false to run workers unconfined")})
            return 1
    faulthandler.enable()  # a segfault leaves a Python traceback in the output tail
    threading.Thread(target=_watch_parent, args=(args.req_fd,), daemon=True).start()
    cfg = VerifyConfig.from_dict(json.loads(args.config))
    try:
        worker = Worker(cfg, args.resp_fd, args.req_fd)
    except BaseException as exc:  # noqa: BLE001
        protocol.send(args.resp_fd, {"event": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    import torch

    protocol.send(args.resp_fd, {
        "event": "ready", "device": worker.device, "device_name": worker.device_name, "device_mem_mb": worker.device_mem_mb,
        "torch_version": torch.__version__, "pid": os.getpid(),
    })
    while True:
        try:
            msg = protocol.recv(args.req_fd)
        except protocol.ProtocolClosed:
            msg = {"op": "exit"}
        if msg.get("op") == "exit":
            # Skip interpreter teardown (torch/inductor atexit hooks take seconds); nothing of the
            # worker's needs flushing.
            os._exit(0)
        protocol.send(args.resp_fd, worker.handle(msg))


if __name__ == "__main__":
    sys.exit(main())
