"""The independent re-check runs each row in the row's own train/eval mode (the `mode` column), as
the verifier timed it and the reward runs it: a BatchNorm task timed in eval mode and re-measured in
train mode (batch statistics) read 13.6x slow on the H200 (2026-12-03 window)."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Dropout: identity in eval mode, random in train mode, so the mode shows in determinism.
CODE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x) * 2.0


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''
TOL = {"atol": 1e-2, "rtol": 1e-2, "det_atol": 1e-6, "det_rtol": 1e-5}


def _check_row():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from recheck_gpu import check_row

    return check_row


def test_the_recheck_runs_a_row_in_its_mode():
    check_row = _check_row()
    ev = check_row(CODE, "cpu", 1, 3, TOL, mode="eval")
    tr = check_row(CODE, "cpu", 1, 3, TOL, mode="train")
    assert ev["deterministic"] and ev["bitwise"]
    assert not tr["deterministic"]  # control: the same task in train mode is another program


def test_a_row_without_a_mode_runs_in_the_default_eval_mode():
    assert _check_row()(CODE, "cpu", 1, 3, TOL, mode=None)["deterministic"]
