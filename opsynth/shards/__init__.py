"""Parquet shards in the Hub layout, the dataset card, the run report and the Hub upload."""

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
