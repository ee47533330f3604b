"""Shared test settings: where the reference data lives, and GPU and Slurm skipping."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The KernelBench reference is read in place (never copied into the project); override with
# OPSYNTH_KERNELBENCH=/path/to/kernelbench.parquet.
KERNELBENCH_PARQUET = Path(
    os.environ.get("OPSYNTH_KERNELBENCH", REPO.parent / "shared" / "kernelbench" / "kernelbench.parquet")
)


def pytest_configure(config):
    # One shared precompiled torch/extension.h for every reward cache the suite creates (each PCH is
    # ~40 s of gcc and ~800 MB; per test cache they would cost minutes and gigabytes).
    # Likewise one compiler cache: the test candidates share an extension source, and its ~90 s build
    # (pybind11 bindings on 2 cores) was paid again by every module that makes a fresh reward cache.
    # Tests that look at a cache's own compiler cache clear the setting (monkeypatch.delenv).
    # Under pytest-xdist (make test) this runs in the controller first: its workers inherit both settings.
    config._opsynth_shared_dirs = []
    for var, prefix in (("OPSYNTH_RL_PCH_DIR", "opsynth_test_pch_"), ("OPSYNTH_RL_CCACHE_DIR", "opsynth_test_ccache_")):
        if not os.environ.get(var):
            d = tempfile.mkdtemp(prefix=prefix)
            os.environ[var] = d
            config._opsynth_shared_dirs.append(d)


    # Tests marked `alone` compare timings taken minutes apart: under pytest-xdist (make test) each
    # runs while no other worker runs a test (a readers-writer lock on this file; see below).
    if not os.environ.get(ALONE_LOCK_ENV):
        d = tempfile.mkdtemp(prefix="opsynth_test_alone_")
        os.environ[ALONE_LOCK_ENV] = os.path.join(d, "suite.lock")
        config._opsynth_shared_dirs.append(d)


def pytest_unconfigure(config):
    for d in getattr(config, "_opsynth_shared_dirs", []):
        shutil.rmtree(d, ignore_errors=True)


ALONE_LOCK_ENV = "OPSYNTH_TEST_ALONE_LOCK"


@contextlib.contextmanager
def _suite_share(path: str, alone: bool):
    """Shared for an ordinary test, exclusive for an `alone` one. The gate is held while waiting for
    the lock, so a waiting `alone` test is not starved by the other worker's next tests."""
    with open(path + ".gate", "a") as gate, open(path, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_held = contextlib.ExitStack()  # the worker's exclusive hold, kept across consecutive `alone` tests
_holding = False  # whether _held holds it now


def _alone(item) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """In an xdist worker: the whole of a test (its fixtures' setup and teardown too) under the suite
    lock, an `alone` test and the `alone` tests right after it under one exclusive hold. Not in a
    plain run, nor in a pytest that a test starts (it has no workerinput)."""
    path = os.environ.get(ALONE_LOCK_ENV)
    if not path or not hasattr(item.config, "workerinput"):
        return (yield)
    if not _alone(item):
        with _suite_share(path, alone=False):
            return (yield)
    global _holding
    if not _holding:
        _held.enter_context(_suite_share(path, alone=True))
        _holding = True
    try:
        return (yield)
    finally:
        if not _alone(nextitem):
            _held.close()
            _holding = False


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _slurm_answers() -> bool:
    """A Slurm controller answers `sinfo` (.ci/slurm_up.sh starts a single-node one)."""
    import subprocess

    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def pytest_collection_modifyitems(config, items):
    if any("slurm" in item.keywords for item in items) and not _slurm_answers():
        skip_slurm = pytest.mark.skip(
            reason="needs a Slurm cluster: `sinfo` does not answer (bash .ci/slurm_up.sh starts one)")
        for item in items:
            if "slurm" in item.keywords:
                item.add_marker(skip_slurm)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def in_ci() -> bool:
    """CI=true (GitHub Actions, GitLab and most runners set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def kernelbench_parquet() -> Path:
    """The KernelBench reference. Missing on a developer's machine: the tests that need it skip.
    Missing in CI: an error, since a CI run that skips decontamination proves nothing about it."""
    if not KERNELBENCH_PARQUET.exists():
        msg = (f"KernelBench reference not found at {KERNELBENCH_PARQUET}; "
               "set OPSYNTH_KERNELBENCH to the kernelbench.parquet path")
        if in_ci():
            pytest.fail(f"CI=true: {msg}", pytrace=False)
        pytest.skip(msg)
    return KERNELBENCH_PARQUET


@pytest.fixture(scope="session")
def ordinary_user():
    """`ordinary_user(uid)`: skip unless this run can become `uid` (root) and that uid can make a
    user namespace, as an ordinary user's evaluator does."""
    import subprocess

    def check(uid: int) -> int:
        if os.getuid() != 0:
            pytest.skip("making an ordinary user's evaluator needs root to switch to it")
        probe = subprocess.run(["unshare", "-U", "-m", "--map-current-user", "true"], capture_output=True,
                               preexec_fn=lambda: os.setresuid(uid, uid, uid))
        if probe.returncode != 0:
            pytest.skip(f"unprivileged user namespaces are off here: {probe.stderr.decode()[-200:]}")
        return uid

    return check
