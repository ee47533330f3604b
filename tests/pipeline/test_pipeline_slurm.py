"""`cluster=slurm` against a real Slurm (skipped unless `sinfo` answers; `.ci/slurm_up.sh` starts a
single-node one): a run gives the rows `cluster=local` gives for the seed and writes nothing outside
its folders; a job Slurm refuses, or one that cannot start in time, ends the run with one line and
exit 2; SIGTERM leaves no job in the queue."""

from __future__ import annotations

import getpass
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pipeline_cli import REPO, generate_cmd, run_env, start_generate, wait_gone

from opsynth.shards import read_rows

pytestmark = pytest.mark.slurm

# Calibration and the runtime band decide by measured time, which differs between two runs; without
# them the accepted rows depend only on the seed, so two clusters must give the same rows.
SMALL = ["n_tasks=4", "sampler=small", "verify=cpu", "verify.compile_backend=aot_eager", "verify.calibrate=false",
         "verify.cpu_min_ms=0", "verify.cpu_max_ms=1000000", "progress=false"]


def _node_cpus() -> int:
    out = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, timeout=30).stdout.split()
    return min(int(re.sub(r"\D", "", c) or 1) for c in out) if out else 1


def _slurm(*extra: str) -> list[str]:
    """The shipped CPU profile, sized to fit any CI runner: one job, <= 2 CPUs, 2 GB."""
    return ["cluster=slurm", "cluster.jobs=1", f"cluster.slurm.cores={min(2, _node_cpus())}",
            "cluster.slurm.memory=2GB", *extra]


def _env(kernelbench: Path, marker: str | None = None) -> dict[str, str]:
    env = run_env(kernelbench, marker)
    # Runs start in an empty folder, so the worktree's code must come from PYTHONPATH (sbatch exports it to the job).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _run(cmd: list[str], env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _job_name(out: Path) -> str:
    return re.search(r"^#SBATCH -J (\S+)$", (out / "slurm" / "job.sh").read_text(), re.M).group(1)


def _queued(job_name: str) -> list[str]:
    p = subprocess.run(["squeue", "-h", "--name", job_name, "-o", "%i %T"], capture_output=True, text=True, timeout=30)
    return p.stdout.splitlines()


def _wait_queue_empty(job_name: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := _queued(job_name)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory, kernelbench_parquet):
    """One small run through Slurm, started in an empty working folder."""
    root = tmp_path_factory.mktemp("slurm")
    cwd, out = root / "cwd", root / "out"
    cwd.mkdir()
    repo_logs = set(REPO.glob("slurm-*.out"))
    proc = _run(generate_cmd(out, *SMALL, *_slurm()), _env(kernelbench_parquet), cwd, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return root, cwd, out, proc, repo_logs


def test_a_slurm_run_gives_the_rows_of_a_local_run(slurm_run, kernelbench_parquet, tmp_path):
    _, _, out, _, _ = slurm_run
    local = tmp_path / "local"
    proc = _run(generate_cmd(local, *SMALL, "cluster=local", "cluster.threads_per_worker=2"),
                _env(kernelbench_parquet), REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cols = ["task_id", "code", "seed", "ops"]
    slurm_rows, local_rows = read_rows(out, columns=cols), read_rows(local, columns=cols)
    assert len(slurm_rows) == 4 and slurm_rows == local_rows
    assert {r["device"] for r in read_rows(out, columns=["device"])} == {"cpu"}


def test_a_slurm_run_writes_only_into_its_folders_and_leaves_no_job(slurm_run):
    root, cwd, out, proc, repo_logs = slurm_run
    assert not any(cwd.iterdir()), f"files in the working folder: {sorted(_files(cwd))}"
    assert set(REPO.glob("slurm-*.out")) == repo_logs, "Slurm logs landed in the repository"
    assert {p.name for p in root.iterdir()} == {"cwd", "out", "out-hydra"}  # out-hydra: hydra.run.dir
    logs = sorted((out / "slurm").iterdir())
    job = _job_name(out)
    assert (out / "slurm" / "job.sh").exists() and any(p.name.startswith(job) and p.suffix == ".err" for p in logs)
    assert "#SBATCH -p" not in (out / "slurm" / "job.sh").read_text()  # queue: null -> the default partition
    assert _wait_queue_empty(job) == []


@pytest.mark.parametrize("override,says,setting", [
    ("cluster.slurm.queue=no-such-partition", "invalid partition", "cluster.slurm.queue"),
    # The GPU profile as shipped, on a cluster without GPUs.
    ("cluster=slurm_gpu", "gres", "cluster.slurm.job_extra_directives"),
])
def test_a_refused_job_ends_the_run_at_once_with_one_line(tmp_path, kernelbench_parquet, override, says, setting):
    out = tmp_path / "out"
    args = [*_slurm(), override] if override.startswith("cluster.") else [override, "cluster.slurm.memory=2GB"]
    t0 = time.monotonic()
    proc = _run(generate_cmd(out, *SMALL, *args, "cluster.start_timeout_s=60"), _env(kernelbench_parquet),
                tmp_path, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = _error_lines(proc.stderr)
    assert says in line.lower() and setting in line, line
    assert took < 60, f"took {took:.0f} s, past cluster.start_timeout_s=60"
    assert _wait_queue_empty(_job_name(out)) == []


def test_a_job_that_cannot_start_in_time_ends_the_run_at_the_deadline(tmp_path, kernelbench_parquet):
    cpus = _node_cpus()
    blocker = subprocess.run(["sbatch", "--parsable", "-J", f"opsynth-test-blocker-{os.getpid()}", "-c", str(cpus),
                              "--mem=100M", "-o", "/dev/null", "--wrap", "sleep 300"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip().split(";")[0]
    try:
        out = tmp_path / "out"
        t0 = time.monotonic()
        proc = _run(generate_cmd(out, *SMALL, *_slurm("cluster.start_timeout_s=8")), _env(kernelbench_parquet),
                    tmp_path, timeout=120)
        took = time.monotonic() - t0
    finally:
        subprocess.run(["scancel", blocker], timeout=30)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = _error_lines(proc.stderr)
    assert "cluster.start_timeout_s=8" in line and "pending" in line, line
    assert took < 60, f"took {took:.0f} s"
    assert _wait_queue_empty(_job_name(out)) == []


def test_sigterm_cancels_the_runs_jobs(tmp_path, kernelbench_parquet, marker):
    out = tmp_path / "out"
    # Two jobs on a node that fits one: one runs (its worker verifying), one waits in the queue.
    cmd = generate_cmd(out, "n_tasks=200", "sampler=small", "verify=cpu", "verify.compile_backend=aot_eager",
                       "progress=false", *_slurm("cluster.jobs=2", f"cluster.slurm.cores={_node_cpus()}"))
    proc = start_generate(cmd, _env(kernelbench_parquet, marker), tmp_path / "run.log")
    try:
        deadline = time.monotonic() + 120
        job = joined = None
        while time.monotonic() < deadline and proc.poll() is None:
            if job is None and (out / "slurm" / "job.sh").exists():
                job = _job_name(out)
            joined = job and any("Registered to" in p.read_text(errors="replace")
                                 for p in (out / "slurm").glob(f"{job}-*.err"))
            if joined and len(_queued(job)) == 2:
                break
            time.sleep(0.5)
        assert proc.poll() is None and joined, (tmp_path / "run.log").read_text()[-3000:]
        time.sleep(2)  # candidates are in flight on the worker
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=90)
        assert rc == 128 + signal.SIGTERM, (tmp_path / "run.log").read_text()[-3000:]
        assert _wait_queue_empty(job) == [], "jobs left in the queue after SIGTERM"
        assert wait_gone(marker, 30) == [], "processes of the run (driver or Slurm worker) outlived it"
        assert (out / ".opsynth-state.json").exists()  # the run saved where to resume
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["scancel", "--user", getpass.getuser(), "--name", job or "none"], timeout=30)


def test_a_job_lost_mid_run_is_replaced_and_the_run_finishes(tmp_path, kernelbench_parquet, marker):
    """What a walltime or a preempted node does: the worker's job ends while candidates are in flight."""
    out = tmp_path / "out"
    proc = start_generate(generate_cmd(out, *SMALL, *_slurm()), _env(kernelbench_parquet, marker), tmp_path / "run.log")
    try:
        deadline, first = time.monotonic() + 120, None
        while first is None and time.monotonic() < deadline and proc.poll() is None:
            first = next((p for p in (out / "slurm").glob("*.err") if "Registered to" in p.read_text(errors="replace")),
                         None) if (out / "slurm").is_dir() else None
            time.sleep(0.5)
        assert first is not None, (tmp_path / "run.log").read_text()[-3000:]
        time.sleep(2)
        subprocess.run(["scancel", first.stem.rsplit("-", 1)[1]], timeout=30, check=True)
        rc = proc.wait(timeout=240)
        assert rc == 0, (tmp_path / "run.log").read_text()[-3000:]
        assert len(read_rows(out, columns=["task_id"])) == 4
        assert len(list((out / "slurm").glob("*.err"))) >= 2, "no replacement job was submitted"
        assert _wait_queue_empty(_job_name(out)) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
