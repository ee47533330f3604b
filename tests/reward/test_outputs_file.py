"""Reading a child's outputs file in the parent (opsynth.reward.outputs_file), and the attack end to end.

The child owns its scratch folder and so what lies at its outputs path. Each of a FIFO, a symlink
(to a FIFO, to /dev/zero, to a good file), a directory, an oversize (sparse) file, a truncated or
garbage file, a legacy-format file and a zip with a compressed record must come back promptly as an
OutputsFileError; a normal file loads. The controls show that the plain `torch.load(path)` the
parent used before hangs on the FIFO (in a subprocess, killed after a short timeout), and the end-to-end
test has a CPU candidate leave a FIFO at its outputs path: -1 with `outputs_unreadable` promptly,
while with the guard off (`disabled_guards=["outputs_file"]`) the whole evaluation hangs.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch

from opsynth.reward.outputs_file import SLACK_BYTES, OutputsFileError, read_outputs, size_cap

REPO = Path(__file__).resolve().parents[2]
CANDS = Path(__file__).parent / "candidates"
OUTPUTS = {"trials": [[torch.randn(64, 32)] for _ in range(3)], "second": [torch.randn(16, 32)], "rounds_kept": {},
           "trial_reused": [False, False, False]}


def _prompt(fn, *args, limit_s: float = 5.0):
    """fn(*args) in a thread that must finish within limit_s: (returned, raised)."""
    box: dict = {}

    def run():
        try:
            box["out"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["err"] = e

    t = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"{fn.__name__} still blocked after {limit_s} s"
    assert time.monotonic() - t0 < limit_s
    return box.get("out"), box.get("err")


def _refused(path, cap=None, match=""):
    out, err = _prompt(read_outputs, path, cap)
    assert isinstance(err, OutputsFileError), (out, err)
    assert match in str(err), str(err)
    return str(err)


@pytest.fixture
def good(tmp_path):
    p = tmp_path / "cand_outputs.pt"
    torch.save(OUTPUTS, p)
    return p


def test_normal_file_loads(good):
    out, err = _prompt(read_outputs, good, size_cap(OUTPUTS))
    assert err is None
    assert all(torch.equal(a[0], b[0]) for a, b in zip(out["trials"], OUTPUTS["trials"]))
    assert out["trial_reused"] == [False] * 3


def test_fifo_returns_promptly(tmp_path):
    p = tmp_path / "cand_outputs.pt"
    os.mkfifo(p)
    _refused(p, match="not a regular file")


def test_control_plain_torch_load_hangs_on_a_fifo(tmp_path):
    """What the parent did before: torch.load(path) on a FIFO nobody writes blocks for ever."""
    p = tmp_path / "cand_outputs.pt"
    os.mkfifo(p)
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(p)!r}, weights_only=True)"], timeout=5)


def test_symlinks_are_not_followed(tmp_path, good):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/zero"), good):
        link = tmp_path / f"link_{target.name}"
        link.symlink_to(target)
        _refused(link, match="cannot open")


def test_directory_and_missing(tmp_path):
    d = tmp_path / "cand_outputs.pt"
    d.mkdir()
    _refused(d, match="not a regular file")
    _refused(tmp_path / "nothing.pt", match="cannot open")


def test_oversize_sparse_file_is_refused_before_reading(tmp_path):
    p = tmp_path / "cand_outputs.pt"
    with open(p, "wb") as f:
        f.truncate(1 << 40)  # 1 TiB, sparse: no disk used
    t0 = time.monotonic()
    _refused(p, size_cap(OUTPUTS), match="more than")
    assert time.monotonic() - t0 < 1.0


def test_size_cap_follows_the_reference():
    n = sum(t.numel() * 4 for tr in OUTPUTS["trials"] for t in tr) + 16 * 32 * 4
    assert size_cap(OUTPUTS) == 4 * n + SLACK_BYTES


def test_truncated_and_garbage_files(tmp_path, good):
    data = good.read_bytes()
    for name, body in (("truncated", data[: len(data) // 2]), ("garbage", os.urandom(4096)), ("empty", b""),
                       ("zeros", bytes(100_000))):
        p = tmp_path / f"{name}.pt"
        p.write_bytes(body)
        _refused(p, size_cap(OUTPUTS))


def test_legacy_format_is_refused(tmp_path):
    """The legacy (non-zip) format: its storage headers size an allocation before any data is read."""
    p = tmp_path / "legacy.pt"
    torch.save(OUTPUTS, p, _use_new_zipfile_serialization=False)
    assert torch.load(p, weights_only=True)["trial_reused"] == [False] * 3  # a valid file of that format
    _refused(p, size_cap(OUTPUTS), match="not a torch zip")


def test_compressed_records_are_refused(tmp_path, good):
    """A record that inflates (a zip bomb) never reaches the loader."""
    p = tmp_path / "deflated.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    _refused(p, size_cap(OUTPUTS), match="compressed")


def test_not_the_harness_dict(tmp_path):
    p = tmp_path / "list.pt"
    torch.save([torch.ones(3)], p)
    _refused(p, match="not the harness's dict")


# ---- end to end: a candidate that leaves a FIFO at its outputs path ----------------------------------

# The candidate's module top level: a FIFO at its outputs path, held open for reading by the candidate
# itself (so the harness's torch.save writes into the pipe and succeeds), with a pipe buffer larger
# than its small outputs. When the child exits the data goes with it, and the parent finds a FIFO
# that no one will ever write: a plain open for reading blocks for ever.
FIFO_ATTACK = textwrap.dedent("""
    import fcntl as _fcntl
    import os as _os

    _p = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "cand_outputs.pt")
    if not _os.path.exists(_p):
        _os.mkfifo(_p)
    _fd = _os.open(_p, _os.O_RDWR | _os.O_NONBLOCK)
    try:
        _fcntl.fcntl(_fd, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError:
        pass
""")
SMALL_CHAIN = (CANDS / "tasks" / "chain.py").read_text().replace("batch_size = 128", "batch_size = 4").replace(
    "dim = 8192", "dim = 256")


def _fifo_candidate() -> str:
    return (CANDS / "cpu" / "ext_prelude.py").read_text() + FIFO_ATTACK + (CANDS / "cpu" / "fast.py").read_text()


RUNNER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {repo!r})
    from opsynth.reward import RewardConfig, evaluate_many
    spec = json.load(open(sys.argv[1]))
    cfg = RewardConfig(device="cpu", cache_dir=spec["cache"], compile_baseline=False, static_check=False, warmup=2,
                       repeats=5, cpu_threads=1, prebuild=False, disabled_guards=spec["off"])
    res = evaluate_many([(spec["task"], c) for c in spec["candidates"]], cfg,
                        progress=lambda m: print(f"{{time.monotonic():.3f}} {{m}}", file=sys.stderr, flush=True))
    print(json.dumps([{{"reward": r.reward, "reason": r.reason, "detail": r.details.get("detail", ""),
                       "judge_s": r.times.get("judge_s")}} for r in res]))
""")

MEASURING = "checking and timing"  # the progress line as a candidate's measuring child starts


def _start(tmp_path, cache, candidates, off) -> subprocess.Popen:
    spec = tmp_path / f"spec_{'_'.join(off) or 'defaults'}.json"
    spec.write_text(json.dumps({"cache": cache, "task": SMALL_CHAIN, "candidates": candidates, "off": off}))
    script = tmp_path / "runner.py"
    script.write_text(RUNNER.format(repo=str(REPO)))
    return subprocess.Popen([sys.executable, str(script), str(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _lines(proc) -> list:
    """The runner's stderr lines as they come (a thread reads them), for waiting on a phase."""
    lines: list = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True).start()
    return lines


def _wait_for(lines, text, proc, limit_s):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        hit = [ln for ln in list(lines) if text in ln]
        if hit:
            return float(hit[0].split()[0])
        if proc.poll() is not None and not any(text in ln for ln in list(lines)):
            time.sleep(0.5)
            if not any(text in ln for ln in list(lines)):
                raise AssertionError("".join(lines)[-3000:])
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} within {limit_s} s: " + "".join(lines)[-3000:])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fifo_at_the_outputs_path_end_to_end(tmp_path, reward_cache):
    fast = (CANDS / "cpu" / "ext_prelude.py").read_text() + (CANDS / "cpu" / "fast.py").read_text()
    proc = _start(tmp_path, reward_cache, [_fifo_candidate(), fast], [])
    lines = _lines(proc)
    t_measure = _wait_for(lines, MEASURING, proc, 600)  # after the reference and the extension's build
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, "".join(lines)[-3000:]
    attack, honest = json.loads(out.strip().splitlines()[-1])
    assert attack["reward"] == -1 and attack["reason"] == "outputs_unreadable", attack
    assert "not a regular file" in attack["detail"], attack
    assert attack["judge_s"] < 1.0, attack  # promptly
    assert honest["reason"] == "ok" and honest["reward"] >= 1, honest  # the honest one beside it is judged as before
    measured_s = time.monotonic() - t_measure  # both candidates, from the first measuring child to the end
    # The control: the parent's plain torch.load(path) of before, on the same candidate (built now), never returns.
    proc = _start(tmp_path, reward_cache, [_fifo_candidate()], ["outputs_file"])
    try:
        lines = _lines(proc)
        _wait_for(lines, MEASURING, proc, 600)
        limit = max(30.0, 2 * measured_s)  # one candidate where measured_s saw two measured and judged
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=limit)
        assert not any("candidate 0: reward" in ln for ln in lines), lines[-5:]  # no verdict: still in torch.load
    finally:
        proc.kill()  # the runner; its fork server and children end when their stdin closes
        proc.wait()
