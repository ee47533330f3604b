"""Task source: `render_task` (OpGraph -> KernelBench-format file) and `parse_task` (any task file ->
facts: operators, size constants, the Model class)."""

from .parse import TaskFacts, TaskParseError, normalized_code, parse_task, task_id
from .source import render_task

__all__ = ["render_task", "parse_task", "TaskFacts", "TaskParseError", "task_id", "normalized_code"]
