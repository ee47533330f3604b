"""Reward for one candidate kernel (or many): sandboxed, hack-resistant, -1 / 1 / 2 / 3.

Flow of one evaluation (every untrusted step in its own child process, with timeout and limits):

1. resolve the candidate (source, file, workspace, or fenced code in a completion) and pre-check it
   statically (cheap rejections first);
2. reference child: builds Model, draws fresh inputs from seeds chosen here, saves its weights,
   inputs and outputs to a scratch dir, and times eager and torch.compile (cached per task, device,
   torch version); the parent loads the outputs and deletes the file before any candidate runs;
3. candidate child, build phase (CPU; in `evaluate_many` on cpu, a separate child per candidate, in
   parallel; otherwise inside the measuring child): runs the module top level, which compiles its
   extensions into a content-addressed cache;
4. candidate child, measure phase (serialised on the device): runs ModelNew under the guards,
   saves its outputs, times it;
5. the parent compares outputs with the reference and applies the reward rule.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from opsynth.reward.candidate import CandidateSpec, extract_candidate, resolve_candidate
from opsynth.reward.eval_types import EvalResult, RewardConfig, reward_from_times

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
    eager_ms: float | None = None
    compile_ms: float | None = None


def _tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def _prepare_reference(task_code: str, cfg: RewardConfig, device: str) -> _Reference:
    from opsynth.reward import baseline_cache
    from opsynth.reward.sandbox import run_child

    scratch = _tmpdir("opsynth_ref_")
    (scratch / "task.py").write_text(task_code)
    cached = baseline_cache.lookup(cfg, task_code, device)
    rng = secrets.SystemRandom()
    job = {
        "task_path": str(scratch / "task.py"),
        "device": device,
        "trial_seeds": [rng.randrange(1, 2**62) for _ in range(cfg.num_trials)],
        "second_seed": rng.randrange(1, 2**62),
        "init_seed": rng.randrange(1, 2**62),
        "second_shape": cfg.second_shape,
        "measure_baselines": cached is None,
        "compile_baseline": cfg.compile_baseline,
        "timing": list(cfg.timing(device)),
        "flush_l2": cfg.flush_l2,
        "cpu_threads": cfg.resolved_cpu_threads(device),
        "memory_limit_gb": cfg.memory_limit_gb,
        "data_path": str(scratch / "data.pt"),
        "init_path": str(scratch / "init.pt"),
        "ref_outputs_path": str(scratch / "ref_outputs.pt"),
        "result_path": str(scratch / "ref_result.json"),
        "device_lock": str(cfg.resolved_cache_dir() / "device.lock"),
    }
    res = run_child("opsynth.reward.reference_runner", job, scratch, cfg.reference_timeout_s, cfg)
    if res.reason != "ok":
        return _Reference(False, "reference_" + res.reason, res.log, scratch)
    import torch

    out_path = Path(job["ref_outputs_path"])
    outputs = torch.load(out_path, weights_only=True)
    out_path.unlink()  # the candidate must never find the answers on disk
    # Nor the inputs and weights: a module could read them at import time (when torch compute is
    # still allowed) and precompute outputs. They reach the candidate child on stdin, after __init__.
    data_path = Path(job["data_path"])
    data = data_path.read_bytes()
    data_path.unlink()
    eager_ms, compile_ms = res.data.get("eager_ms"), res.data.get("compile_ms")
    if cached is not None:
        eager_ms, compile_ms = cached["eager_ms"], cached["compile_ms"]
    else:
        baseline_cache.store(cfg, task_code, device, eager_ms, compile_ms)
    job["output_meta"] = res.data.get("output_meta")
    job["has_second"] = res.data.get("has_second", False)
    return _Reference(True, "ok", res.log, scratch, job, outputs=outputs, data=data, eager_ms=eager_ms, compile_ms=compile_ms)


def _candidate_job(spec: CandidateSpec, ref: _Reference, cfg: RewardConfig, device: str, scratch: Path, mode: str) -> dict:
    (scratch / "model_new.py").write_text(spec.source)
    if spec.kernel_files:
        kdir = scratch / "kernels"
        kdir.mkdir(exist_ok=True)
        for name, text in spec.kernel_files.items():
            (kdir / name).write_text(text)
    job = {
        "mode": mode,
        "candidate_path": str(scratch / "model_new.py"),
        "workspace": bool(spec.kernel_files),
        "device": device,
        "cache_dir": str(cfg.resolved_cache_dir()),
        "shared_pch": cfg.shared_pch,
        "cpu_threads": cfg.resolved_cpu_threads(device),
        "memory_limit_gb": cfg.memory_limit_gb,
        "result_path": str(scratch / f"cand_{mode}.json"),
        "device_lock": str(cfg.resolved_cache_dir() / "device.lock"),
    }
    if ref is not None and ref.job is not None:
        job.update(
            {
                "init_path": ref.job["init_path"],
                "output_meta": ref.job["output_meta"],
                "has_second": ref.job["has_second"],
                "init_seed": ref.job["init_seed"],
                "timing": ref.job["timing"],
                "flush_l2": cfg.flush_l2,
                "outputs_path": str(scratch / "cand_outputs.pt"),
            }
        )
    return job


def _build(spec: CandidateSpec, cfg: RewardConfig, device: str, scratch: Path):
    """Run the candidate's module top level once (compiling its extensions into the shared cache)."""
    from opsynth.reward.sandbox import run_child

    job = _candidate_job(spec, None, cfg, device, scratch, "build")
    job["cpu_threads"] = 1  # it only compiles: no torch thread pools to spin next to the compilers
    return run_child("opsynth.reward.candidate_runner", job, scratch, cfg.build_timeout_s, cfg)


def _measure(spec: CandidateSpec, ref: _Reference, cfg: RewardConfig, device: str, scratch: Path, build_log: str = "") -> EvalResult:
    from opsynth.reward.compare import judge_outputs
    from opsynth.reward.sandbox import run_child

    times = {"candidate_ms": None, "eager_ms": ref.eager_ms, "compile_ms": ref.compile_ms}
    job = _candidate_job(spec, ref, cfg, device, scratch, "measure")
    # The first run of a fresh build compiles inside this child too, so allow for it.
    res = run_child("opsynth.reward.candidate_runner", job, scratch, cfg.run_timeout_s + cfg.build_timeout_s, cfg, stdin_bytes=ref.data)
    log = (build_log + "\n" + res.log).strip()
    if res.reason != "ok":
        return EvalResult.rejected(res.reason, log, times, device)
    times["measure_wall_s"] = round(res.wall_s, 3)  # the whole measuring child, start to exit
    times["candidate_ms"] = res.data.get("candidate_ms")
    times["build_s"] = res.data.get("build_s")
    times["setup_s"] = res.data.get("setup_s")  # child start-up to checked calls (outside the device lock)
    times["locked_s"] = res.data.get("locked_s")  # checks, profiler and timing (holding the device lock)
    import torch

    cand = torch.load(job["outputs_path"], weights_only=True)
    verdict, detail = judge_outputs(ref.outputs, cand, cfg)
    log = (log + "\n" + detail).strip()
    if verdict != "ok":
        return EvalResult.rejected(verdict, log, times, device)
    reward = reward_from_times(times["candidate_ms"], ref.eager_ms, ref.compile_ms, cfg.margin)
    return EvalResult(reward=reward, correct=True, reason="ok", times=times, log=log, device=device)


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


def evaluate(task_code: str, candidate: str | Path, cfg: RewardConfig | None = None) -> EvalResult:
    """Reward of one candidate for one task. Never raises for anything the candidate does."""
    cfg = cfg or RewardConfig()
    device = cfg.resolved_device()
    t0 = time.perf_counter()
    spec, early = _precheck(candidate, cfg, device)
    if early is not None:
        return early
    ref = _prepare_reference(task_code, cfg, device)
    scratch = _tmpdir("opsynth_cand_")
    try:
        if not ref.ok:
            return EvalResult.rejected(ref.reason, ref.log, device=device)
        result = _measure(spec, ref, cfg, device, scratch)
    finally:
        _cleanup(scratch, cfg)
        _cleanup(ref.scratch, cfg)
    result.times["wall_s"] = round(time.perf_counter() - t0, 3)
    return result


def evaluate_many(pairs, cfg: RewardConfig | None = None, on_result=None) -> list[EvalResult]:
    """Evaluate (task_code, candidate) pairs, overlapping CPU builds with device measurement.

    `on_result(index, result)`, when given, is called (from a worker thread) as each result is known,
    for progress reporting; an exception it raises is ignored.

    References (one per distinct task) and candidates run in `measure_workers` children, whose
    device-sensitive sections (checked calls and timing) take an exclusive lock on the device, so
    timings never overlap each other while other children's builds and start-up (imports, CUDA
    context, loading the extension) do. With `prebuild` (the cpu default, where builds and timings
    would compete for the same cores) candidates first build in `build_workers` separate children,
    and all builds finish before anything is timed; on cuda each candidate's one child builds inline.
    """
    cfg = cfg or RewardConfig()
    device = cfg.resolved_device()
    pairs = list(pairs)
    results: list[EvalResult | None] = [None] * len(pairs)
    specs: dict[int, CandidateSpec] = {}

    def report(i, res):
        if on_result is not None:
            try:
                on_result(i, res)
            except Exception:  # progress reporting must never lose a batch
                pass

    for i, (_task, cand) in enumerate(pairs):
        spec, early = _precheck(cand, cfg, device)
        if early is not None:
            results[i] = early
            report(i, early)
        else:
            specs[i] = spec
    build_workers = cfg.resolved_build_workers(device)
    scratches = {i: _tmpdir("opsynth_cand_") for i in specs}
    by_digest: dict[str, list[int]] = {}
    for i in specs:
        by_digest.setdefault(specs[i].digest(), []).append(i)

    def build(digest):
        i = by_digest[digest][0]
        if not cfg.resolved_prebuild(device):  # the measuring child builds inline (one process per candidate)
            from opsynth.reward.sandbox import ChildResult

            return digest, ChildResult("ok")
        return digest, _build(specs[i], cfg, device, scratches[i])

    ref_futs = {}

    def measure(j, bres):
        res = _measure_one(j, bres)
        report(j, res)
        return res

    def _measure_one(j, bres):
        ref = ref_futs[pairs[j][0]].result()
        if not ref.ok:
            return EvalResult.rejected(ref.reason, ref.log, device=device)
        if bres.reason != "ok":
            return EvalResult.rejected(bres.reason, bres.log, device=device)
        res = _measure(specs[j], ref, cfg, device, scratches[j], bres.log)
        if bres.data and bres.data.get("build_s") is not None:
            res.times["prebuild_s"] = round(bres.data["build_s"], 3)  # compiling, inside the build child
            res.times["prebuild_wall_s"] = round(bres.wall_s, 3)  # the whole build child, start to exit
        return res

    try:
        with ThreadPoolExecutor(max_workers=build_workers) as bpool, ThreadPoolExecutor(
            max_workers=cfg.resolved_measure_workers(device)
        ) as mpool:
            def submit_references():
                for i in specs:
                    task = pairs[i][0]
                    if task not in ref_futs:
                        ref_futs[task] = mpool.submit(_prepare_reference, task, cfg, device)

            # On a GPU, builds (CPU) overlap timing (device). On the cpu backend they would share the
            # cores and skew every baseline and candidate timing, so all builds finish first there.
            overlap = device != "cpu"
            if overlap:  # references go first in the measurement queue, so measurements never wait long
                submit_references()
            build_futs = [bpool.submit(build, d) for d in by_digest]  # identical candidates build once
            if not overlap:
                for fut in build_futs:
                    fut.exception()  # wait
                submit_references()
            measure_futs = {}
            for fut in as_completed(build_futs):
                digest, bres = fut.result()
                for j in by_digest[digest]:
                    measure_futs[j] = mpool.submit(measure, j, bres)
            for j, fut in measure_futs.items():
                try:
                    results[j] = fut.result()
                except Exception as e:  # a harness bug must not lose the whole batch
                    results[j] = EvalResult.rejected("crashed", f"harness error: {type(e).__name__}: {e}", device=device)
    finally:
        for s in scratches.values():
            _cleanup(s, cfg)
        for f in ref_futs.values():
            if f.done() and f.exception() is None:
                _cleanup(f.result().scratch, cfg)
    return [r if r is not None else EvalResult.rejected("crashed", "not evaluated", device=device) for r in results]


def main_json(task_path: str, candidate_path: str, cfg: RewardConfig | None = None) -> dict:
    """One evaluation from files, as a JSON-ready dict (used by pipelines.evaluate)."""
    res = evaluate(Path(task_path).read_text(), Path(candidate_path), cfg)
    return res.to_dict()


if __name__ == "__main__":  # pragma: no cover - convenience
    import sys

    print(json.dumps(main_json(sys.argv[1], sys.argv[2])))
