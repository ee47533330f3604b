"""Sandbox integrity: a candidate cannot change what the evaluator trusts (one test per door).

Each door candidate is correct (the slow naive matmul) and, at import, tries one door: rewrite the
cached baselines (from Python, and from a C++ static initialiser), the shared PCH, another
candidate's cached build, the project's package folder, a file in the user's home; read a Hub token
from the environment or /proc; open a socket. The static pre-check is off, so only the sandbox stands
in the way. Afterwards the files are unchanged and a known slow candidate still gets reward 1.
The whole batch runs in a subprocess started with HF_TOKEN in its environment, as a trainer would be.
A control run with `isolation=none` shows the same door open (so the test can fail).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]

CANDS = Path(__file__).parent / "candidates"
REPO = Path(__file__).resolve().parents[2]
PRELUDE = (CANDS / "cpu" / "ext_prelude.py").read_text()
SLOW = (CANDS / "cpu" / "slow_linear.py").read_text()
LINEAR = (CANDS / "tasks" / "matmul_bias.py").read_text()
PKG = REPO / "opsynth" / "reward"
TOKEN = "hf_door_test_secret_0123456789"

# Runs in the subprocess: evaluate a batch, print the results as JSON on the last line.
RUNNER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {repo!r})
    from opsynth.reward import RewardConfig, evaluate_many
    spec = json.load(open(sys.argv[1]))
    cfg = RewardConfig(device="cpu", cache_dir=spec["cache"], compile_baseline=False, static_check=False,
                       warmup=2, repeats=5, cpu_threads=1, isolation=spec["isolation"])
    res = evaluate_many([(spec["task"], c) for c in spec["candidates"]], cfg)
    print(json.dumps([{{"reward": r.reward, "reason": r.reason, "log": r.log[-1500:]}} for r in res]))
    """
)


def _door(code: str) -> str:
    """A correct, slow candidate whose module top level first runs `code` (errors swallowed)."""
    body = textwrap.indent(textwrap.dedent(code).strip(), "    ")
    return PRELUDE + "\nLEAKED = False\ntry:\n" + body + "\nexcept Exception:\n    pass\n" + SLOW.replace(
        "return ext.linear_relu(x, self.linear.weight, self.linear.bias)",
        "out = ext.linear_relu(x, self.linear.weight, self.linear.bias)\n        return out * 0 if LEAKED else out",
    )


def _doors(cache: Path, home: Path, port: int) -> dict[str, str]:
    c, pkg, h = str(cache), str(PKG), str(home)
    return {
        "baselines_py": f"""
            import json
            p = {c!r} + "/baselines.json"
            d = json.load(open(p))
            for v in d.values():
                if isinstance(v, dict) and "eager_ms" in v:
                    v["eager_ms"] = v["eager_ms"] * 1000
            d["door_was_here"] = True
            open(p, "w").write(json.dumps(d))
        """,
        "baselines_cpp": f'''
            from torch.utils.cpp_extension import load_inline as _li
            _li(name="door_cpp", functions=["door_noop"], extra_cflags=["-O1"], cpp_sources=r"""
            #include <torch/extension.h>
            #include <cstdio>
            static int door_init = []() {{
                FILE* f = std::fopen("{c}/baselines.json", "w"); if (f) {{ std::fputs("{{}}", f); std::fclose(f); }}
                FILE* g = std::fopen("{pkg}/door_from_cpp.txt", "w"); if (g) std::fclose(g);
                return 0;
            }}();
            void door_noop(torch::Tensor x) {{}}
            """).door_noop(torch.zeros(1))
        ''',
        "pch": f"""
            import glob
            for p in glob.glob({c!r} + "/pch/*/torch/*.gch"):
                open(p, "ab").write(b"x")
        """,
        "other_build": f"""
            import glob
            for p in glob.glob({c!r} + "/ext/*/*.so"):
                open(p, "r+b").write(b"\\0\\0\\0\\0")
        """,
        "package": f"""
            open({pkg!r} + "/door_from_py.py", "w").write("PWNED = True")
        """,
        "home": f"""
            open({h!r} + "/door_home.txt", "w").write("x")
        """,
        "token": f"""
            import os, glob
            LEAKED = {TOKEN!r} in "".join(os.environ.values())
            for p in glob.glob("/proc/*/environ"):
                try:
                    LEAKED = LEAKED or {TOKEN!r}.encode() in open(p, "rb").read()
                except OSError:
                    pass
        """,
        "socket": f"""
            import socket
            s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
            s.sendall(b"leak")
            LEAKED = True
        """,
    }


def _digest(paths) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def _run(cache: Path, candidates: list[str], isolation: str, tmp: Path, home: Path) -> list[dict]:
    spec = tmp / f"spec_{isolation}_{len(candidates)}.json"
    spec.write_text(json.dumps({"cache": str(cache), "task": LINEAR, "candidates": candidates, "isolation": isolation}))
    runner = tmp / "runner.py"
    runner.write_text(RUNNER.format(repo=str(REPO)))
    env = {**os.environ, "HF_TOKEN": TOKEN, "HOME": str(home)}
    proc = subprocess.run([sys.executable, str(runner), str(spec)], capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def doors(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("doors")
    cache, home = tmp / "cache", tmp / "home"
    home.mkdir()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.5)
    received = []

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                received.append(conn.recv(16))
            except OSError:
                continue

    stop = threading.Event()
    threading.Thread(target=accept, daemon=True).start()
    door_src = _doors(cache, home, server.getsockname()[1])
    # First a plain slow candidate: fills the baseline cache, the PCH and the extension cache.
    first = _run(cache, [_door("pass")], "auto", tmp, home)
    trusted = sorted((cache / "ext").glob("*/*.so")) + sorted((cache / "pch").glob("*/torch/*.gch")) + [cache / "baselines.json"]
    before = _digest(trusted)
    names = list(door_src)
    results = _run(cache, [_door(door_src[n]) for n in names], "auto", tmp, home)
    after = _digest(trusted)
    again = _run(cache, [_door("pass")], "auto", tmp, home)
    stop.set()
    return {
        "first": first[0], "results": dict(zip(names, results)), "again": again[0], "before": before, "after": after,
        "received": received, "home": home, "tmp": tmp, "cache": cache, "door_src": door_src,
    }


def test_a_known_slow_candidate_gets_1(doors):
    assert doors["first"]["reward"] == 1, doors["first"]
    assert doors["again"]["reward"] == 1, doors["again"]  # no door changed its verdict


def test_trusted_files_unchanged(doors):
    assert doors["before"], "nothing trusted was cached"
    assert doors["after"] == doors["before"]


@pytest.mark.parametrize("door", ["baselines_py", "baselines_cpp", "pch", "other_build", "package", "home", "token", "socket"])
def test_door_is_closed(doors, door):
    r = doors["results"][door]
    # Either the attempt failed quietly (the candidate is judged as the slow one it is: reward 1) or it
    # made the candidate fail with a named reason; it never leaked (then its output would be wrong).
    assert r["reason"] != "incorrect", f"{door}: the door let something through: {r}"
    assert r["reward"] in (1, -1), r
    if door in ("package", "baselines_cpp"):
        assert not list(PKG.glob("door_from_*")), "the candidate wrote into the project's package"
    if door == "home":
        assert not (doors["home"] / "door_home.txt").exists()
    if door == "socket":
        assert doors["received"] == []


def test_control_without_isolation_the_baseline_door_is_open(doors):
    """With isolation=none the same door works: the slow candidate is then scored 3 (the test can fail)."""
    cache = doors["tmp"] / "cache_open"
    first = _run(cache, [_door("pass")], "none", doors["tmp"], doors["home"])
    assert first[0]["reward"] == 1
    honest = {k: v["eager_ms"] for k, v in json.loads((cache / "baselines.json").read_text()).items()}
    _run(cache, [_door(_doors(cache, doors["home"], 9)["baselines_py"])], "none", doors["tmp"], doors["home"])
    data = json.loads((cache / "baselines.json").read_text())
    assert data.get("door_was_here")  # the door rewrote the cache...
    # ...but the entries it edited no longer verify: that same evaluation re-measured and stored them
    # (its baselines are timed fresh and the cache re-validated with them), as did the next one
    assert all(data[k]["eager_ms"] < 10 * honest[k] for k in honest)
    again = _run(cache, [_door("pass")], "none", doors["tmp"], doors["home"])
    assert again[0]["reward"] == 1, "...but the edited entry no longer verifies, so it was re-measured"
