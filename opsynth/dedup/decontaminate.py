"""Decontamination: how close a task is to any KernelBench problem, and whether that rejects it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from opsynth.dedup.config import DedupConfig
from opsynth.dedup.kernelbench import KBProblem, load_kernelbench
from opsynth.dedup.similarity import Fingerprint, ReferenceMatrix, fingerprint
from opsynth.render.parse import TaskFacts, TaskParseError, normalized_code, parse_task

__all__ = ["KBMatch", "KernelBenchIndex"]


@dataclass(frozen=True)
class KBMatch:
    """The result of checking one task against KernelBench; recorded on every task, kept or not."""

    max_similarity: float  # highest AST similarity to any problem, in [0, 1]
    nearest: str | None  # that problem, e.g. "level_2/1_Conv2D_ReLU_BiasAdd"
    op_sequence_match: str | None  # a problem (of op_sequence_levels) with the same ordered operator list
    rejected: bool
    reason: str | None  # "kb_similarity" | "kb_op_sequence" | None

    def as_row(self) -> dict[str, Any]:
        return {"kb_max_similarity": float(self.max_similarity), "kb_nearest": self.nearest or ""}


class KernelBenchIndex:
    """KernelBench problems with precomputed fingerprints; ``check`` scores one task against all of them."""

    def __init__(
        self,
        problems: list[KBProblem],
        threshold: float = 0.9,
        op_sequence_levels: list[int] | tuple[int, ...] = (2,),
        op_sequence_action: str = "reject",
    ):
        if not problems:
            raise ValueError("KernelBenchIndex needs at least one problem")
        if op_sequence_action not in ("reject", "flag"):
            raise ValueError(f"op_sequence_action must be 'reject' or 'flag', got {op_sequence_action!r}")
        self.problems = list(problems)
        self.threshold = float(threshold)
        self.op_sequence_action = op_sequence_action
        fps: list[Fingerprint] = []
        for p in self.problems:
            try:
                fps.append(fingerprint(p.code))
            except TaskParseError as e:
                raise ValueError(f"KernelBench problem {p.key} does not parse as a task: {e}") from e
        self.fingerprints = fps
        self.matrix = ReferenceMatrix(fps)
        levels = set(op_sequence_levels)
        self.op_sequences: dict[tuple[str, ...], str] = {}
        for p, fp in zip(self.problems, fps):
            if p.level in levels and fp.op_keys:
                self.op_sequences.setdefault(fp.op_keys, p.key)

    @classmethod
    def from_config(cls, cfg: DedupConfig | Mapping[str, Any] | None = None, **overrides: Any) -> "KernelBenchIndex":
        c = DedupConfig.from_any(cfg, **overrides)
        problems = load_kernelbench(kb_path=c.kb_path, kb_dataset=c.kb_dataset, levels=c.kb_levels)
        return cls(problems, c.kb_threshold, c.op_sequence_levels, c.op_sequence_action)

    def __len__(self) -> int:
        return len(self.problems)

    def similarities(self, task: str | TaskFacts | Fingerprint) -> np.ndarray:
        """Similarity of the task to every problem, in ``self.problems`` order."""
        fp = task if isinstance(task, Fingerprint) else fingerprint(task)
        return self.matrix.similarities(fp)

    def check(self, source: str | TaskFacts) -> KBMatch:
        """Score a task; raises TaskParseError for a source that is not a task."""
        facts = parse_task(source, with_ops=False) if isinstance(source, str) else source
        fp = fingerprint(facts)
        sims = self.matrix.similarities(fp)
        best = float(sims.max())
        ties = np.flatnonzero(sims >= best)
        i = int(ties[0])
        if len(ties) > 1 and best >= 1.0:
            # Several problems are the same program up to sizes (level-1 matmuls): name the verbatim one.
            code = normalized_code(source) if isinstance(source, str) else None
            for t in ties:
                if code is not None and normalized_code(self.problems[int(t)].code) == code:
                    i = int(t)
                    break
        op_match = self.op_sequences.get(fp.op_keys) if fp.op_keys else None
        reason = None
        if best > self.threshold:
            reason = "kb_similarity"
        elif op_match is not None and self.op_sequence_action == "reject":
            reason = "kb_op_sequence"
        return KBMatch(
            max_similarity=round(min(max(best, 0.0), 1.0), 6),
            nearest=self.problems[i].key,
            op_sequence_match=op_match,
            rejected=reason is not None,
            reason=reason,
        )
