"""Load a KernelBench-format task in a fresh namespace, and make its second shape (scaled batch_size)."""

from __future__ import annotations

import ast
import types


def load_task_module(source: str, name: str = "task_module") -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = f"<{name}>"
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    return mod


def second_batch_size(bs: int) -> int:
    """A different, odd-ish batch size that catches kernels hard-coding get_inputs shapes."""
    return bs + 1 if bs < 4 else bs // 2 + 1


def with_second_shape(source: str) -> str | None:
    """The task with its module-level `batch_size = <int>` changed, or None when it has none.

    The task contract says batch_size is the leading dimension of every input and nothing in
    get_init_inputs depends on it, so the same Model (and weights) accepts both shapes.
    """
    tree = ast.parse(source)
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "batch_size"
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, int)
            and not isinstance(node.value.value, bool)
        ):
            new = second_batch_size(node.value.value)
            lines = source.splitlines(keepends=True)
            v = node.value
            if v.lineno != v.end_lineno:
                return None
            line = lines[v.lineno - 1]
            # col offsets are in UTF-8 bytes
            b = line.encode()
            lines[v.lineno - 1] = (b[: v.col_offset] + str(new).encode() + b[v.end_col_offset :]).decode()
            return "".join(lines)
    return None


def as_output_list(out) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]
