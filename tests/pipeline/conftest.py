"""Fixtures of the generate-pipeline tests; the helpers live in pipeline_cli.py."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_cli import kill_marked  # noqa: E402


@pytest.fixture
def marker():
    """A fresh run marker; whatever still carries it at teardown is killed (by pid)."""
    m = uuid.uuid4().hex
    yield m
    kill_marked(m)


@pytest.fixture(scope="session")
def kernelbench(kernelbench_parquet) -> Path:
    return kernelbench_parquet
