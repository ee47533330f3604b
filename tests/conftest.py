"""Shared test settings: where the reference data lives, and GPU skipping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The KernelBench reference is read in place (never copied into the project); override with
# OPSYNTH_KERNELBENCH=/path/to/kernelbench.parquet.
KERNELBENCH_PARQUET = Path(
    os.environ.get("OPSYNTH_KERNELBENCH", REPO.parent / "shared" / "kernelbench" / "kernelbench.parquet")
)


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kernelbench_parquet() -> Path:
    if not KERNELBENCH_PARQUET.exists():
        pytest.skip(
            f"KernelBench reference not found at {KERNELBENCH_PARQUET}; "
            "set OPSYNTH_KERNELBENCH to the kernelbench.parquet path"
        )
    return KERNELBENCH_PARQUET
