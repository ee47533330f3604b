"""Which slot of the operator-count mixture (`torch#1`..`torch#5`, `transformers#1`) and which
kind (precision, pass) a seed gets: the one copy of that draw, shared by the sampler (which then
draws the graph) and the generate driver (which fills the mixture by quota, `opsynth.generate.quota`).

A `SlotPlan` is plain data (picklable): a worker builds it from its sampler and the driver draws
with it, so both give every seed the same slot without the driver loading what the worker's
catalog excludes per precision on its device.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

Kind = tuple[str, str]  # (dtype, task_pass)


def source_name(key: str) -> str:
    """A mixture key ("1".."5", "transformers") as the `data_source` column says it."""
    return "transformers#1" if key == "transformers" else f"torch#{key}"


@dataclass(frozen=True)
class SlotPlan:
    """kinds: ((kind, weight), ...) sorted; mixtures: kind -> ((key, weight), ...), each kind's
    mixture renormalised over the slots it can fill (a kind whose catalog has no transformers
    operator has no transformers slot)."""

    kinds: tuple[tuple[Kind, float], ...]
    mixtures: dict[Kind, tuple[tuple[str, float], ...]]

    def draw_kind(self, seed: int) -> Kind:
        """The task's (dtype, pass), from its seed alone (an RNG of its own: the graph's draws are
        the same whatever the kind mixture)."""
        if len(self.kinds) == 1:
            return self.kinds[0][0]
        kinds, weights = zip(*self.kinds)
        return random.Random(f"opsynth-kind:{int(seed)}").choices(kinds, weights=weights)[0]

    def draw(self, seed: int) -> tuple[Kind, str, random.Random]:
        """(kind, mixture key, the seed's RNG after the slot draw): the sampler goes on drawing the
        graph from that RNG."""
        kind = self.draw_kind(seed)
        rng = random.Random(seed)
        keys, weights = zip(*self.mixtures[kind])
        return kind, rng.choices(keys, weights=weights)[0], rng

    def slot(self, seed: int) -> str:
        """The seed's slot as its row's `data_source` says it (microseconds: no graph is drawn)."""
        return source_name(self.draw(seed)[1])

    def shares(self) -> dict[str, float]:
        """Expected share of each slot over seeds: the kind-weighted average of each kind's
        renormalised mixture (what the sampler aims at, which can differ from the configured
        mixture when a kind cannot fill a slot)."""
        total = sum(w for _, w in self.kinds)
        out: dict[str, float] = {}
        for kind, wk in self.kinds:
            mix = self.mixtures[kind]
            msum = sum(w for _, w in mix)
            if msum <= 0:  # a kind that can fill no slot (its sample() fails the same way)
                continue
            for key, w in mix:
                out[source_name(key)] = out.get(source_name(key), 0.0) + wk / total * w / msum
        return out

    def kind_shares(self) -> dict[str, dict[str, float]]:
        """Expected share of each precision and each pass over seeds ({"dtype": {name: share},
        "task_pass": {...}}, named as the row columns are): the marginals of the kind weights, over
        the kinds that can fill a slot (as `shares`: another kind's seeds give no task)."""
        live = [(kind, w) for kind, w in self.kinds if sum(x for _, x in self.mixtures[kind]) > 0]
        total = sum(w for _, w in live)
        out: dict[str, dict[str, float]] = {"dtype": {}, "task_pass": {}}
        for (dtype, task_pass), w in live:
            out["dtype"][dtype] = out["dtype"].get(dtype, 0.0) + w / total
            out["task_pass"][task_pass] = out["task_pass"].get(task_pass, 0.0) + w / total
        return out

    def values(self, seed: int) -> dict[str, str]:
        """The seed's value on each quota axis, named as its row's columns say it."""
        (dtype, task_pass), key, _ = self.draw(seed)
        return {"data_source": source_name(key), "dtype": dtype, "task_pass": task_pass}
