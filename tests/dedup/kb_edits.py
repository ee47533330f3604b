"""Meaning-preserving edits of a task source, made programmatically, for the decontamination tests.

An author copying a KernelBench problem can rename every identifier, change the sizes, swap statements
that do not depend on each other and add comments or docstrings without changing what it computes.
"""

from __future__ import annotations

import ast
import builtins
import re

_KEEP = set(dir(builtins)) | {"self", "Model", "get_inputs", "get_init_inputs", "super", "forward", "__init__"}


def _imported(tree: ast.Module) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out.update((a.asname or a.name.split(".")[0]) for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            out.update((a.asname or a.name) for a in n.names)
    return out


class Renamer(ast.NodeTransformer):
    """Consistently renames variables, parameters, module constants and ``self.<attr>`` attributes."""

    def __init__(self, tree: ast.Module, prefix: str = "zz"):
        self.keep = _KEEP | _imported(tree)
        self.methods = {
            f.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body if isinstance(f, ast.FunctionDef)
        }
        self.helpers = {s.name for s in tree.body if isinstance(s, (ast.ClassDef, ast.FunctionDef))}
        self.prefix = prefix
        self.map: dict[str, str] = {}

    def new(self, name: str) -> str:
        if name in self.keep or name in self.helpers or name.startswith("__"):
            return name
        return self.map.setdefault(name, f"{self.prefix}{len(self.map)}_{name[::-1].strip('_') or 'v'}")

    def visit_Name(self, node: ast.Name):
        node.id = self.new(node.id)
        return node

    def visit_arg(self, node: ast.arg):
        node.arg = self.new(node.arg)
        return node

    def visit_Attribute(self, node: ast.Attribute):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr not in self.methods:
            node.attr = self.new("attr_" + node.attr)
        return node

    def visit_keyword(self, node: ast.keyword):
        # keyword names belong to the callee (library API); only the value is the author's
        node.value = self.visit(node.value)
        return node


def rename_identifiers(source: str) -> str:
    tree = ast.parse(source)
    return ast.unparse(Renamer(tree).visit(tree))


def change_sizes(source: str) -> str:
    """Module-level integer / float constants change value (ints doubled plus one, floats halved)."""
    tree = ast.parse(source)
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            for n in ast.walk(stmt.value):
                if isinstance(n, ast.Constant) and type(n.value) is int:
                    n.value = n.value * 2 + 1
                elif isinstance(n, ast.Constant) and type(n.value) is float:
                    n.value = n.value / 2
    return ast.unparse(tree)


def _names(node: ast.AST, store: bool) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) == store:
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            if isinstance(n.ctx, ast.Store) == store:
                out.add("self." + n.attr)
    return out


def _independent(a: ast.stmt, b: ast.stmt) -> bool:
    if not all(isinstance(s, ast.Assign) for s in (a, b)):
        return False
    da, ua, db, ub = _names(a, True), _names(a, False), _names(b, True), _names(b, False)
    # nn.Parameter / modules are registered by attribute name, so the order of self.* assignments is free
    return not (da & ub or db & ua or da & db)


def swap_independent_statements(source: str) -> tuple[str, int]:
    """Swaps adjacent independent assignments in every method of Model; returns (source, swaps)."""
    tree = ast.parse(source)
    swaps = 0
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == "Model"):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            body = fn.body
            i = 0
            while i + 1 < len(body):
                if _independent(body[i], body[i + 1]):
                    body[i], body[i + 1] = body[i + 1], body[i]
                    swaps += 1
                    i += 2
                else:
                    i += 1
    return ast.unparse(tree), swaps


def add_comments_and_docstrings(source: str) -> str:
    tree = ast.parse(source)
    for n in ast.walk(tree):
        if isinstance(n, (ast.ClassDef, ast.FunctionDef)):
            n.body.insert(0, ast.Expr(ast.Constant(f"{n.name}: documented by someone else entirely.")))
    text = ast.unparse(tree)
    text = re.sub(r"^(\s*)(def |return )", r"\1# what follows matters\n\1\2", text, flags=re.M)
    return "# Copyright nobody\n" + text + "\n# end of file\n"


def all_edits(source: str) -> str:
    swapped, _ = swap_independent_statements(source)
    return add_comments_and_docstrings(change_sizes(rename_identifiers(swapped)))
