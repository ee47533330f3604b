"""Calibration arithmetic and the batch_size rewrite (no worker processes)."""

from __future__ import annotations

import ast

from opsynth.verify.calibrate import draw_target_ms, next_batch_size, read_batch_size, set_batch_size
from opsynth.verify.config import VerifyConfig

SRC = '''import torch
# batch_size = 7 in a comment is not the constant
batch_size = 16  # leading dim
dim = 128


def get_inputs():
    return [torch.randn(batch_size, dim)]
'''


def test_read_and_set_batch_size_keeps_the_rest_of_the_file():
    assert read_batch_size(SRC) == 16
    out = set_batch_size(SRC, 4096)
    assert read_batch_size(out) == 4096
    assert out == SRC.replace("batch_size = 16  #", "batch_size = 4096  #")
    ast.parse(out)


def test_no_batch_size_or_non_literal_is_not_calibratable():
    assert read_batch_size("dim = 3\n") is None
    assert read_batch_size("batch_size = dim * 2\n") is None
    assert read_batch_size("def f():\n    batch_size = 3\n") is None  # not module level


def test_target_is_deterministic_per_task_and_inside_the_band():
    cfg = VerifyConfig()
    a = draw_target_ms(SRC, cfg, 1.0, 100.0)
    assert a == draw_target_ms(SRC, cfg, 1.0, 100.0)
    targets = [draw_target_ms(SRC + f"# {i}\n", cfg, 1.0, 100.0) for i in range(2000)]
    assert all(1.5 <= t <= 100.0 / 1.5 for t in targets)
    targets.sort()
    median = targets[1000]
    p90 = targets[1800]
    assert 3.0 < median < 5.5  # log-normal median 4 ms
    assert 14.0 < p90 < 27.0  # 90 % under 20 ms


def test_next_batch_size_is_geometric_and_respects_memory_cap():
    assert next_batch_size(16, 0.01, 4.0, None, 2**30) == 6400
    assert next_batch_size(1024, 400.0, 4.0, None, 2**30) == 10
    # 1 MB at batch 16 with a 64 MB cap: at most 1024, however fast the task is.
    assert next_batch_size(16, 0.001, 4.0, 2**20, 64 * 2**20) == 1024
    assert next_batch_size(1, 1000.0, 4.0, None, 2**30) == 1
