"""AST similarity of two Model classes, and its vectorised form against a fixed reference set.

Two views of a task, each compared by the multiset Dice coefficient of its n-grams
(``2 * |A ∩ B| / (|A| + |B|)`` over counts, in [0, 1]):

- *structure*: 1- to 3-grams of the canonical Model tokens (``normalize.model_tokens``): the code's
  shape, data flow and library calls, with author names and literals abstracted;
- *operators*: 1- and 2-grams (with start/end marks) of the operator keys in canonical statement order.

The similarity is the smaller of the two: a task is as similar to a problem as its least similar view.
A renamed, resized, reordered or re-commented copy scores 1.0 on both; a copy with one operator
swapped keeps a high structure score but loses on operators (2 of 3 shared operators is ~0.6), so a
different operator chain does not count as the same problem, as ../shared/DESIGN.md asks.

Dice over n-gram counts is chosen over an edit distance (difflib, tree edit distance) because it is
exact yet vectorises: scoring one task against all references is a gather and a ``minimum`` over
a (features x references) matrix, ~10 µs instead of 270 Python-level sequence alignments.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from opsynth.dedup.normalize import model_tokens
from opsynth.render.parse import TaskFacts, parse_task

__all__ = ["Fingerprint", "fingerprint", "canonical_op_keys", "dice", "ast_similarity", "ReferenceMatrix", "STRUCT_NGRAMS"]

STRUCT_NGRAMS = 3


def _ngrams(tokens: list[str] | tuple[str, ...], n_max: int) -> Counter:
    c: Counter = Counter(tokens)
    L = len(tokens)
    for n in range(2, n_max + 1):
        c.update(tuple(tokens[i : i + n]) for i in range(L - n + 1))
    return c


@dataclass(frozen=True)
class Fingerprint:
    """What similarity looks at: n-gram counts of both views, and the operator keys in order."""

    struct: Counter
    ops: Counter
    op_keys: tuple[str, ...]


def canonical_op_keys(tokens: list[str]) -> tuple[str, ...]:
    """Operator keys applied outside ``__init__``, in the canonical statement order of the tokens.

    Unlike ``parse_task(...).ops`` (source order), swapping two independent statements leaves this
    unchanged, so the operator view is as order-robust as the structure view.
    """
    start = len(tokens)
    for marker in ("def:forward", "def"):
        if marker in tokens:
            start = min(start, tokens.index(marker))
    # Tokens are prefix notation (a CALL's head precedes its arguments; ")" closes CALL, "(" and "[");
    # emitting each call at its closing token gives evaluation order: torch.relu(conv(x)) -> conv, relu.
    keys: list[str] = []
    stack: list[str | None] = []
    for i in range(start, len(tokens)):
        t = tokens[i]
        if t == "CALL":
            head = tokens[i + 1] if i + 1 < len(tokens) else ""
            stack.append(head if head.startswith(("lib:", "M:")) else None)
        elif t == "(" or t == "[":
            stack.append(None)
        elif t == ")" and stack:
            head = stack.pop()
            if head is None:
                continue
            if head.startswith("lib:"):
                keys.append(head[4:])
            else:
                keys.extend(k for k in head[2:].split(",") if k)
    return tuple(keys)


def fingerprint(task: str | TaskFacts) -> Fingerprint:
    facts = parse_task(task, with_ops=False) if isinstance(task, str) else task
    toks = model_tokens(facts, keep_literals=False)
    keys = canonical_op_keys(toks)
    return Fingerprint(struct=_ngrams(toks, STRUCT_NGRAMS), ops=_ngrams(("^",) + keys + ("$",), 2), op_keys=keys)


def dice(a: Counter, b: Counter) -> float:
    total = sum(a.values()) + sum(b.values())
    if total == 0:
        return 1.0
    small, big = (a, b) if len(a) <= len(b) else (b, a)
    inter = sum(min(v, big[k]) for k, v in small.items() if k in big)
    return 2.0 * inter / total


def ast_similarity(a: str | TaskFacts | Fingerprint, b: str | TaskFacts | Fingerprint) -> float:
    """Similarity in [0, 1] of two tasks' Model classes (1.0: the same program up to names/literals/order)."""
    fa = a if isinstance(a, Fingerprint) else fingerprint(a)
    fb = b if isinstance(b, Fingerprint) else fingerprint(b)
    return min(dice(fa.struct, fb.struct), dice(fa.ops, fb.ops))


class _CountMatrix:
    """Dense (features x references) count matrix for one view; features outside it only add to totals."""

    def __init__(self, counters: list[Counter]):
        vocab: dict = {}
        for c in counters:
            for k in c:
                if k not in vocab:
                    vocab[k] = len(vocab)
        self.vocab = vocab
        m = np.zeros((max(len(vocab), 1), len(counters)), dtype=np.float32)
        for j, c in enumerate(counters):
            for k, v in c.items():
                m[vocab[k], j] = v
        self.m = m
        self.totals = np.array([sum(c.values()) for c in counters], dtype=np.float32)

    def dice(self, q: Counter) -> np.ndarray:
        idx: list[int] = []
        vals: list[float] = []
        q_total = 0
        get = self.vocab.get
        for k, v in q.items():
            q_total += v
            i = get(k)
            if i is not None:
                idx.append(i)
                vals.append(v)
        denom = self.totals + np.float32(q_total)
        if idx:
            sub = self.m[idx]  # (features in common, references): a copy we may overwrite
            np.minimum(sub, np.asarray(vals, dtype=np.float32)[:, None], out=sub)
            inter = sub.sum(axis=0)
        else:
            inter = np.zeros_like(denom)
        # two empty views are identical (1.0)
        return np.divide(2.0 * inter, denom, out=np.ones_like(denom), where=denom > 0)


class ReferenceMatrix:
    """Fingerprints of a fixed reference set, precomputed so one query scores against all of them at once."""

    def __init__(self, fingerprints: list[Fingerprint]):
        self.n = len(fingerprints)
        self._struct = _CountMatrix([f.struct for f in fingerprints])
        self._ops = _CountMatrix([f.ops for f in fingerprints])

    def similarities(self, fp: Fingerprint) -> np.ndarray:
        """``ast_similarity`` of the query to every reference, shape (n,)."""
        return np.minimum(self._struct.dice(fp.struct), self._ops.dice(fp.ops))
