"""Host copies of outputs go to memory reserved before the device is locked (opsynth.reward.host_copies)."""

import pytest
import torch

from opsynth.reward.host_copies import HostCopies, fresh_copy


def _outs():
    return [torch.randn(3, 5), torch.arange(7, dtype=torch.int64)]


def _meta(outs):
    return [[list(o.shape), str(o.dtype).replace("torch.", "")] for o in outs]


def test_a_copy_lands_in_a_reserved_set_and_owns_its_memory():
    outs = _outs()
    host = HostCopies(torch, pin=False)
    host.reserve(_meta(outs), 2)
    reserved = {t.data_ptr() for sets in host.free.values() for s in sets for t in s}
    got = host.take(outs)
    assert all(torch.equal(g, o) for g, o in zip(got, outs))
    assert {g.data_ptr() for g in got} <= reserved
    outs[0].fill_(0)  # the call's buffers are poisoned and reused after: the copy must not follow
    assert not torch.equal(got[0], outs[0])
    assert (host.taken, host.fallbacks) == (1, 0)


def test_an_unexpected_layout_or_too_many_copies_fall_back_to_new_memory():
    outs = _outs()
    host = HostCopies(torch, pin=False)
    host.reserve(_meta(outs), 1)
    host.take(outs)
    again = host.take(outs)  # none left
    other = host.take([torch.randn(2, 2)])  # a shape the reference did not have
    assert torch.equal(again[1], outs[1]) and other[0].shape == (2, 2)
    assert (host.taken, host.fallbacks) == (1, 2)


def test_no_page_locked_memory_means_pageable_sets_not_an_error(monkeypatch):
    real = torch.empty

    def empty(*a, pin_memory=False, **k):
        if pin_memory:
            raise RuntimeError("no page-locked memory here")
        return real(*a, **k)

    monkeypatch.setattr(torch, "empty", empty)
    outs = _outs()
    host = HostCopies(torch, pin=True)
    host.reserve(_meta(outs), 1)
    assert host.pinned is False
    assert all(torch.equal(g, o) for g, o in zip(host.take(outs), outs))


def test_the_fallback_copies_on_the_cpu_backend_too():
    x = torch.randn(4)
    (y,) = fresh_copy([x])
    x.fill_(1)
    assert not torch.equal(x, y)


def test_outputs_on_the_host_are_copied_at_once_whatever_the_hold_budget():
    outs = _outs()  # the cpu backend's outputs: nothing to hold on a device
    host = HostCopies(torch, pin=False, hold_bytes=1 << 30)
    host.reserve(_meta(outs), 1)
    got = host.keep(outs)
    outs[0].fill_(0)
    assert not torch.equal(got[0], outs[0]) and host.held == 0 and host.taken == 1
    assert host.land(got) is got and host.land(None) is None


def test_device_outputs_are_held_as_clones_within_the_budget_then_go_to_the_host(monkeypatch):
    # "meta" stands for a GPU here: tensors that are not on the host
    outs = [torch.empty(256, 256, device="meta"), torch.empty(10, device="meta")]
    size = sum(o.numel() * o.element_size() for o in outs)
    host = HostCopies(torch, pin=False, hold_bytes=2 * size)
    sent = []
    monkeypatch.setattr(host, "take", lambda o: sent.append(o) or ["host copy"])
    held = host.keep(outs)
    assert [h.device.type for h in held] == ["meta", "meta"] and held[0] is not outs[0]  # clones, not the call's buffers
    assert host.keep(outs, cloned=True)[0] is outs[0]  # the harness's own clones are kept as they are
    assert (host.held, host.hold_left, sent) == (2, 0, [])
    assert host.keep(outs) == ["host copy"] and len(sent) == 1  # the budget spent: to the host at once
    assert host.land(held) == ["host copy"] and len(sent) == 2  # after the lock: the held ones to the host


def test_the_job_carries_the_copies_settings_and_a_typo_is_an_error(monkeypatch):
    from opsynth.reward import host_copies

    monkeypatch.delenv(host_copies.MODE_ENV, raising=False)
    monkeypatch.delenv(host_copies.HOLD_ENV, raising=False)
    assert host_copies.job_settings() == {"host_copies": "pinned", "hold_copies": True}
    monkeypatch.setenv(host_copies.MODE_ENV, "fresh")
    monkeypatch.setenv(host_copies.HOLD_ENV, "0")
    job = host_copies.job_settings()
    cuda = host_copies.for_job(torch, job, cuda=True)
    assert (cuda.pin, cuda.hold_left, cuda.reserving) == (False, 0, False)
    cuda.reserve(_meta(_outs()), 2)
    assert cuda.free == {}  # the control: every copy into new memory
    assert host_copies.for_job(torch, {"host_copies": "pinned", "hold_copies": True}, cuda=True).pin
    cpu = host_copies.for_job(torch, {"host_copies": "pinned", "hold_copies": True}, cuda=False)
    assert (cpu.pin, cpu.hold_left, cpu.reserving) == (False, 0, True)  # nothing to pin or hold on the cpu backend
    monkeypatch.setenv(host_copies.MODE_ENV, "pined")
    with pytest.raises(ValueError, match="pinned, pageable, fresh"):
        host_copies.job_settings()


def test_a_device_out_of_memory_for_the_clone_sends_the_copy_to_the_host(monkeypatch):
    outs = [torch.empty(64, device="meta")]
    host = HostCopies(torch, pin=False, hold_bytes=1 << 30)

    def no_memory(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(host, "_clone", no_memory)
    monkeypatch.setattr(host, "take", lambda o: ["host copy"])
    assert host.keep(outs) == ["host copy"]
    assert (host.held, host.hold_left) == (0, 0)  # nothing more is held: the device is short of memory
