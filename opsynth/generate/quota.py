"""Per-slot quotas of the operator-count mixture, decided from committed results only.

Slots pass verification at different rates, so accepting candidates as they come drifts the rows'
mixture away from the target (an H200 run: `torch#3` 8.8 % for 7.6 %, `transformers#1` 0.6 % for
1.2 %). With quotas, each slot may hold at most its share of `n_tasks` (largest remainder over the
sampler's effective shares, `SlotPlan.shares`, so the quotas sum to `n_tasks`); the committer
rejects an accepted candidate whose slot is already full (`mixture_slot_full`). The counts are
those of committed rows, in candidate order, so the rows depend on seed and settings alone, and a
resumed run (counts rebuilt from the `data_source` column on disk) decides as an uninterrupted one.

A slot that cannot fill (all its candidates fail on some device) is *given up* after `give_up`
of its committed candidates in a row were rejected (any reason but a full slot): its quota drops
to the rows it holds and the rows it leaves are shared out over the live slots by their shares
(a live slot's quota never shrinks). The misses in a row are carried in the state file.
"""

from __future__ import annotations

import math
from collections import Counter

REASON = "mixture_slot_full"


def apportion(n: int, shares: dict[str, float]) -> dict[str, int]:
    """`n` seats over `shares` by largest remainder (ties by name): the quotas sum to `n`."""
    total = sum(v for v in shares.values() if v > 0)
    if n <= 0 or total <= 0:
        return {s: 0 for s in shares}
    exact = {s: n * max(v, 0.0) / total for s, v in shares.items()}
    out = {s: math.floor(x) for s, x in exact.items()}
    left = n - sum(out.values())
    for s in sorted(exact, key=lambda s: (-(exact[s] - out[s]), s))[:left]:
        out[s] += 1
    return out


class MixtureQuota:
    """Quotas and committed counts per slot. `full(slot)` is what the committer asks before it
    accepts a row; `note(slot, accepted)` records each committed candidate of the slot."""

    def __init__(self, n_tasks: int, shares: dict[str, float], counts: Counter | None = None,
                 give_up: int = 0, misses: dict | None = None, given_up: list | None = None):
        self.n_tasks, self.shares, self.give_up = n_tasks, dict(shares), int(give_up)
        self.counts: Counter = Counter(counts or {})
        self.misses: Counter = Counter({str(k): int(v) for k, v in (misses or {}).items()})
        self.given_up: list[str] = []
        self.quotas = apportion(n_tasks, self.shares)
        for slot in given_up or []:
            self._give_up(str(slot))

    def full(self, slot: str) -> bool:
        return self.counts[slot] >= self.quotas.get(slot, 0)

    def note(self, slot: str, accepted: bool) -> bool:
        """Count one committed candidate of `slot` (not one rejected for a full slot); True when
        this gave the slot up (the live slots' quotas grew)."""
        if accepted:
            self.counts[slot] += 1
            self.misses[slot] = 0
            return False
        self.misses[slot] += 1
        if self.give_up and self.misses[slot] >= self.give_up and slot not in self.given_up and not self.full(slot):
            self._give_up(slot)
            return True
        return False

    def _give_up(self, slot: str) -> None:
        self.given_up.append(slot)
        self.quotas[slot] = self.counts[slot]
        dead = set(self.given_up)
        live = {s: v for s, v in self.shares.items() if s not in dead}
        seats = apportion(self.n_tasks - sum(self.quotas[s] for s in dead), live)
        for s, q in seats.items():
            self.quotas[s] = max(self.quotas[s], q)

    def unfilled(self) -> dict[str, tuple[int, int]]:
        """slot -> (rows, quota) for every slot below its quota."""
        return {s: (self.counts[s], q) for s, q in sorted(self.quotas.items()) if self.counts[s] < q}

    def to_state(self) -> dict:
        """What the state file carries (the counts are rebuilt from the rows)."""
        return {"misses": dict(self.misses), "given_up": list(self.given_up)}

    def summary(self) -> dict:
        """What the card and report print."""
        return {"quotas": dict(sorted(self.quotas.items())), "rows": {s: self.counts[s] for s in sorted(self.quotas)},
                "given_up": list(self.given_up), "give_up_after": self.give_up, "reason": REASON}
