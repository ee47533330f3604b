"""Reward environment (sandboxed evaluation of candidate kernels), prompts and the GRPO trainer."""

from opsynth.rl.candidate import extract_candidate
from opsynth.rl.eval_types import EvalResult, RewardConfig
from opsynth.rl.evaluate import evaluate, evaluate_many

__all__ = ["evaluate", "evaluate_many", "extract_candidate", "EvalResult", "RewardConfig"]
