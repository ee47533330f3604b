"""Task shards for training: load them, split them deterministically, order them by difficulty.

Shards are the generate stage's Parquet files in the Hub layout (`data/train-*.parquet`) or a Hub
dataset id. Splits hash the `task_id`, so a task stays on the same side of the split whatever the
shard order, the machine or the number of rows, and a held-out task never leaks into training.
"""

from __future__ import annotations

import glob
import hashlib
import os
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

REQUIRED_COLUMNS = ("code", "ops", "num_ops", "task_id")
# Columns the training stage carries along; anything else in the shards is dropped on load.
KEPT_COLUMNS = REQUIRED_COLUMNS + ("data_source", "eager_ms", "compile_ms", "device", "mode")

SPLITS = ("train", "heldout", "all")


class TrainDataError(ValueError):
    """The shards named cannot give tasks (no such folder or Hub dataset, no shards, a row without
    code, an empty split): the caller's input, said in one line by the train command."""


class ShardsNotFound(TrainDataError, FileNotFoundError):
    """No shards where the setting points."""


def _local_parquet_files(folder: str) -> list[str]:
    """Shard files of a local folder: an opsynth dataset's shards in row order (the shard writer's own
    listing), else any Parquet files (an Ops-6K download, say), read here with a tolerant schema."""
    from opsynth.shards import list_shards

    try:
        shards = list_shards(folder)
    except ValueError as e:  # a gap in an opsynth folder's shard indices: say so rather than read part of it
        raise ShardsNotFound(str(e)) from None
    if shards:
        return [str(s.path) for s in shards]
    for pattern in ("data/*.parquet", "*.parquet", "**/*.parquet"):
        files = sorted(glob.glob(os.path.join(folder, pattern), recursive=True))
        if files:
            return files
    return []


def load_rows(source: str, hub_split: str = "train", limit: int | None = None) -> list[dict[str, Any]]:
    """Read task rows from a local shard folder (or one Parquet file) or a Hub dataset id.

    A path that exists locally is read with pyarrow (no `datasets` cache, no network); anything else
    is treated as a Hub dataset id and read with `datasets.load_dataset`.
    """
    if os.path.exists(source):
        files = [source] if os.path.isfile(source) else _local_parquet_files(source)
        if not files:
            raise ShardsNotFound(f"no Parquet shards under {source} (expected data/train-*.parquet)")
        tables = [pq.read_table(f) for f in files]
        table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
        rows = table.to_pylist()
    else:
        import datasets  # imported here: the local path needs only pyarrow

        try:
            rows = list(datasets.load_dataset(source, split=hub_split))
        except Exception as e:  # noqa: BLE001 - offline, no such repo, no such split: the caller's setting
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ShardsNotFound(f"{source} is not a local folder or file, and as a Hub dataset id it did not load "
                                 f"({type(e).__name__}: {first})") from None
    rows = [_normalise_row(r) for r in rows]
    return rows[:limit] if limit else rows


def _normalise_row(row: dict[str, Any]) -> dict[str, Any]:
    missing = [c for c in ("code",) if c not in row]
    if missing:
        raise TrainDataError(f"shard row lacks column(s) {missing}; have {sorted(row)}")
    out = {k: row[k] for k in KEPT_COLUMNS if k in row}
    # Ops-6K rows have no task_id / num_ops: derive them so its shards load too.
    if not out.get("task_id"):
        out["task_id"] = hashlib.sha256(row["code"].encode()).hexdigest()[:16]
    if out.get("ops") is None:
        out["ops"] = []
    if out.get("num_ops") is None:
        out["num_ops"] = len(out["ops"])
    return out


def heldout_fraction_of(task_id: str, salt: str = "opsynth-split") -> float:
    """A task's position in [0, 1), from a hash of its id: the split's only input."""
    digest = hashlib.sha256(f"{salt}:{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_rows(
    rows: Iterable[dict[str, Any]], split: str, heldout_fraction: float = 0.1, salt: str = "opsynth-split"
) -> list[dict[str, Any]]:
    """Rows of one split: `heldout` holds the tasks whose hash falls below `heldout_fraction`."""
    if split not in SPLITS:
        raise TrainDataError(f"unknown split {split!r}; expected one of {SPLITS}")
    rows = list(rows)
    if split == "all":
        return rows
    held = [heldout_fraction_of(r["task_id"], salt) < heldout_fraction for r in rows]
    want_held = split == "heldout"
    return [r for r, h in zip(rows, held) if h == want_held]


def curriculum_order(
    rows: Iterable[dict[str, Any]], max_num_ops: int | None = None, salt: str = "opsynth-curriculum"
) -> list[dict[str, Any]]:
    """Easy tasks first: ascending `num_ops`, ties broken by a hash (stable, yet not shard order).

    `max_num_ops` drops harder tasks altogether (e.g. train on 1-2 op fusions only).
    """
    rows = [r for r in rows if max_num_ops is None or int(r["num_ops"]) <= max_num_ops]
    return sorted(rows, key=lambda r: (int(r["num_ops"]), heldout_fraction_of(r["task_id"], salt)))


def select_tasks(
    source: str,
    split: str = "train",
    heldout_fraction: float = 0.1,
    curriculum: bool = False,
    max_num_ops: int | None = None,
    limit: int | None = None,
    hub_split: str = "train",
) -> list[dict[str, Any]]:
    """The rows one run trains or scores on: load, split, optionally order by difficulty, cap."""
    every = load_rows(source, hub_split=hub_split)
    rows = split_rows(every, split, heldout_fraction)
    if not rows and split == "heldout" and every:  # a small folder: say why, and what to do
        raise TrainDataError(
            f"no tasks in split 'heldout' of {source}: none of its {len(every)} tasks falls in the held-out "
            f"{heldout_fraction:.0%} (heldout_fraction={heldout_fraction}, chosen by a hash of task_id); score with "
            "split all, or train and score with a larger heldout_fraction")
    if curriculum or max_num_ops is not None:
        rows = curriculum_order(rows, max_num_ops)
    if limit:
        rows = rows[:limit]
    if not rows:
        raise TrainDataError(f"no tasks in split {split!r} of {source} (heldout_fraction={heldout_fraction})")
    return rows
