"""The child side of a confined job: what a forked child runs before and around the untrusted work.

`run_job` is the fork server's entry for each child (opsynth.runtime.forkserver); a runner module
(opsynth.reward.candidate_runner, reference_runner, build_runner) calls `child_main(run)`, which
reads the job, sets the limits, runs it and writes the verdict whatever the untrusted code did.
Kept apart from opsynth.runtime.sandbox (the parent side, which starts the fork server) so that
neither imports the other.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

from opsynth.runtime.device_lock import checks_share, timing_section


def apply_limits(job: dict) -> None:
    """Limits the child sets on itself before running untrusted code."""
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


def device_lock(job: dict, _timing_section=timing_section):
    """The device to itself for a child's timed work (`opsynth.runtime.device_lock.timing_section`:
    no checks and no other timing run on the device meanwhile). The lock function is bound as a
    default argument: the reward's harness snapshot watches this function's defaults, so a candidate
    that rebinds it to skip the lock is seen."""
    return _timing_section(job.get("device_lock") or None)


def device_checks(job: dict, _checks_share=checks_share):
    """The device for a child's checked, untimed work (reference outputs, correctness runs): shared
    with other checks, never beside a timing (`opsynth.runtime.device_lock.checks_share`)."""
    return _checks_share(job.get("device_lock") or None)


BUILD_FD: int | None = None  # the child's end of its build channel, when it has one
FDS: dict[str, int] = {}  # every channel the parent handed this child, by name ("build", "outputs")


def park(module: str, go_fd: int, prewarm: dict) -> None:
    """A parked child (`sandbox.ParkedChild`), confined already: do the runner's job-independent
    start-up (`module.prewarm(prewarm)`, e.g. a CUDA context), then wait for the parent's go byte,
    written once this child's one job is in its scratch. End quietly when the parent closes the pipe
    without one (its pool shut down): there is no job to report on."""
    import importlib

    fn = getattr(importlib.import_module(module), "prewarm", None)
    if fn is not None:
        fn(prewarm)
    go = os.read(go_fd, 1)  # retried on EINTR by Python (PEP 475)
    os.close(go_fd)
    if not go:
        os._exit(0)


def run_job(module: str, job_path: str, fds: dict[str, int] | None = None) -> None:
    """Entry of a forked child: import the runner (already warm) and run it."""
    import importlib

    global BUILD_FD
    FDS.clear()
    FDS.update(fds or {})
    BUILD_FD = FDS.get("build")
    mod = importlib.import_module(module)
    if hasattr(mod, "_T_IMPORT"):
        mod._T_IMPORT = time.perf_counter()  # this child's start, not the fork server's
    child_main(mod.run, job_path)


def child_main(fn, job_path: str | None = None) -> None:
    """Read the job, apply limits, call fn(job) -> dict, write the verdict, exit without teardown."""
    t0 = time.perf_counter()
    job_path = Path(job_path or sys.argv[1])
    job = json.loads(job_path.read_text())
    apply_limits(job)
    result_path = Path(job["result_path"])
    try:
        data = fn(job)
    except BaseException as e:  # the verdict must be written whatever the untrusted code did
        import traceback

        traceback.print_exc()
        data = {"reason": "crashed", "error": f"{type(e).__name__}: {e}"[:2000]}
    if isinstance(data, dict):  # the job's own seconds, for the parent's diagnostics only (the
        # rest of its wall is the fork and the exit; the child could lie, so nothing is decided on it)
        data.setdefault("run_s", round(time.perf_counter() - t0, 3))
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: untrusted atexit hooks and extension destructors
