"""Which in-flight candidate traced a forward first: lets a later candidate with the same forward skip
its torch.compile until the earlier one's fate is known.

Why: the committed-rows feed (`driver._CommittedFeed`) tells a worker the forwards of rows already
committed, but not those of candidates still in flight. On the 2026-12-07 H100 window (16 verifier
workers), 416 of the 2,076 candidates that were compiled and timed were then rejected as
`semantic_duplicate` of a candidate that had been in flight beside them: a fifth of the compiles.

The rule keeps the rows a function of seed and settings: a candidate whose forward an earlier
candidate claimed first stops before compile (`deferred_to` in its record). When its turn to commit
comes, the earlier one has been committed; if a committed row has this forward, the committer rejects
the deferred one as a `semantic_duplicate`, as it would have after compiling it (semantic duplicates
are decided before compile's verdict). Otherwise the driver sends it again with no claims, and it
runs to the end as it would have. Which candidates defer depends on timing; what is committed does not.

A Dask actor (one per run, on one worker) holds the claims: `distributed` is already the transport,
the claims are a few bytes, and a claim is one small call after a candidate's eager checks, which take
seconds. When the actor does not answer in time, the candidate compiles: that costs time, never a row.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

log = logging.getLogger("opsynth.generate")

# Seconds a worker waits for the claims actor before it compiles anyway (a claim takes milliseconds).
CLAIM_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ClaimsRef:
    """Where the run's claims actor lives, as plain values that candidates are sent with. Not the
    `Actor` itself: Dask makes a task depend on an actor in its arguments, so when a worker died with
    the actor on it, every candidate in flight failed instead of being recomputed (seen in
    test_pipeline_driver's killed-worker test); with plain values a lost actor only stops deferring."""

    address: str
    key: str


_PROXIES: dict[ClaimsRef, object | None] = {}  # this process's actor proxies; None: that actor is gone
_PROXIES_LOCK = threading.Lock()


def _proxy(claims):
    """The actor proxy for a `ClaimsRef` (built once per process), or `claims` itself when it is one
    already (a stand-in in tests); None once that actor failed here."""
    if not isinstance(claims, ClaimsRef):
        return claims
    with _PROXIES_LOCK:
        if claims not in _PROXIES:
            from distributed.actor import Actor

            _PROXIES[claims] = Actor(InflightTraces, claims.address, claims.key)
        return _PROXIES[claims]


class InflightTraces:
    """A Dask actor: trace signature -> the lowest candidate index that claimed it."""

    def __init__(self) -> None:
        self._first: dict[str, int] = {}
        self._inverted = 0
        self._released = 0
        self._closed = False

    def claim(self, signature: str, index: int) -> int:
        """Claim `signature` for candidate `index`; returns the lowest index that claimed it so far
        (this one's own index when it is the first, or lower than every earlier claimant; its own
        once the run is over: `close`)."""
        if self._closed:
            return index
        first = self._first.get(signature)
        if first is not None and index < first:
            self._inverted += 1  # a later candidate claimed it first: it defers only if it asks again before compile
        if first is None or index < first:
            self._first[signature] = first = index
        return first

    def release(self, signature: str, index: int) -> bool:
        """Candidate `index` will leave no row (the verifier rejected it): drop its claim, if it
        still holds it, so that later candidates with this forward compile instead of deferring to
        it (those that deferred already are re-sent by the driver)."""
        if not self._closed and self._first.get(signature) == index:
            del self._first[signature]
            self._released += 1
            return True
        return False

    def releases(self) -> int:
        return self._released

    def close(self) -> None:
        """The run is over: forget the claims and answer every later call as if there were none
        (candidates still running when the run ended ask after it; the driver keeps the actor for
        them, `driver._start_claims`)."""
        self._first.clear()
        self._closed = True

    def size(self) -> int:
        return len(self._first)

    def inversions(self) -> int:
        """Claims that came from an earlier candidate after a later one had claimed the same forward
        (the later one defers when it asks again before compile; past that, both compile and the
        later one is then rejected as a `semantic_duplicate`): reported as
        `compile_deferrals["inverted"]`."""
        return self._inverted


def earlier_claim(claims, signature: str | None, index: int, timeout: float = CLAIM_TIMEOUT_S) -> int | None:
    """The earlier candidate that claimed this forward first, or None: this one is first, has no
    forward to claim, runs without claims (a re-run, a repair), or the actor did not answer."""
    if claims is None or not signature:
        return None
    proxy = None
    try:
        proxy = _proxy(claims)
        if proxy is None:
            return None
        first = proxy.claim(signature, index).result(timeout=timeout)
    except Exception as e:  # noqa: BLE001 - a lost actor or a timeout: compile, as without claims
        if isinstance(claims, ClaimsRef) and not isinstance(e, TimeoutError):
            with _PROXIES_LOCK:  # its worker is gone: stop asking it (a slow answer is asked again next time)
                _PROXIES[claims] = None
        log.info("candidate %d: the in-flight claims did not answer (%s: %s); compiling", index, type(e).__name__, e)
        return None
    return first if first < index else None


def release_claim(claims, signature: str | None, index: int, timeout: float = CLAIM_TIMEOUT_S) -> None:
    """Let candidate `index`'s claim of this forward go (`InflightTraces.release`); a lost actor or a
    timeout only leaves the claim (later candidates defer and are re-sent, as before)."""
    if claims is None or not signature:
        return
    try:
        proxy = _proxy(claims)
        if proxy is not None:
            proxy.release(signature, index).result(timeout=timeout)
    except Exception as e:  # noqa: BLE001 - the claim stays; nothing is lost but a compile
        log.info("candidate %d: could not release its in-flight claim (%s: %s)", index, type(e).__name__, e)
