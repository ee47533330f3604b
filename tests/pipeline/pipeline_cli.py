"""Helpers for the generate-pipeline tests (imported by the test modules; conftest.py puts this
folder on sys.path): run `python -m pipelines.generate` as a user would, and
find the processes a run left behind (every process of a run carries a marker in its environment)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Small, fast settings where inductor is not the point. The CPU band is the real one: sizes come
# from the cost model, not from timings, so two runs with one seed accept the same tasks even under
# timing noise (NOISE).
FAST = [
    "sampler=small",
    "sampler.scale=0.1",
    "verify=cpu",
    "verify.compile_backend=eager",
    "cluster.n_workers=1",
    "cluster.threads_per_worker=2",
    "progress=false",
]
MARK = "OPSYNTH_PIPELINE_TEST_RUN"
# Every timing multiplied by a random factor in [0.8, 1.25] (opsynth.runtime.timing).
NOISE = {"OPSYNTH_TIMING_NOISE": "0.8,1.25"}


def generate_cmd(output_dir: Path, *overrides: str) -> list[str]:
    """The CLI call; Hydra's own output folder goes next to the dataset, not into the repo."""
    hydra_dir = Path(output_dir).parent / (Path(output_dir).name + "-hydra")
    return [sys.executable, "-m", "pipelines.generate", f"output_dir={output_dir}", f"hydra.run.dir={hydra_dir}",
            *overrides]


def run_env(kernelbench: Path, marker: str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OPSYNTH_KERNELBENCH=str(kernelbench),
               PYTHONUNBUFFERED="1", **extra)
    env[MARK] = marker or uuid.uuid4().hex
    return env


def start_generate(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    fh = open(log, "wb")
    try:
        # Own session: the test can clean up the whole group if an assertion fails midway.
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        fh.close()


def run_generate(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment carries `MARK=marker` (the driver and everything it started)."""
    needle = f"{MARK}={marker}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                stat = (d / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":  # a zombie is already dead
                    pids.append(int(d.name))
        except (OSError, IndexError):
            continue
    return pids


def wait_gone(marker: str, timeout: float) -> list[int]:
    """Wait until no marked process is left; returns the survivors (empty on success)."""
    deadline = time.monotonic() + timeout
    while True:
        left = marked_pids(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def kill_marked(marker: str) -> None:
    for pid in marked_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
