"""Settings of the dedup stage (mirrored by conf/dedup/default.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

__all__ = ["DedupConfig"]


@dataclass
class DedupConfig:
    # KernelBench reference: a local Parquet file or folder (kb_path); None: a local copy if one is found
    # ($OPSYNTH_KERNELBENCH, ../shared/kernelbench/kernelbench.parquet), else the Hub dataset (kb_dataset).
    kb_dataset: str = "ScalingIntelligence/KernelBench"
    kb_path: str | None = None
    kb_levels: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    # Reject a task whose Model class is more similar than this to any KernelBench problem.
    kb_threshold: float = 0.9
    # Flag (or reject) a task whose ordered operator list equals that of a problem of these levels.
    op_sequence_levels: list[int] = field(default_factory=lambda: [2])
    op_sequence_action: str = "reject"  # "reject" | "flag"
    # Within-run near-duplicates: MinHash-LSH over shingles of the canonical Model tokens.
    neardup_threshold: float = 0.9
    num_perm: int = 128
    shingle_size: int = 3
    # Keep literal values inside the Model class (dim=1 vs dim=2 differ) in the near-dup view;
    # module-level sizes never count (the KB view always abstracts literals).
    neardup_keep_literals: bool = True

    def __post_init__(self) -> None:
        if self.op_sequence_action not in ("reject", "flag"):
            raise ValueError(f"dedup.op_sequence_action must be 'reject' or 'flag', got {self.op_sequence_action!r}")
        for name in ("kb_threshold", "neardup_threshold"):
            v = getattr(self, name)
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"dedup.{name} must be in [0, 1], got {v!r}")
        if self.shingle_size < 1 or self.num_perm < 8:
            raise ValueError("dedup.shingle_size must be >= 1 and dedup.num_perm >= 8")

    @classmethod
    def from_any(cls, cfg: "DedupConfig | Mapping[str, Any] | None" = None, **overrides: Any) -> "DedupConfig":
        """Accept a DedupConfig, a plain mapping or an OmegaConf node (Hydra's ``cfg.dedup``), built
        by the shared builder (unknown keys and mistyped values named as ``dedup.<key>``)."""
        from opsynth.config import build, to_plain

        if isinstance(cfg, cls):
            values: dict[str, Any] = {f.name: getattr(cfg, f.name) for f in fields(cls)}
        else:
            values = dict(to_plain(cfg) or {})
        values.update(overrides)
        for k in ("kb_levels", "op_sequence_levels"):
            if isinstance(values.get(k), (list, tuple)):
                values[k] = [int(x) for x in values[k]]
        return build(cls, values, "dedup")
