"""opsynth: regenerate CUDA-Agent-Ops-6K-style operator-fusion tasks and train kernel-writing policies on them."""

__version__ = "0.1.0"
