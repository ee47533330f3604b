"""Dask on Slurm (dask-jobqueue's SLURMCluster) with a lifecycle a user can rely on.

- Before anything is queued, the job script is written to the log folder and checked with
  `sbatch --test-only`, so a partition, account, memory or GPU request the cluster cannot serve
  stops the run at once with Slurm's own message and the setting to change.
- Then `jobs` jobs are submitted and the run waits at most `start_timeout_s` for the first Dask
  worker; a job that ends before its worker connects, a pending reason that cannot clear, or the
  deadline stop it with one line naming the job's state or log.
- While the run goes on, jobs whose worker left (walltime, node failure) are submitted again, and
  when no worker at all has been connected for `start_timeout_s` the run stops instead of waiting.
- SIGTERM (a scheduler's or `kill`'s default) unwinds the run like Ctrl-C, so the run's jobs are
  cancelled; at close every job with the run's unique job name is cancelled, even one dask-jobqueue
  lost track of.
- Job scripts and logs go to `<output_dir>/slurm/` (or `cluster.slurm.log_directory`), never to the
  working directory.

Every message that ends a run is one line, in a `ClusterError` (at start) or a `ClusterLost`
(mid-run); `pipelines/generate.py` prints it and exits 2.
"""

from __future__ import annotations

import _thread
import inspect
import logging
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("opsynth.slurm")

SUPERVISE_EVERY_S = 5.0

# Slurm's wording (lower case) -> the setting that decides it.
_ERROR_HINTS = (
    ("invalid partition", "set cluster.slurm.queue to a partition `sinfo` lists{partitions}"),
    ("invalid generic resource", "fix the --gres/--gpus line in cluster.slurm.job_extra_directives "
                                 "(`sinfo -o '%P %G'` lists each partition's GPUs)"),
    ("memory specification", "lower cluster.slurm.memory (`sinfo -o '%P %m'` lists each node's memory in MB)"),
    ("requested node configuration is not available",
     "lower cluster.slurm.cores or cluster.slurm.memory, or fix the --gres line in cluster.slurm.job_extra_directives "
     "(no node of the partition has that much; `sinfo -o '%P %c %m %G'` lists what they have)"),
    ("account", "set cluster.slurm.account to an account you may use (`sacctmgr show assoc user=$USER`)"),
    ("time limit", "lower cluster.slurm.walltime (`sinfo -o '%P %l'` lists each partition's limit)"),
    ("qos", "fix the --qos line in cluster.slurm.job_extra_directives (`sacctmgr show qos`)"),
)
# Pending reasons that waiting does not clear -> the setting to change.
_HOPELESS_PENDING = {
    "PartitionConfig": "the job asks for more than the partition allows: lower cluster.slurm.cores or "
                       "cluster.slurm.memory, or set cluster.slurm.queue to a partition with bigger nodes",
    "PartitionTimeLimit": "lower cluster.slurm.walltime below the partition's limit (`sinfo -o '%P %l'`)",
    "PartitionNodeLimit": "the partition has no node that size: lower cluster.slurm.cores or cluster.slurm.memory",
    "BadConstraints": "fix the constraint in cluster.slurm.job_extra_directives",
    "InvalidAccount": "set cluster.slurm.account to an account you may use",
    "InvalidQOS": "fix the --qos line in cluster.slurm.job_extra_directives",
    "AccountNotAllowed": "set cluster.slurm.account to an account allowed on cluster.slurm.queue",
    "QOSMaxWallDurationPerJobLimit": "lower cluster.slurm.walltime to what the QOS allows",
}


class ClusterError(RuntimeError):
    """The cluster cannot run this job as configured; the message is one line naming the setting."""


class ClusterLost(BaseException):
    """Mid-run, every worker left and none came back in time. Raised in the main thread from a
    signal handler, so it may land inside any `except Exception` of the run: a BaseException, like
    KeyboardInterrupt, it unwinds past them (running the finally blocks) instead of being taken
    for a failed candidate."""


def known_settings() -> set[str]:
    """Every keyword SLURMCluster accepts (its job and cluster parameters)."""
    from dask_jobqueue.core import Job, JobQueueCluster
    from dask_jobqueue.slurm import SLURMJob

    names: set[str] = set()
    for fn in (SLURMJob.__init__, Job.__init__, JobQueueCluster.__init__):
        names |= {p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names - {"self", "scheduler", "name", "config_name", "job_cls", "n_workers", "loop", "asynchronous"}


def check_settings(slurm: dict) -> None:
    """Refuse a key SLURMCluster does not take (a typo would otherwise surface as a TypeError in a
    background thread) and values it would misread."""
    try:
        known = known_settings()
    except ImportError:
        return  # start_slurm says how to install dask-jobqueue
    unknown = sorted(set(slurm) - known)
    if unknown:
        hint = "; the partition is `queue` (sbatch -p)" if "partition" in unknown else ""
        raise ValueError(f"unknown cluster.slurm setting(s) {unknown}{hint}; known: {sorted(known)}")
    for key in ("cores", "processes"):
        v = slurm.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"cluster.slurm.{key} must be an integer >= 1, got {v!r}")
    if slurm.get("cores") is None or not slurm.get("memory"):
        raise ValueError("cluster=slurm needs cluster.slurm.cores and cluster.slurm.memory (per job, e.g. 2 and 8GB)")


def walltime_seconds(walltime: str | None) -> int | None:
    """Slurm's time formats (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in seconds; None if unreadable."""
    if not walltime:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(walltime).strip())
    if not m:
        return None
    d, a, b, c = (int(x) if x else None for x in m.groups())
    if d is not None:  # D-H[:M[:S]]
        return ((d * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    if c is not None:  # H:M:S
        return (a * 60 + b) * 60 + c
    return a * 60 + (b or 0)  # M or M:S


def _lifetime_args(walltime: str | None, extra: list[str]) -> list[str]:
    """Workers retire a few minutes before the walltime (dask-jobqueue's advice), so their tasks
    move to other workers instead of being killed mid-candidate; the supervisor submits a
    replacement job."""
    w = walltime_seconds(walltime)
    if w is None or w < 15 * 60 or any(a.startswith("--lifetime") for a in extra):
        return []
    return ["--lifetime", f"{w - 6 * 60}s", "--lifetime-stagger", f"{2 * 60}s"]


def _first_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "error:" in ln.lower():
            return re.sub(r"^(sbatch: )?error: ", "", ln)
    return lines[-1] if lines else "(no message)"


def _partitions() -> str:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=20).stdout
        names = sorted(set(out.split()))
        return f" ({', '.join(names)})" if names else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def explain(message: str) -> str:
    """Slurm's error message followed by the setting that decides it."""
    low = message.lower()
    for needle, hint in _ERROR_HINTS:
        if needle in low:
            return f"{message}; {hint.format(partitions=_partitions() if '{partitions}' in hint else '')}"
    return f"{message}; check the cluster.slurm settings against `sinfo` and your site's rules"


def check_submission(script: Path) -> None:
    """`sbatch --test-only`: Slurm validates the request (partition, account, sizes, GPUs) and says
    when it would start, without queueing anything."""
    if shutil.which("sbatch") is None:
        raise ClusterError("cluster=slurm: `sbatch` is not on PATH; launch the run from a machine that submits "
                           "Slurm jobs (a login node), or use cluster=local")
    try:
        p = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise ClusterError("cluster=slurm: `sbatch --test-only` did not answer in 60 s; "
                           "is slurmctld up (`sinfo`)?") from None
    if p.returncode != 0:
        raise ClusterError(f"cluster=slurm: Slurm refused the job: {explain(_first_error_line(p.stderr + p.stdout))}")


def queue_states(job_name: str) -> dict[str, tuple[str, str]] | None:
    """job id -> (state, reason) of this run's jobs still in the queue; None when squeue did not answer."""
    try:
        p = subprocess.run(["squeue", "-h", "--name", job_name, "-o", "%i %T %r"], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None
    out = {}
    for ln in p.stdout.splitlines():
        parts = ln.split(None, 2)
        if len(parts) >= 2:
            out[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return out


def cancel_jobs(job_name: str) -> None:
    """Cancel every job of this run (by its unique name, so a job dask-jobqueue lost track of goes too)."""
    try:
        import getpass

        subprocess.run(["scancel", "--name", job_name, "--user", getpass.getuser()], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError, KeyError):
        pass


def _log_tail(log_dir: Path, job_name: str, job_id: str) -> str:
    for suffix in ("err", "out"):
        p = log_dir / f"{job_name}-{job_id}.{suffix}"
        try:
            lines = [ln.strip() for ln in p.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        if lines:
            return f"{lines[-1][:300]} (log: {p})"
    return f"no log yet in {log_dir}"


def _submit_error(cluster) -> str | None:
    for job in list(cluster.workers.values()):
        err = getattr(job, "submit_error", None)
        if err:
            return err
    return None


def _job_ids(cluster) -> list[str]:
    return [str(j.job_id) for j in list(cluster.workers.values()) if getattr(j, "job_id", None)]


def _n_workers(client) -> int:
    try:
        return len(client.nthreads())
    except Exception:
        return 0


def wait_for_worker(cluster, client, job_name: str, log_dir: Path, timeout_s: float) -> None:
    """Return once a Dask worker has joined; raise ClusterError naming why none did."""
    deadline = time.monotonic() + timeout_s
    warned = False
    while True:
        if _n_workers(client):
            return
        ids = _job_ids(cluster)
        err = _submit_error(cluster)
        if err:
            message = explain(_first_error_line(err.split("stderr:", 1)[-1]))
            if not ids:  # nothing was queued; when some jobs were (a per-user job limit), run with those
                raise ClusterError(f"cluster=slurm: sbatch refused the job: {message}")
            if not warned:
                log.warning("sbatch refused some of the cluster.jobs=%d jobs: %s", len(cluster.workers), message)
                warned = True
        states = queue_states(job_name)
        if states is None:  # squeue did not answer this time: decide nothing from it
            states, ids = {}, []
        for jid, (state, reason) in states.items():
            if state == "PENDING" and reason in _HOPELESS_PENDING:
                raise ClusterError(f"cluster=slurm: Slurm job {jid} cannot start (pending, reason {reason}); "
                                   f"{_HOPELESS_PENDING[reason]}")
        if ids and not any(j in states for j in ids) and not _n_workers(client):
            raise ClusterError(f"cluster=slurm: Slurm job {ids[0]} ended before its Dask worker connected: "
                               f"{_log_tail(log_dir, job_name, ids[0])}")
        if time.monotonic() > deadline:
            if states:
                jid, (state, reason) = next(iter(states.items()))
                if state == "PENDING":
                    why = (f"job {jid} is still pending (reason {reason}); the cluster may be busy: raise "
                           f"cluster.start_timeout_s, or ask for less (cluster.slurm.cores, cluster.slurm.memory, "
                           f"cluster.slurm.walltime) or another partition (cluster.slurm.queue)")
                else:
                    why = (f"job {jid} is {state} but its worker has not connected: "
                           f"{_log_tail(log_dir, job_name, jid)}; if the node cannot reach this machine, set "
                           f"cluster.slurm.interface (e.g. ib0)")
            else:
                why = "no job of this run is in the queue (`squeue --name " + job_name + "`)"
            raise ClusterError(f"cluster=slurm: no Dask worker joined within cluster.start_timeout_s="
                               f"{timeout_s:g} s: {why}")
        time.sleep(1.0)


class Supervisor(threading.Thread):
    """Keeps `jobs` jobs submitted (a job whose worker left is submitted again) and stops the run
    when no worker has been connected for `timeout_s`: the Dask tasks would otherwise wait forever."""

    def __init__(self, cluster, client, jobs: int, job_name: str, log_dir: Path, timeout_s: float,
                 fail: Callable[[str], None]):
        super().__init__(name="opsynth-slurm-supervisor", daemon=True)
        self.cluster, self.client, self.jobs, self.job_name = cluster, client, jobs, job_name
        self.log_dir, self.timeout_s, self.fail = log_dir, timeout_s, fail
        self.stop = threading.Event()

    def run(self) -> None:
        from distributed.core import Status

        empty_since = None
        while not self.stop.wait(SUPERVISE_EVERY_S):
            if getattr(self.cluster, "status", None) in (Status.closing, Status.closed):
                return
            try:
                self.cluster.scale(jobs=self.jobs)  # re-submits the jobs of workers that left
                if _n_workers(self.client):
                    empty_since = None
                    continue
                empty_since = empty_since or time.monotonic()
                if time.monotonic() - empty_since > self.timeout_s:
                    states = queue_states(self.job_name) or {}
                    now = ", ".join(f"job {j} {s} ({r})" for j, (s, r) in states.items()) or "no job in the queue"
                    self.fail(f"cluster=slurm: every Dask worker left and none came back within "
                              f"cluster.start_timeout_s={self.timeout_s:g} s ({now}; logs in {self.log_dir}); "
                              f"rerun with the same output_dir to resume")
                    return
            except Exception as e:  # the loop must not die of a transient squeue or scheduler hiccup
                log.debug("supervisor: %s", e)


def _recording_job_cls():
    from dask_jobqueue.slurm import SLURMJob

    class RecordingSLURMJob(SLURMJob):
        """Keeps sbatch's refusal, which dask-jobqueue only logs from a background task."""

        submit_error: str | None = None

        async def start(self):
            try:
                await super().start()
            except Exception as e:
                self.submit_error = str(e)
                raise

    return RecordingSLURMJob


class _Termination:
    """SIGTERM unwinds the main thread like Ctrl-C (finally blocks run, jobs are cancelled); a
    supervisor's fatal message arrives the same way, as ClusterLost."""

    def __init__(self):
        self.fatal: str | None = None
        self.previous: Any = None
        self.installed = False

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)
            self.installed = True

    def _handle(self, signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        if self.fatal:
            raise ClusterLost(self.fatal)
        log.warning("SIGTERM: stopping and cancelling this run's Slurm jobs")
        raise SystemExit(128 + signal.SIGTERM)

    def fail_main(self, message: str) -> None:
        self.fatal = message
        if self.installed:
            _thread.interrupt_main(signal.SIGTERM)
        else:
            log.error("%s", message)

    def restore(self) -> None:
        if self.installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.previous if self.previous is not None else signal.SIG_DFL)
            self.installed = False


def start_slurm(cfg, run_dir: str | Path | None):
    """A SLURMCluster with one worker joined, or a ClusterError. Returns (client, cluster, slots, cleanup)."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise ClusterError("cluster=slurm needs dask-jobqueue: pip install 'opsynth[slurm]'") from None
    from distributed import Client

    kw = dict(cfg.slurm)
    log_dir = kw.pop("log_directory", None) or (Path(run_dir) / "slurm" if run_dir is not None
                                                 else tempfile.mkdtemp(prefix="opsynth-slurm-"))
    log_dir = Path(log_dir).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    # Unique per run: scancel by name reaches exactly this run's jobs.
    job_name = f"{kw.pop('job_name', None) or 'opsynth'}-{secrets.token_hex(4)}"
    processes = kw["processes"] = int(kw.get("processes") or 1)
    threads = max(1, int(kw["cores"]) // processes)
    extra = [str(a) for a in (kw.get("worker_extra_args") or [])]
    if cfg.gpu:  # as on local_cuda: a GPU worker takes `threads` candidates, each asking for GPU=1
        extra += ["--resources", f"GPU={threads}"]
    extra += _lifetime_args(kw.get("walltime"), extra)
    kw["worker_extra_args"] = extra
    kw["job_extra_directives"] = [str(a) for a in (kw.get("job_extra_directives") or [])]
    # No dashboard unless asked; its HTTP server then takes any free port rather than warning about 8787.
    quiet = {} if cfg.dashboard else {"dashboard": False, "dashboard_address": ":0"}
    kw["scheduler_options"] = {**quiet, **(kw.get("scheduler_options") or {})}

    term = _Termination()
    term.install()
    cluster = client = supervisor = None

    def cleanup() -> None:
        if supervisor is not None:
            supervisor.stop.set()
        cancel_jobs(job_name)
        term.restore()

    try:
        try:
            cluster = SLURMCluster(job_cls=_recording_job_cls(), job_name=job_name, log_directory=str(log_dir), **kw)
        except (TypeError, ValueError) as e:
            raise ClusterError(f"cluster=slurm: dask-jobqueue refused the settings: {str(e).splitlines()[0]}") from None
        script = log_dir / "job.sh"
        body = cluster.job_script().split("\n", 1)
        script.write_text(f"{body[0]}\n# What each job runs (checked with sbatch --test-only; each worker gets its own "
                          f"--name)\n{body[1] if len(body) > 1 else ''}")
        log.info("Slurm job script %s (logs in %s)", script, log_dir)
        check_submission(script)
        cluster.scale(jobs=cfg.jobs)
        client = Client(cluster)
        wait_for_worker(cluster, client, job_name, log_dir, cfg.start_timeout_s)
        supervisor = Supervisor(cluster, client, cfg.jobs, job_name, log_dir, cfg.start_timeout_s, term.fail_main)
        supervisor.start()
    except BaseException:
        try:
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
        finally:
            cleanup()
        raise
    return client, cluster, max(1, cfg.jobs * processes * threads), cleanup
