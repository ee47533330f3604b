"""The task contract, in one place: how a task file is loaded, and how it is resized.

Loading: the file is executed as a real module (registered in ``sys.modules`` and ``linecache``, so
dynamo, ``inspect`` and tracebacks see its source); it must define ``Model``, ``get_inputs`` and
``get_init_inputs``. Task code is untrusted: call this only in a sandbox child process.

Resizing: ``batch_size`` is a module-level int literal, the leading dimension of every input and
absent from ``get_init_inputs()``, so a task is resized by rewriting that one constant (weights and
``Model`` stay the same). The literal is located with ``ast`` and spliced into the original text,
so the rest of the file (formatting, comments) is untouched.
"""

from __future__ import annotations

import ast
import linecache
import sys
import types

REQUIRED = ("Model", "get_inputs", "get_init_inputs")


class MissingDefinitions(Exception):
    """The file ran but does not define everything the contract requires."""


def load_task_module(source: str, name: str = "opsynth_task") -> types.ModuleType:
    """Execute ``source`` as module ``name``. Raises SyntaxError, whatever the task's own code
    raises, or MissingDefinitions naming what is missing."""
    filename = f"<{name}>"
    code = compile(source, filename, "exec")
    mod = types.ModuleType(name)
    mod.__file__ = filename
    sys.modules[name] = mod
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(code, mod.__dict__)
    missing = [n for n in REQUIRED if not hasattr(mod, n)]
    if missing:
        raise MissingDefinitions(f"missing {', '.join(missing)}")
    return mod


def _batch_size_node(source: str) -> ast.Constant | None:
    """The int literal of the module-level ``batch_size = N`` assignment, if there is one."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found = None
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "batch_size" for t in targets):
                value = node.value
                if (
                    isinstance(value, ast.Constant)
                    and isinstance(value.value, int)
                    and not isinstance(value.value, bool)
                ):
                    found = value  # the last assignment wins, as it would when executed
                else:
                    found = None
    return found


def read_batch_size(source: str) -> int | None:
    node = _batch_size_node(source)
    return None if node is None else int(node.value)


def set_batch_size(source: str, batch_size: int) -> str:
    """Return ``source`` with its ``batch_size`` literal replaced by ``batch_size``."""
    node = _batch_size_node(source)
    if node is None:
        raise ValueError("task has no module-level integer batch_size")
    lines = source.splitlines(keepends=True)
    if node.lineno != node.end_lineno:
        raise ValueError("batch_size literal spans lines")
    i = node.lineno - 1
    # col offsets are in UTF-8 bytes; a size constant's line is ASCII in practice, but be exact.
    raw = lines[i].encode()
    raw = raw[: node.col_offset] + str(int(batch_size)).encode() + raw[node.end_col_offset :]
    lines[i] = raw.decode()
    return "".join(lines)
