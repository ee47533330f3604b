"""Verifier: run a task in a sandboxed warm worker and accept it with measurements, or reject it
with a named reason (see ``result.REASONS``). Start with :class:`WorkerPool` (pool.py)."""

from __future__ import annotations

from .config import DeviceLimits, VerifyConfig
from .pool import WorkerPool
from .result import ACCEPTED, REASONS, VerifyResult

__all__ = ["ACCEPTED", "REASONS", "DeviceLimits", "VerifyConfig", "VerifyResult", "WorkerPool"]
