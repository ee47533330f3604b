"""Quotas of the configured mixture, decided from committed results only: the operator-count slot
(`data_source`), the precision (`dtype`) and the pass (`task_pass`) each have theirs.

Slots and kinds pass verification at different rates, so accepting candidates as they come drifts
the rows' mixture away from the target (H200 runs: `torch#3` 8.8 % for 7.6 %; bf16 35 % for 40 %,
backward 18 % for 25 %). With quotas, each value of each axis may hold at most its share of
`n_tasks` (largest remainder over the sampler's effective shares, `SlotPlan.shares` and
`SlotPlan.kind_shares`, so each axis' quotas sum to `n_tasks`); the committer rejects an accepted
candidate of which any axis' value is already full (`mixture_slot_full`: one reason for every axis,
the evidence names the axis, so rejection counts read as before and one table row says the rule).
The counts are those of committed rows, in candidate order, so the rows depend on seed and settings
alone, and a resumed run (counts rebuilt from the rows' columns on disk) decides as an uninterrupted
one. An axis with one value has no quota (it could only ever hold all the rows).

A value that cannot fill (all its candidates fail on some device) is *given up* after `give_up`
of the committed candidates carrying it in a row were rejected (any reason but a full value; one
rejected before the verifier counts `PRE_VERIFIER_MISS` of a miss, see there): its
quota drops to the rows it holds and the rows it leaves are shared out over its axis' live values
by their shares (a live value's quota never shrinks). The marginal quotas are met only if the draws
hold the needed combinations (fp32 and forward full leave only bf16/fp16 backward candidates to
fill the rest): when a combination never passes, its values' misses grow together, so at most one
value is given up per candidate (the first axis' first), which reopens the others' candidates, and
the last live value of an axis is never given up (its rows have nowhere to go). So the run ends
unless the one combination every axis still allows never passes; it then stops at `max_candidates`
naming the values below their quota. The misses in a row and the given-up values are carried in the
state file.
"""

from __future__ import annotations

import math
from collections import Counter

REASON = "mixture_slot_full"
# What a candidate rejected before it reached the verifier (sampling, sizing: mostly `predicted_oom`, the
# KernelBench check) counts toward give-up, against 1 for one the verifier checked. Such a rejection costs a
# preparing process about 27 ms and no GPU time, against seconds of a verifier worker for a checked one; counted as
# a whole miss it gave up slots that fill at a low but cheap rate: on an H100 with 16 workers (4.2 GB a request)
# single-op `torch#1` and `transformers#1` candidates are mostly `predicted_oom`, and both were given up at 16/34
# and 7/12 rows (benchmarks/results/generate_quota_h100/2026-12-07). A slot that can never pass is still given
# up, after give_up / PRE_VERIFIER_MISS cheap rejections in a row.
PRE_VERIFIER_MISS = 0.1
SLOT_AXIS = "data_source"
AXES = (SLOT_AXIS, "dtype", "task_pass")  # the row columns counted, in the order they are asked


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
    """Quotas and committed counts of one axis' values. `full(value)` is what the committer asks
    before it accepts a row; `note(value, accepted)` records each committed candidate carrying it."""

    def __init__(self, n_tasks: int, shares: dict[str, float], counts: Counter | None = None,
                 give_up: int = 0, misses: dict | None = None, given_up: list | None = None):
        self.n_tasks, self.shares, self.give_up = n_tasks, dict(shares), int(give_up)
        self.counts: Counter = Counter(counts or {})
        self.misses: Counter = Counter({str(k): float(v) for k, v in (misses or {}).items()})
        self.given_up: list[str] = []
        self.quotas = apportion(n_tasks, self.shares)
        for value in given_up or []:
            self._give_up(str(value))

    def full(self, value: str) -> bool:
        return self.counts[value] >= self.quotas.get(value, 0)

    def note(self, value: str, accepted: bool, may_give_up: bool = True, miss: float = 1.0) -> bool:
        """Count one committed candidate of `value` (not one rejected for a full value), a rejected
        one as `miss` of a miss; True when this gave the value up (the live values' quotas grew)."""
        if accepted:
            self.counts[value] += 1
            self.misses[value] = 0
            return False
        self.misses[value] = round(self.misses[value] + miss, 6)  # tenths add up exactly: a give-up never waits one more
        if may_give_up and self.can_give_up(value):
            self._give_up(value)
            return True
        return False

    def can_give_up(self, value: str) -> bool:
        """Missed `give_up` times in a row, not full, and another value of the axis is live."""
        live = [s for s, v in self.shares.items() if v > 0 and s not in self.given_up and s != value]
        return bool(self.give_up and self.misses[value] >= self.give_up and value not in self.given_up
                    and not self.full(value) and live)

    def _give_up(self, value: str) -> None:
        self.given_up.append(value)
        self.quotas[value] = self.counts[value]
        dead = set(self.given_up)
        live = {s: v for s, v in self.shares.items() if s not in dead}
        seats = apportion(self.n_tasks - sum(self.quotas[s] for s in dead), live)
        for s, q in seats.items():
            self.quotas[s] = max(self.quotas[s], q)

    def unfilled(self) -> dict[str, tuple[int, int]]:
        """value -> (rows, quota) for every value below its quota."""
        return {s: (self.counts[s], q) for s, q in sorted(self.quotas.items()) if self.counts[s] < q}

    def to_state(self) -> dict:
        """What the state file carries (the counts are rebuilt from the rows)."""
        return {"misses": dict(self.misses), "given_up": list(self.given_up)}

    def summary(self) -> dict:
        return {"quotas": dict(sorted(self.quotas.items())), "rows": {s: self.counts[s] for s in sorted(self.quotas)},
                "given_up": list(self.given_up)}


class MixtureQuotas:
    """One `MixtureQuota` per axis: the slot's always (as before), each other axis' when it has more
    than one value. Values are given as {axis: value} (a row's columns, or the plan's draw)."""

    def __init__(self, n_tasks: int, shares: dict[str, dict[str, float]], counts: dict[str, Counter] | None = None,
                 give_up: int = 0, state: dict | None = None):
        self.n_tasks, self.give_up = n_tasks, int(give_up)
        counts, state = counts or {}, dict(state or {})
        # The slot axis' state at the top level (state files from before the other axes read as is).
        states = {SLOT_AXIS: state, **(state.get("axes") or {})}
        self.axes: dict[str, MixtureQuota] = {}
        for axis in AXES:
            if axis not in shares or (axis != SLOT_AXIS and sum(1 for v in shares[axis].values() if v > 0) < 2):
                continue
            st = states.get(axis) or {}
            self.axes[axis] = MixtureQuota(n_tasks, shares[axis], counts.get(axis), give_up=give_up,
                                           misses=st.get("misses"), given_up=st.get("given_up"))

    @property
    def slot(self) -> MixtureQuota:
        return self.axes[SLOT_AXIS]

    def full(self, values: dict[str, str]) -> tuple[str, str] | None:
        """The first (axis, value) of the candidate that holds its quota, or None."""
        for axis, q in self.axes.items():
            if q.full(values[axis]):
                return axis, values[axis]
        return None

    def quota(self, axis: str, value: str) -> int:
        return self.axes[axis].quotas.get(value, 0)

    def note(self, values: dict[str, str], accepted: bool, miss: float = 1.0) -> tuple[str, str] | None:
        """Count one committed candidate on every axis (a rejected one as `miss` of a miss); the
        (axis, value) this gave up, if any (at most one per candidate: the first axis' that is due)."""
        gave = None
        for axis, q in self.axes.items():
            if q.note(values[axis], accepted, may_give_up=gave is None, miss=miss):
                gave = axis, values[axis]
        return gave

    def unfilled(self) -> dict[str, tuple[int, int]]:
        """Every value below its quota -> (rows, quota); a slot by its name, another axis' value as
        `axis=value`."""
        return {(v if axis == SLOT_AXIS else f"{axis}={v}"): c
                for axis, q in self.axes.items() for v, c in q.unfilled().items()}

    def to_state(self) -> dict:
        """The slot axis' misses and given-up slots at the top level, the other axes' under `axes`."""
        out = self.slot.to_state()
        others = {axis: q.to_state() for axis, q in self.axes.items() if axis != SLOT_AXIS}
        if others:
            out["axes"] = others
        return out

    def summary(self) -> dict:
        """What the card and report print: the slot axis at the top level, the other axes under `axes`."""
        out = {**self.slot.summary(), "give_up_after": self.give_up, "pre_verifier_miss": PRE_VERIFIER_MISS,
               "reason": REASON}
        others = {axis: q.summary() for axis, q in self.axes.items() if axis != SLOT_AXIS}
        if others:
            out["axes"] = others
        return out
