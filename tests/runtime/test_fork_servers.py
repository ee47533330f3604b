"""The fork servers (opsynth.runtime.forkserver, sandbox.fork_server): what a light server's children
start with, and that servers of different kinds start side by side.

A cold evaluation asks for its build at once and for its reference at once; the build's children
come from a light server (torch only), the reference's from the full one (Dynamo too). The build must not wait for the full server's start: each key has its own start lock (before,
one lock held through every start serialised them).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time

import pytest

from opsynth.runtime import sandbox
from opsynth.runtime.forkserver import LIGHT_MODULES, WARM_MODULES, ForkServer

# A job module: reports which of the full server's modules its process has loaded at its start.
PROBE = textwrap.dedent("""
    import json, sys
    HEAVY = ("torch._dynamo", "torch._inductor")

    def run(job):
        return {"reason": "ok", "loaded": {m: m in sys.modules for m in ("torch", *HEAVY)}}

    if __name__ == "__main__":
        from opsynth.runtime.child import child_main
        child_main(run)
""")


def _loaded_in_a_child(tmp_path, base) -> dict:
    (tmp_path / "probe_job_mod.py").write_text(PROBE)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    srv = ForkServer(env, warm=("probe_job_mod",), base=base)
    try:
        job = {"result_path": str(tmp_path / "result.json"), "timeout_s": 60}
        job_path = tmp_path / "job.json"
        job_path.write_text(json.dumps(job))
        log_fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        r, w = os.pipe()
        os.close(w)
        try:
            child = srv.spawn({"module": "probe_job_mod", "job_path": str(job_path), "cwd": str(tmp_path), "env": env,
                               "isolation": {"enabled": False}}, {"stdin": r, "log": log_fd})
        finally:
            os.close(r)
            os.close(log_fd)
        assert srv.wait(child, 60) == 0, (tmp_path / "log").read_text()
        child.close()
        return json.loads((tmp_path / "result.json").read_text())["loaded"]
    finally:
        srv.close()


@pytest.mark.timeout(300)
def test_a_light_servers_children_start_without_dynamo(tmp_path):
    for kind in ("light", "full"):
        (tmp_path / kind).mkdir()
    light = _loaded_in_a_child(tmp_path / "light", LIGHT_MODULES)
    assert light == {"torch": True, "torch._dynamo": False, "torch._inductor": False}, light
    full = _loaded_in_a_child(tmp_path / "full", WARM_MODULES)
    assert full["torch"] and full["torch._dynamo"], full  # the control: the full server's


class _SlowServer:
    """Stands in for ForkServer: a start that takes START_S, recorded in `starts`."""

    START_S = 1.0
    starts: list = []

    def __init__(self, env, warm=(), base=()):
        time.sleep(self.START_S)
        self.base = base
        _SlowServer.starts.append((tuple(warm), base))

    def alive(self):
        return True

    def close(self):
        pass


def _fake_servers(monkeypatch, start_s: float) -> None:
    import opsynth.runtime.forkserver as fs

    monkeypatch.setattr(fs, "ForkServer", _SlowServer)
    monkeypatch.setattr(_SlowServer, "START_S", start_s)
    monkeypatch.setattr(_SlowServer, "starts", [])
    monkeypatch.setattr(sandbox, "_servers", {})
    monkeypatch.setattr(sandbox, "_starting", {})


def test_servers_of_different_kinds_start_side_by_side(monkeypatch):
    _fake_servers(monkeypatch, 1.0)
    got: dict = {}

    def start(light):
        got[light] = sandbox.fork_server({"PATH": "/bin"}, ("m",), light)

    t0 = time.monotonic()
    threads = [threading.Thread(target=start, args=(light,)) for light in (False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    assert got[True].base == LIGHT_MODULES and got[False].base == WARM_MODULES
    assert wall < 1.8 * _SlowServer.START_S, wall  # side by side; one after the other would be 2x
    # and one key's callers share its one server, started once
    t0 = time.monotonic()
    assert sandbox.fork_server({"PATH": "/bin"}, ("m",), True) is got[True]
    assert time.monotonic() - t0 < 0.5 * _SlowServer.START_S


def test_prestart_starts_the_servers_the_evaluation_then_uses(monkeypatch):
    """opsynth.reward.servers.prestart (the command line's, before its torch import): both kinds, with
    the keys `run_child` then asks for, so the evaluation starts none of its own."""
    from opsynth.reward.eval_types import BUILD_RUNNERS, RUNNERS, RewardConfig
    from opsynth.reward.servers import prestart

    _fake_servers(monkeypatch, 0.2)
    cfg = RewardConfig(device="cpu")
    threads = prestart(cfg)
    assert len(threads) == 2
    for t in threads:
        t.join(10)
    assert sorted(w for w, _ in _SlowServer.starts) == sorted([BUILD_RUNNERS, RUNNERS])
    env = sandbox.server_env(cfg)
    full, light = sandbox.fork_server(env, RUNNERS, False), sandbox.fork_server(env, BUILD_RUNNERS, True)
    assert len(_SlowServer.starts) == 2 and full is not light
