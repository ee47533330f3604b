"""Fixtures shared by the reward tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def reward_cache(tmp_path_factory) -> str:
    """One build cache for the CPU candidate modules that share tests/reward/candidates/cpu/ext_prelude.py
    (test_reward_cpu.py, test_reward_hacks_cpu.py, test_reward_kinds_cpu.py): the extension is built once per session."""
    return str(tmp_path_factory.mktemp("reward_cache"))
