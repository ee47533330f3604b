from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from opsynth.shards.schema import COLUMNS, SCHEMA, RowValidationError, check_schema, rows_to_table, validate_row

DESIGN_COLUMNS = [
    "code", "ops", "data_source", "task_id", "num_ops", "graph", "input_shapes", "eager_ms",
    "compile_ms", "device", "torch_version", "kb_max_similarity", "kb_nearest", "seed",
    "mode", "trace_signature", "dtype", "task_pass",  # after the design's columns: Ops-6K's three stay first
]


def test_schema_has_the_design_columns_in_order_with_ops6k_first():
    assert list(SCHEMA.names) == DESIGN_COLUMNS
    assert SCHEMA.field("ops").type == pa.list_(pa.string())
    assert SCHEMA.field("num_ops").type == pa.int64() and SCHEMA.field("seed").type == pa.int64()
    assert SCHEMA.field("eager_ms").type == pa.float64()


def test_valid_row_comes_back_in_column_order_with_numpy_scalars_coerced(make_row):
    row = make_row(5)
    row["num_ops"] = np.int64(row["num_ops"])
    row["eager_ms"] = np.float32(2.5)
    row["ops"] = tuple(row["ops"])
    shuffled = dict(reversed(list(row.items())))
    out = validate_row(shuffled)
    assert list(out) == list(COLUMNS)
    assert type(out["num_ops"]) is int and type(out["eager_ms"]) is float and out["eager_ms"] == 2.5
    assert out["ops"] == list(row["ops"])
    assert rows_to_table([row]).schema.equals(SCHEMA)


def test_null_similarity_is_allowed_when_decontamination_was_off(make_row):
    row = make_row(0)
    assert row["kb_max_similarity"] is None
    assert validate_row(row)["kb_nearest"] is None


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("ops", "nn.Conv2d", "'ops' must be a list of str"),
        ("ops", ["nn.Conv2d", 3], "has int item 3"),
        ("num_ops", "2", "'num_ops' must be int, got str"),
        ("num_ops", True, "'num_ops' must be int, got bool"),
        ("seed", 1.5, "'seed' must be int, got float"),
        ("eager_ms", "1.0", "'eager_ms' must be float, got str"),
        ("eager_ms", float("nan"), "'eager_ms' must be finite"),
        ("code", b"import torch", "'code' must be str, got bytes"),
        ("code", None, "'code' is null"),
        ("graph", "{not json", "'graph' must be a JSON string"),
        ("num_ops", -1, "'num_ops' must be >= 0"),
    ],
)
def test_wrong_values_are_rejected_with_the_column_named(make_row, column, value, message):
    row = make_row(3)
    row[column] = value
    with pytest.raises(RowValidationError) as e:
        validate_row(row, index=7)
    assert message in str(e.value)
    assert "row 7" in str(e.value) and "task-00003" in str(e.value)


def test_missing_and_unknown_columns_are_named(make_row):
    row = make_row(1)
    del row["compile_ms"], row["seed"]
    with pytest.raises(RowValidationError, match=r"missing column\(s\) \['compile_ms', 'seed'\]"):
        validate_row(row)
    row = make_row(1)
    row["extra"] = 1
    with pytest.raises(RowValidationError, match=r"unknown column\(s\) \['extra'\]"):
        validate_row(row)
    with pytest.raises(RowValidationError, match="must be a mapping"):
        validate_row(["not", "a", "row"])


def test_check_schema_names_the_difference():
    other = SCHEMA.set(SCHEMA.get_field_index("seed"), pa.field("seed", pa.string(), nullable=False))
    with pytest.raises(ValueError, match="'seed' is string, expected int64"):
        check_schema(other)
    with pytest.raises(ValueError, match="missing 'seed'"):
        check_schema(SCHEMA.remove(SCHEMA.get_field_index("seed")))
    check_schema(SCHEMA.with_metadata({b"k": b"v"}))
