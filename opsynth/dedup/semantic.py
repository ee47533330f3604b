"""Semantic duplicates: two tasks whose forwards make the same torch calls, wired the same way, up
to sizes and constants (`opsynth.verify.tracing.ForwardTrace.signature`, the `trace_signature`
column). The near-duplicate stage compares source text, which a renamed, reordered or respelled
copy (`F.relu` for `torch.relu`, another kernel size) escapes; the call graph does not.

The generator's committer and `pipelines.audit` decide with this one index, in row order: the
first task with a signature is kept, every later one is a `semantic_duplicate` of it. A dict
lookup, so it is asked before the MinHash stage (and a task the MinHash stage then drops is never
recorded here: the index holds exactly the rows written, as a resumed run rebuilds it).
"""

from __future__ import annotations

REASON = "semantic_duplicate"


class SemanticDupIndex:
    """signature -> key of the first task that had it."""

    def __init__(self) -> None:
        self._first: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._first)

    def signatures(self) -> frozenset[str]:
        """Every signature recorded so far (the generate driver sends them to its workers, which then
        skip torch.compile for a candidate that can only be a duplicate: the index only grows)."""
        return frozenset(self._first)

    def find(self, signature: str | None) -> str | None:
        """The key of the first task with this signature, or None; records nothing."""
        return self._first.get(signature) if signature else None

    def add(self, key: str, signature: str | None) -> str | None:
        """The key of the earlier task with this signature, or None (then `key` is recorded). A task
        without a signature (rows made before the column existed) is never a duplicate."""
        if not signature:
            return None
        earlier = self._first.get(signature)
        if earlier is not None:
            return earlier
        self._first[signature] = key
        return None
