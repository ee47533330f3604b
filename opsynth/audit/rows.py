"""The rows of a dataset in the Ops-6K format, from a folder, a Parquet file or the Hub.

Ops-6K's columns are `code`, `ops` and `data_source`; an opsynth folder has those first and more
after them (`graph`, `mode`, ...), which the audit uses when present and never needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class RowsUnavailable(ValueError):
    """The source is neither a readable folder or file nor a Hub dataset that loads; one line."""


def is_local(source: str) -> bool:
    return Path(source).exists()


def load_rows(source: str, split: str = "train", revision: str | None = None, limit: int = 0) -> list[dict[str, Any]]:
    """Every row, in dataset order (the order dedup decides in)."""
    rows = _local(Path(source)) if is_local(source) else _hub(source, split, revision)
    if limit:
        rows = rows[:limit]
    bad = next((i for i, r in enumerate(rows) if not isinstance(r.get("code"), str)), None)
    if bad is not None:
        raise RowsUnavailable(f"{source}: row {bad} has no `code` string; columns: {sorted(rows[bad])} "
                              "(an Ops-6K-format dataset has `code`, `ops`, `data_source`)")
    return rows


def _local(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.is_file():
        files = [path]
    else:
        data = path / "data"
        files = sorted(data.glob("*.parquet")) if data.is_dir() else []
        files = files or sorted(p for p in path.rglob("*.parquet") if "audit" not in p.relative_to(path).parts)
    if not files:
        raise RowsUnavailable(f"{path}: no Parquet files (expected data/*.parquet, as an opsynth folder or a Hub snapshot)")
    try:
        tables = [pq.read_table(f) for f in files]
        table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    except (OSError, pa.ArrowException) as e:
        raise RowsUnavailable(f"{path}: cannot read its Parquet files ({type(e).__name__}: {e})") from None
    return table.to_pylist()


def _hub(repo_id: str, split: str, revision: str | None) -> list[dict[str, Any]]:
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".")):
        raise RowsUnavailable(f"{repo_id}: no such file or folder, and not a Hub dataset id (owner/name)")
    import datasets

    try:
        ds = datasets.load_dataset(repo_id, split=split, revision=revision)
    except Exception as e:  # noqa: BLE001 - offline, no such repo or split: one line for the caller
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RowsUnavailable(f"{repo_id}: the Hub dataset did not load (offline, or no such dataset or split "
                              f"{split!r}): {type(e).__name__}: {first[:300]}") from None
    return [dict(r) for r in ds]
