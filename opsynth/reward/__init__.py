"""The reward environment: sandboxed, hack-resistant evaluation of candidate kernels (-1 / 1 / 2 / 3)."""

from opsynth.reward.candidate import extract_candidate
from opsynth.reward.eval_types import EvalResult, RewardConfig
from opsynth.reward.evaluate import evaluate, evaluate_many

__all__ = ["evaluate", "evaluate_many", "extract_candidate", "EvalResult", "RewardConfig"]
