"""The training stage: prompts and feedback, shard data and splits, policies, the GRPO trainer, metrics, scoring.

It consumes the reward environment (`opsynth.reward`) and never the other way round.
"""
