"""Candidate child: build (mode "build") or run, check and time (mode "measure") one ModelNew.

`python -m opsynth.reward.candidate_runner job.json`. Never sees the task source or reference outputs:
only the inputs, the reference weights and the expected output shapes (to poison memory with).
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import time
import traceback
import types

from contextlib import ExitStack

from opsynth.reward.compare import as_output_list as _outputs_list
from opsynth.runtime.sandbox import child_main, device_lock

_T_IMPORT = time.perf_counter()  # child start: setup_s counts from here (reset at each fork by sandbox.run_job)

CUDA_LIBRARY_KERNELS = ("at::", "at_cuda_detail", "cublas", "cutlass", "gemm", "gemv", "xmma", "nvjet", "cudnn", "Memcpy", "Memset", "cub::", "splitKreduce")


class Reject(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _install(job):
    import torch

    from opsynth.reward import guards

    audit = guards.OpAudit()
    guards.Blocker(audit).install()
    from opsynth.runtime import sandbox

    tracker = guards.ExtensionTracker(audit, sandbox.BUILD_FD)  # builds go to the trusted build service
    tracker.install()
    audit.__enter__()  # stays on the mode stack for the child's life; it only acts while armed
    return torch, guards, audit, tracker


def _load_candidate(job, tracker):
    """Execute the candidate module (and build a workspace's kernels first)."""
    path = job["candidate_path"]
    cand_dir = os.path.dirname(path)
    sys.path.insert(0, cand_dir)
    if job.get("workspace"):
        import torch.utils.cpp_extension as ce

        from opsynth.reward.candidate import KERNEL_SUFFIXES, WORKSPACE_EXTENSION_NAME

        srcs = sorted(f for f in glob.glob(os.path.join(cand_dir, "kernels", "*")) if f.endswith((".cu", ".cpp", ".cc")))
        if not srcs:
            raise Reject("no_code", "workspace has no kernels/*.cu or kernels/*.cpp")
        cuda = any(s.endswith(".cu") for s in srcs)
        try:
            ext = ce.load(
                WORKSPACE_EXTENSION_NAME,
                srcs,
                extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3"] if cuda else None,
                extra_include_paths=[os.path.join(cand_dir, "kernels")],
                with_cuda=cuda,
            )
        except Exception as e:
            raise Reject("build_error", f"{type(e).__name__}: {e}"[-4000:])
        sys.modules[WORKSPACE_EXTENSION_NAME] = ext
        _ = KERNEL_SUFFIXES
    mod = types.ModuleType("model_new")
    mod.__file__ = path
    sys.modules["model_new"] = mod
    source = open(path).read()
    try:
        exec(compile(source, path, "exec"), mod.__dict__)
    except SyntaxError as e:
        raise Reject("syntax_error", str(e))
    except BaseException:
        if tracker.build_failed:
            raise Reject("build_error", tracker.build_failed)
        raise Reject("import_error", traceback.format_exc()[-4000:])
    return mod


def build(job) -> dict:
    _, _, _, tracker = _install(job)
    t0 = time.perf_counter()
    try:
        _load_candidate(job, tracker)
    except Reject as r:
        print(r.detail, flush=True)
        return {"reason": r.reason, "detail": r.detail[-2000:]}
    return {"reason": "ok", "build_s": time.perf_counter() - t0, "extensions": tracker.modules, "builds": tracker.builds}


def _device_inputs(torch, trial, device):
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in trial]


def _poison(torch, meta, device):
    """Fill memory the caching allocator (or malloc) will hand out next with NaN / sentinel values.

    Belt and braces: the audit also NaN-fills every torch.empty* made during a checked call.
    """
    from opsynth.reward.guards import poison_fill

    for shape, dtype in meta or []:
        p = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        poison_fill(p)
        del p


def _same_bits(torch, a, b) -> bool:
    """Bitwise equality (NaN-safe, unlike torch.equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.detach().reshape(-1).contiguous().view(torch.uint8), b.detach().reshape(-1).contiguous().view(torch.uint8))




def sandbox_fd():
    from opsynth.runtime import sandbox

    return sandbox.BUILD_FD


def measure(job) -> dict:
    torch, guards, audit, tracker = _install(job)
    device = job["device"]
    if job.get("cpu_threads"):
        torch.set_num_threads(int(job["cpu_threads"]))
    cuda = device == "cuda"
    # Warm pools and the allocator before anything untrusted runs.
    t_ctx = time.perf_counter()
    torch.ones(1 << 20).add_(1)
    if cuda:
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    cuda_init_s = round(time.perf_counter() - t_ctx, 3)
    from opsynth.render.task_file import set_mode  # bound before the candidate is imported
    from opsynth.reward import candidate_runner
    from opsynth.runtime import timing

    from opsynth.reward import cuda_state as cuda_state_mod
    from opsynth.reward import rounds, timed_inputs

    snapshot = guards.HarnessSnapshot(extra_modules=[guards, timing, candidate_runner, rounds, timed_inputs, cuda_state_mod])
    off = set(job.get("disabled_guards") or ())  # guards switched off, for tests' controls only
    cstate = cuda_state_mod.CudaState() if cuda else None
    if cstate is not None and not cstate.available:
        print("[candidate] no CUDA runtime library in this process: launch-error and persisting-L2 checks are off", flush=True)
    # The set-aside the device starts with (nonzero by default on the H200: every candidate read as
    # holding one when compared with 0); only a candidate's own reservation beyond it is refused.
    l2_start = cstate.persisting_l2_bytes() if cstate is not None else 0
    init_inputs = torch.load(job["init_path"], weights_only=True)
    base_threads = {t.ident for t in threading.enumerate()}
    _save = torch.save
    _clone = torch.Tensor.clone
    _sync = torch.cuda.synchronize if cuda else (lambda: None)
    info: dict = {"build_s": None, "cuda_init_s": cuda_init_s}

    def check_harness(where: str):
        if "harness_snapshot" in off:
            return
        bad = snapshot.changed()
        if bad:
            raise Reject(bad.split(":")[0], f"{bad} ({where})")

    lock = ExitStack()
    try:
        t0 = time.perf_counter()
        mod = _load_candidate(job, tracker)
        info["build_s"] = round(time.perf_counter() - t0, 3)
        check_harness("module import")
        ModelNew = getattr(mod, "ModelNew", None)
        if not isinstance(ModelNew, type):
            raise Reject("no_model_new", "the candidate defines no class ModelNew")
        if any(c.__name__ == "Model" for c in ModelNew.__mro__):
            raise Reject("uses_model", "ModelNew subclasses Model")
        try:
            torch.manual_seed(int(job["init_seed"]))
            with torch.device(device):
                model = ModelNew(*init_inputs)
            model = set_mode(model.to(device), job.get("task_mode"))  # the task's mode, as the reference
        except Reject:
            raise
        except Exception:
            raise Reject("init_error", traceback.format_exc()[-4000:])
        if not isinstance(model, torch.nn.Module):
            raise Reject("no_model_new", "ModelNew is not an nn.Module")
        for sub in model.modules():
            if type(sub).__name__ == "Model":
                raise Reject("uses_model", "ModelNew holds a Model instance")
        threads = guards.new_python_threads(base_threads)
        if threads:
            raise Reject("side_stream", f"thread(s) {threads} started by the candidate's import or __init__")
        check_harness("ModelNew init")
        # Weights and inputs arrive only now, on stdin: nothing the candidate ran so far could see them.
        import io

        data = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=True)
        own = model.state_dict()
        matched = {k: v for k, v in data["state_dict"].items() if k in own and tuple(own[k].shape) == tuple(v.shape)}
        model.load_state_dict(matched, strict=False)
        print(f"[candidate] copied {len(matched)}/{len(data['state_dict'])} reference weights", flush=True)
        check_harness("ModelNew init")

        protected = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        poisoned: set = set()  # storages of outputs poisoned after their call
        reused: list = []  # per trial: did it return a storage poisoned after an earlier call

        def poison_outputs(outs):
            """Poison what a call returned once it is judged: a candidate that hands back the same
            buffer next time without writing it (a kernel that failed to launch) returns NaN, not
            the previous call's correct result. Model parameters it returned are left alone."""
            if "poison_outputs" in off:
                return
            for o in outs:
                if isinstance(o, torch.Tensor) and o.numel() and o.untyped_storage().data_ptr() not in protected:
                    try:
                        guards.poison_fill(o)
                        poisoned.add(o.untyped_storage().data_ptr())
                    except RuntimeError:  # an expanded (self-overlapping) view cannot be filled
                        pass

        def check_outputs(outs, where: str):
            """Plain tensors on the task's device, nothing else."""
            for o in outs:
                if not isinstance(o, torch.Tensor):
                    raise Reject("wrong_type", f"{where}: output is {type(o).__name__}, not a tensor")
                if type(o) is not torch.Tensor:
                    raise Reject("tensor_subclass", f"{where}: output is a {type(o).__qualname__}")
                if o.device.type != device:
                    raise Reject("wrong_device", f"{where}: output on {o.device}")

        def device_state(where: str):
            """Launch errors the candidate left unchecked; a persisting-L2 set-aside."""
            if cstate is None:
                return
            if "launch_check" not in off:
                err = cstate.last_error()
                if err:
                    raise Reject("launch_failed", f"{where}: a kernel launch failed ({err}) and nothing checked it")
            if "l2_reset" not in off:
                held = cstate.persisting_l2_bytes()
                if held > l2_start:
                    raise Reject("persisting_cache", f"{where}: a persisting-L2 set-aside of {held} bytes is in force "
                                 "(it would keep the working set in L2 across the harness's flush)")

        def sync_checked(where: str):
            try:
                _sync()
            except RuntimeError as e:
                raise Reject("launch_failed", f"{where}: {e}"[:2000])

        def guarded(*args):
            audit.armed = True
            try:
                return model(*args)
            finally:
                audit.armed = False

        def call_checked(args, meta, where):
            """One audited forward with every dynamic check; returns a CPU copy of the outputs."""
            pristine = [_clone(a) if isinstance(a, torch.Tensor) else a for a in args]
            _poison(torch, meta, device)
            if cuda:
                sync_checked(f"before {where}")
                device_state(f"before {where}")
            n_viol = len(audit.violations)
            audit.poison = True
            try:
                out = guarded(*args)
            except Exception as e:
                if len(audit.violations) > n_viol:
                    raise Reject("forbidden_op:" + audit.violations[n_viol], f"{where}: {e}")
                raise Reject("runtime_error", f"{where}: " + traceback.format_exc()[-4000:])
            finally:
                audit.poison = False
            if len(audit.violations) > n_viol:
                raise Reject("fallback", f"{where}: blocked op {audit.violations[n_viol]} was caught and swallowed by the candidate")
            if audit.stream_use:
                raise Reject("side_stream", f"{where}: {audit.stream_use[0]} used inside forward")
            check_harness(where)
            outs = _outputs_list(out)
            check_outputs(outs, where)
            reused.append(any(o.untyped_storage().data_ptr() in poisoned for o in outs))
            # Work still running after forward returned escaped the timed region.
            if cuda:
                try:
                    torch.cuda.current_stream().synchronize()
                except RuntimeError as e:
                    raise Reject("launch_failed", f"{where}: {e}"[:2000])
                device_state(where)
            early = [_clone(o) for o in outs]
            threads = guards.new_python_threads(base_threads)
            if threads:
                raise Reject("side_stream", f"{where}: thread(s) {threads} still running after forward returned")
            time.sleep(0.02)
            sync_checked(where)
            for e, o in zip(early, outs):
                if not _same_bits(torch, e, o):
                    raise Reject("side_stream", f"{where}: output changed after forward returned (work outside the timed region)")
            for p, a in zip(pristine, args):
                if isinstance(a, torch.Tensor) and not _same_bits(torch, p, a):
                    raise Reject("input_mutated", f"{where}: forward modified its input in place")
            poison_outputs(outs)
            return [o.detach().cpu() for o in early]

        if cuda:  # profiler (CUPTI) start-up costs seconds: pay it here, outside the device lock
            from torch.profiler import ProfilerActivity, profile

            t_prof = time.perf_counter()
            with profile(activities=[ProfilerActivity.CUDA]):
                torch.ones(1, device="cuda").add_(1)
                _sync()
            info["profiler_init_s"] = round(time.perf_counter() - t_prof, 3)
        t_setup = time.perf_counter() - _T_IMPORT
        info["setup_s"] = round(t_setup, 3)
        lock.enter_context(device_lock(job))
        t1 = time.perf_counter()
        meta = job["output_meta"]
        contents = [_device_inputs(torch, t, device) for t in data["trials"]]
        # One set of buffers for all trials: a cache keyed on the input pointer sees new contents.
        buffers = [_clone(x) if isinstance(x, torch.Tensor) else x for x in contents[0]]
        trial_outs = []
        with torch.no_grad():
            for k, c in enumerate(contents):
                timing.load_contents(buffers, c)
                trial_outs.append(call_checked(buffers, meta["trials"], f"trial {k}"))
            second_outs = None
            if job.get("has_second") and data.get("second") is not None:
                args2 = _device_inputs(torch, data["second"], device)
                try:
                    second_outs = call_checked(args2, meta["second"], "second shape")
                except Reject as r:
                    if r.reason in ("runtime_error",):
                        raise Reject("shape_hardcoded", r.detail)
                    raise
            # The candidate's own code must have run: counted extension calls, or on CUDA its kernels.
            launched = tracker.calls > 0
            kernels: list[str] = []
            kernel_times: list = []  # [name, microseconds] of the candidate's own kernels, slowest first
            if cuda:
                from torch.profiler import ProfilerActivity, profile

                timing.load_contents(buffers, contents[0])
                marker = torch.zeros(1, device="cuda")
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    marker.add_(1)  # an aten kernel on the current (timed) stream, launched first
                    _sync()
                    profiled = guarded(*buffers)
                    _sync()
                poison_outputs(_outputs_list(profiled))  # as after every call: a reused buffer must be rewritten
                profiled = None
                dev_events = sorted(
                    (e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA") and "Memcpy" not in e.name and "Memset" not in e.name),
                    key=lambda e: e.time_range.start,
                )
                own = [e for e in dev_events[1:] if not any(p in e.name for p in CUDA_LIBRARY_KERNELS)]
                kernels = sorted({e.name for e in own})
                by_name: dict = {}
                for e in own:
                    by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us()
                kernel_times = sorted(([n, round(us, 2)] for n, us in by_name.items()), key=lambda x: -x[1])
                if dev_events:
                    timed_stream = getattr(dev_events[0], "device_resource_id", None)
                    elsewhere = sorted({e.name for e in dev_events[1:] if getattr(e, "device_resource_id", None) != timed_stream})
                    if elsewhere:
                        raise Reject("side_stream", f"kernel(s) {elsewhere[:3]} ran on another CUDA stream than the timed one")
                launched = bool(kernels)
                print(f"[candidate] own kernels seen by the profiler: {kernels[:8]}", flush=True)
            if not launched:
                raise Reject("kernel_not_launched", f"no call into the candidate's compiled code during forward (extensions: {tracker.modules})")
            warmup, repeats = job["timing"]
            timer = timing.Timer(device, job.get("flush_l2", True))
            snapshot.watch("opsynth.runtime.timing.Timer instance", timer)
            audit.stream_use.clear()
            n_viol = len(audit.violations)
            chan = rounds.Channel(sandbox_fd())
            stacked = timed_inputs.stack_trials(contents)

            def before_call():
                if cstate is not None and "l2_reset" not in off:
                    cstate.reset_persisting_l2()

            def check_call(j, outs):
                where = f"timed call {j}"
                check_outputs(outs, where)
                device_state(where)

            def timed_pass(first: int, count: int) -> dict:
                try:
                    kept, _ = rounds.run_rounds(guarded, buffers, stacked, timer, chan, range(first, first + count),
                                                fresh="fresh_inputs" not in off, trials=contents, before_call=before_call,
                                                check_call=check_call, after_report=poison_outputs)
                    rep = chan.request({"kind": "timing_done"})
                except Reject:
                    raise
                except rounds.ProtocolError as e:
                    raise Reject("timing_protocol", str(e))
                except Exception as e:
                    if len(audit.violations) > n_viol:
                        raise Reject("forbidden_op:" + audit.violations[n_viol], f"timing: {e}")
                    if cuda and "CUDA error" in str(e):
                        raise Reject("launch_failed", f"timing: {e}"[:2000])
                    raise Reject("runtime_error", "timing: " + traceback.format_exc()[-4000:])
                if not rep.get("ok"):
                    raise Reject("timing_protocol", str(rep.get("error")))
                kept["again"] = int(rep.get("again") or 0)
                return kept

            main = warmup + repeats
            kept = timed_pass(0, main)
            again = kept.pop("again")
            if again:  # the parent saw a median below the physical floor: a second pass, fresh seeds
                print(f"[candidate] median below the physical floor: {again} more timed calls", flush=True)
                kept.update(timed_pass(main, again))
                kept.pop("again", None)
            if len(audit.violations) > n_viol:
                raise Reject("fallback", f"timing: blocked op {audit.violations[n_viol]} swallowed")
            if audit.stream_use:
                raise Reject("side_stream", f"timing: {audit.stream_use[0]} used inside forward")
            if guards.new_python_threads(base_threads):
                raise Reject("side_stream", "timing: thread still running after forward returned")
            check_harness("timing")
            lock.close()
            info["locked_s"] = round(time.perf_counter() - t1, 3)
            info["timed_calls"] = main + again
            print(f"[candidate] setup {t_setup:.2f} s, checks and timing {info['locked_s']:.2f} s", flush=True)
        _save({"trials": trial_outs, "second": second_outs, "rounds_kept": kept, "trial_reused": reused[:len(trial_outs)]}, job["outputs_path"])
        return {"reason": "ok", "kernels": kernels[:20], "kernel_times": kernel_times[:10], "ext_calls": tracker.calls, "builds": tracker.builds, **info}
    except Reject as r:
        print(f"[candidate] rejected: {r.reason}: {r.detail}", flush=True)
        return {"reason": r.reason, "detail": r.detail[-2000:], **info}
    finally:
        lock.close()


def run(job: dict) -> dict:
    return build(job) if job["mode"] == "build" else measure(job)


if __name__ == "__main__":
    child_main(run)
