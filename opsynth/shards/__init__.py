"""Parquet shards in the Hub layout, the dataset card, the run report and the Hub upload.

The end of a generate run, in order:

    writer = ShardWriter(output_dir, rows_per_shard=..., row_group_size=...)  # resumes what is there
    # rebuild within-run dedup from iter_rows(output_dir); skip candidates with `task_id in writer`
    writer.write(row)                 # per accepted task; writer.flush() now and then bounds crash loss
    files = writer.finalize()         # data/train-XXXXX-of-YYYYY.parquet
    write_report(output_dir, stats)   # report.json + plots/*.png (before the card, which links the plots)
    write_card(output_dir, stats, repo_id=...)   # README.md
then `python -m pipelines.push output_dir=... repo_id=...`.
"""

from opsynth.shards.schema import COLUMNS, SCHEMA, RowValidationError, validate_row
from opsynth.shards.stats import RunStats
from opsynth.shards.progress import RunProgress
from opsynth.shards.writer import ShardWriter, count_rows, existing_task_ids, iter_rows, list_shards, read_rows

__all__ = [
    "COLUMNS",
    "SCHEMA",
    "RowValidationError",
    "RunProgress",
    "RunStats",
    "ShardWriter",
    "count_rows",
    "existing_task_ids",
    "iter_rows",
    "list_shards",
    "read_rows",
    "validate_row",
    "write_card",
    "write_report",
]


def __getattr__(name: str):
    # card and report pull in huggingface_hub and matplotlib; load them only when asked for.
    if name == "write_card":
        from opsynth.shards.card import write_card

        return write_card
    if name == "write_report":
        from opsynth.shards.report import write_report

        return write_report
    raise AttributeError(name)
