"""The Parquet row schema of a dataset shard, and the check every row passes before it is written.

The first three columns are exactly CUDA-Agent-Ops-6K's (`code`, `ops`, `data_source`), so code that
reads Ops-6K reads our shards unchanged; the rest record how the task was made and measured.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

# Columns that may be null: KernelBench decontamination can be switched off, and then there is no
# similarity to record. Every other column is always known for an accepted task.
NULLABLE = frozenset({"kb_max_similarity", "kb_nearest"})

SCHEMA = pa.schema(
    [
        pa.field("code", pa.string(), nullable=False),
        pa.field("ops", pa.list_(pa.string()), nullable=False),
        pa.field("data_source", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("num_ops", pa.int64(), nullable=False),
        pa.field("graph", pa.string(), nullable=False),
        pa.field("input_shapes", pa.string(), nullable=False),
        pa.field("eager_ms", pa.float64(), nullable=False),
        pa.field("compile_ms", pa.float64(), nullable=False),
        pa.field("device", pa.string(), nullable=False),
        pa.field("torch_version", pa.string(), nullable=False),
        pa.field("kb_max_similarity", pa.float64(), nullable=True),
        pa.field("kb_nearest", pa.string(), nullable=True),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),
        pa.field("trace_signature", pa.string(), nullable=False),
        pa.field("dtype", pa.string(), nullable=False),
        pa.field("task_pass", pa.string(), nullable=False),
    ]
)

# What each column means; the dataset card prints this table.
DESCRIPTIONS: dict[str, str] = {
    "code": "the task file: `class Model(nn.Module)`, size constants, `get_inputs()`, `get_init_inputs()`",
    "ops": "the seed operators composed, in order",
    "data_source": "`torch#k` (k composed torch ops) or `transformers#1`",
    "task_id": "stable content hash of the normalised code",
    "num_ops": "k, the number of composed operators",
    "graph": "the op graph as JSON: nodes with op and attributes, edges",
    "input_shapes": "shapes and dtypes of `get_inputs()` as JSON",
    "eager_ms": "median eager runtime (ms) measured by the verifier",
    "compile_ms": "median `torch.compile` runtime (ms) measured by the verifier",
    "device": "where the runtimes were measured",
    "torch_version": "torch version the task was verified with",
    "kb_max_similarity": "highest AST similarity to any KernelBench problem (null when not checked)",
    "kb_nearest": "the most similar KernelBench problem (null when not checked)",
    "seed": "sampler seed that produced the graph",
    "mode": "`train` or `eval`: the mode `Model` runs in (`train` when its output differs between the two, "
            "e.g. BatchNorm's batch statistics); the verifier and the reward run it so",
    "trace_signature": "hash of the forward's torch calls and their wiring, up to sizes and constants "
                       "(no two rows share one)",
    "dtype": "the precision the task's inputs and parameters are made in (`float32`, `bfloat16`, `float16`); "
             "also stated in `code` (`dtype = torch.<name>`, absent for float32)",
    "task_pass": "`forward`, or `backward`: the task asks for the output and the gradients of sum(output * grad_output) "
                 "with respect to every floating input and parameter (stated in `code` as `task_pass = \"backward\"`)",
}

COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
OPS6K_COLUMNS: tuple[str, ...] = ("code", "ops", "data_source")
JSON_COLUMNS = frozenset({"graph", "input_shapes"})


class RowValidationError(ValueError):
    """A row does not fit SCHEMA; the message names the row, the column and what was wrong."""


def _where(row: Mapping[str, Any], index: int | None) -> str:
    parts = []
    if index is not None:
        parts.append(f"row {index}")
    tid = row.get("task_id") if isinstance(row, Mapping) else None
    if isinstance(tid, str):
        parts.append(f"task_id={tid!r}")
    return " (" + ", ".join(parts) + ")" if parts else ""


def _check_value(name: str, value: Any, where: str) -> Any:
    """Return `value` coerced to the plain Python type of column `name`, or raise."""
    field = SCHEMA.field(name)
    if value is None:
        if field.nullable:
            return None
        raise RowValidationError(f"column {name!r} is null but must have a value{where}")
    t = field.type
    if pa.types.is_string(t):
        if not isinstance(value, str):
            raise RowValidationError(f"column {name!r} must be str, got {type(value).__name__}{where}")
        if name in JSON_COLUMNS:
            try:
                json.loads(value)
            except ValueError as e:
                raise RowValidationError(f"column {name!r} must be a JSON string: {e}{where}") from None
        return value
    if pa.types.is_list(t):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise RowValidationError(f"column {name!r} must be a list of str, got {type(value).__name__}{where}")
        bad = [v for v in value if not isinstance(v, str)]
        if bad:
            raise RowValidationError(
                f"column {name!r} must be a list of str, has {type(bad[0]).__name__} item {bad[0]!r}{where}"
            )
        return list(value)
    if pa.types.is_integer(t):
        # bool is an int subclass in Python; a bool here is always a caller bug.
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise RowValidationError(f"column {name!r} must be int, got {type(value).__name__}{where}")
        return int(value)
    if pa.types.is_floating(t):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RowValidationError(f"column {name!r} must be float, got {type(value).__name__}{where}")
        value = float(value)
        if not math.isfinite(value):
            raise RowValidationError(f"column {name!r} must be finite, got {value}{where}")
        return value
    raise AssertionError(f"unhandled arrow type {t} for column {name!r}")  # SCHEMA and this function disagree


def validate_row(row: Mapping[str, Any], index: int | None = None) -> dict[str, Any]:
    """Check one row against SCHEMA and return it as a plain dict in column order.

    Raises RowValidationError on a missing or unknown column, a wrong type, a null in a required
    column, a non-finite float, or a `graph`/`input_shapes` that is not JSON.
    """
    if not isinstance(row, Mapping):
        raise RowValidationError(f"a row must be a mapping of column -> value, got {type(row).__name__}")
    where = _where(row, index)
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise RowValidationError(f"missing column(s) {missing}{where}")
    unknown = sorted(set(row) - set(COLUMNS))
    if unknown:
        raise RowValidationError(f"unknown column(s) {unknown}; the schema has {list(COLUMNS)}{where}")
    out = {name: _check_value(name, row[name], where) for name in COLUMNS}
    if out["num_ops"] < 0:
        raise RowValidationError(f"column 'num_ops' must be >= 0, got {out['num_ops']}{where}")
    return out


def rows_to_table(rows: list[Mapping[str, Any]]) -> pa.Table:
    """Validate `rows` and build a pyarrow Table with exactly SCHEMA."""
    clean = [validate_row(r, i) for i, r in enumerate(rows)]
    return pa.Table.from_pylist(clean, schema=SCHEMA)


def check_schema(schema: pa.Schema, where: str = "") -> None:
    """Raise ValueError when a Parquet file's schema is not SCHEMA (e.g. written by another version)."""
    if schema.remove_metadata().equals(SCHEMA):
        return
    have = {f.name: f.type for f in schema}
    diffs = []
    for f in SCHEMA:
        if f.name not in have:
            diffs.append(f"missing {f.name!r}")
        elif have[f.name] != f.type:
            diffs.append(f"{f.name!r} is {have[f.name]}, expected {f.type}")
    extra = [n for n in schema.names if n not in COLUMNS]
    if extra:
        diffs.append(f"unknown {extra}")
    if not diffs and schema.names != list(COLUMNS):
        diffs.append(f"column order {schema.names}, expected {list(COLUMNS)}")
    if not diffs:
        diffs.append("nullability differs")
    raise ValueError(f"shard schema does not match opsynth.shards.schema.SCHEMA{where}: " + "; ".join(diffs))
