"""Is a dataset folder still what its state file says it holds? And, when it is not, rebuild it.

A generate run records, at every flush, its *row ledger* (the sampler seed and task_id of every
row it committed, in row order) and the shard files it wrote. :func:`check_folder` reads the
folder without trusting any file: a shard that does not open as Parquet (truncated, overwritten)
is reported by name with what is wrong, never raised as a bare ``ArrowInvalid``; a shard the ledger
expects but the folder lacks is reported by name; and the rows of the ledger that no readable shard
holds are listed, so a caller can regenerate exactly those seeds.

:func:`rewrite_shards` replaces the folder's shards with a given row sequence atomically enough for
a crash at any point to leave either the old or the new set (a completed rewrite is finished by
:func:`finish_rewrite` on the next open), and :func:`set_aside` moves a damaged file out of
``data/`` (into ``.opsynth-damaged/``) without deleting it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from opsynth.shards.schema import check_schema
from opsynth.shards.writer import (
    DATA_DIR,
    ShardWriter,
    _FolderLock,
    _fsync_dir,
    group_shards,
    part_name,
)

REWRITE_DIR = ".opsynth-rewrite"
OLD_DATA_DIR = ".opsynth-data-old"
DAMAGED_DIR = ".opsynth-damaged"
_COMPLETE = "COMPLETE"


class ShardUnreadable(ValueError):
    """A shard that cannot be read; the message names the file and says why."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def read_ids(path: Path) -> list[tuple[int, str]]:
    """(seed, task_id) of every row of one shard, in order; ShardUnreadable when it will not read."""
    try:
        pf = pq.ParquetFile(path)
        check_schema(pf.schema_arrow, f" ({path})")
        table = pf.read(columns=["seed", "task_id"])
    except Exception as e:  # noqa: BLE001 - ArrowInvalid, OSError, a schema ValueError: "not a shard of ours"
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ShardUnreadable(path, f"unreadable ({type(e).__name__}: {why})") from None
    return list(zip(table.column("seed").to_pylist(), table.column("task_id").to_pylist()))


def read_rows_of(path: Path) -> list[dict[str, Any]]:
    """Every row of one shard that :func:`read_ids` read (full rows, in order)."""
    return pq.read_table(path).to_pylist()


@dataclass(frozen=True)
class ShardIssue:
    name: str  # relative to the output folder, e.g. "data/part-00001.parquet"
    problem: str  # "missing" or "unreadable (...)"


@dataclass
class FolderCheck:
    """What :func:`check_folder` found. ``rows``: (seed, task_id) of the rows that read, in row
    order; ``missing``: ledger entries that no readable shard holds."""

    rows: list[tuple[int, str]] = field(default_factory=list)
    readable: list[Path] = field(default_factory=list)
    issues: list[ShardIssue] = field(default_factory=list)
    missing: list[tuple[int, str]] = field(default_factory=list)
    ledger_rows: int | None = None

    @property
    def ok(self) -> bool:
        return not self.issues and not self.missing

    def summary(self, output_dir: str | os.PathLike) -> str:
        """One line: which files, what is wrong, how many rows are gone."""
        parts = [f"{i.name} is {i.problem}" for i in self.issues]
        head = "; ".join(parts) if parts else "shards hold fewer rows than the state file lists"
        if self.ledger_rows is not None:
            gone = f"{len(self.missing)} of the {self.ledger_rows} rows the state file lists are gone"
        else:
            gone = "the state file has no row ledger, so which rows are gone is unknown"
        return f"{output_dir}: {head}: {gone}"


def check_folder(output_dir: str | os.PathLike, ledger: Iterable[tuple[int, str]] | None = None,
                 shards: Iterable[Mapping[str, Any]] | None = None) -> FolderCheck:
    """Compare the folder with a ledger (``None``: check only that every shard reads) and with the
    shard files the state recorded (``[{"name": ..., "rows": ...}]``, to name a deleted one)."""
    out = Path(output_dir)
    finish_rewrite(out)
    data = out / DATA_DIR
    found, _stale = group_shards(data)
    check = FolderCheck()
    for shard in found:
        try:
            check.rows.extend(read_ids(shard.path))
            check.readable.append(shard.path)
        except ShardUnreadable as e:
            check.issues.append(ShardIssue(f"{DATA_DIR}/{shard.path.name}", e.why))
    have = {s.index for s in found}
    recorded = {}
    for rec in shards or []:
        idx = _index_of(rec["name"])
        if idx is not None:
            recorded[idx] = rec["name"]
    top = max([*have, *recorded], default=-1)
    for idx in range(top + 1):
        if idx not in have:
            check.issues.append(ShardIssue(f"{DATA_DIR}/{recorded.get(idx, part_name(idx))}", "missing"))
    if ledger is not None:
        ledger = list(ledger)
        check.ledger_rows = len(ledger)
        present = {tid for _, tid in check.rows}
        check.missing = [(int(s), t) for s, t in ledger if t not in present]
    return check


def _index_of(name: str) -> int | None:
    from opsynth.shards.writer import _FINAL_RE, _PART_RE

    m = _PART_RE.match(name) or _FINAL_RE.match(name)
    return int(m.group(1)) if m else None


def set_aside(output_dir: str | os.PathLike, name: str) -> Path | None:
    """Move ``name`` (e.g. "data/part-00001.parquet") to ``.opsynth-damaged/``; returns the new
    path, or None when the file is not there."""
    out = Path(output_dir)
    src = out / name
    if not src.exists():
        return None
    dest_dir = out / DAMAGED_DIR
    dest_dir.mkdir(exist_ok=True)
    dest, i = dest_dir / src.name, 1
    while dest.exists():
        dest, i = dest_dir / f"{src.name}.{i}", i + 1
    os.replace(src, dest)
    return dest


def rewrite_shards(output_dir: str | os.PathLike, rows: Iterable[Mapping[str, Any]], rows_per_shard: int,
                   row_group_size: int) -> int:
    """Replace every shard of ``output_dir`` with ``rows`` (in this order); returns the row count.

    The new shards are written next to the folder's ``data/`` first; only once they are complete
    (and marked so) is ``data/`` swapped for them. The folder is locked meanwhile."""
    out = Path(output_dir)
    lock = _FolderLock(out)
    lock.acquire()
    try:
        tmp = out / REWRITE_DIR
        shutil.rmtree(tmp, ignore_errors=True)
        with ShardWriter(tmp, rows_per_shard=rows_per_shard, row_group_size=row_group_size) as w:
            for row in rows:
                w.write(row)
            n = w.num_rows
        (tmp / _COMPLETE).write_text(str(n))
        _fsync_dir(tmp)
        finish_rewrite(out)
        return n
    finally:
        lock.release()


def finish_rewrite(output_dir: Path) -> None:
    """Complete a rewrite that was interrupted after its new shards were written (a no-op when
    there is none); an unfinished one is discarded, leaving ``data/`` as it was."""
    tmp = output_dir / REWRITE_DIR
    old = output_dir / OLD_DATA_DIR
    if not tmp.exists():
        return
    if not (tmp / _COMPLETE).exists():  # the swap never started: data/ is the original
        shutil.rmtree(tmp, ignore_errors=True)
        return
    data = output_dir / DATA_DIR
    if (tmp / DATA_DIR).exists():
        if data.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(data, old)
        os.replace(tmp / DATA_DIR, data)
        _fsync_dir(output_dir)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)  # last: while it exists, the steps above can be redone
