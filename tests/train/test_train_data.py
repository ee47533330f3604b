"""Shard loading, the held-out split and the curriculum: deterministic and leak-free."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opsynth.train.data import curriculum_order, load_rows, select_tasks, split_rows
from opsynth.train.prompts import KERNEL_BRIEF, build_prompt, completion_text, prompt_record


def _rows(n: int):
    return [dict(code=f"# task {i}\n", ops=["torch.relu"] * (1 + i % 3), num_ops=1 + i % 3, task_id=f"t{i:04d}",
                 data_source="torch#1") for i in range(n)]


def _write(folder, rows, shards: int = 2):
    (folder / "data").mkdir(parents=True)
    for k in range(shards):
        part = rows[k::shards]
        pq.write_table(pa.Table.from_pylist(part), folder / "data" / f"train-{k:05d}-of-{shards:05d}.parquet")
    return str(folder)


def test_hub_layout_folder_loads_all_shards(tmp_path):
    rows = load_rows(_write(tmp_path / "s", _rows(10)))
    assert sorted(r["task_id"] for r in rows) == [f"t{i:04d}" for i in range(10)]
    assert set(rows[0]) >= {"code", "ops", "num_ops", "task_id"}


def test_ops6k_style_rows_get_task_id_and_num_ops(tmp_path):
    folder = tmp_path / "o"
    (folder / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"code": "x = 1\n", "ops": ["a", "b"], "data_source": "torch#2"}]),
                   folder / "data" / "train-00000-of-00001.parquet")
    (row,) = load_rows(str(folder))
    assert row["num_ops"] == 2 and len(row["task_id"]) == 16


def test_heldout_split_is_disjoint_stable_and_sized():
    rows = _rows(2000)
    train, held = split_rows(rows, "train", 0.1), split_rows(rows, "heldout", 0.1)
    assert len(train) + len(held) == 2000
    assert not {r["task_id"] for r in train} & {r["task_id"] for r in held}
    assert 140 < len(held) < 260
    # Independent of row order and of the other rows: a task's side depends on its id only.
    assert {r["task_id"] for r in split_rows(rows[::-1][:500], "heldout", 0.1)} <= {r["task_id"] for r in held}


def test_curriculum_puts_fewer_ops_first_and_caps(tmp_path):
    ordered = curriculum_order(_rows(30))
    assert [r["num_ops"] for r in ordered] == sorted(r["num_ops"] for r in ordered)
    assert all(r["num_ops"] <= 2 for r in curriculum_order(_rows(30), max_num_ops=2))
    with pytest.raises(ValueError, match="no tasks"):
        select_tasks(_write(tmp_path / "c", _rows(5)), split="train", max_num_ops=0)


def test_prompt_carries_task_and_rules():
    code = "class Model(nn.Module):\n    pass\n"
    p = build_prompt(code)
    assert code.strip() in p and "ModelNew" in p and "load_inline" in p and "```python" in p
    rec = prompt_record({"code": code, "task_id": "x", "num_ops": 1}, chat=True)
    assert rec["prompt"][0]["role"] == "user" and KERNEL_BRIEF in rec["prompt"][0]["content"]
    assert rec["task_code"] == code
    assert completion_text([{"role": "assistant", "content": "hi"}]) == "hi"


def test_the_brief_states_the_tolerance_and_margin_the_reward_applies():
    from opsynth.train.prompts import kernel_brief

    assert kernel_brief() == KERNEL_BRIEF  # the defaults: the table's own words
    brief = kernel_brief({"atol": 5e-2, "rtol": 5e-2, "margin": 0.9})
    assert "within atol = rtol = 0.05" in brief and "more than 10% faster than eager" in brief
    assert "1e-2" not in brief and "5%" not in brief
