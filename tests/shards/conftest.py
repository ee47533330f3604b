"""Rows that fit the shard schema, for the shards tests."""

from __future__ import annotations

import json

import pytest


def _row(i: int) -> dict:
    k = 1 + i % 3
    ops = ["nn.Conv2d", "torch.relu", "torch.sum"][:k]
    return {
        "code": f"import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    pass  # task {i}\n",
        "ops": ops,
        "data_source": f"torch#{k}",
        "task_id": f"task-{i:05d}",
        "num_ops": k,
        "graph": json.dumps({"nodes": [{"id": j, "op": op} for j, op in enumerate(ops)], "edges": []}),
        "input_shapes": json.dumps([{"shape": [8, 3, 32, 32], "dtype": "float32"}]),
        "eager_ms": 1.0 + i * 0.5,
        "compile_ms": 0.8 + i * 0.25,
        "device": "cpu",
        "torch_version": "2.13.0",
        "kb_max_similarity": None if i % 4 == 0 else 0.1 + (i % 8) / 10,
        "kb_nearest": None if i % 4 == 0 else f"level2/{i % 7}",
        "seed": 1000 + i,
        "mode": "eval" if i % 5 else "train",
        "trace_signature": f"{i:016x}",
        "dtype": "float32",
        "task_pass": "forward",
    }


@pytest.fixture
def make_row():
    """make_row(i) -> a valid row whose task_id and values depend on i."""
    return _row
