"""Reward for one candidate kernel (or many): sandboxed, hack-resistant, -1 / 1 / 2 / 3.

Flow of one evaluation (every untrusted step in its own confined child, forked from a warm server,
with timeout and limits; see opsynth.runtime.sandbox and .isolation):

1. resolve the candidate (source, file, workspace, or fenced code in a completion) and pre-check it
   statically (cheap rejections first);
2. reference child: builds Model, draws fresh inputs from seeds chosen here, saves its weights,
   inputs and outputs to a scratch dir, and computes the fingerprints of every timed round; the
   parent loads the outputs and deletes the files before any candidate runs. An eager baseline child
   for the task starts beside it (`baselines`: the baselines are timed in blocks between the
   candidate's, and the cache of them is re-validated);
3. candidate child: runs the module top level; its `load_inline` calls are built by the trusted
   build service (opsynth.reward.builds: content-addressed extension cache, ccache per translation
   unit, shared PCH), and it loads the result read-only. On the cpu backend `evaluate_many` first runs
   every candidate's top level in a separate child ("prebuild") so no build runs beside a timing;
4. the same child, measure phase (the parent holds the device lock for it): runs ModelNew under the
   guards, saves its outputs, times it in rounds, between which the parent times baseline blocks with
   builds paused (`quiet`), taking more blocks while the ratio is near a threshold;
5. the parent compares outputs with the reference and applies the reward rule to the ratio's
   interval (`confidence`).

`evaluate_many(..., client=)` spreads a batch over a Dask cluster: each GPU worker evaluates its
share under its own device lock, and with `remote_builds` the builds go to any worker.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from opsynth.render.task_file import check_mode, task_kind, tolerance
from opsynth.reward.candidate import CandidateSpec, extract_candidate, resolve_candidate
from opsynth.reward.builds import build_service
from opsynth.reward.eval_types import EvalResult, RewardConfig, device_env, device_lock_file, reward_from_times
from opsynth.reward import host_copies

__all__ = ["evaluate", "evaluate_many", "extract_candidate", "EvalResult", "RewardConfig"]


@dataclass
class _Reference:
    """What the reference child produced for one task: outputs live in this process only."""

    ok: bool
    reason: str
    log: str
    scratch: Path | None = None
    job: dict | None = None
    outputs: dict | None = None  # {"trials": [[tensor,...],...], "second": [[...]] or None}
    data: bytes | None = None  # weights and inputs (torch.save bytes), handed to candidates on stdin
    eager_ms: float | None = None  # the cached baselines (the fresh ones come with each candidate's timing)
    compile_ms: float | None = None
    baselines: object = None  # the task's baselines in this batch (opsynth.reward.baselines.TaskBaselines)
    plan: object = None  # the timed rounds' TimingPlan (opsynth.reward.rounds), shared by its candidates
    rounds: object = None  # the reference's RoundSession: the parent's clock of its rounds, its input hashes
    floor_ms: float | None = None  # the physical floor (opsynth.reward.floor)
    flop_bound_ms: float | None = None
    cfg: RewardConfig | None = None  # the settings with the task's tolerance (task_cfg)
    facts: object = None  # compare.FactsMemo: facts about `outputs`, computed once for all its candidates
    rounds_s: float | None = None  # the reference child's timed rounds, holding the device to itself
    untimed_rounds_s: float | None = None  # its unclocked rounds (tolerances, the seeds past the main pass), the device shared
    done_at_s: float | None = None  # seconds into its batch when it was ready (the batch's timeline)
    ready_child: bool = False  # it ran in a child forked and started ahead (`ready_children`, role "reference")
    # Where the reference's seconds go (a user's single evaluation waits for it as for its build):
    # its child start to exit, the fork server's start before it, and the parent's read of what it wrote
    phases: dict = field(default_factory=dict)
    # Set on the early form only (`_with_data`: the reference's data and facts, before its timed rounds):
    # the future of the whole reference, which the candidate's timing and judging wait for
    full: object = None


# "0": candidates start only on the whole reference, as before (the benchmark's control,
# `reward_throughput.py --late-data-group`); read by the parent when it makes a reference's job
EARLY_DATA_ENV = "OPSYNTH_EARLY_REFERENCE_DATA"


def task_cfg(cfg: RewardConfig, task_code: str) -> RewardConfig:
    """The settings a task's outputs are judged with: `cfg` for float32 (its atol / rtol), the task
    contract's tolerance (`opsynth.render.task_file.TOLERANCES`) for a reduced precision."""
    import dataclasses

    dtype = task_kind(task_code).dtype
    if dtype == "float32":
        return cfg
    tol = tolerance(dtype)
    return dataclasses.replace(cfg, atol=tol.atol, rtol=tol.rtol)


def _tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def _once_timed(handler, rounds, on_timed, job: dict):
    """`handler`, which also calls `on_timed(job)` once, as soon as the reference's timed rounds are
    done (from the channel's thread: it must not block): what waits for them (the baseline children)
    starts while the reference finishes its untimed rounds and hands its data over, never beside its
    timed rounds, the candidates' wall-clock yardstick."""
    fired = threading.Event()

    def handle(req):
        out = handler(req)
        if rounds.done and not fired.is_set():
            fired.set()
            on_timed(job)
        return out

    return handle


def _with_data(handler, job: dict, on_data, early):
    """`handler`, which also takes the reference child's `reference_data` (once): its candidates' data
    is written, before its timed rounds. Reads the data (the file goes), fills the job's facts from the
    message and calls `on_data(early(data))` (from the channel's thread: it must not block).
    Returns (the handler, a dict whose "data" is the bytes read, None until then)."""
    state: dict = {"data": None}

    def handle(req):
        if not (isinstance(req, dict) and req.get("kind") == "reference_data"):
            return handler(req)
        if state["data"] is not None:
            return {"ok": False, "error": "reference_data was sent twice"}
        try:
            path = Path(job["data_path"])
            data = path.read_bytes()
            path.unlink()
        except OSError as e:
            return {"ok": False, "error": f"the reference's data: {e}"}
        state["data"] = data
        job.update(output_meta=req.get("output_meta"), has_second=bool(req.get("has_second")),
                   n_inputs=req.get("n_inputs"), param_names=req.get("param_names"))
        on_data(early(data))
        return {"ok": True}

    return handle, state


def _prepare_reference(task_code: str, cfg: RewardConfig, device: str, task_mode: str | None = None,
                       on_timed=None, on_data=None) -> _Reference:
    """The task's reference run (its outputs, data and timed rounds). `on_timed(job)`, when given, is
    called once the reference's timed rounds are over (`_once_timed`), with the job its seeds are in.
    `on_data(early)`, when given, is called with the reference's early form (`_Reference` with its
    data, facts, plan and clock, `full` unset) as soon as the child has written its data, before its
    timed rounds (`_with_data`; not with $OPSYNTH_EARLY_REFERENCE_DATA=0)."""
    from opsynth.reward import baseline_cache
    from opsynth.reward.eval_types import RUNNERS
    from opsynth.runtime.sandbox import run_child

    try:
        kind = task_kind(task_code)
    except ValueError as e:
        scratch = _tmpdir("opsynth_ref_")
        return _Reference(False, "task_error", f"[reward] {e}", scratch)
    from opsynth.reward import ready_children

    parked = ready_children.take(cfg, device, "reference")  # forked and started ahead (its scratch, channel, lock), or None
    scratch = parked.scratch if parked is not None else _tmpdir("opsynth_ref_")
    (scratch / "task.py").write_text(task_code)
    tcfg = task_cfg(cfg, task_code)
    cached = baseline_cache.lookup(cfg, task_code, device, task_mode)
    from opsynth.reward.baselines import decides_as_stored

    as_stored = decides_as_stored(cfg, cached)  # then no baseline blocks, and no rounds to add
    rng = secrets.SystemRandom()
    job = {
        "task_path": str(scratch / "task.py"),
        "task_mode": check_mode(task_mode),  # the reference and the candidate run Model / ModelNew so
        "task_kind": {"dtype": kind.dtype, "task_pass": kind.task_pass},  # and call them in its precision and pass
        "device": device,
        "trial_seeds": [rng.randrange(1, 2**62) for _ in range(cfg.num_trials)],
        "second_seed": rng.randrange(1, 2**62),
        "init_seed": rng.randrange(1, 2**62),
        "second_shape": cfg.second_shape,
        "timing": list(cfg.timing(device)),
        "flush_l2": cfg.flush_l2,
        "cpu_threads": cfg.resolved_cpu_threads(device),
        "memory_limit_gb": cfg.memory_limit_gb,
        "data_path": str(scratch / "data.pt"),
        "init_path": str(scratch / "init.pt"),
        "result_path": str(scratch / "ref_result.json"),
        "device_lock": device_lock_file(cfg, device),
        **host_copies.job_settings(),
        "early_data": on_data is not None and os.environ.get(EARLY_DATA_ENV, "1") != "0",
    }
    from opsynth.reward.rounds import RoundSession, TimingPlan, session_handler

    warmup, repeats = cfg.timing(device)
    extra = 0 if as_stored else cfg.timing_cap(device) - repeats  # rounds a ratio near a threshold may add
    min_timed = None if as_stored else cfg.resolved_min_timed(device)  # where the pacer may end a main pass
    plan = TimingPlan.draw(warmup, repeats, tcfg.atol, tcfg.rtol, extra, min_timed)  # seeds reach the reference on stdin only
    # The reference clocks the main pass's rounds through the protocol (its overhead is the wall-clock
    # check's yardstick) and computes every other round's fingerprints without a clock
    ref_rounds = RoundSession(plan, end=plan.main, own_work=True)
    from opsynth.reward.outputs_file import OutputsChannel, OutputsFileError

    # The outputs through a channel of this process's (no file: the candidate must never find the answers on disk)
    with (parked.channel if parked is not None else OutputsChannel("opsynth-reference-outputs")) as channel:
        plan_bytes, handler = json.dumps(plan.to_dict()).encode(), session_handler(ref_rounds, None)
        if on_timed is not None:
            handler = _once_timed(handler, ref_rounds, on_timed, job)
        from opsynth.reward import floor

        def made(data: bytes, log: str = "", **whole) -> _Reference:  # the early form, and what the whole one adds
            meta = (job["output_meta"] or {}).get("trials") or []
            return _Reference(True, "ok", log, scratch, job, data=data, eager_ms=(cached or {}).get("eager_ms"),
                              compile_ms=(cached or {}).get("compile_ms"), plan=plan, rounds=ref_rounds,
                              floor_ms=floor.floor_ms(meta, device), cfg=tcfg, ready_child=parked is not None, **whole)

        handed: dict = {"data": None}
        if job["early_data"]:
            handler, handed = _with_data(handler, job, on_data, made)
        if parked is not None:
            res = parked.child.run(job, cfg.reference_timeout_s, stdin_bytes=plan_bytes, build_handler=handler)
        else:
            res = run_child("opsynth.reward.reference_runner", job, scratch, cfg.reference_timeout_s, cfg, warm=RUNNERS,
                            env_extra=device_env(cfg, device), stdin_bytes=plan_bytes, build_handler=handler,
                            channels={"outputs": channel.fd})
        if res.reason != "ok":
            # the task's own failure: named task_* (task_timeout, task_error), never a program's reason
            return _Reference(False, res.reason if res.reason.startswith("task_") else "task_" + res.reason, res.log, scratch)
        if not ref_rounds.done:
            return _Reference(False, "task_crashed", res.log + f"\n[reward] the reference's timed rounds did not finish: {ref_rounds.error}", scratch)
        t_read = time.perf_counter()
        try:
            outputs = channel.read()  # the task's code wrote it: the same checks as a candidate's
        except OutputsFileError as e:
            return _Reference(False, "task_crashed", res.log + f"\n[reward] the reference's outputs: {e}", scratch)
    from opsynth.reward.compare import FactsMemo

    for j, r in enumerate(outputs.get("rounds") or []):  # the input hashes of the rounds it did not report over the channel
        if "key" in r:
            ref_rounds.keys.setdefault(j, r["key"])
    # Nor the inputs and weights: a module could read them at import time (when torch compute is
    # still allowed) and precompute outputs. They reach the candidate child on stdin, after __init__.
    data = handed["data"]
    if data is None:  # not handed over early
        data_path = Path(job["data_path"])
        data = data_path.read_bytes()
        data_path.unlink()
    t_facts = time.perf_counter()
    facts = FactsMemo()
    facts.warm(outputs, tcfg)  # here, while the candidates build: no candidate's judging waits for it
    phases = {"child_s": round(res.wall_s, 3), "server_wait_s": res.server_wait_s, **(res.data.get("parts") or {}),
              "read_s": round(t_facts - t_read, 3), "facts_s": round(time.perf_counter() - t_facts, 3)}
    job["output_meta"] = res.data.get("output_meta")
    job["has_second"] = res.data.get("has_second", False)
    job["n_inputs"], job["param_names"] = res.data.get("n_inputs"), res.data.get("param_names")  # a backward step's
    meta = (job["output_meta"] or {}).get("trials") or []
    return made(data, res.log, outputs=outputs, flop_bound_ms=floor.flop_bound_ms(res.data.get("flops"), meta, device),
                facts=facts, rounds_s=res.data.get("rounds_s"), untimed_rounds_s=res.data.get("untimed_rounds_s"), phases=phases)


def _candidate_job(spec: CandidateSpec, ref: _Reference, cfg: RewardConfig, device: str, scratch: Path, mode: str) -> dict:
    (scratch / "model_new.py").write_text(spec.source)
    if spec.kernel_files:
        kdir = scratch / "kernels"
        kdir.mkdir(exist_ok=True)
        for name, text in spec.kernel_files.items():
            (kdir / name).write_text(text)
    job = {  # no device lock: the parent holds it for the child's timed section (`_TimingLock`)
        "mode": mode,
        "candidate_path": str(scratch / "model_new.py"),
        "workspace": bool(spec.kernel_files),
        "device": device,
        "cpu_threads": cfg.resolved_cpu_threads(device),
        "memory_limit_gb": cfg.memory_limit_gb,
        "result_path": str(scratch / f"cand_{mode}.json"),
    }
    if ref is not None and ref.job is not None:
        # A copy in the candidate's own scratch: the reference's scratch belongs to the reference
        # child's uid, which no other child can read.
        shutil.copyfile(ref.job["init_path"], scratch / "init.pt")
        job.update(
            {
                "init_path": str(scratch / "init.pt"),
                "output_meta": ref.job["output_meta"],
                "has_second": ref.job["has_second"],
                "init_seed": ref.job["init_seed"],
                "task_mode": ref.job["task_mode"],
                "task_kind": ref.job["task_kind"],
                "n_inputs": ref.job.get("n_inputs"),
                "param_names": ref.job.get("param_names"),
                "timing": ref.job["timing"],
                "flush_l2": cfg.flush_l2,
                "disabled_guards": list(cfg.disabled_guards),
                **host_copies.job_settings(),
            }
        )
    return job


def _build(spec: CandidateSpec, cfg: RewardConfig, device: str, scratch: Path):
    """Run the candidate's module top level once (compiling its extensions into the shared cache)."""
    from opsynth.reward.eval_types import BUILD_RUNNERS
    from opsynth.runtime.sandbox import run_child

    job = _candidate_job(spec, None, cfg, device, scratch, "build")
    job["cpu_threads"] = 1  # it only waits for builds: no torch thread pools next to the compilers
    builds = build_service(cfg, device).session()  # a refused build decides the verdict, not the child
    return builds.overrule(run_child("opsynth.reward.candidate_runner", job, scratch, cfg.build_timeout_s, cfg, warm=BUILD_RUNNERS,
                                     light=True, build_handler=builds, env_extra=device_env(cfg, device)))


def _measure(spec: CandidateSpec, ref: _Reference, cfg: RewardConfig, device: str, scratch: Path, build_log: str = "") -> EvalResult:
    from opsynth.reward.eval_types import RUNNERS
    from opsynth.runtime.sandbox import run_child

    from opsynth.reward.baselines import Pacer
    from opsynth.reward.rounds import RoundSession, session_handler

    from opsynth.reward import ready_children

    off = set(cfg.disabled_guards)
    times = {"candidate_ms": None, "eager_ms": ref.eager_ms, "compile_ms": ref.compile_ms, "floor_ms": ref.floor_ms}
    parked = ready_children.take(cfg, device)  # a child forked and started ahead (its own scratch and channel), or None
    if parked is not None:
        scratch = parked.scratch
    times["ready_child"] = parked is not None
    job = _candidate_job(spec, ref, cfg, device, scratch, "measure")
    fresh = "fresh_inputs" not in off

    def bound(whole: _Reference) -> dict:  # what the pacer takes from the whole reference
        return {"baselines": whole.baselines, "reference": (whole.outputs["rounds"], whole.rounds.keys) if fresh else None,
                "reference_ms": _reference_ms(whole)}

    full = ref.full  # set on the early form: the timed section and the judging wait for the whole reference
    known = {"baselines": None, "pending": _whole_reference(full, bound)} if full is not None else bound(ref)
    pacer = Pacer(cfg=cfg, device=device, lock_path=device_lock_file(cfg, device), warmup=ref.plan.warmup,
                  cap_end=ref.plan.main + ref.plan.extra, **known)
    rounds = RoundSession(ref.plan, floor_ms=None if "physical_floor" in off else ref.floor_ms,
                          reference=None if "wall_clock" in off else ref.rounds, pacer=pacer,
                          call_floor="call_wall_floor" not in off)
    # The first run of a fresh build compiles inside this child too, so allow for it.
    builds = build_service(cfg, device).session()  # a refused build decides the verdict, not the child
    from opsynth.reward.outputs_file import OutputsChannel

    # what the child's harness saves; read by _judge
    channel = parked.channel if parked is not None else OutputsChannel("opsynth-candidate-outputs")
    if "outputs_file" in off:  # the control only: a file in the child's scratch, as before the channel
        job["outputs_path"] = str(scratch / "cand_outputs.pt")
    try:
        try:
            timeout_s = cfg.run_timeout_s + cfg.build_timeout_s
            if parked is not None:
                res = parked.child.run(job, timeout_s, stdin_bytes=ref.data, build_handler=session_handler(rounds, builds),
                                       on_start=pacer.set_pid)
            else:
                res = run_child("opsynth.reward.candidate_runner", job, scratch, timeout_s, cfg,
                                warm=RUNNERS, stdin_bytes=ref.data, build_handler=session_handler(rounds, builds),
                                env_extra=device_env(cfg, device), on_start=pacer.set_pid, channels={"outputs": channel.fd})
            res = builds.overrule(res)
        finally:
            pacer.close()  # the device lock and the quiet window, whatever the child did
        if full is not None:  # the early form: the whole reference decides from here on
            ref = full.result()
            if not ref.ok:
                return EvalResult.rejected(ref.reason, ref.log, device=device)
        log = (build_log + "\n" + res.log).strip()
        details = {k: res.data[k] for k in ("detail", "kernels", "kernel_times", "builds", "ext_calls") if res.data.get(k) is not None}
        if res.reason != "ok":
            out = EvalResult.rejected(res.reason, log, times, device)
            out.details = details
            return out
        times["measure_wall_s"] = round(res.wall_s, 3)  # the whole measuring child, start to exit
        times["child_run_s"] = res.data.get("run_s")  # of it, the job itself (the rest: handing it over, the exit)
        times["build_s"] = res.data.get("build_s")
        times["setup_s"] = res.data.get("setup_s")  # child start-up to checked calls (outside the device lock)
        times["locked_s"] = res.data.get("locked_s")  # timing, holding the device to itself (the checks share it)
        for k in ("prepare_s", "instantiate_s", "weights_s", "host_alloc_s", "host_pinned",  # parts of setup_s
                  "cuda_init_s", "profiler_init_s", "checks_wait_s", "trials_s", "profiled_s", "harness_warm_s", "timing_wait_s", "rounds_s",  # parts of setup_s; the checks; locked_s
                  "timing_prep_s", "rounds_run_s", "timing_done_s", "timing_checks_s",  # parts of rounds_s (the child's clock)
                  "land_s", "held_copies", "harness_warm_parts", "prepare_parts",  # the copies held on the device brought to the host, after the lock
                  "save_outputs_s"):  # writing the outputs into their channel, after the lock
            if res.data.get(k) is not None:
                times[k] = res.data[k]
        times["baseline_blocks_s"] = round(pacer.blocks_s, 3)  # part of rounds_s: the parent's baseline blocks
        times["quiet_window_s"] = round(pacer.window_s, 3)  # part of rounds_s: stopping builds and idle baseline children
        times["settle_device_s"] = round(pacer.settle_s, 3)  # part of rounds_s: the idle probe before the first timed round
        times["intervals_s"] = round(pacer.intervals_s, 3)  # part of rounds_s: the ratio intervals (bootstrap) it looked at
        # parts of baseline_blocks_s: the baseline's timed calls, the blocks' other work, stopping the candidate
        times["baseline_calls_s"], times["baseline_block_overhead_s"] = round(pacer.calls_s, 3), round(pacer.block_overhead_s, 3)
        times["candidate_stop_s"] = round(pacer.stop_s, 3)
        if pacer.probe_ms:  # CUDA: the baseline children's waits for an idle device, and their probes' range
            times["baseline_quiet_wait_ms"] = round(pacer.quiet_wait_ms, 3)
            times["baseline_probe_ms"] = pacer.probe_ms
            times["baseline_disturbed_blocks"] = pacer.disturbed
        if pacer.compile_wait_s:
            times["compile_wait_s"] = round(pacer.compile_wait_s, 3)  # the compile child's start, lock released
            if times.get("locked_s") is not None:  # the device was not held meanwhile
                times["locked_s"] = round(max(0.0, times["locked_s"] - pacer.compile_wait_s), 3)
        t_judge = time.perf_counter()
        verdict, detail = _judge(ref, rounds, pacer, channel, job.get("outputs_path"), cfg, times, details, off)
        times["judge_s"] = round(time.perf_counter() - t_judge, 3)  # in this (trusted) process, after the child
        log = (log + "\n" + detail).strip()
        if verdict != "ok":
            out = EvalResult.rejected(verdict, log, times, device)
            out.details = {**details, "detail": detail}
            return out
        reward = _decide(ref, pacer, rounds, cfg, times, details)
        return EvalResult(reward=reward, correct=True, reason="ok", times=times, log=log, device=device, details=details)
    finally:
        channel.close()  # the outputs loaded from it keep their mapping
        if parked is not None:
            _cleanup(parked.scratch, cfg)  # the batch cleans the candidate's own scratch


def _whole_reference(full, bound):
    """The pacer's `pending` for a candidate started on its reference's early form: waits (in the
    channel's thread, when the child asks for the timing lock) for the whole reference, then returns
    `bound(whole)`, or why the candidate cannot be timed (the reference failed: the verdict is then
    the reference's, `_measure`)."""

    def get():
        try:
            whole = full.result()
        except Exception as e:  # noqa: BLE001 - the reference's own error reaches the verdict through `_measure`
            return f"the task's reference did not finish: {type(e).__name__}"
        if not whole.ok:
            return f"the task's reference failed: {whole.reason}"
        return bound(whole)

    return get


def _reference_ms(ref: _Reference) -> float | None:
    """The median of the reference child's timed rounds (the task's Model, the same Timer, before any
    candidate ran): the eager time a decision falls back on when baseline blocks were disturbed."""
    claims = ref.rounds.decided()  # the reference's own session: its claims as reported
    return statistics.median(claims.values()) if claims else None


def _judge(ref: _Reference, rounds, pacer, channel, control_path: str | None, cfg: RewardConfig, times: dict, details: dict,
           off: set) -> tuple[str, str]:
    """The verdict on a measuring child that exited ok, in this (trusted) process: its outputs read
    from the channel it was given (`outputs_file`: sealed, then checked and loaded in place), the
    outputs against the reference's (through the reference's FactsMemo), the timed rounds, the
    pacer's own failure."""
    from opsynth.reward.compare import judge_outputs
    from opsynth.reward.outputs_file import OutputsFileError, size_cap

    tcfg = ref.cfg or cfg  # the task's tolerance
    details["settings"] = tcfg.quoted_settings()
    t0 = time.perf_counter()
    if control_path is not None:  # the `outputs_file` control only: a plain load of a path the child owns, which a FIFO there hangs
        import torch

        cand = torch.load(control_path, weights_only=True)
    else:
        try:
            cand = channel.read(size_cap(ref.outputs))
        except OutputsFileError as e:
            return "outputs_unreadable", f"the candidate's outputs: {e}"
    # Where judging goes (diagnostics): reading the outputs, then comparing them with the reference's
    t1 = time.perf_counter()
    times["judge_read_s"] = round(t1 - t0, 3)
    times["outputs_mb"] = round(channel.size() / 2**20, 1) if control_path is None else None
    verdict, detail = judge_outputs(ref.outputs, cand, tcfg, ref.facts)
    times["judge_compare_s"] = round(time.perf_counter() - t1, 3)
    if verdict == "ok":
        verdict, detail = _judge_timing(ref, rounds, cand, tcfg, times, details, off)
    if verdict == "ok" and pacer.failed:
        verdict, detail = "task_crashed", f"the task's baseline could not be timed: {pacer.failed}"
    return verdict, detail


def _decide(ref: _Reference, pacer, rounds, cfg: RewardConfig, times: dict, details: dict) -> int:
    """The reward of a correct candidate: from the ratio's interval against the fresh baselines (the
    cache re-validated with them), or, with `baselines="cached"` and a complete entry, the rule on
    the cached figures as stored. Fills in the ratio, its interval and what the cache did."""
    from opsynth.reward.baselines import fresh_medians

    if pacer.baselines is None:
        times["eager_ratio"] = round(times["candidate_ms"] / ref.eager_ms, 5) if ref.eager_ms else None
        details["baseline"] = {"mode": "cached", "eager": "used_as_stored", "compile": "used_as_stored",
                               "cached": {"eager_ms": ref.eager_ms, "compile_ms": ref.compile_ms}}
        return reward_from_times(times["candidate_ms"], ref.eager_ms, ref.compile_ms, cfg.margin)
    decision = pacer.decision(rounds)
    # Blocks timed on a busy device (after the quiet cap) read slow: they neither decide a speed-up nor
    # become the task's cached baseline
    status = ref.baselines.record(pacer.samples) if not pacer.disturbed else {"not_recorded": "disturbed blocks"}
    fresh = fresh_medians(pacer.samples)
    times["eager_ms"] = fresh["eager_ms"]
    # torch.compile is timed only once eager is beaten (it decides nothing before); else the cache's figure, reported
    times["compile_ms"] = fresh["compile_ms"] if fresh["compile_ms"] is not None else (ref.baselines.cached or {}).get("compile_ms")
    for kind in ("eager", "compile"):
        iv = decision.get(kind)
        if iv:
            times[f"{kind}_ratio"], times[f"{kind}_ratio_lo"], times[f"{kind}_ratio_hi"] = iv["ratio"], iv["lo"], iv["hi"]
    details["decision"] = decision
    details["baseline"] = {"mode": "fresh", "compile_source": "fresh" if fresh["compile_ms"] is not None else "cache", **status}
    return decision["reward"]


def _judge_timing(ref: _Reference, rounds, cand: dict, cfg: RewardConfig, times: dict, details: dict, off: set) -> tuple[str, str]:
    """The timed rounds, judged here: their outputs (fingerprints, the kept ones in full), the median
    from the per-round claims, the parent's wall clock against them, and the physical floor."""
    from opsynth.reward.rounds import call_margin, judge_rounds, plausible

    if not rounds.done or rounds.error is not None:
        return "timing_protocol", rounds.error or "the timed rounds did not finish"
    ran = sorted(rounds.claims)
    fresh = "fresh_inputs" not in off
    keys = {ref.rounds.keys.get(j) for j in ran} if fresh else set(range(min(len(ref.outputs["trials"]), len(ran))))
    details["timed_input_sets"] = len(keys)
    details["timed_outputs_checked"] = len(ran) if fresh else 0
    details["timed_outputs_compared"] = len(cand.get("rounds_kept") or {}) if fresh else 0
    times["candidate_ms"] = rounds.median(main=True)
    # The parent's ms per timed call beyond the claimed time, the candidate's and the reference's (wall-clock check)
    times["round_overhead_ms"] = round(statistics.median(rounds.overheads()), 3)
    times["call_overhead_ms"] = round(statistics.median(rounds.call_overheads()), 3)
    times["reference_round_overhead_ms"] = round(statistics.median(ref.rounds.overheads()), 3)
    times["reference_call_overhead_ms"] = round(statistics.median(ref.rounds.call_overheads()), 3)
    # How much of a claim is host time beyond the device's clock (launch, event records, the sync's
    # wake-up), the candidate's and the reference's: diagnostics for between-run spread
    for key, sess in (("host_ms", rounds), ("reference_host_ms", ref.rounds)):
        shares = sess.host_shares()
        times[key] = round(statistics.median(shares), 4) if shares else None
    # What a round costs the device, the gap to the next one included; the rounds run, by pass
    periods, ref_periods = rounds.periods(), ref.rounds.periods()
    times["round_period_ms"] = round(statistics.median(periods), 3) if periods else None
    # The same periods summed, their longest, and the parent's own stretches before each round (the
    # pacer's blocks, settling and quiet window): with them the child's `rounds_run_s` adds up
    times["round_periods_s"] = round(sum(periods) / 1e3, 4) if periods else None
    times["round_period_max_ms"] = round(max(periods), 3) if periods else None
    by_round = rounds.periods_by_round()
    times["round_period_max_at"] = max(by_round, key=by_round.get, default=None)
    # The first round's stretches: inputs made, the call on the parent's clock, checks and fingerprints
    # after it (it was the longest, ~150 ms on the H200 against 2.5 ms, until the harness's first-time
    # costs moved before the lock: `candidate_runner._warm_harness`)
    times["first_round_ms"] = {k: round(d[0], 3) for k, d in (("before", rounds.before), ("call", rounds.call_wall),
                                                                ("after", rounds.after)) if 0 in d} or None
    times["pacer_before_rounds_s"] = round(sum(rounds.started[j] - rounds.asked[j] for j in rounds.started if j in rounds.asked), 4)
    times["reference_round_period_ms"] = round(statistics.median(ref_periods), 3) if ref_periods else None
    times["reference_rounds_s"] = ref.rounds_s  # the task's reference child, once per task and batch
    times["reference_untimed_rounds_s"] = ref.untimed_rounds_s
    # The harness's stretches outside the call, median per round (rounds.GAP_FACTOR checks them)
    for key, mine, theirs in (("before_call", rounds.before, ref.rounds.before), ("after_call", rounds.after, ref.rounds.after),
                              ("settle", rounds.settle, ref.rounds.settle)):
        times[f"{key}_ms"] = round(statistics.median(mine.values()), 3) if mine else None
        times[f"reference_{key}_ms"] = round(statistics.median(theirs.values()), 3) if theirs else None
    details["rounds"] = {**rounds.passes(), "reference": ref.rounds.next_round}
    # What the timed claims were raised by to meet the parent's clock around the call (1 and 0: as claimed)
    scale, shift = rounds.floor(main=not rounds.again)
    times["call_floor_scale"], times["call_shortfall_ms"] = round(scale, 4), round(shift, 3)
    # ... and the margin that decides it, unclipped (an honest child's reads near 0 or below; the floor
    # acts beyond CALL_FLOOR_SLACK_MS): what a machine's honest runs say that slack must cover
    times["call_margin_ms"] = round(call_margin(rounds, ref.rounds, rounds.timed(main=not rounds.again)), 3)
    if fresh:
        verdict, detail = judge_rounds(ref.outputs, rounds, cand.get("rounds_kept") or {}, cfg, ref.rounds.keys, ref.facts)
        if verdict != "ok":
            return verdict, detail
    if "wall_clock" not in off:
        ok, why = plausible(rounds, ref.rounds)
        if not ok:
            return "implausible_timing", why + (" (in the second timed pass)" if rounds.again else "")
    if rounds.again:
        times["first_pass_ms"] = times["candidate_ms"]
        times["candidate_ms"] = rounds.median(main=False)
        if "physical_floor" not in off and ref.floor_ms is not None and times["candidate_ms"] < ref.floor_ms:
            return "below_physical_floor", (f"median {times['candidate_ms']:.6f} ms, measured twice (first {times['first_pass_ms']:.6f} ms), "
                                            f"is below the physical floor {ref.floor_ms:.6f} ms: the outputs alone take that long to write at the device's peak bandwidth")
    if ref.flop_bound_ms is not None:
        times["flop_bound_ms"] = ref.flop_bound_ms
    return "ok", ""


def _precheck(candidate: str | Path, cfg: RewardConfig, device: str) -> tuple[CandidateSpec | None, EvalResult | None]:
    from opsynth.reward.static_check import static_check

    try:
        spec = resolve_candidate(candidate)
    except (OSError, UnicodeDecodeError) as e:
        return None, EvalResult.rejected("no_code", f"cannot read candidate: {e}", device=device)
    if spec is None:
        return None, EvalResult.rejected("no_code", "no code block found in the candidate", device=device)
    reason, detail = static_check(spec, enabled=cfg.static_check)
    if reason != "ok":
        return spec, EvalResult.rejected(reason, detail, device=device)
    return spec, None


def _cleanup(path: Path | None, cfg: RewardConfig) -> None:
    if path is not None and not cfg.keep_scratch:
        shutil.rmtree(path, ignore_errors=True)


def evaluate(task_code: str, candidate: str | Path, cfg: RewardConfig | None = None, progress=None,
             mode: str | None = None) -> EvalResult:
    """Reward of one candidate for one task. Never raises for anything the candidate does.

    `mode`: the task's train/eval mode (its row's `mode` column; `opsynth.render.task_file`).

    The reference run (eager and torch.compile baselines) and the candidate's build overlap;
    `progress(message)`, when given, hears one line per phase.
    """
    t0 = time.perf_counter()
    result = evaluate_many([(task_code, candidate, mode)], cfg, progress=progress)[0]
    result.times["wall_s"] = round(time.perf_counter() - t0, 3)
    return result


def evaluate_many(pairs, cfg: RewardConfig | None = None, on_result=None, client=None, progress=None) -> list[EvalResult]:
    """Evaluate (task_code, candidate) pairs, overlapping CPU builds with device measurement. A pair
    may carry the task's mode third, `(task_code, candidate, mode)` (default: `task_file.DEFAULT_MODE`).

    `on_result(index, result)`, when given, is called (from a worker thread) as each result is known,
    for progress reporting; an exception it raises is ignored. `progress(message)` hears phases.

    With a Dask `client`, the batch is spread over the cluster's workers (each GPU worker measures
    its share under its own device lock; see `_evaluate_on_cluster`). Otherwise, here: references
    (one per distinct task) and candidates run in `measure_workers` confined children, whose
    device-sensitive sections (checked calls and timing) take the device's exclusive lock; with
    `prebuild` (the default) every candidate first runs its module top level in a separate child,
    which is what triggers its builds, in parallel with the references; on the cpu backend all builds
    finish before anything is timed, since builds and timings would share the cores.
    """
    cfg = cfg or RewardConfig()
    pairs = [_with_mode(p) for p in pairs]
    if client is not None:
        return _evaluate_on_cluster(pairs, cfg, client, on_result, progress)
    device = cfg.resolved_device()
    batch = _Batch(pairs, cfg, device, _sayer(progress), on_result, [None] * len(pairs))
    _precheck_all(batch)
    if not batch.specs:
        return _with_settings([r for r in batch.results], cfg)  # type: ignore[misc]
    _start_services(cfg, device, batch.say)
    batch.services_at_s = batch.at()
    build_workers = cfg.resolved_build_workers(device)
    batch.scratches = {i: _tmpdir("opsynth_cand_") for i in batch.specs}
    for i in batch.specs:
        batch.by_digest.setdefault(batch.specs[i].digest(), []).append(i)
    batch.say(f"[reward] {len(batch.specs)} candidate(s), {len(batch.by_digest)} distinct, "
              f"{len({_task_of(pairs[i]) for i in batch.specs})} task(s) on {device}")
    try:
        with ThreadPoolExecutor(max_workers=build_workers) as bpool, ThreadPoolExecutor(
            max_workers=cfg.resolved_measure_workers(device)
        ) as mpool:
            measure_futs = _schedule(batch, bpool, mpool)
            _collect(batch, measure_futs)
    finally:
        _cleanup_batch(batch)
    return _with_settings([r if r is not None else EvalResult.rejected("crashed", "not evaluated", device=device)
                           for r in batch.results], cfg)


@dataclass
class _Batch:
    """One local evaluate_many call's shared state: what its worker threads read and fill in."""

    pairs: list
    cfg: RewardConfig
    device: str
    say: object
    on_result: object
    results: list
    specs: dict = field(default_factory=dict)  # index -> CandidateSpec, for those past the precheck
    scratches: dict = field(default_factory=dict)  # index -> the candidate's scratch folder
    by_digest: dict = field(default_factory=dict)  # candidate digest -> indices: identical ones build once
    # The batch's timeline, seconds from its start: where a user's single evaluation waits (services,
    # its task's reference, its build, its measurement), reported in each result's times
    t0: float = field(default_factory=time.perf_counter)
    services_at_s: float | None = None
    build_at_s: dict = field(default_factory=dict)  # candidate digest -> when its build child was asked for
    built_at_s: dict = field(default_factory=dict)  # candidate digest -> when its build child ended
    ref_futs: dict = field(default_factory=dict)  # (task_code, mode) -> future of its _Reference
    data_futs: dict = field(default_factory=dict)  # (task_code, mode) -> future of its early _Reference (None: none)

    def at(self) -> float:
        """Seconds since the batch began (its timeline)."""
        return round(time.perf_counter() - self.t0, 3)

    @cached_property
    def task_count(self) -> int:
        """Distinct tasks among the candidates past the precheck (asked once `specs` is filled)."""
        return len({_task_of(self.pairs[i]) for i in self.specs})

    def report(self, i, res):
        """Hand a result to on_result; progress reporting must never lose a batch."""
        if self.on_result is not None:
            try:
                self.on_result(i, res)
            except Exception:
                pass


def _precheck_all(batch: _Batch) -> None:
    """Settle what needs no child (bad or missing candidates) before any service starts."""
    for i, (_task, cand, _mode) in enumerate(batch.pairs):
        spec, early = _precheck(cand, batch.cfg, batch.device)
        if early is not None:
            batch.results[i] = early
            batch.report(i, early)
        else:
            batch.specs[i] = spec


def _start_services(cfg: RewardConfig, device: str, say) -> None:
    """Device and isolation checked once (one clear error, not one per candidate), then the build service."""
    try:
        cfg.check_device()
    except ValueError as e:
        raise RewardSetupError(str(e)) from None
    try:
        from opsynth.runtime.sandbox import isolation_enabled

        isolation_enabled(cfg.isolation)  # one clear error before any child, not one per candidate
    except RuntimeError as e:
        raise RewardSetupError(str(e)) from None
    build_service(cfg, device, log=say)
    from opsynth.reward import ready_children

    ready_children.start(cfg, device)  # measuring, reference and eager children forked and started ahead


def _build_distinct(batch: _Batch, digest):
    """Run one distinct candidate's module top level in a build child (or leave it to the measuring child)."""
    i = batch.by_digest[digest][0]
    if not batch.cfg.resolved_prebuild(batch.device):  # the measuring child builds inline
        from opsynth.runtime.sandbox import ChildResult

        return digest, ChildResult("ok")
    batch.say(f"[reward] candidate {i}: running its module top level (builds its extensions)")
    batch.build_at_s[digest] = batch.at()  # before the child: a cold fork server's start-up lies between
    try:
        return digest, _build(batch.specs[i], batch.cfg, batch.device, batch.scratches[i])
    finally:
        batch.built_at_s[digest] = batch.at()


def _start_baselines(batch: _Batch, task, job: dict):
    """The task's baselines (`baselines.TaskBaselines`): its eager child, and its compile child when the
    batch prestarts it. They need only the seeds the parent drew for the reference (`job`)."""
    from opsynth.reward.baselines import TaskBaselines, prestarts_compile

    baselines = TaskBaselines(task[0], task[1], job, batch.cfg, batch.device)  # starts its eager child now
    if prestarts_compile(batch.cfg, batch.device, batch.task_count):
        baselines.prestart_compile()
    return baselines


def _reference_task(batch: _Batch, task):
    """One task's reference run, with a line before and after for progress. Its baseline children
    start as soon as the reference's timed rounds are over (a cold torch.compile took 3.5 s of a
    warm CLI evaluation's wall when it started only after the reference had handed its data over)."""
    batch.say("[reward] reference: Model outputs and the timed rounds' fingerprints; an eager baseline child")
    early: list[Future] = []
    at: dict = {}

    def start_early(job):
        fut: Future = Future()
        early.append(fut)
        at["baselines_at_s"] = batch.at()

        def start():
            try:
                fut.set_result(_start_baselines(batch, task, job))
            except BaseException as e:  # noqa: BLE001 - raised where it was raised before: from this task's reference
                fut.set_exception(e)

        threading.Thread(target=start, name="opsynth-baselines-start", daemon=True).start()

    def close_early():
        if early and early[0].exception() is None:
            early[0].result().close()

    data_fut = batch.data_futs.get(task)

    def on_data(early_ref: _Reference):
        at["handed_at_s"] = batch.at()  # seconds into the batch when its data was handed over
        if data_fut is not None and not data_fut.done():
            data_fut.set_result(early_ref)

    try:
        ref = _prepare_reference(task[0], batch.cfg, batch.device, task[1], on_timed=start_early,
                                 on_data=on_data if data_fut is not None else None)
    except BaseException:
        close_early()
        raise
    finally:
        if data_fut is not None and not data_fut.done():
            data_fut.set_result(None)  # no early form: its candidates wait for the whole reference
    ref.done_at_s = batch.at()
    ref.phases.update(at)
    if not ref.ok:
        close_early()
    elif early:
        ref.baselines = early[0].result()
    else:  # not taken in practice: an ok reference reported its rounds done through the handler, which started them
        ref.baselines = _start_baselines(batch, task, ref.job)
    batch.say(f"[reward] reference: {'ok' if ref.ok else ref.reason} (cached eager {ref.eager_ms} ms, compile {ref.compile_ms} ms)")
    return ref


def _measure_reported(batch: _Batch, j, bres):
    """Measure candidate j and report its result as soon as it is known."""
    batch.say(f"[reward] candidate {j}: checking and timing")
    res = _measure_one(batch, j, bres)
    batch.say(f"[reward] candidate {j}: reward {res.reward} ({res.reason})")
    batch.report(j, res)
    return res


def _measure_one(batch: _Batch, j, bres):
    """Candidate j's result: its reference's or build's rejection, else the measuring child's verdict.
    A built candidate starts on its reference's early form when there is one (its data is written):
    its setup and checked calls overlap the reference's timed rounds, and `_measure` holds its timing
    and judging until the reference is whole."""
    device = batch.device
    task = _task_of(batch.pairs[j])
    data_fut = batch.data_futs.get(task)
    early = data_fut.result() if data_fut is not None and bres.reason == "ok" else None
    if early is not None:
        early.full = batch.ref_futs[task]
        ref = early
    else:
        ref = batch.ref_futs[task].result()
    if not ref.ok:
        return EvalResult.rejected(ref.reason, ref.log, device=device)
    if bres.reason != "ok":
        out = EvalResult.rejected(bres.reason, bres.log, device=device)
        out.details = {k: bres.data[k] for k in ("detail", "builds") if bres.data.get(k) is not None}
        return out
    measure_at = batch.at()
    res = _measure(batch.specs[j], ref, batch.cfg, device, batch.scratches[j], bres.log)
    if early is not None:
        ref = early.full.result()  # whole by now: _measure waited for it
        res.times["early_data"] = True
    # The timeline (seconds into the batch): services up, its reference ready, its build ended, its
    # measuring child started (after both), its result known (the judging included)
    if ref.baselines is not None:  # which of the task's first children were parked ahead (diagnostics)
        eager = ref.baselines.started("eager")
        res.times["ready_reference"] = ref.ready_child
        res.times["ready_eager"] = eager.parked if eager is not None else None
    res.times.update({f"reference_{k}": v for k, v in ref.phases.items()})
    res.times.update(services_at_s=batch.services_at_s, reference_at_s=ref.done_at_s,
                     build_at_s=batch.build_at_s.get(batch.specs[j].digest()),
                     built_at_s=batch.built_at_s.get(batch.specs[j].digest()), measure_at_s=measure_at, done_at_s=batch.at())
    if bres.data and bres.data.get("build_s") is not None:
        res.times["prebuild_s"] = round(bres.data["build_s"], 3)  # the module top level, builds included
        res.times["prebuild_wall_s"] = round(bres.wall_s, 3)  # the whole build child, start to exit
        res.times["prebuild_server_wait_s"] = bres.server_wait_s  # a cold fork server's start, before that child
    if bres.data and bres.data.get("builds"):
        res.details["builds"] = bres.data["builds"]
    return res


def _schedule(batch: _Batch, bpool, mpool) -> dict:
    """Submit references, builds and (as each build finishes) measurements; returns index -> future."""

    def submit_references():
        for i in batch.specs:
            task = _task_of(batch.pairs[i])
            if task not in batch.ref_futs:
                if early_data:
                    batch.data_futs[task] = Future()
                batch.ref_futs[task] = mpool.submit(_reference_task, batch, task)

    # On a GPU, builds (CPU) overlap timing (device). On the cpu backend they would share the
    # cores and skew every baseline and candidate timing, so all builds finish first there.
    overlap = batch.device != "cpu"
    # Candidates start on their reference's early form only where measurements overlap one another
    # anyway (more than one measuring worker): with one, nothing could start earlier, and on the cpu
    # backend a child's start-up beside the reference's timed rounds would share its cores
    early_data = batch.cfg.resolved_measure_workers(batch.device) > 1
    if overlap:  # references go first in the measurement queue, so measurements never wait long
        submit_references()
    build_futs = [bpool.submit(_build_distinct, batch, d) for d in batch.by_digest]  # identical candidates build once
    if not overlap:
        for fut in build_futs:
            fut.exception()  # wait
        submit_references()
    measure_futs = {}
    for fut in as_completed(build_futs):
        digest, bres = fut.result()
        for j in batch.by_digest[digest]:
            measure_futs[j] = mpool.submit(_measure_reported, batch, j, bres)
    return measure_futs


def _collect(batch: _Batch, measure_futs: dict) -> None:
    """Results into their slots; a harness bug is one candidate's 'crashed', never the batch's loss."""
    for j, fut in measure_futs.items():
        try:
            batch.results[j] = fut.result()
        except RewardSetupError:
            raise
        except Exception as e:  # a harness bug must not lose the whole batch
            batch.results[j] = EvalResult.rejected("crashed", f"harness error: {type(e).__name__}: {e}", device=batch.device)


def _cleanup_batch(batch: _Batch) -> None:
    """Scratch folders of candidates and of the references that finished."""
    for s in batch.scratches.values():
        _cleanup(s, batch.cfg)
    for f in batch.ref_futs.values():
        if f.done() and f.exception() is None:
            if f.result().baselines is not None:
                f.result().baselines.close()
            _cleanup(f.result().scratch, batch.cfg)


def _with_mode(pair) -> tuple:
    """(task_code, candidate, mode) from a pair with or without its task's mode."""
    task_code, candidate, *rest = pair
    if len(rest) > 1:
        raise ValueError(f"a pair is (task_code, candidate) or (task_code, candidate, mode), got {len(pair)} items")
    return task_code, candidate, check_mode(rest[0] if rest else None)


def _task_of(pair: tuple) -> tuple[str, str]:
    """What one reference run serves: the task's code in its mode."""
    return pair[0], pair[2]


def _with_settings(results: list[EvalResult], cfg: RewardConfig) -> list[EvalResult]:
    """Record the settings each verdict was reached with (the feedback turn quotes them)."""
    for r in results:
        r.details.setdefault("settings", cfg.quoted_settings())
    return results


class RewardSetupError(RuntimeError):
    """The environment cannot evaluate anything here (no sandbox, no fork server): the caller's problem."""


def _sayer(progress):
    if progress is None:
        return lambda msg: None

    def say(msg):
        try:
            progress(msg)
        except Exception:
            pass

    return say


def cache_stats(cfg: RewardConfig | None = None, device: str | None = None) -> dict:
    """Build-cache counters of this process (extension hits, builds) plus ccache's translation units."""
    from opsynth.reward.builds import ccache_stats

    cfg = cfg or RewardConfig()
    device = device or cfg.resolved_device()
    svc = build_service(cfg, device)
    return {"extensions": svc.stats.as_dict(), "ccache": ccache_stats(svc.ccache, svc.cache_dir), "ccache_path": svc.ccache}


# ---- on a Dask cluster --------------------------------------------------------------------------------


def _worker_evaluate(chunk: list, cfg_dict: dict) -> list[dict]:
    """On a Dask worker: evaluate this share of the batch with the worker's own fork server, device
    and lock. With `remote_builds`, this worker's builds go to any worker of the cluster."""
    cfg = RewardConfig.from_dict(cfg_dict)
    if cfg.remote_builds:
        from distributed import get_client

        svc = build_service(cfg, cfg.resolved_device())
        svc.remote = get_client()
    return [r.to_dict() for r in evaluate_many(chunk, cfg)]


def _evaluate_on_cluster(pairs: list, cfg: RewardConfig, client, on_result, progress) -> list[EvalResult]:
    """Split the batch by task over the workers (GPU workers when the cluster has them), one share each."""
    import dataclasses

    from opsynth.cluster.workers import cluster_workers

    say = _sayer(progress)
    workers = cluster_workers(client)
    gpu = {a: w for a, w in workers.items() if "GPU" in (w.get("resources") or {})}
    targets = sorted(gpu or workers)
    if not targets:
        raise RewardSetupError("the Dask cluster has no workers")
    cfg_dict = dataclasses.asdict(cfg)
    if gpu and cfg.device == "auto":
        cfg_dict["device"] = "cuda"
    by_task: dict[tuple[str, str], list[int]] = {}
    for i, pair in enumerate(pairs):
        by_task.setdefault(_task_of(pair), []).append(i)
    shares: list[list[int]] = [[] for _ in targets]
    for idx in sorted(by_task.values(), key=len, reverse=True):  # largest task groups first, to the lightest share
        min(shares, key=len).extend(idx)
    futs = {}
    for addr, idx in zip(targets, shares):
        if idx:
            kw = {"resources": {"GPU": 1}} if gpu else {"workers": [addr]}
            futs[client.submit(_worker_evaluate, [pairs[i] for i in idx], cfg_dict, pure=False, **kw)] = idx
    say(f"[reward] {len(pairs)} candidate(s) over {len(futs)} worker(s) ({'GPU' if gpu else 'CPU'})")
    from distributed import as_completed as dask_completed

    results: list[EvalResult | None] = [None] * len(pairs)
    for fut in dask_completed(list(futs)):
        idx = futs[fut]
        try:
            got = [EvalResult(**d) for d in fut.result()]
        except Exception as e:  # a lost worker fails its share, not the batch
            got = [EvalResult.rejected("crashed", f"worker failed: {type(e).__name__}: {e}") for _ in idx]
        for i, r in zip(idx, got):
            results[i] = r
            if on_result is not None:
                try:
                    on_result(i, r)
                except Exception:
                    pass
    return [r if r is not None else EvalResult.rejected("crashed", "not evaluated") for r in results]


def main_json(task_path: str, candidate_path: str, cfg: RewardConfig | None = None) -> dict:
    """One evaluation from files, as a JSON-ready dict."""
    res = evaluate(Path(task_path).read_text(), Path(candidate_path), cfg, progress=lambda m: print(m, file=sys.stderr, flush=True))
    return res.to_dict()


if __name__ == "__main__":  # pragma: no cover - convenience
    print(json.dumps(main_json(sys.argv[1], sys.argv[2])))
