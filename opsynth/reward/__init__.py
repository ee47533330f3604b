"""The reward environment: sandboxed, hack-resistant evaluation of candidate kernels (-1 / 1 / 2 / 3).

`evaluate` and `evaluate_many` are loaded on first use: importing the package (its config and
candidate types, what a command line reads first) does not import torch, so a caller can start the
fork servers (`opsynth.reward.servers.prestart`) before paying for its own torch import.
"""

import importlib
import sys
import types

from opsynth.reward.candidate import extract_candidate
from opsynth.reward.eval_types import EvalResult, RewardConfig

__all__ = ["evaluate", "evaluate_many", "extract_candidate", "EvalResult", "RewardConfig"]

_LAZY = ("evaluate", "evaluate_many")  # from the submodule opsynth.reward.evaluate, which imports torch


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module("opsynth.reward.evaluate"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    """`evaluate` names both the function users import from here and the submodule that defines it.
    Importing the submodule binds it on its package; here that binding is dropped, so
    `opsynth.reward.evaluate` stays the function, as when the package imported it eagerly."""

    def __setattr__(self, name, value):
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
