"""`verify.sandbox`: confined workers refuse a task's attempts to get out, and verify as before.

Run as root (as CI does) and as an ordinary user where namespaces allow it. Task files try, at
their top level, in forward and from a C library's static initialiser, to remount the package's
mount read-write, write into the package, read the pool's HF_TOKEN and open a socket
(tests/verify/attacks.py). With the sandbox on, every attempt fails and the tasks are accepted as
any other; the control (sandbox off) shows each attempt working. The failure modes whose detection
depends on the process the pool started (signal, timeout kill, memory watch) keep their reasons
when that process is the sandbox's waiting outer one.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import socket
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from opsynth.runtime import isolation
from opsynth.verify import VerifyConfig, WorkerPool
from opsynth.verify.config import SANDBOX_MODES

sys.path.insert(0, str(Path(__file__).parent))
import attacks  # noqa: E402
from test_verify_pool import FAULTY, GOOD, task  # noqa: E402

PKG = str(Path(__file__).resolve().parents[2] / "opsynth" / "verify")
TOKEN = "hf_" + secrets.token_hex(8)

# Everything a task does to a worker (aot_eager: compile checks in about a second).
CFG = dict(device="cpu", n_workers=1, timeout_s=20.0, compile_backend="aot_eager", cpu_min_ms=0.01,
           cpu_mem_limit_gb=1.0, warmup=2, repeats=5, timing_budget_ms=100.0, preload_compiler=False)

# Grows a child process (not the worker: its RLIMIT_AS would stop that first) to 1.25 GB, a quarter
# above the pool's 1 GB host limit, and waits: only a memory watch over the worker's process tree
# sees it, and only a kill of its process group ends the child. `MARK` finds leftovers.
MARK = "opsynth-sandbox-test-" + secrets.token_hex(4)
CHILD_MEMORY = task(
    "        child = subprocess.Popen([sys.executable, '-c', CODE])\n"
    "        while True:\n            time.sleep(0.1)\n",
    imports="import subprocess\nimport sys\nimport time\n"
            f"CODE = \"import time\\nx = b'1' * (1280 << 20)\\nwhile True: time.sleep(1)  # {MARK}\"\n")

_PROBE = isolation.probe()
pytestmark = pytest.mark.skipif(not _PROBE[0], reason=f"the sandbox cannot confine here: {_PROBE[1]}")


@pytest.fixture(scope="module")
def listener():
    """A TCP server on the host's loopback; what reaches it is recorded."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    got: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    got.append(conn.recv(100))
                except OSError:
                    got.append(b"")

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1], got
    srv.close()


def _run_attacks(sandbox: str, port: int, got: list[bytes]):
    """Verify the three attack tasks on a fresh pool whose parent holds HF_TOKEN; returns the
    results, each attempt's outcome, the files that appeared in the package and what the listener
    received."""
    tag = f"{sandbox}{secrets.token_hex(4)}"
    sources = [attacks.python_task(PKG, port, tag, "top"), attacks.python_task(PKG, port, tag, "forward"),
               attacks.native_task(PKG, port, tag)]
    old = os.environ.get("HF_TOKEN")
    os.environ["HF_TOKEN"] = TOKEN
    got.clear()
    try:
        with WorkerPool(VerifyConfig(**CFG, sandbox=sandbox)) as pool:
            assert pool.sandboxed == (sandbox == "true")
            results = pool.verify_many(sources)
            outcomes = {}
            for f in glob.glob(f"{pool._tmp}/**/attack-{tag}-*.json", recursive=True):
                outcomes[Path(f).stem.rsplit("-", 1)[-1]] = json.loads(Path(f).read_text())
        time.sleep(0.2)  # the listener thread records the last connection
        return results, outcomes, sorted(Path(p).name for p in glob.glob(f"{PKG}/_attack_{tag}_*")), list(got)
    finally:
        for p in glob.glob(f"{PKG}/_attack_{tag}_*"):
            os.unlink(p)
        if old is None:
            os.environ.pop("HF_TOKEN", None)
        else:
            os.environ["HF_TOKEN"] = old


def test_every_attempt_fails_in_the_sandbox_and_the_tasks_are_still_accepted(listener):
    port, got = listener
    results, outcomes, written, received = _run_attacks("true", port, got)
    assert [r.reason for r in results] == ["accepted"] * 3, [r.evidence for r in results]
    assert set(outcomes) == {"top", "forward", "native"}  # every attempt ran (and could report)
    for where, out in outcomes.items():
        assert set(out) == set(attacks.ATTEMPTS)
        assert all(v != "ok" for v in out.values()), (where, out)
    assert written == [] and received == []


def test_control_without_the_sandbox_every_attempt_works(listener):
    port, got = listener
    results, outcomes, written, received = _run_attacks("false", port, got)
    assert [r.reason for r in results] == ["accepted"] * 3, [r.evidence for r in results]
    assert set(outcomes) == {"top", "forward", "native"}
    for where, out in outcomes.items():
        assert out == {a: "ok" for a in attacks.ATTEMPTS}, (where, out)
    assert len(written) == 3 and len(received) >= 3


@pytest.mark.slow
def test_failure_modes_keep_their_reasons_in_the_sandbox():
    """The segfault's signal, the timeout's kill and the memory watch work through the outer process
    (tests/verify/test_verify_pool.py runs every other failure mode confined too: `auto` confines
    hand-written tasks)."""
    cfg = VerifyConfig(**{**CFG, "timeout_s": 8.0}, sandbox="true")
    with WorkerPool(cfg) as pool:
        batch = [GOOD, FAULTY["segfault"][0], FAULTY["infinite_loop"][0], CHILD_MEMORY, GOOD]
        results = pool.verify_many(batch)
        assert [r.reason for r in results] == ["accepted", "crashed", "timeout", "oom", "accepted"], \
            [r.evidence.get("message") for r in results]
        assert results[1].evidence["signal"] == "SIGSEGV"
        assert "host memory grew" in results[3].evidence["message"]
        assert pool.alive() == 1
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if MARK in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []


def test_a_worker_that_cannot_be_confined_stops_the_pool_with_a_named_reason(monkeypatch, tmp_path):
    # An image without libseccomp: the filter cannot be built, so the worker must not run tasks.
    monkeypatch.setenv("OPSYNTH_LIBSECCOMP", str(tmp_path / "missing" / "libseccomp.so.2"))
    pytest.importorskip("pyseccomp")
    try:
        import seccomp  # noqa: F401 - the official binding ignores OPSYNTH_LIBSECCOMP
        pytest.skip("the official libseccomp binding is installed")
    except ImportError:
        pass
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="sandbox_failed: .*verify.sandbox=false"):
        WorkerPool(VerifyConfig(**CFG, sandbox="true")).start()
    assert time.monotonic() - t0 < 60


def test_auto_confines_what_the_sampler_did_not_generate():
    assert SANDBOX_MODES == ("auto", "true", "false")
    auto = VerifyConfig()
    assert auto.sandbox == "auto" and auto.sandboxed(sampled=False) and not auto.sandboxed(sampled=True)
    assert VerifyConfig(sandbox=True).sandboxed(sampled=True)  # YAML's `sandbox: true`
    assert not VerifyConfig(sandbox="false").sandboxed(sampled=False)
    assert WorkerPool(auto).sandboxed and not WorkerPool(auto, sampled=True).sandboxed
    with pytest.raises(ValueError, match="verify.sandbox must be one of auto, true, false"):
        VerifyConfig(sandbox="yes")


_AS_USER = r'''
import json, os, sys
sys.path[:0] = [{tests!r}, {repo!r}]
import attacks
from test_verify_pool import GOOD
from opsynth.verify import VerifyConfig, WorkerPool

os.environ["HF_TOKEN"] = {token!r}
with WorkerPool(VerifyConfig(**{cfg!r}, sandbox="true")) as pool:
    results = pool.verify_many([GOOD, attacks.python_task({pkg!r}, {port}, "user", "forward")])
    out = json.load(open(os.path.join(pool._box.scratch(0), "attack-user-forward.json")))
print(json.dumps({{"uid": os.getuid(), "reasons": [r.reason for r in results], "attempts": out}}))
'''


@pytest.mark.slow
def test_as_an_ordinary_user_every_attempt_fails_too(listener, tmp_path, ordinary_user):
    """An ordinary user's pool: the worker keeps its uid inside a user namespace of its own."""
    import subprocess

    uid = ordinary_user(1_990_000_124)
    port, got = listener
    got.clear()
    here = Path(__file__).resolve().parent
    script = tmp_path / "as_user.py"
    script.write_text(_AS_USER.format(tests=str(here), repo=str(here.parents[1]), token=TOKEN, cfg=CFG, pkg=PKG,
                                      port=port))
    (tmp_path / "tmp").mkdir()
    for p in (tmp_path, tmp_path / "tmp", script):
        os.lchown(p, uid, uid)
    env = {**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path / "tmp")}
    run = subprocess.run([sys.executable, str(here.parents[1] / "tests" / "runtime" / "as_unprivileged.py"), str(uid),
                          str(tmp_path), "--", sys.executable, str(script)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["uid"] == uid and out["reasons"] == ["accepted", "accepted"]
    assert set(out["attempts"]) == set(attacks.ATTEMPTS) and all(v != "ok" for v in out["attempts"].values()), out
    assert got == [] and glob.glob(f"{PKG}/_attack_user_*") == []
