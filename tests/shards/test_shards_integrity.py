"""Checking a folder against its row ledger never trusts a file: a truncated or foreign shard is
named with what is wrong (not raised as ArrowInvalid), a deleted one is named from the state's
shard list, the ledger's missing rows are listed; rewriting the shards is all-or-nothing."""

from __future__ import annotations

import os

from opsynth.shards import ShardWriter, read_rows
from opsynth.shards.integrity import (
    DAMAGED_DIR,
    REWRITE_DIR,
    check_folder,
    finish_rewrite,
    read_rows_of,
    rewrite_shards,
    set_aside,
)


def _folder(tmp_path, make_row, n=7, per_shard=3):
    out = tmp_path / "ds"
    rows = [make_row(i) for i in range(n)]
    with ShardWriter(out, rows_per_shard=per_shard) as w:
        w.write(rows)
    files = sorted((out / "data").iterdir())
    ledger = [(r["seed"], r["task_id"]) for r in rows]
    shards = [{"name": p.name, "rows": len(read_rows_of(p))} for p in files]
    return out, rows, files, ledger, shards


def test_a_healthy_folder_checks_out(tmp_path, make_row):
    out, _rows, files, ledger, shards = _folder(tmp_path, make_row)
    check = check_folder(out, ledger, shards)
    assert check.ok and check.rows == ledger and check.readable == files


def test_truncated_deleted_and_foreign_shards_are_named(tmp_path, make_row):
    out, _rows, files, ledger, shards = _folder(tmp_path, make_row)
    files[0].write_bytes(files[0].read_bytes()[:40])  # truncated
    files[2].unlink()  # the last one: no gap shows it, the shard list does
    check = check_folder(out, ledger, shards)
    assert not check.ok
    by_name = {i.name: i.problem for i in check.issues}
    assert by_name[f"data/{files[0].name}"].startswith("unreadable (ArrowInvalid")
    assert by_name[f"data/{files[2].name}"] == "missing"
    assert check.missing == ledger[:3] + ledger[6:]
    line = check.summary(out)
    assert "\n" not in line and "4 of the 7 rows" in line and files[0].name in line and files[2].name in line
    # Without a ledger the damage is still found, and said to be of unknown extent.
    assert "unknown" in check_folder(out).summary(out)


def test_a_middle_gap_is_named_even_without_a_shard_list(tmp_path, make_row):
    out, _rows, files, ledger, _ = _folder(tmp_path, make_row)
    files[1].unlink()
    check = check_folder(out, ledger)
    assert [(i.name, i.problem) for i in check.issues] == [("data/part-00001.parquet", "missing")]


def test_rewrite_replaces_the_shards_and_set_aside_keeps_the_damaged_file(tmp_path, make_row):
    out, rows, files, _ledger, _shards = _folder(tmp_path, make_row)
    files[1].write_bytes(b"garbage")
    moved = set_aside(out, f"data/{files[1].name}")
    assert moved == out / DAMAGED_DIR / files[1].name and moved.read_bytes() == b"garbage"
    assert rewrite_shards(out, rows[::-1], rows_per_shard=4, row_group_size=2) == 7
    assert read_rows(out) == rows[::-1]
    assert sorted(p.name for p in (out / "data").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert not (out / REWRITE_DIR).exists()


def test_an_interrupted_rewrite_is_finished_or_discarded(tmp_path, make_row):
    out, rows, _files, _ledger, _shards = _folder(tmp_path, make_row)
    # Crash before the new shards were complete: discarded, data/ untouched.
    (out / REWRITE_DIR / "data").mkdir(parents=True)
    (out / REWRITE_DIR / "data" / "part-00000.parquet").write_bytes(b"half")
    finish_rewrite(out)
    assert not (out / REWRITE_DIR).exists() and read_rows(out) == rows
    # Crash after they were complete, with data/ already moved aside: finished on the next check.
    other = tmp_path / "other"
    with ShardWriter(other, rows_per_shard=10) as w:
        w.write(rows[:2])
    (out / REWRITE_DIR).mkdir()
    os.replace(other / "data", out / REWRITE_DIR / "data")
    (out / REWRITE_DIR / "COMPLETE").write_text("2")
    os.replace(out / "data", out / ".opsynth-data-old")
    check = check_folder(out)
    assert [t for _, t in check.rows] == [r["task_id"] for r in rows[:2]]
    assert not (out / ".opsynth-data-old").exists() and not (out / REWRITE_DIR).exists()
