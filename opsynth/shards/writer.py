"""Resumable, crash-safe Parquet shard writer in the Hugging Face Hub layout.

Layout. Rows go to `<output_dir>/data/`. While a run streams, the total shard count is unknown, so
shards are written as `part-XXXXX.parquet`; `finalize()` renames each to
`train-XXXXX-of-YYYYY.parquet` once YYYYY is known. The index XXXXX is a shard's identity in both
names, so a reader (and a resumed writer) handles a folder in any mix of the two, including one left
by a crash halfway through `finalize()`.

Atomicity. A shard is written to a hidden temp file in the same folder, fsynced, then `os.replace`d
over its final name: a reader sees the previous complete version or the new complete version, never
half a file. Temp files left by a crash are deleted when a writer next opens the folder.

Resume. On open the writer reads the task_ids already on disk, so `write()` skips rows it already
has, and it loads the rows of the last shard when that shard is short: new rows top it up and the
shard is atomically rewritten under the same index. An interrupted and resumed run therefore ends with
the same rows, in the same order and the same shard layout, as an uninterrupted one that wrote the
same sequence of rows. Rows still in the buffer when a process dies are lost from disk (the caller
regenerates them, because it skips only what `existing_task_ids` reports); `flush()` bounds that loss.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from opsynth.shards.schema import SCHEMA, check_schema, validate_row

log = logging.getLogger(__name__)

DATA_DIR = "data"
LOCK_NAME = ".opsynth-writer.lock"
TMP_PREFIX = ".tmp-"
SPLIT = "train"
_PART_RE = re.compile(r"^part-(\d{5,})\.parquet$")
_FINAL_RE = re.compile(r"^" + SPLIT + r"-(\d{5,})-of-(\d{5,})\.parquet$")

DEFAULT_ROWS_PER_SHARD = 10_000
# Small row groups keep the Hub dataset viewer and partial reads fast; tasks are ~2-5 kB each,
# so 1,000 rows is a few MB uncompressed per group.
DEFAULT_ROW_GROUP_SIZE = 1_000


@dataclass(frozen=True)
class ShardFile:
    """One shard on disk: its index, its path, and whether it carries the final `train-..-of-..` name."""

    index: int
    path: Path
    final: bool


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def final_name(index: int, total: int) -> str:
    return f"{SPLIT}-{index:05d}-of-{total:05d}.parquet"


def group_shards(data_dir: Path) -> tuple[list[ShardFile], list[Path]]:
    """(the shard to read for each index present, in index order; stale files shadowed by a newer
    version of the same index). Indices may have gaps; `_scan` refuses those."""
    by_index: dict[int, list[ShardFile]] = {}
    if not data_dir.is_dir():
        return [], []
    for p in data_dir.iterdir():
        m = _PART_RE.match(p.name)
        if m:
            by_index.setdefault(int(m.group(1)), []).append(ShardFile(int(m.group(1)), p, False))
            continue
        m = _FINAL_RE.match(p.name)
        if m:
            by_index.setdefault(int(m.group(1)), []).append(ShardFile(int(m.group(1)), p, True))
    shards, stale = [], []
    for index in sorted(by_index):
        versions = by_index[index]
        parts = [s for s in versions if not s.final]
        finals = [s for s in versions if s.final]
        if len(finals) > 1:
            raise ValueError(f"{data_dir}: shard {index} has several final files: {sorted(s.path.name for s in finals)}")
        # A `part-` file is only ever written after the final file of the same index existed (a
        # finalized short shard being topped up), so when both exist the part is the newer one.
        if parts:
            shards.append(parts[0])
            stale.extend(s.path for s in finals)
        else:
            shards.append(finals[0])
    return shards, stale


def _scan(data_dir: Path) -> tuple[list[ShardFile], list[Path]]:
    """Return (the shard to read for each index, stale files shadowed by a newer version)."""
    shards, stale = group_shards(data_dir)
    expected = list(range(len(shards)))
    if [s.index for s in shards] != expected:
        missing = sorted(set(expected) - {s.index for s in shards}) or [len(shards)]
        raise ValueError(
            f"{data_dir}: shard indices are not contiguous from 0 "
            f"(have {[s.index for s in shards]}, first missing {missing[0]}); a shard was deleted or moved"
        )
    return shards, stale


def list_shards(output_dir: str | os.PathLike) -> list[ShardFile]:
    """The shards of `output_dir`, in index order (= row order), whatever their naming stage."""
    return _scan(Path(output_dir) / DATA_DIR)[0]


def iter_rows(
    output_dir: str | os.PathLike, columns: list[str] | None = None, batch_size: int = 1_000
) -> Iterator[dict[str, Any]]:
    """Rows already written under `output_dir`, in write order, one row group batch in memory at a time."""
    for shard in list_shards(output_dir):
        pf = pq.ParquetFile(shard.path)
        check_schema(pf.schema_arrow, f" ({shard.path})")
        for batch in pf.iter_batches(batch_size=batch_size, columns=columns):
            yield from batch.to_pylist()


def read_rows(output_dir: str | os.PathLike, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """All rows already written under `output_dir`, in write order (empty when there is nothing)."""
    return list(iter_rows(output_dir, columns=columns))


def existing_task_ids(output_dir: str | os.PathLike) -> list[str]:
    """The task_ids already written under `output_dir`, in write order; reads only that column."""
    return [r["task_id"] for r in read_rows(output_dir, columns=["task_id"])]


def count_rows(output_dir: str | os.PathLike) -> int:
    """Number of rows on disk, from the Parquet footers (no data read)."""
    return sum(pq.ParquetFile(s.path).metadata.num_rows for s in list_shards(output_dir))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class FolderLocked(RuntimeError):
    """Another writer (another run) holds the output folder's lock."""


class _FolderLock:
    """An exclusive advisory lock on the output folder, so two writers never interleave shards.

    flock is released by the kernel when the process dies, so a SIGKILLed run never leaves the
    folder locked.
    """

    def __init__(self, output_dir: Path):
        self.path = output_dir / LOCK_NAME
        self._fh = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: no locking, documented limitation
            return
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise FolderLocked(f"{self.path.parent} is being written by another run (another ShardWriter holds "
                               f"{self.path}); wait for it to finish or choose another output_dir") from None
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the descriptor drops the flock
            self._fh = None


class ShardWriter:
    """Buffer validated rows and write them as zstd Parquet shards of `rows_per_shard` rows.

    Use as a context manager or call `close()`; call `finalize()` at the end of a run to give the
    shards their final Hub names. `write()` skips rows whose task_id is already written (on disk from
    an earlier run, or earlier in this one), which makes rerunning a run idempotent.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
        row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
        compression: str = "zstd",
        compression_level: int | None = None,
    ):
        if rows_per_shard < 1:
            raise ValueError(f"rows_per_shard must be >= 1, got {rows_per_shard}")
        if row_group_size < 1:
            raise ValueError(f"row_group_size must be >= 1, got {row_group_size}")
        self.output_dir = Path(output_dir)
        self.data_dir = self.output_dir / DATA_DIR
        self.rows_per_shard = int(rows_per_shard)
        self.row_group_size = min(int(row_group_size), self.rows_per_shard)
        self.compression = compression
        self.compression_level = compression_level
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _FolderLock(self.output_dir)
        self._lock.acquire()
        self._closed = False
        try:
            self._open_existing()
        except BaseException:
            self._lock.release()
            raise

    # -- opening -------------------------------------------------------------------------------

    def _open_existing(self) -> None:
        for p in self.data_dir.iterdir():
            if p.name.startswith(TMP_PREFIX):
                log.info("removing temp file left by an interrupted write: %s", p)
                p.unlink()
        shards, stale = _scan(self.data_dir)
        for p in stale:
            log.info("removing shard superseded by a newer version of the same index: %s", p)
            p.unlink()
        if stale:
            _fsync_dir(self.data_dir)
        self._task_ids: set[str] = set()
        self._persisted_rows = 0  # rows in shards before `_index`
        self._buffer: list[dict[str, Any]] = []  # rows of shard `_index`, on disk or not
        self._dirty = False  # whether `_buffer` differs from what is on disk for `_index`
        self._index = len(shards)
        self._shadowed: Path | None = None  # a final-named file that the next write of `_index` replaces
        for shard in shards:
            pf = pq.ParquetFile(shard.path)
            check_schema(pf.schema_arrow, f" ({shard.path})")
            ids = pf.read(columns=["task_id"]).column("task_id").to_pylist()
            dup = next((t for t in ids if t in self._task_ids), None)
            if dup is not None:
                raise ValueError(f"{shard.path}: task_id {dup!r} already appears in an earlier shard")
            self._task_ids.update(ids)
            self._persisted_rows += len(ids)
        if shards:
            last = shards[-1]
            n_last = pq.ParquetFile(last.path).metadata.num_rows
            if n_last < self.rows_per_shard:
                # Top the short last shard up instead of starting a new one: keeps the layout of a
                # resumed run identical to an uninterrupted one.
                self._buffer = pq.read_table(last.path).to_pylist()
                self._persisted_rows -= n_last
                self._index = last.index
                self._shadowed = last.path if last.final else None
        if self.num_rows:
            log.info("resuming %s: %d rows in %d shards already written", self.output_dir, self.num_rows, len(shards))

    # -- state -----------------------------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        """Rows written so far, on disk or buffered, including those from earlier runs."""
        return self._persisted_rows + len(self._buffer)

    @property
    def task_ids(self) -> frozenset[str]:
        """task_ids of every row written so far (on disk or buffered)."""
        return frozenset(self._task_ids)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._task_ids

    # -- writing -----------------------------------------------------------------------------------

    def write(self, rows: Iterable[Mapping[str, Any]] | Mapping[str, Any]) -> int:
        """Validate and buffer `rows` (one row or many), writing each shard once it is full.

        The whole batch is validated before any row is buffered, so a bad row leaves the writer
        unchanged. Rows whose task_id is already written are skipped. Returns the number of rows added.
        """
        self._check_open()
        if isinstance(rows, Mapping):
            rows = [rows]
        clean = [validate_row(r, i) for i, r in enumerate(rows)]
        added = 0
        for row in clean:
            tid = row["task_id"]
            if tid in self._task_ids:
                log.debug("skipping task_id %s: already written", tid)
                continue
            self._task_ids.add(tid)
            self._buffer.append(row)
            self._dirty = True
            added += 1
            if len(self._buffer) >= self.rows_per_shard:
                self._write_shard(self._index, self._buffer)
                self._persisted_rows += len(self._buffer)
                self._buffer = []
                self._dirty = False
                self._index += 1
        return added

    def flush(self) -> None:
        """Make buffered rows durable now by writing the current, partly filled shard.

        Later rows top that shard up and rewrite it (atomically) under the same index, so flushing
        often costs rewrites of at most `rows_per_shard` rows but never changes the final layout.
        """
        self._check_open()
        if self._dirty and self._buffer:
            self._write_shard(self._index, self._buffer)
            self._dirty = False

    def finalize(self) -> list[Path]:
        """Flush, rename every shard to `data/train-XXXXX-of-YYYYY.parquet`, close; return the files.

        Each rename is atomic; a crash halfway leaves a mix of names that `read_rows` and a new
        writer read correctly, and calling `finalize()` again completes it.
        """
        self.flush()
        try:
            shards, _ = _scan(self.data_dir)
            total = len(shards)
            out = []
            for shard in shards:
                target = self.data_dir / final_name(shard.index, total)
                if shard.path != target:
                    os.replace(shard.path, target)
                out.append(target)
            _fsync_dir(self.data_dir)
            return out
        finally:
            self.close()

    def close(self) -> None:
        """Flush buffered rows and release the folder. Shards keep their `part-` names."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._lock.release()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("ShardWriter is closed (close() or finalize() was called)")

    def _write_shard(self, index: int, rows: list[dict[str, Any]]) -> Path:
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        target = self.data_dir / part_name(index)
        tmp = self.data_dir / f"{TMP_PREFIX}{target.name}.{os.getpid()}"
        with open(tmp, "wb") as fh:
            pq.write_table(
                table,
                fh,
                row_group_size=self.row_group_size,
                compression=self.compression,
                compression_level=self.compression_level,
            )
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        if self._shadowed is not None and index == self._index:
            self._shadowed.unlink(missing_ok=True)
            self._shadowed = None
        _fsync_dir(self.data_dir)
        log.debug("wrote %s (%d rows)", target, len(rows))
        return target
