"""The sandbox holds against a candidate's own C++, as root and as an ordinary user.

One correct, slow candidate (the naive linear+relu) carries a C++ extension that tries every door
out of the sandbox (tests/runtime/doors.py) from its static initialiser and again from forward:
remount read-write, unmount the cover over the signing key, a new user+mount namespace, fresh tmpfs
and proc mounts, setns, chroot, ptrace and signal the evaluator, read the key by path, write into
/dev/shm, /tmp, the baseline cache, the compiler cache and the package, read a Hub token in the
evaluator's home and a file in a sibling candidate's scratch folder. A second one is the exploit
that was seen: unmount the cover, read the key, re-sign baselines 1000x slower. The static
pre-check is off: only the sandbox stands in the way.

Every door stays shut (its bit is 0 at load time and in forward), the door candidate is judged the
slow correct program it is (reward 1), a known slow candidate evaluated afterwards still gets 1, and
nothing changed in the package, the cache, the compiler cache, /dev/shm or /tmp. The control run with
`reward.isolation=none` shows the doors open and the exploit working (a slow candidate then scores
above 1), so these tests can fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from doors import DOORS, door_source, parse_masks  # noqa: E402

pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "opsynth"
CANDS = REPO / "tests" / "reward" / "candidates"
PRELUDE = (CANDS / "cpu" / "ext_prelude.py").read_text()
SLOW = PRELUDE + (CANDS / "cpu" / "slow_linear.py").read_text()
TASK = (CANDS / "tasks" / "matmul_bias.py").read_text()
UNPRIVILEGED_UID = 1_990_000_123
GPU_PRELUDE = (CANDS / "cuda" / "ext_prelude.py").read_text()
GPU_SLOW = GPU_PRELUDE + (CANDS / "cuda" / "slow_linear.py").read_text()
GPU_TASK = (CANDS / "tasks" / "matmul_bias_gpu.py").read_text()

RUNNER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {repo!r})
    from opsynth.reward import RewardConfig, evaluate_many
    spec = json.load(open(sys.argv[1]))
    cfg = RewardConfig(device=spec["device"], cache_dir=spec["cache"], compile_baseline=False, static_check=False,
                       warmup=2, repeats=5, cpu_threads=1, isolation=spec["isolation"], shared_pch=spec["shared_pch"],
                       baselines=spec.get("baselines", "fresh"))
    res = evaluate_many([(spec["task"], c) for c in spec["candidates"]], cfg)
    print(json.dumps([{{"reward": r.reward, "reason": r.reason, "log": r.log[-4000:]}} for r in res]))
    """
)


def _exploit(cache: Path, prelude: str = PRELUDE, ccache: Path | None = None) -> str:
    """The exploit that was seen: lift the cover from C++, then re-sign every baseline 1000x slower."""
    resign = textwrap.dedent(f"""
        try:
            import json as _json
            from opsynth.reward import baseline_cache as _bc
            _key = open({str(cache)!r} + "/trust/baselines.key").read().strip().encode()
            _p = {str(cache)!r} + "/baselines.json"
            _d = _json.load(open(_p))
            for _k, _v in _d.items():
                _v["eager_ms"] *= 1000
                _v["compile_ms"] = None if _v.get("compile_ms") is None else _v["compile_ms"] * 1000
                _v["sig"] = _bc._sign(_key, _k, _v)
            open(_p, "w").write(_json.dumps(_d))
        except Exception as _e:
            print("exploit failed:", type(_e).__name__, _e)
    """)
    src = door_source(cache, PKG, os.getpid(), "exploit", safe=False, prelude=prelude, ccache=ccache)
    return src.replace("LEAKED = _door.door_init_mask() != 0", "LEAKED = False\n" + resign)


def _tree_digest(root: Path, skip=()) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not any(s in p.parts for s in skip):
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _strays() -> list[str]:
    return sorted(str(p) for d in (Path("/dev/shm"), Path("/tmp")) if d.is_dir() for p in d.glob("opsynth_door_*"))


def _run(tmp: Path, cache: Path, candidates: list[str], isolation: str, as_uid: int | None = None, device: str = "cpu",
         baselines: str = "fresh") -> list[dict]:
    spec = tmp / f"spec_{isolation}_{len(candidates)}_{as_uid}.json"
    task = TASK if device == "cpu" else GPU_TASK
    spec.write_text(json.dumps({"cache": str(cache), "task": task, "candidates": candidates, "isolation": isolation, "device": device,
                                "shared_pch": as_uid is None, "baselines": baselines}))
    runner = tmp / "runner.py"
    runner.write_text(RUNNER.format(repo=str(REPO)))
    cmd = [sys.executable, str(runner), str(spec)]
    env = {**os.environ, "HOME": str(tmp / "home"), "HF_TOKEN": "hf_door_secret"}
    if as_uid is not None:
        for p in [tmp, *tmp.rglob("*")]:
            os.lchown(p, as_uid, as_uid)
        cmd = [sys.executable, str(Path(__file__).parent / "as_unprivileged.py"), str(as_uid), str(tmp), "--", *cmd]
        env["TMPDIR"] = str(tmp / "tmp")
        env.pop("OPSYNTH_RL_PCH_DIR", None)  # the suite's shared PCH folder is root's (and this user skips the PCH)
        env.pop("OPSYNTH_RL_CCACHE_DIR", None)  # so is its compiler cache: this user's builds use the cache's own
        (tmp / "tmp").mkdir(exist_ok=True)
        os.lchown(tmp / "tmp", as_uid, as_uid)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _plant(tmp: Path, as_uid: int | None) -> tuple[Path, Path]:
    """A Hub token in the evaluator's home and a file in a sibling's scratch folder (0700, made where
    the evaluator makes its scratch folders), for the doors that try to read them."""
    secret = tmp / "home" / ".cache" / "huggingface" / "token"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("hf_door_secret_in_home")
    secret.chmod(0o600)
    tmpdir = tmp / "tmp" if as_uid is not None else Path(tempfile.gettempdir())
    sibling = tmpdir / f"opsynth_sibling_{os.getpid()}_{tmp.name}" / "job_candidate.json"
    sibling.parent.mkdir(parents=True, exist_ok=True)
    sibling.parent.chmod(0o700)
    sibling.write_text('{"candidate": "the sibling\'s source"}')
    return secret, sibling


def _confined_session(tmp: Path, as_uid: int | None, device: str = "cpu") -> dict:
    cache = tmp / "cache"
    (tmp / "home").mkdir(exist_ok=True)
    secret, sibling = _plant(tmp, as_uid)
    slow, prelude = (SLOW, PRELUDE) if device == "cpu" else (GPU_SLOW, GPU_PRELUDE)
    try:
        first = _run(tmp, cache, [slow], "auto", as_uid, device)[0]
        trusted_before = _tree_digest(cache, skip=("tmp",))
        pkg_before = _tree_digest(PKG, skip=("__pycache__",))
        strays_before = _strays()
        ccache = cache / "ccache" if as_uid is not None else None  # see _run
        door, exploit = _run(tmp, cache, [door_source(cache, PKG, os.getpid(), "confined", prelude=prelude, secret=secret,
                                                      sibling=sibling, ccache=ccache), _exploit(cache, prelude, ccache)],
                             "auto", as_uid, device)
    finally:
        shutil.rmtree(sibling.parent, ignore_errors=True)
    again = _run(tmp, cache, [slow], "auto", as_uid, device)[0]
    return {
        "first": first, "door": door, "exploit": exploit, "again": again, "masks": parse_masks(door["log"]),
        "trusted_changed": sorted(set(_tree_digest(cache, skip=("tmp",)).items()) ^ set(trusted_before.items())),
        "pkg_changed": sorted(set(_tree_digest(PKG, skip=("__pycache__",)).items()) ^ set(pkg_before.items())),
        "strays": sorted(set(_strays()) - set(strays_before)),
    }


@pytest.fixture(scope="module")
def as_root(tmp_path_factory):
    if os.getuid() != 0:
        pytest.skip("the evaluator-as-root setup needs root (CI runs as root)")
    return _confined_session(tmp_path_factory.mktemp("doors_root"), None)


@pytest.fixture(scope="module")
def as_user(tmp_path_factory, ordinary_user):
    ordinary_user(UNPRIVILEGED_UID)
    return _confined_session(tmp_path_factory.mktemp("doors_user"), UNPRIVILEGED_UID)


@pytest.fixture(scope="module")
def cuda_as_root(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if os.getuid() != 0:
        pytest.skip("the evaluator-as-root setup needs root")
    return _confined_session(tmp_path_factory.mktemp("doors_cuda"), None, "cuda")


SETUPS = ["as_root", "as_user", pytest.param("cuda_as_root", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("setup", SETUPS)
def test_every_door_stays_shut_at_load_time_and_in_forward(setup, request):
    s = request.getfixturevalue(setup)
    assert set(s["masks"]) == {"init", "forward"}, s["door"]["log"][-2000:]
    opened = {where: [d for d, ok in m.items() if ok] for where, m in s["masks"].items()}
    assert opened == {"init": [], "forward": []}


@pytest.mark.parametrize("setup", SETUPS)
def test_door_candidates_are_judged_as_the_slow_programs_they_are(setup, request):
    s = request.getfixturevalue(setup)
    assert s["first"]["reward"] == 1, s["first"]
    assert s["door"]["reward"] == 1, s["door"]
    assert s["exploit"]["reward"] == 1, s["exploit"]
    assert "exploit failed" in s["exploit"]["log"]
    assert s["again"]["reward"] == 1, s["again"]  # the exploit did not make a slow candidate fast


@pytest.mark.parametrize("setup", SETUPS)
def test_nothing_changed_in_the_package_the_caches_or_tmp(setup, request):
    s = request.getfixturevalue(setup)
    assert s["pkg_changed"] == []
    assert s["trusted_changed"] == []
    assert s["strays"] == []


def test_control_without_isolation_the_doors_open_and_the_exploit_pays(tmp_path):
    """reward.isolation=none: the same C++ opens the doors, and the re-signing exploit works."""
    cache = tmp_path / "cache"
    (tmp_path / "home").mkdir()
    secret, sibling = _plant(tmp_path, None)
    first = _run(tmp_path, cache, [SLOW], "none")[0]
    assert first["reward"] == 1, first
    try:
        door = _run(tmp_path, cache, [door_source(cache, PKG, os.getpid(), "control", safe=True, secret=secret, sibling=sibling)],
                    "none")[0]
    finally:
        shutil.rmtree(sibling.parent, ignore_errors=True)
    masks = parse_masks(door["log"])
    expect = {"mount_tmpfs", "mount_proc", "chroot", "signal_parent", "read_key", "write_dev_shm", "write_tmp",
              "write_baselines", "write_package", "unshare_userns_mount", "read_home_secret", "read_sibling_scratch"}
    for where in ("init", "forward"):
        assert expect <= {d for d, ok in masks[where].items() if ok}, (where, masks[where])
    assert door["reward"] == -1  # a door that opened zeroes the output: it can never pass as correct
    exploit = _run(tmp_path, cache, [_exploit(cache)], "none")[0]
    assert "exploit failed" not in exploit["log"], exploit["log"][-1500:]
    # The known slow candidate now "beats" its forged baselines when the cache decides as stored: 2
    # here, where the CPU runs time no compiled baseline (3 on the H200, as reported). (With the
    # default, fresh baselines, re-validation replaces the forged entry: tests/reward/test_reward_baselines.py.)
    again = _run(tmp_path, cache, [SLOW], "none", baselines="cached")[0]
    assert again["reward"] == 2, again
    assert _strays() == [] or all("control" not in s for s in _strays())


def test_doors_are_listed_once():
    assert len(set(DOORS)) == len(DOORS) == 17
