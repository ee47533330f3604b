"""The watched forward (opsynth.verify.tracing) and the checks built on it, in process: what counts
as state read, the call-graph signature's invariances, the mode decision and fixed inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from opsynth.verify import checks as C
from opsynth.verify.tracing import ForwardTrace, call_name


class Spare(nn.Module):
    """Reads conv; makes a Linear, a Parameter, a buffer and a ReLU it never reads; asks a shape."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.extra = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))
        self.register_buffer("offset", torch.zeros(4))
        self.act = nn.ReLU()

    def forward(self, x):
        return torch.relu(self.conv(x)) * self.scale.shape[0]  # a shape is metadata, not a read


class Indirect(nn.Module):
    """State reached without calling its module: the weight handed to F.linear, an LSTM's flat weights."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x):
        y, _ = self.lstm(x)
        return F.linear(y, self.fc.weight)


def test_state_made_but_never_read_is_named_and_indirect_reads_count():
    t = ForwardTrace(Spare(), [torch.randn(2, 3, 8, 8)])
    assert sorted(t.unused_state()) == ["act", "extra", "offset", "scale"]
    assert ForwardTrace(Indirect(), [torch.randn(2, 3, 8)]).unused_state() == []  # fc's bias unread: fc is read
    with pytest.raises(C.Reject) as e:
        C.check_state_used(Spare(), t)
    assert e.value.reason == "unused_state" and "extra" in str(e.value)


def test_batchnorm_in_eval_mode_is_used_although_it_never_reads_its_counter():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    assert ForwardTrace(m, [torch.randn(2, 3, 8, 8)]).unused_state() == []


def _sig(model, *inputs):
    return ForwardTrace(model, list(inputs)).signature()


class Chain(nn.Module):
    def __init__(self, c, k, respell=False, scale=2.0):
        super().__init__()
        self.conv, self.respell, self.scale = nn.Conv2d(3, c, k), respell, scale

    def forward(self, x):
        y = self.conv(x)
        return (F.relu(y) if self.respell else torch.relu(y)) * self.scale


def test_the_signature_ignores_sizes_constants_and_spelling_but_not_the_calls_or_their_wiring():
    base = _sig(Chain(4, 3), torch.randn(2, 3, 8, 8))
    assert _sig(Chain(16, 5, respell=True, scale=3.0), torch.randn(4, 3, 16, 16)) == base
    assert _sig(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sigmoid()), torch.randn(2, 3, 8, 8)) != base

    class Add(nn.Module):
        def __init__(self, same):
            super().__init__()
            self.same = same

        def forward(self, x, y):
            return torch.relu(x) + (x if self.same else y)

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    assert _sig(Add(True), x, y) != _sig(Add(False), x, y)  # the same calls, wired to other inputs


def test_call_names_fold_operators_and_in_place_variants():
    assert {call_name(f) for f in (torch.Tensor.__radd__, torch.Tensor.add_, torch.add, torch.Tensor.__iadd__)} == {"add"}
    assert call_name(F.relu) == call_name(torch.relu) == "relu"


def test_mode_is_train_only_when_the_outputs_differ_and_buffers_are_put_back():
    x = [torch.randn(8, 16)]
    lin = nn.Linear(16, 16)
    assert C.choose_mode(lin, x, 1e-2, 1e-2)[0] == "eval" and not lin.training
    bn = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16))
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    mode, trace = C.choose_mode(bn, x, 1e-2, 1e-2)
    assert mode == "train" and bn.training and trace.unused_state() == []
    assert all(torch.equal(before[k], v) for k, v in bn.state_dict().items())  # running stats as constructed


def test_fixed_inputs_are_rejected_and_one_random_tensor_is_enough():
    fixed = [torch.arange(6.0)]
    with pytest.raises(C.Reject) as e:
        C.check_inputs_vary(fixed, [torch.arange(6.0)])
    assert e.value.reason == "fixed_inputs"
    with pytest.raises(C.Reject):
        C.check_inputs_vary([3, 4], [3, 4])  # no tensor at all
    C.check_inputs_vary([torch.arange(6), torch.randn(3)], [torch.arange(6), torch.randn(3)])  # passes
