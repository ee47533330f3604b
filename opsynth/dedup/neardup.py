"""Within-run duplicate removal: exact duplicates by signature, near-duplicates by MinHash-LSH.

Tasks arrive as a stream; ``add`` either keeps a task (it joins the index) or names the earlier kept
task it duplicates. Nothing depends on timing, so the same stream in the same order gives the same
decisions, and a resumed run rebuilds the index from its already-accepted tasks (``rebuild``).
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import numpy as np
from datasketch import MinHash, MinHashLSH

from opsynth.dedup.normalize import model_tokens
from opsynth.render.parse import TaskFacts, parse_task

__all__ = ["NearDupIndex", "task_shingles", "task_signature"]

_SEP = "\x1f"


def _tokens(task: str | TaskFacts, keep_literals: bool) -> list[str]:
    facts = parse_task(task, with_ops=False) if isinstance(task, str) else task
    return model_tokens(facts, keep_literals=keep_literals)


def task_signature(task: str | TaskFacts, keep_literals: bool = True) -> str:
    """Hash of the canonical Model tokens: equal for copies that differ only in names, sizes, order, comments."""
    return hashlib.sha1(_SEP.join(_tokens(task, keep_literals)).encode("utf-8")).hexdigest()


def task_shingles(tokens: list[str], size: int = 3) -> set[bytes]:
    """Distinct ``size``-grams of the canonical tokens (the whole sequence when shorter)."""
    if len(tokens) <= size:
        return {_SEP.join(tokens).encode("utf-8")}
    return {_SEP.join(tokens[i : i + size]).encode("utf-8") for i in range(len(tokens) - size + 1)}


class NearDupIndex:
    """Incremental exact + near-duplicate detector; the first task of a duplicate group is kept."""

    def __init__(
        self,
        threshold: float = 0.9,
        num_perm: int = 128,
        shingle_size: int = 3,
        keep_literals: bool = True,
        seed: int = 1,
    ):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"near-duplicate threshold must be in (0, 1], got {threshold}")
        self.threshold = float(threshold)
        self.num_perm = int(num_perm)
        self.shingle_size = int(shingle_size)
        self.keep_literals = bool(keep_literals)
        self.seed = int(seed)
        self._template = MinHash(num_perm=self.num_perm, seed=self.seed)
        # Reuse the template's permutations: generating them per MinHash costs more than hashing a task.
        self._mh_kwargs = {"num_perm": self.num_perm, "seed": self.seed, "permutations": self._template.permutations}
        if hasattr(self._template, "scheme"):  # datasketch >= 2.0 asks for it explicitly
            self._mh_kwargs["scheme"] = self._template.scheme
        self._scratch = MinHash(**self._mh_kwargs)
        self._lsh = MinHashLSH(threshold=self.threshold, num_perm=self.num_perm)
        self._by_signature: dict[str, str] = {}
        self._order: dict[str, int] = {}  # key -> arrival rank among kept tasks
        self._hashes: list[np.ndarray] = []  # kept tasks' MinHash values, by rank (uint32: values < 2**32)
        self.counts = {"kept": 0, "exact_duplicate": 0, "near_duplicate": 0}

    @classmethod
    def from_config(cls, cfg=None, **overrides) -> "NearDupIndex":
        from opsynth.dedup.config import DedupConfig

        c = DedupConfig.from_any(cfg, **overrides)
        return cls(c.neardup_threshold, c.num_perm, c.shingle_size, c.neardup_keep_literals)

    @classmethod
    def rebuild(cls, accepted: Iterable[tuple], **kwargs) -> "NearDupIndex":
        """An index holding already-accepted tasks, given as ``(key, source)`` or ``(key, source, signature)``
        in their original order (for a resumed run)."""
        index = cls(**kwargs)
        for item in accepted:
            index.add(*item)
        return index

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: str) -> bool:
        return key in self._order

    def minhash(self, task: str | TaskFacts) -> MinHash:
        m = MinHash(**self._mh_kwargs)
        m.update_batch(task_shingles(_tokens(task, self.keep_literals), self.shingle_size))
        return m

    def add(self, key: str, task: str | TaskFacts, signature: str | None = None) -> str | None:
        """Offer a task. Returns the key of the earlier kept task it duplicates (it is then not added), or
        None when it is new (it is added). ``signature``: the caller's canonical signature (e.g.
        ``OpGraph.signature()``); by default one derived from the normalised AST."""
        if key in self._order:
            raise ValueError(f"key {key!r} was already added")
        tokens = _tokens(task, self.keep_literals)
        sig = signature if signature is not None else hashlib.sha1(_SEP.join(tokens).encode("utf-8")).hexdigest()
        earlier = self._by_signature.get(sig)
        if earlier is not None:
            self.counts["exact_duplicate"] += 1
            return earlier
        m = self._scratch  # reused: LSH keeps band hashes, not the MinHash object
        m.clear()
        m.update_batch(task_shingles(tokens, self.shingle_size))
        hv = m.hashvalues.astype(np.uint32)
        candidates = self._lsh.query(m)
        if candidates:
            # LSH candidates are probable; confirm with the MinHash Jaccard estimate, keep the earliest.
            for cand in sorted(candidates, key=self._order.__getitem__):
                if float(np.mean(self._hashes[self._order[cand]] == hv)) >= self.threshold:
                    self.counts["near_duplicate"] += 1
                    return cand
        self._by_signature[sig] = key
        self._order[key] = len(self._hashes)
        self._hashes.append(hv)
        self._lsh.insert(key, m, check_duplication=False)
        self.counts["kept"] += 1
        return None
