"""Child processes for untrusted work: `python -m <runner> job.json`, with a timeout and rlimits.

subprocess rather than multiprocessing: callers may be daemonic (Dask workers, trainer processes),
which may not fork children through multiprocessing. The child writes its verdict to a JSON file;
anything else it prints becomes the log.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_LIMIT = 20_000


@dataclass
class ChildResult:
    reason: str  # "ok", "timeout", "crashed", or the child's own named reason
    data: dict = field(default_factory=dict)
    log: str = ""
    wall_s: float = 0.0


def child_env(cache_dir: Path, cpu_threads: int | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["TORCH_EXTENSIONS_DIR"] = str(cache_dir / "torch_extensions")
    env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    # Keep freed blocks (up to 32 MiB) in the heap with their contents, so the poison the candidate
    # runner writes into freed memory is what an unwritten output shows (glibc would otherwise unmap it).
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 * 2**20))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(2**30))
    if cpu_threads:
        env["OMP_NUM_THREADS"] = str(cpu_threads)
    return env


def _feed(proc, data: bytes) -> None:
    try:
        proc.stdin.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass  # the child died or stopped reading; its verdict says why
    finally:
        try:
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass


def run_child(module: str, job: dict, scratch: Path, timeout_s: float, cfg, stdin_bytes: bytes | None = None) -> ChildResult:
    """Run `python -m module job.json` in scratch; kill its whole process group on timeout.

    stdin_bytes, when given, is streamed to the child's stdin (read by it when it is ready).
    """
    scratch = Path(scratch)
    job = dict(job, timeout_s=timeout_s)
    job_path = scratch / f"job_{module.rsplit('.', 1)[-1]}_{job.get('mode', 'run')}.json"
    job_path.write_text(json.dumps(job))
    result_path = Path(job["result_path"])
    result_path.unlink(missing_ok=True)
    log_path = job_path.with_suffix(".log")
    cache_dir = cfg.resolved_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log_path, "wb") as log_f:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, str(job_path)],
            cwd=scratch,
            stdin=subprocess.PIPE if stdin_bytes is not None else subprocess.DEVNULL,
            stdout=log_f,
            stderr=subprocess.STDOUT,
            env=child_env(cache_dir, job.get("cpu_threads", cfg.cpu_threads)),
            start_new_session=True,  # its own process group, so a timeout kills builds it spawned too
        )
        feeder = None
        if stdin_bytes is not None:
            import threading

            feeder = threading.Thread(target=_feed, args=(proc, stdin_bytes), daemon=True)
            feeder.start()
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            rc = proc.wait()
        if feeder is not None:
            feeder.join(timeout=5)
    wall = time.perf_counter() - t0
    log = log_path.read_text(errors="replace")[-LOG_LIMIT:]
    if timed_out:
        return ChildResult("timeout", {}, log + f"\n[sandbox] killed after {timeout_s:.0f} s", wall)
    if result_path.exists():
        try:
            data = json.loads(result_path.read_text())
        except json.JSONDecodeError:
            data = {"reason": "crashed"}
        return ChildResult(data.get("reason", "crashed"), data, log, wall)
    how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
    return ChildResult("crashed", {}, log + f"\n[sandbox] child ended with {how} and no verdict", wall)


# ---- child side -------------------------------------------------------------------------------------


def apply_limits(job: dict) -> None:
    """Limits the child sets on itself before running untrusted code (no preexec_fn: parents may be threaded)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    timeout = float(job.get("timeout_s") or 600)
    cpu = int(timeout * max(2, os.cpu_count() or 2)) + 60
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    fsize = 16 * 2**30
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    if job.get("device") == "cpu" and job.get("memory_limit_gb"):
        # CUDA reserves terabytes of address space, so an address-space cap only fits the cpu backend.
        cap = int(float(job["memory_limit_gb"]) * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def device_lock(job: dict):
    """Exclusive use of the device for the timed and checked part of a child's work (the verifier's
    lock: one per physical GPU, `opsynth.verify.timing.device_lock_path`)."""
    from opsynth.verify.timing import file_lock

    return file_lock(job.get("device_lock") or None)


def child_main(fn) -> None:
    """Entry of a runner: read the job, apply limits, call fn(job) -> dict, write the verdict."""
    job_path = Path(sys.argv[1])
    job = json.loads(job_path.read_text())
    apply_limits(job)
    result_path = Path(job["result_path"])
    try:
        data = fn(job)
    except BaseException as e:  # the verdict must be written whatever the untrusted code did
        import traceback

        traceback.print_exc()
        data = {"reason": "crashed", "error": f"{type(e).__name__}: {e}"[:2000]}
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: untrusted atexit hooks and extension destructors
