"""The task contract, in one place: load a KernelBench-format task file, read and rewrite its sizes.

Used by verify (calibration, checks) and reward (reference runner, second shape) alike, so the two
never disagree about what a task file is. The contract (docs/INTERFACES.md): `batch_size` is a
module-level int literal, the leading dimension of every input, and nothing in `get_init_inputs()`
depends on it, so the same Model and weights accept any batch size.
"""

from __future__ import annotations

import ast
import linecache
import sys
import types

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


def load_task_module(source: str, name: str = "task_module", register: bool = False) -> types.ModuleType:
    """Execute a task's source as a fresh module.

    With `register`, the module is put in `sys.modules` and its source in `linecache`, so dynamo,
    `inspect` and tracebacks can see it (torch.compile needs this). Raises whatever the source raises
    (SyntaxError included): callers classify the failure.
    """
    filename = f"<{name}>"
    code = compile(source, filename, "exec")
    mod = types.ModuleType(name)
    mod.__file__ = filename
    if register:
        sys.modules[name] = mod
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(code, mod.__dict__)
    return mod


def missing_names(mod: types.ModuleType) -> list[str]:
    """The contract's required definitions the module lacks."""
    return [n for n in REQUIRED_NAMES if not hasattr(mod, n)]


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
                if isinstance(value, ast.Constant) and isinstance(value.value, int) and not isinstance(value.value, bool):
                    found = value  # the last assignment wins, as it would when executed
                else:
                    found = None
    return found


def read_batch_size(source: str) -> int | None:
    node = _batch_size_node(source)
    return None if node is None else int(node.value)


def set_batch_size(source: str, batch_size: int) -> str:
    """Return ``source`` with its ``batch_size`` literal replaced; the rest of the text is untouched."""
    node = _batch_size_node(source)
    if node is None:
        raise ValueError("task has no module-level integer batch_size")
    if node.lineno != node.end_lineno:
        raise ValueError("batch_size literal spans lines")
    lines = source.splitlines(keepends=True)
    i = node.lineno - 1
    raw = lines[i].encode()  # col offsets are in UTF-8 bytes
    raw = raw[: node.col_offset] + str(int(batch_size)).encode() + raw[node.end_col_offset :]
    lines[i] = raw.decode()
    return "".join(lines)


def second_batch_size(bs: int) -> int:
    """A different, odd-ish batch size that catches kernels hard-coding get_inputs shapes."""
    return bs + 1 if bs < 4 else bs // 2 + 1


def with_second_shape(source: str) -> str | None:
    """The task at a second batch size (to catch hard-coded shapes), or None when it has no batch_size."""
    bs = read_batch_size(source)
    if bs is None:
        return None
    try:
        return set_batch_size(source, second_batch_size(bs))
    except ValueError:
        return None


# The mode a task's Model runs in (the row's `mode` column). A Model whose output is the same in
# train and eval mode is an "eval" task (what the reward has always run); one whose output differs
# (BatchNorm's batch statistics, say) means what it computes as constructed, which is train mode
# (KernelBench runs such tasks so). The verifier decides it (`opsynth.verify.checks.choose_mode`);
# the verifier's later checks, its compile check and the reward's reference and candidate all put
# the model in that mode with `set_mode`, and nowhere else.
MODES = ("train", "eval")
DEFAULT_MODE = "eval"  # for a task whose row does not say (an Ops-6K row, a task file on disk)


def check_mode(mode: str | None) -> str:
    """The mode, `DEFAULT_MODE` for None; a ValueError naming the choices for anything else."""
    if mode is None or mode == "":
        return DEFAULT_MODE
    if mode not in MODES:
        raise ValueError(f"task mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def set_mode(model, mode: str | None):
    """Put `model` (an nn.Module) in the task's mode; returns it."""
    model.train(check_mode(mode) == "train")
    return model
