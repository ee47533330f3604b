"""A timed round's numbers read on the host in one transfer (issue 28), value for value what the
functions that read them one by one gave (tests/reward/legacy_timed_inputs.py, a frozen copy).

What a user relies on: the parent compares a candidate's fingerprints and input hashes with the
reference's, and both children make them with the same functions, so a changed value on one side
only would fail honest candidates or pass wrong ones; here every value is bit for bit the old one
(sign of zero, int and float types included) on floating outputs with and without NaN and infinity,
half and bfloat16, complex, integer and bool outputs, empty ones, non-contiguous ones and ones over
several chunks; one transfer (one device sync on CUDA) per round in the usual case; fresh inputs
unchanged; and the child's channel reads whole replies, however they arrive.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).parent))
import legacy_timed_inputs as legacy  # noqa: E402
from opsynth.reward import timed_inputs  # noqa: E402
from opsynth.reward.rounds import Channel  # noqa: E402

# "cpu+transfer": the CPU through the queue and the one transfer a CUDA device takes (a CPU's values
# are read at once, timed_inputs._READ_NOW)
DEVICES = ["cpu", "cpu+transfer", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def device(request, monkeypatch):
    if request.param == "cpu+transfer":
        monkeypatch.setattr(timed_inputs, "_READ_NOW", ())
        return "cpu"
    return request.param


def _same(a, b) -> bool:
    """Equal bit for bit: the same nesting, types, integers and float bits (NaN and -0.0 included)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return a == b


def _outputs(device: str, n: int = 3000) -> dict:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, generator=g) * 3
    special = x.clone()
    special[::97] = float("nan")
    special[5::101] = float("inf")
    special[7::103] = -float("inf")
    outs = {
        "float32": x,
        "float64": x.double(),
        "float16": x.half(),
        "bfloat16": x.bfloat16(),
        "float32_nan_inf": special,
        "float16_nan_inf": special.half(),
        "bfloat16_only_nan": torch.where(x > 2, float("nan"), x).bfloat16(),
        "all_nan": torch.full((17,), float("nan")),
        "huge_finite": torch.full((64,), 1e308, dtype=torch.float64),  # the projections overflow: finite input
        "negative_zero": torch.tensor([-0.0]),
        "zeros": torch.zeros(40),
        "complex64": torch.complex(x[:500], x[500:1000]),
        "int64": torch.randint(-2**62, 2**62, (n,), generator=g),
        "int32": torch.randint(-2**31, 2**31 - 1, (n,), generator=g, dtype=torch.int32),
        "int16": torch.randint(-2**15, 2**15 - 1, (n,), generator=g, dtype=torch.int16),
        "int8": torch.randint(-128, 127, (n,), generator=g, dtype=torch.int8),
        "uint8": torch.randint(0, 255, (n,), generator=g, dtype=torch.uint8),
        "bool": x > 0,
        "empty_float": torch.empty(0, 5),
        "empty_int": torch.empty(0, dtype=torch.int64),
        "empty_bool": torch.empty(3, 0, dtype=torch.bool),
        "transposed": x[:2400].reshape(40, 60).t(),
        "strided": x[::3],
        "expanded": x[:50].reshape(50, 1).expand(50, 8),
        "scalar": x[0].clone(),
    }
    return {k: v.to(device) for k, v in outs.items()}


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 1000 elements in both copies: outputs and inputs over several chunks, cheaply."""
    monkeypatch.setattr(timed_inputs, "_CHUNK", 1000)
    monkeypatch.setattr(legacy, "_CHUNK", 1000)


def _check_fingerprints(outs: dict):
    for name, o in outs.items():
        assert _same(timed_inputs.fingerprint([o]), legacy.fingerprint([o])), name
    every = list(outs.values())
    assert _same(timed_inputs.fingerprint(every), legacy.fingerprint(every))
    for name, o in outs.items():
        assert _same(timed_inputs.tolerance([o], 1e-2, 1e-2), legacy.tolerance([o], 1e-2, 1e-2)), name
    assert _same(timed_inputs.tolerance(every, 1e-3, 2e-2), legacy.tolerance(every, 1e-3, 2e-2))


def _check_keys(outs: dict):
    for name, o in outs.items():
        assert _same(timed_inputs.input_key([o]), legacy.input_key([o])), name
    every = [*outs.values(), 3, None, "x"]  # non-tensors are left out of the hash
    assert _same(timed_inputs.input_key(every), legacy.input_key(every))
    assert _same(timed_inputs.input_key([]), legacy.input_key([]))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_fingerprints_and_tolerances_are_the_ones_read_one_by_one(device):
    _check_fingerprints(_outputs(device))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_fingerprints_over_several_chunks_are_the_ones_read_one_by_one(device, small_chunks):
    outs = _outputs(device, n=5500)  # 6 chunks, the last one short
    late = outs["float32"].clone()
    late[4321] = float("nan")  # a non-finite value in a later chunk only
    outs["nan_in_a_later_chunk"] = late
    _check_fingerprints(outs)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_input_keys_are_the_ones_read_one_by_one(device):
    _check_keys(_outputs(device))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_input_keys_over_several_chunks_are_the_ones_read_one_by_one(device, small_chunks):
    _check_keys(_outputs(device, n=5500))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_a_rounds_fingerprints_and_key_together_are_each_alone(device, small_chunks):
    outs = _outputs(device, n=2500)
    o = [outs["float32"], outs["bfloat16"], outs["int32"], outs["bool"], outs["float16_nan_inf"]]
    ins = [outs["float32"], outs["int64"], 7, outs["bool"]]
    fp, key = timed_inputs.fingerprints_and_key(o, ins)
    assert _same(fp, legacy.fingerprint(o)) and _same(key, legacy.input_key(ins))
    assert _same(timed_inputs.fingerprints_and_key([], []), ([], 0))


class _HostReads(TorchFunctionMode):
    """Reads of a tensor's values on the host: each a device sync on CUDA. Reads of what a `.cpu()`
    brought over (by storage) are not counted again: that copy was the read."""

    def __init__(self):
        super().__init__()
        self.n = 0
        self.copied: set = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in ("__bool__", "__int__", "__float__", "item", "tolist", "cpu"):
            t = args[0]
            if t.untyped_storage().data_ptr() not in self.copied:
                self.n += 1
            if name == "cpu":
                self.copied.add(out.untyped_storage().data_ptr())
        return out


def test_a_round_reads_the_device_once(small_chunks, monkeypatch):
    """The usual round (finite outputs) copies its numbers to the host once, where the one-by-one
    reads took one per output and chunk and one per input and chunk (on the CPU's transfer path)."""
    monkeypatch.setattr(timed_inputs, "_READ_NOW", ())
    outs = _outputs("cpu", n=2500)
    o = [outs["float32"], outs["float16"], outs["int32"], outs["bool"], outs["complex64"]]
    ins = [outs["float32"], outs["int64"], outs["bool"]]
    timed_inputs.fingerprints_and_key(o, ins)  # the projections' weights, made once
    with _HostReads() as new:
        timed_inputs.fingerprints_and_key(o, ins)
    with _HostReads() as old:
        legacy.fingerprint(o), legacy.input_key(ins)
    assert new.n == 1 and old.n > 10, (new.n, old.n)
    with _HostReads() as nan:  # an output with NaN reads it again, chunk by chunk (as before)
        timed_inputs.fingerprints_and_key([outs["float32_nan_inf"]], ins)
    assert nan.n > 1


@pytest.mark.gpu
def test_a_round_syncs_the_device_once():
    """On CUDA: the synchronizing operations torch's sync debug mode reports, once a round."""
    import warnings

    outs = _outputs("cuda", n=2500)
    o = [outs["float32"], outs["bfloat16"], outs["int32"], outs["bool"]]
    ins = [outs["float32"], outs["int64"]]
    timed_inputs.fingerprints_and_key(o, ins)
    torch.cuda.synchronize()
    counts = []
    for fn in (lambda: timed_inputs.fingerprints_and_key(o, ins), lambda: (legacy.fingerprint(o), legacy.input_key(ins))):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        counts.append(sum("synchroniz" in str(x.message) for x in w))
    assert counts[0] == 1 and counts[1] > 4, counts


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_fresh_inputs_are_the_ones_made_before(device):
    g = torch.Generator().manual_seed(5)
    trials = [[torch.randn(64, 48, generator=g), torch.randint(0, 9, (64, 48), generator=g), torch.randn(48, generator=g).half(),
               torch.randn(48, 64, generator=g).t(), 3] for _ in range(5)]  # the last tensor non-contiguous
    trials = [[x.to(device) if isinstance(x, torch.Tensor) else x for x in t] for t in trials]
    stacked = timed_inputs.stack_trials(trials)
    new = [x.clone() if isinstance(x, torch.Tensor) else x for x in trials[0]]
    old = [x.clone() if isinstance(x, torch.Tensor) else x for x in trials[0]]
    assert not new[3].is_contiguous()
    for seed in (1, 2, 2**61 + 17):
        timed_inputs.fresh_inputs(new, stacked, seed)
        legacy.fresh_inputs(old, stacked, seed)
        for a, b in zip(new, old):
            if isinstance(a, torch.Tensor):
                assert a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)
            else:
                assert a == b


# ---- the child's channel ----------------------------------------------------------------------------------


def _parent(sock, replies, pieces):
    """Answers each line with the next reply, written in `pieces` parts (a reply arriving in bits)."""
    f = sock.makefile("rb")
    for reply in replies:
        if not f.readline():
            break
        data = json.dumps(reply).encode() + b"\n"
        step = max(1, math.ceil(len(data) / pieces))
        for i in range(0, len(data), step):
            sock.sendall(data[i:i + step])
    f.close()


@pytest.mark.parametrize("pieces", [1, 3, 200])
def test_the_childs_channel_reads_whole_replies_however_they_arrive(pieces):
    replies = [{"ok": True, "seed": 2**61 + k, "keep": k % 2 == 0, "pad": "x" * (k * 37)} for k in range(30)]
    replies.append({"ok": True, "big": "y" * 200_000})  # larger than one read
    parent, child = socket.socketpair()
    t = threading.Thread(target=_parent, args=(parent, replies, pieces), daemon=True)
    t.start()
    chans = [Channel(child.fileno()), Channel(child.fileno())]  # the candidate's: its rounds', its locks'
    try:
        for k, want in enumerate(replies):
            assert chans[k % 2].request({"kind": "round_ready", "j": k}) == want
        assert all(not c.pending for c in chans)
    finally:
        child.close()
        t.join(5)
        parent.close()


def test_the_childs_channel_says_when_the_parent_is_gone():
    parent, child = socket.socketpair()
    parent.close()
    with pytest.raises((RuntimeError, OSError)):
        Channel(child.fileno()).request({"kind": "round_start", "j": 0})
    child.close()


def test_a_round_leaves_the_harness_snapshot_as_it_was():
    """The candidate child takes any change to these modules' names for a patch (harness_patched):
    the round's functions keep no module state that they rebind, even on first use."""
    from opsynth.reward import guards, rounds

    snap = guards.HarnessSnapshot(extra_modules=[timed_inputs, rounds])
    g = torch.Generator().manual_seed(9)
    trials = [[torch.randn(37, 29, generator=g), torch.randint(0, 5, (37, 29), generator=g, dtype=torch.int32)] for _ in range(3)]
    buffers = [t.clone() for t in trials[0]]
    timed_inputs.fresh_inputs(buffers, timed_inputs.stack_trials(trials), 4)
    outs = [buffers[0] * 2, buffers[1] > 2, buffers[0].half()]
    timed_inputs.fingerprints_and_key(outs, buffers)
    timed_inputs.tolerance(outs, 1e-2, 1e-2)
    assert snap.changed() is None
