"""Audit any dataset in the Ops-6K format (an opsynth folder, a Parquet file, a Hub dataset id) with
every check the generator applies, through the generator's own code: KernelBench decontamination
(`opsynth.dedup.KernelBenchIndex`), the verifier's checks in its confined workers
(`opsynth.verify.WorkerPool`: runs, finite, not constant, fixed inputs, train/eval mode, unused
state, deterministic, input-sensitive, torch.compile), and the committer's within-dataset dedup in
row order (semantic duplicates by traced call graph, exact and near duplicates by source).

`audit(AuditConfig(source=...))` writes `audit.json` and `verdicts.parquet` and returns the summary;
`pipelines.audit` is its command line.
"""

from opsynth.audit.config import AuditConfig
from opsynth.audit.run import AuditError, audit, format_table

__all__ = ["AuditConfig", "AuditError", "audit", "format_table"]
