"""Fixtures shared by the reward tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the helpers beside the tests (fake_baselines, legacy_timed_inputs)


@pytest.fixture(scope="session")
def reward_cache(tmp_path_factory) -> str:
    """One build cache for the CPU candidate modules that share tests/reward/candidates/cpu/ext_prelude.py
    (test_reward_cpu.py, test_reward_hacks_cpu.py, test_reward_kinds_cpu.py): the extension is built once per session."""
    return str(tmp_path_factory.mktemp("reward_cache"))
