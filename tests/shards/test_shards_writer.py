from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opsynth.shards.schema import RowValidationError
from opsynth.shards.writer import (
    ShardWriter,
    count_rows,
    existing_task_ids,
    list_shards,
    read_rows,
)

REPO = Path(__file__).resolve().parents[2]


def _names(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "data").iterdir())


def _layout(out: Path) -> list[tuple[str, list[str]]]:
    return [(s.path.name, pq.read_table(s.path, columns=["task_id"]).column(0).to_pylist()) for s in list_shards(out)]


def _uninterrupted(tmp_path: Path, rows: list[dict], **kw) -> Path:
    out = tmp_path / "reference"
    w = ShardWriter(out, **kw)
    w.write(rows)
    w.finalize()
    return out


def test_finalize_writes_hub_layout_zstd_bounded_row_groups_in_write_order(tmp_path, make_row):
    rows = [make_row(i) for i in range(23)]
    w = ShardWriter(tmp_path, rows_per_shard=10, row_group_size=4)
    assert w.write(rows[:13]) == 13
    assert _names(tmp_path) == ["part-00000.parquet"]  # full shard written while streaming
    assert w.write(rows[13:]) == 10
    files = w.finalize()
    assert [f.name for f in files] == [f"train-0000{i}-of-00003.parquet" for i in range(3)]
    assert _names(tmp_path) == [f.name for f in files]
    assert read_rows(tmp_path) == [{**r} for r in rows]
    assert count_rows(tmp_path) == 23
    for f in files:
        md = pq.ParquetFile(f).metadata
        assert md.num_rows <= 10
        assert all(md.row_group(g).num_rows <= 4 for g in range(md.num_row_groups))
        assert md.row_group(0).column(0).compression == "ZSTD"
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [10, 10, 3]


def test_write_skips_task_ids_already_written_and_validates_the_whole_batch_first(tmp_path, make_row):
    w = ShardWriter(tmp_path, rows_per_shard=4)
    assert w.write([make_row(0), make_row(1), make_row(0)]) == 2
    assert w.write(make_row(1)) == 0  # a single row is accepted as a mapping
    bad = make_row(2)
    bad["num_ops"] = "two"
    with pytest.raises(RowValidationError, match="row 1"):
        w.write([make_row(3), bad])
    assert w.num_rows == 2 and "task-00003" not in w
    w.finalize()
    assert existing_task_ids(tmp_path) == ["task-00000", "task-00001"]
    with pytest.raises(RuntimeError, match="closed"):
        w.write(make_row(4))


def test_a_second_writer_on_the_same_folder_is_refused(tmp_path):
    w = ShardWriter(tmp_path)
    with pytest.raises(RuntimeError, match="another ShardWriter"):
        ShardWriter(tmp_path)
    w.close()
    ShardWriter(tmp_path).close()  # released on close


def test_resume_after_close_continues_without_duplicates_and_with_the_same_layout(tmp_path, make_row):
    rows = [make_row(i) for i in range(23)]
    reference = _uninterrupted(tmp_path, rows, rows_per_shard=5, row_group_size=2)

    out = tmp_path / "resumed"
    with ShardWriter(out, rows_per_shard=5, row_group_size=2) as w:
        w.write(rows[:12])  # close() flushes the 2 buffered rows as a short part-00002
    assert _names(out) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]

    w = ShardWriter(out, rows_per_shard=5, row_group_size=2)
    assert w.num_rows == 12 and w.task_ids == {r["task_id"] for r in rows[:12]}
    assert w.write(rows) == 11  # the caller may replay everything: known rows are skipped
    w.finalize()
    assert read_rows(out) == read_rows(reference)
    assert _layout(out) == _layout(reference)


def test_resume_after_finalize_tops_up_the_short_final_shard(tmp_path, make_row):
    rows = [make_row(i) for i in range(17)]
    reference = _uninterrupted(tmp_path, rows, rows_per_shard=5)
    out = tmp_path / "resumed"
    w = ShardWriter(out, rows_per_shard=5)
    w.write(rows[:7])
    w.finalize()
    assert _names(out) == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    w = ShardWriter(out, rows_per_shard=5)
    w.write(rows[7:])
    # the topped-up shard 1 replaced its finalized predecessor: no index is visible twice
    assert "train-00001-of-00002.parquet" not in _names(out)
    assert read_rows(out) == rows[:15]
    w.finalize()
    assert _layout(out) == _layout(reference)
    assert read_rows(out) == rows


def test_leftovers_of_a_crash_are_never_read_and_are_cleaned_on_open(tmp_path, make_row):
    rows = [make_row(i) for i in range(12)]
    w = ShardWriter(tmp_path, rows_per_shard=4)
    w.write(rows)
    w.close()
    # a half-written temp shard, as a crash inside _write_shard leaves it
    half = tmp_path / "data" / ".tmp-part-00003.parquet.999"
    half.write_bytes(b"PAR1 truncated")
    assert read_rows(tmp_path) == rows
    # a crash halfway through finalize(): shard 0 renamed, 1 and 2 not yet
    os.replace(tmp_path / "data" / "part-00000.parquet", tmp_path / "data" / "train-00000-of-00003.parquet")
    assert read_rows(tmp_path) == rows
    w = ShardWriter(tmp_path, rows_per_shard=4)
    assert not half.exists() and w.num_rows == 12
    assert [f.name for f in w.finalize()] == [f"train-0000{i}-of-00003.parquet" for i in range(3)]
    assert read_rows(tmp_path) == rows


def test_a_part_file_supersedes_the_final_file_of_the_same_index(tmp_path, make_row):
    w = ShardWriter(tmp_path, rows_per_shard=4)
    w.write([make_row(i) for i in range(6)])
    w.finalize()
    # the state between writing the topped-up part-00001 and deleting train-00001-of-00002
    table = pa.Table.from_pylist([make_row(i) for i in range(4, 8)], schema=pq.read_schema(tmp_path / "data" / "train-00000-of-00002.parquet"))
    pq.write_table(table, tmp_path / "data" / "part-00001.parquet")
    assert [r["task_id"] for r in read_rows(tmp_path)][4:] == ["task-00004", "task-00005", "task-00006", "task-00007"]
    ShardWriter(tmp_path, rows_per_shard=4).close()
    assert "train-00001-of-00002.parquet" not in _names(tmp_path)


def test_a_missing_shard_or_a_foreign_schema_is_an_error(tmp_path, make_row):
    w = ShardWriter(tmp_path, rows_per_shard=2)
    w.write([make_row(i) for i in range(6)])
    w.close()
    (tmp_path / "data" / "part-00001.parquet").unlink()
    with pytest.raises(ValueError, match="not contiguous.*first missing 1"):
        read_rows(tmp_path)
    other = tmp_path / "other"
    (other / "data").mkdir(parents=True)
    pq.write_table(pa.table({"code": ["x"]}), other / "data" / "part-00000.parquet")
    with pytest.raises(ValueError, match="schema does not match"):
        ShardWriter(other)


def test_nothing_written_reads_as_empty(tmp_path):
    assert read_rows(tmp_path / "absent") == [] and existing_task_ids(tmp_path) == []
    assert ShardWriter(tmp_path).finalize() == []


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from conftest import _row
    from opsynth.shards.writer import ShardWriter
    out, kill_after = sys.argv[1], int(sys.argv[2])
    w = ShardWriter(out, rows_per_shard=4, row_group_size=2)
    written = 0
    for i in range(30):
        if _row(i)["task_id"] in w:
            continue
        w.write(_row(i))
        written += 1
        if written % 3 == 0:
            w.flush()
        if written == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    w.finalize()
    """
)


def test_sigkill_midway_then_rerun_gives_the_rows_and_layout_of_an_uninterrupted_run(tmp_path, make_row):
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "killed"
    for kill_after in (11, 9):  # killed twice, at different points, then let finish
        p = subprocess.run([sys.executable, str(script), str(out), str(kill_after)], env=env, capture_output=True)
        assert p.returncode == -signal.SIGKILL, p.stderr.decode()
    assert 0 < count_rows(out) < 30  # something survived, not everything
    p = subprocess.run([sys.executable, str(script), str(out), "0"], env=env, capture_output=True)
    assert p.returncode == 0, p.stderr.decode()

    reference = _uninterrupted(tmp_path, [make_row(i) for i in range(30)], rows_per_shard=4, row_group_size=2)
    got = read_rows(out)
    assert got == read_rows(reference)
    assert len({r["task_id"] for r in got}) == 30
    assert _layout(out) == _layout(reference)
