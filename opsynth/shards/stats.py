"""What a generate run tells the card and the report: one plain record the pipeline fills in.

Everything that can be read back from the shards (row counts, the achieved mixture, runtimes) is
computed from the rows themselves; RunStats carries only what the shards cannot know: the target,
the rejections, the thresholds, where and how fast it ran.
"""

from __future__ import annotations

import platform
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RunStats:
    """Facts about one generate run, passed by the pipeline to `write_card` and `write_report`.

    target_mixture: data_source (e.g. "torch#2", "transformers#1") -> target fraction (sums to ~1).
    rejected: rejection reason -> count, for this run (see `reject`).
    categories: op name (as in the `ops` column) -> its catalog category, for category coverage.
    thresholds: filter name -> threshold, as configured (e.g. {"eager_ms_min": 1.0,
        "eager_ms_max": 100.0, "kb_similarity_max": 0.9, "near_dup_threshold": 0.85}).
    versions: library -> version (torch, python, opsynth, cuda, ...), measured where tasks ran.
    candidates: candidates evaluated this run (accepted + rejected, skipped ones excluded).
    resumed_rows: rows already in the folder when this run started.
    """

    n_tasks: int = 0
    target_mixture: dict[str, float] = field(default_factory=dict)
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    candidates: int = 0
    categories: dict[str, str] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    versions: dict[str, str] = field(default_factory=dict)
    wall_time_s: float = 0.0
    seed: int | None = None
    cluster: str = ""
    resumed_rows: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    # Seconds per stage summed over candidates (sampling, kb_check, the verifier's stages, writing);
    # workers run in parallel, so the sum exceeds the wall time.
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def accept(self, n: int = 1) -> None:
        self.accepted += n
        self.candidates += n

    def reject(self, reason: str, n: int = 1) -> None:
        """Count a rejected candidate under its named reason."""
        if not reason:
            raise ValueError("a rejection needs a named reason")
        self.rejected[reason] = self.rejected.get(reason, 0) + n
        self.candidates += n

    @property
    def num_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def acceptance_rate(self) -> float | None:
        total = self.accepted + self.num_rejected
        return self.accepted / total if total else None

    @property
    def candidates_per_minute(self) -> float | None:
        return 60.0 * self.candidates / self.wall_time_s if self.wall_time_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rejected"] = dict(Counter(self.rejected).most_common())
        d["num_rejected"] = self.num_rejected
        d["acceptance_rate"] = self.acceptance_rate
        d["candidates_per_minute"] = self.candidates_per_minute
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunStats:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


def default_versions() -> dict[str, str]:
    """Versions of the libraries that shape the data, from the current process."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("torch", "opsynth", "pyarrow", "datasets"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out
