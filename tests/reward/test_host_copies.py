"""Host copies of outputs go to memory reserved before the device is locked (opsynth.reward.host_copies)."""

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
