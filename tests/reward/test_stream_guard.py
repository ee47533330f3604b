"""The side-stream guard tells a handle on the current stream (what `torch.cuda.current_stream()`
returns, and what a CUDA launch from Python needs) from a new stream (work on it escapes the timed
stream's events). Before, every Stream built inside forward counted, so the warm start's own CUDA
programs, which launch on `torch.cuda.current_stream().cuda_stream`, all scored -1 `side_stream`
on the H200. On the CPU, torch's C++ stream state is replaced by a stand-in with the same shape."""

from __future__ import annotations

import torch

from opsynth.reward.guards import Blocker, OpAudit, is_current_stream


class FakeStream:
    """torch.cuda.Stream's constructor contract: `stream_id=` wraps an existing stream; none makes a new one."""

    _next = 100

    def __new__(cls, device=None, priority=0, stream_id=0, device_index=0, device_type=1, **_):
        obj = object.__new__(cls)
        if not stream_id:
            FakeStream._next += 1
            stream_id = FakeStream._next
        obj.stream_id, obj.device_index, obj.device_type = stream_id, device_index, device_type
        return obj


def _current(_device_index):
    return (7, 0, 1)  # stream id, device index, device type


def _watched(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentStream", _current, raising=False)
    audit = OpAudit()
    audit.armed = True
    return audit, Blocker(audit)._stream_wrap("Stream", FakeStream)


def test_a_handle_on_the_current_stream_is_not_a_side_stream(monkeypatch):
    audit, Stream = _watched(monkeypatch)
    s = Stream(stream_id=7, device_index=0, device_type=1)  # what current_stream() builds
    assert is_current_stream(s) and audit.stream_use == []


def test_a_new_stream_or_another_existing_one_is(monkeypatch):
    audit, Stream = _watched(monkeypatch)
    Stream()
    assert audit.stream_use == ["torch.cuda.Stream"]
    Stream(stream_id=8, device_index=0, device_type=1)  # a pool stream, not the timed one
    assert len(audit.stream_use) == 2


def test_an_unreadable_stream_state_counts_as_a_side_stream(monkeypatch):
    def broken(_):
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(torch._C, "_cuda_getCurrentStream", broken, raising=False)
    audit = OpAudit()
    audit.armed = True
    Blocker(audit)._stream_wrap("Stream", FakeStream)(stream_id=7)
    assert audit.stream_use == ["torch.cuda.Stream"]
