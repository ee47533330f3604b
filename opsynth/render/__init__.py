"""Task source: `render_task` (OpGraph -> KernelBench-format file) and `parse_task` (any task file ->
facts: operators, size constants, the Model class); the task contract: load a task
file (`load_task_module`) and resize it (`read_batch_size`, `set_batch_size`)."""

from .contract import load_task_module, read_batch_size, set_batch_size
from .parse import TaskFacts, TaskParseError, normalized_code, parse_task, task_id
from .source import render_task

__all__ = ["load_task_module", "read_batch_size", "set_batch_size", "render_task", "parse_task", "TaskFacts", "TaskParseError", "task_id", "normalized_code"]
