"""Verifier: run a task in a sandboxed warm worker and accept it with measurements, or reject it
with a named reason (see ``result.REASONS``). Start with :class:`WorkerPool` (pool.py).

The pool is imported on first use: a worker (``python -m opsynth.verify.worker``) imports this
package first and must be able to confine itself before torch, which the pool's imports pull in,
starts a thread (``verify.sandbox``).
"""

from __future__ import annotations

from .config import DeviceLimits, VerifyConfig
from .result import ACCEPTED, REASONS, VerifyResult

__all__ = ["ACCEPTED", "REASONS", "DeviceLimits", "VerifyConfig", "VerifyResult", "WorkerPool"]


def __getattr__(name: str):
    if name == "WorkerPool":
        from .pool import WorkerPool

        return WorkerPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
