"""A child's outputs reach the parent through a sealed channel (opsynth.reward.outputs_file), and the
path attack end to end.

The parent makes a memfd per child; the child's harness writes torch.save's bytes into it; the
parent seals it once the child has ended and loads it in place. Unit tests: what the harness writes
loads; a channel with nothing, too much (a sparse 1 TiB), garbage, a truncated or legacy-format file
or a compressed record, or not the harness's dict, comes back promptly as an OutputsFileError; a
channel some process still maps for writing, or that the child sealed against sealing with its
contents writable, is refused (control: unsealed, such a process changes the outputs the parent has
already loaded). End to end: a CPU candidate leaves a FIFO at the path its outputs were written to
before the channel (`cand_outputs.pt`); it is judged as the honest candidate it otherwise is, promptly,
while with the guard off (`disabled_guards=["outputs_file"]`: the child writes to that path and the
parent loads it plainly) the whole evaluation hangs.
"""

from __future__ import annotations

import fcntl
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

from opsynth.reward.outputs_file import SLACK_BYTES, OutputsChannel, OutputsFileError, channel_writer, size_cap

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


@pytest.fixture
def channel():
    with OutputsChannel("test-outputs") as ch:
        yield ch


def _saved(obj=OUTPUTS, **kw) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def _write(ch: OutputsChannel, body: bytes) -> None:
    os.pwrite(ch.fd, body, 0)


def _as_child(monkeypatch, ch: OutputsChannel):
    """channel_writer as a child's harness gets it: the parent's channel among the child's descriptors."""
    from opsynth.runtime import child

    monkeypatch.setattr(child, "FDS", {"outputs": ch.fd})
    return channel_writer(torch.save)


def _refused(ch, cap=None, match=""):
    out, err = _prompt(ch.read, cap)
    assert isinstance(err, OutputsFileError), (out, err)
    assert match in str(err), str(err)
    return str(err)


def test_what_the_harness_writes_loads(channel, monkeypatch):
    _as_child(monkeypatch, channel)(OUTPUTS)
    out, err = _prompt(channel.read, size_cap(OUTPUTS))
    assert err is None, err
    assert all(torch.equal(a[0], b[0]) for a, b in zip(out["trials"], OUTPUTS["trials"]))
    assert out["trial_reused"] == [False] * 3
    assert fcntl.fcntl(channel.fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE  # final from now on
    with pytest.raises(PermissionError):
        os.pwrite(channel.fd, b"changed", 0)


def test_the_harness_writes_from_the_start_whatever_was_there(channel, monkeypatch):
    """A candidate that writes junk into the channel (and leaves its offset far in) before the harness
    saves: the harness's bytes alone, from offset 0."""
    write = _as_child(monkeypatch, channel)
    os.write(channel.fd, os.urandom(1 << 20))
    os.lseek(channel.fd, 5 << 20, os.SEEK_SET)
    write(OUTPUTS)
    assert channel.size() == len(_saved())
    assert channel.read(size_cap(OUTPUTS))["trial_reused"] == [False] * 3


def test_a_child_without_a_channel_is_told(monkeypatch):
    from opsynth.runtime import child

    monkeypatch.setattr(child, "FDS", {})
    with pytest.raises(RuntimeError, match="without an outputs channel"):
        channel_writer(torch.save)(OUTPUTS)


def test_nothing_written(channel):
    _refused(channel, size_cap(OUTPUTS), match="nothing was written")


def test_oversize_sparse_channel_is_refused_before_reading(channel):
    os.ftruncate(channel.fd, 1 << 40)  # 1 TiB, sparse: no memory used
    t0 = time.monotonic()
    _refused(channel, size_cap(OUTPUTS), match="more than")
    assert time.monotonic() - t0 < 1.0


def test_size_cap_follows_the_reference():
    n = sum(t.numel() * 4 for tr in OUTPUTS["trials"] for t in tr) + 16 * 32 * 4
    assert size_cap(OUTPUTS) == 4 * n + SLACK_BYTES


@pytest.mark.parametrize("name", ["truncated", "garbage", "zeros"])
def test_truncated_and_garbage(name):
    data = _saved()
    body = {"truncated": data[: len(data) // 2], "garbage": os.urandom(4096), "zeros": bytes(100_000)}[name]
    with OutputsChannel() as ch:
        _write(ch, body)
        _refused(ch, size_cap(OUTPUTS))


def test_legacy_format_is_refused(channel, tmp_path):
    """The legacy (non-zip) format: its storage headers size an allocation before any data is read."""
    body = _saved(_use_new_zipfile_serialization=False)
    assert torch.load(io.BytesIO(body), weights_only=True)["trial_reused"] == [False] * 3  # valid in that format
    _write(channel, body)
    _refused(channel, size_cap(OUTPUTS), match="not a torch zip")


def test_compressed_records_are_refused(channel):
    """A record that inflates (a zip bomb) never reaches the loader."""
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(_saved())) as src, zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    _write(channel, buf.getvalue())
    _refused(channel, size_cap(OUTPUTS), match="compressed")


def test_not_the_harness_dict(channel):
    _write(channel, _saved([torch.ones(3)]))
    _refused(channel, match="not the harness's dict")


def test_a_channel_sealed_by_the_child_with_every_needed_seal_loads(channel):
    _write(channel, _saved())
    fcntl.fcntl(channel.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    assert channel.read(size_cap(OUTPUTS))["trial_reused"] == [False] * 3


def test_a_channel_sealed_against_sealing_with_writes_open_is_refused(channel):
    """The child seals the seals first: the parent cannot make the contents final, so it does not load them."""
    _write(channel, _saved())
    fcntl.fcntl(channel.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL)
    _refused(channel, size_cap(OUTPUTS), match="sealed against sealing")


def test_where_memfds_cannot_be_sealed_a_private_copy_is_judged(channel, monkeypatch):
    """A kernel without memfd seals (EINVAL): the outputs still load, from a copy taken once, which
    nothing the child left behind can change afterwards."""
    import opsynth.reward.outputs_file as of

    real = fcntl.fcntl

    def no_seals(fd, cmd, *a):
        if cmd == fcntl.F_ADD_SEALS:
            raise OSError(22, "Invalid argument")
        return real(fd, cmd, *a)

    monkeypatch.setattr(of.fcntl, "fcntl", no_seals)
    _write(channel, _saved())
    out = channel.read(size_cap(OUTPUTS))
    os.pwrite(channel.fd, bytes(channel.size()), 0)  # the channel zeroed after the read
    assert all(torch.equal(a[0], b[0]) for a, b in zip(out["trials"], OUTPUTS["trials"]))


# A process of the child's that outlived it, still mapping the channel for writing: it rewrites the
# first output's values whenever told (a line on stdin), after the parent has loaded them.
MAPPER = textwrap.dedent("""
    import mmap, os, sys
    fd = int(sys.argv[1])
    m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    print("mapped", flush=True)
    for line in sys.stdin:
        at = m.find(bytes.fromhex(line.strip()))
        m[at:at + 64] = bytes(64)  # zeros over the first output's first 16 floats
        m.flush()
        print("rewritten", at, flush=True)
""")


def _mapper(channel):
    p = subprocess.Popen([sys.executable, "-c", MAPPER, str(channel.fd)], pass_fds=[channel.fd], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "mapped"
    return p


def test_a_channel_still_mapped_for_writing_is_refused(channel):
    _write(channel, _saved())
    p = _mapper(channel)
    try:
        _refused(channel, size_cap(OUTPUTS), match="still mapped for writing")
    finally:
        p.kill()
        p.wait()


def test_control_unsealed_a_mapping_process_changes_outputs_already_loaded(channel):
    """The attack the seal stops: the parent loads the outputs in place (mapped), and a process that
    still maps the channel for writing rewrites them afterwards, under the judge's eyes."""
    _write(channel, _saved())
    p = _mapper(channel)
    try:
        out = torch.load(f"/proc/self/fd/{channel.fd}", mmap=True, weights_only=True)  # read_channel without `seal`
        first = out["trials"][0][0]
        before = first.reshape(-1)[:16].clone()
        assert before.abs().sum() > 0
        p.stdin.write(before.numpy().tobytes().hex() + "\n")
        p.stdin.flush()
        assert p.stdout.readline().startswith("rewritten")
        assert torch.equal(first.reshape(-1)[:16], torch.zeros(16))  # the loaded tensor changed under the parent
    finally:
        p.kill()
        p.wait()


# ---- end to end: a candidate that leaves a FIFO at the path its outputs were written to before -------

# The candidate's module top level: a FIFO at that path, held open for reading by the candidate
# itself (so a harness's torch.save to the path writes into the pipe and succeeds), with a pipe buffer
# larger than its small outputs. When the child exits the data goes with it, and a parent that opens
# the path finds a FIFO that no one will ever write: a plain open for reading blocks for ever.
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
def test_fifo_at_the_old_outputs_path_end_to_end(tmp_path, reward_cache):
    fast = (CANDS / "cpu" / "ext_prelude.py").read_text() + (CANDS / "cpu" / "fast.py").read_text()
    proc = _start(tmp_path, reward_cache, [_fifo_candidate(), fast], [])
    lines = _lines(proc)
    t_measure = _wait_for(lines, MEASURING, proc, 600)  # after the reference and the extension's build
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, "".join(lines)[-3000:]
    attack, honest = json.loads(out.strip().splitlines()[-1])
    # The outputs came through the channel: the FIFO at the path is never opened, and the candidate is
    # judged as the honest fused kernel it otherwise is, promptly
    assert attack["reason"] == "ok" and attack["reward"] >= 1, attack
    assert attack["judge_s"] < 1.0, attack
    assert honest["reason"] == "ok" and honest["reward"] >= 1, honest  # the honest one beside it is judged as before
    measured_s = time.monotonic() - t_measure  # both candidates, from the first measuring child to the end
    # The control: outputs written to the path and the parent's plain torch.load(path) of before, on the
    # same candidate (built now): it never returns.
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
