"""Task source -> facts: the reverse of the renderer.

Works on any KernelBench-format file (ours or a KernelBench problem) by reading the AST only; nothing
is executed. The operator list uses the catalog's vocabulary:

- ``nn.<Module>`` for ``torch.nn`` modules, resolved from ``self.<attr>(...)`` calls through the
  ``self.<attr> = nn.X(...)`` assignments in ``__init__`` (``nn.Sequential`` / ``nn.ModuleList``
  contents in order, helper ``nn.Module`` classes of the same file inlined);
- ``F.<fn>`` for ``torch.nn.functional.<fn>``;
- ``torch.<fn>`` for torch functions, for tensor methods that have a torch function of the same name
  (``x.mean()`` -> ``torch.mean``; in-place ``x.relu_()`` -> ``torch.relu``) and for arithmetic
  operators on tensors (``+`` -> ``torch.add``, ``@`` -> ``torch.matmul``, ...).
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field
from functools import lru_cache

__all__ = [
    "TaskFacts",
    "TaskParseError",
    "parse_task",
    "task_id",
    "normalized_code",
    "strip_docstrings",
    "ImportMap",
    "canonical_op_name",
]

# Libraries whose calls count as operators; stdlib / numpy arithmetic on Python scalars does not.
TENSOR_LIBRARIES = ("torch", "transformers", "einops")

BINOP_TO_TORCH = {
    ast.Add: "torch.add",
    ast.Sub: "torch.sub",
    ast.Mult: "torch.mul",
    ast.Div: "torch.div",
    ast.FloorDiv: "torch.floor_divide",
    ast.Mod: "torch.remainder",
    ast.MatMult: "torch.matmul",
    ast.Pow: "torch.pow",
}
CMPOP_TO_TORCH = {
    ast.Gt: "torch.gt",
    ast.GtE: "torch.ge",
    ast.Lt: "torch.lt",
    ast.LtE: "torch.le",
    ast.Eq: "torch.eq",
    ast.NotEq: "torch.ne",
}
UNARYOP_TO_TORCH = {ast.USub: "torch.neg"}

# Tensor methods that only query metadata: not operators even though torch has a function of the name.
_QUERY_METHODS = frozenset({"numel", "is_tensor", "is_floating_point", "is_complex", "is_nonzero"})
_SCALAR_CALLS = frozenset({"len", "int", "float", "round", "abs", "min", "max", "sum", "range", "bool"})
_SHAPE_METHODS = frozenset({"size", "dim", "numel", "item", "ndimension", "nelement"})
_CONTAINER_MODULES = frozenset({"nn.Sequential", "nn.ModuleList", "nn.ModuleDict"})
_PARAMETER_CALLS = frozenset({"nn.Parameter", "nn.parameter.Parameter"})


class TaskParseError(ValueError):
    """The source is not a task we can read: it does not parse, or it has no ``Model`` class."""


@dataclass
class TaskFacts:
    """What a task file says, read from its AST."""

    tree: ast.Module
    model_class: ast.ClassDef
    sizes: dict[str, object]
    init_params: list[str]
    ops: list[str]
    imports: "ImportMap" = field(repr=False)
    # self.<attr> of Model -> what it holds: ("module", [ops]) | ("param", []) | ("buffer", []) |
    # ("tensor", []) | ("value", [])
    attrs: dict[str, tuple[str, list[str]]] = field(default_factory=dict, repr=False)


# ----------------------------------------------------------------------------------------------
# names


def canonical_op_name(dotted: str) -> str:
    """Full dotted library path -> catalog vocabulary (``torch.nn.functional.relu`` -> ``F.relu``)."""
    if dotted.startswith("torch.nn.functional."):
        return "F." + dotted[len("torch.nn.functional.") :]
    if dotted.startswith("torch.nn.modules."):
        # torch.nn.modules.conv.Conv2d -> nn.Conv2d
        return "nn." + dotted.rsplit(".", 1)[1]
    if dotted.startswith("torch.nn."):
        return "nn." + dotted[len("torch.nn.") :]
    if dotted.startswith("transformers."):
        # AutoModel.from_pretrained(...) builds an AutoModel: name the class, not the factory.
        parts = dotted.split(".")
        parts = [p for p in parts if p not in ("from_pretrained", "from_config", "_from_config")]
        return ".".join(parts[:1] + parts[-1:]) if len(parts) > 1 else parts[0]
    return dotted


class ImportMap:
    """Local names bound by the file's imports -> the dotted path they stand for."""

    def __init__(self, tree: ast.Module):
        self.names: dict[str, str] = {}
        # Module-level imports only (also inside top-level if/try blocks): walking the whole tree
        # would cost more than the rest of the parse for a small task.
        stack = list(reversed(tree.body))
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.names[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        self.names[root] = root
            elif isinstance(node, ast.ImportFrom):
                if node.module and node.level == 0:
                    for a in node.names:
                        if a.name != "*":
                            self.names[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, (ast.If, ast.Try)):
                for h in getattr(node, "handlers", []):
                    stack.extend(reversed(h.body))
                stack.extend(reversed(node.orelse))
                stack.extend(reversed(node.body))

    def resolve(self, node: ast.AST) -> str | None:
        """``nn.Conv2d`` / ``torch.nn.functional.relu`` / ``F.relu`` -> full dotted path, else None."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.names:
            return None
        parts.append(self.names[node.id])
        return ".".join(reversed(parts))

    def resolve_op(self, node: ast.AST) -> str | None:
        """Like ``resolve`` but only for tensor libraries, in catalog vocabulary."""
        dotted = self.resolve(node)
        if dotted is None or dotted.split(".")[0] not in TENSOR_LIBRARIES:
            return None
        return canonical_op_name(dotted)


@lru_cache(maxsize=None)
def _torch_function_names() -> frozenset[str]:
    import torch  # lazy: parsing is also used by tools that never need torch otherwise

    names = set()
    for n in dir(torch):
        if n.startswith("_"):
            continue
        f = getattr(torch, n, None)
        if callable(f) and not isinstance(f, type):
            names.add(n)
    return frozenset(names)


def tensor_method_op(method: str) -> str | None:
    """``mean`` -> ``torch.mean``; ``relu_`` -> ``torch.relu``; ``view`` -> None (no torch.view)."""
    if method in _QUERY_METHODS or method.startswith("__"):
        return None
    fns = _torch_function_names()
    if method.endswith("_") and method[:-1] in fns:
        return "torch." + method[:-1]
    if method in fns:
        return "torch." + method
    return None


# ----------------------------------------------------------------------------------------------
# docstrings, normalised code, ids


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """Remove docstrings in place (module, classes, functions); an emptied body gets ``pass``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(
                body[0].value.value, str
            ):
                body.pop(0)
                if not body and not isinstance(node, ast.Module):
                    body.append(ast.Pass())
    return tree


def _parse(source: str) -> ast.Module:
    if not isinstance(source, str):
        raise TaskParseError(f"task source must be a str, got {type(source).__name__}")
    try:
        return ast.parse(source)
    except SyntaxError as e:
        raise TaskParseError(f"task source does not parse: line {e.lineno}: {e.msg}") from e
    except ValueError as e:  # e.g. null bytes
        raise TaskParseError(f"task source does not parse: {e}") from e


def normalized_code(source: str) -> str:
    """The code with comments, docstrings and formatting normalised away (``ast.unparse``)."""
    return ast.unparse(strip_docstrings(_parse(source)))


def task_id(source: str) -> str:
    """Stable content hash of the normalised code: comments/whitespace/docstrings do not change it."""
    return hashlib.sha256(normalized_code(source).encode("utf-8")).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# sizes


_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}


def _eval_literal(node: ast.AST, env: dict[str, object]) -> object:
    """Evaluate a constant expression that may name earlier constants; raise ValueError otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise ValueError(node.id)
    if isinstance(node, (ast.Tuple, ast.List)):
        vals = [_eval_literal(e, env) for e in node.elts]
        return tuple(vals) if isinstance(node, ast.Tuple) else vals
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_literal(node.operand, env)
        if not isinstance(v, (int, float)):
            raise ValueError("unary")
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval_literal(node.left, env), _eval_literal(node.right, env)
        if isinstance(node.op, ast.Pow) and isinstance(b, (int, float)) and abs(b) > 64:
            raise ValueError("pow too large")
        return _BINOPS[type(node.op)](a, b)
    raise ValueError(type(node).__name__)


def _module_sizes(tree: ast.Module) -> dict[str, object]:
    sizes: dict[str, object] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        try:
            v = _eval_literal(value, sizes)
        except (ValueError, TypeError, ZeroDivisionError, OverflowError):
            continue
        for t in targets:
            if isinstance(t, ast.Name):
                sizes[t.id] = v
    return sizes


# ----------------------------------------------------------------------------------------------
# operators


def _is_self_attr(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}


class _FileResolver:
    """Operator resolution over one file: imports, helper classes and functions, per-class bindings."""

    def __init__(self, tree: ast.Module, sizes: dict[str, object]):
        self.tree = tree
        self.imports = ImportMap(tree)
        self.sizes = sizes
        self.classes = {s.name: s for s in tree.body if isinstance(s, ast.ClassDef)}
        self.functions = {s.name: s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self._class_ops: dict[str, list[str]] = {}
        self._class_attrs: dict[str, dict[str, tuple[str, list[str]]]] = {}
        self._in_progress: set[str] = set()
        self._callables: dict[str, ast.FunctionDef] = dict(self.functions)

    # --- __init__: what each self.<attr> holds

    def class_attrs(self, cls: ast.ClassDef) -> dict[str, tuple[str, list[str]]]:
        if cls.name in self._class_attrs:
            return self._class_attrs[cls.name]
        attrs: dict[str, tuple[str, list[str]]] = {}
        local: dict[str, list[str]] = {}  # local names in __init__ holding modules / lists of modules
        methods = _methods(cls)
        init = methods.get("__init__")
        saved = self._callables
        self._callables = dict(self.functions)
        self._callables.update({f"self.{k}": v for k, v in methods.items()})
        try:
            if init is not None:
                self._callables.update(
                    {s.name: s for s in _walk_statements(init.body) if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
                )
                for stmt in _walk_statements(init.body):
                    self._bind_init_stmt(stmt, attrs, local)
        finally:
            self._callables = saved
        self._class_attrs[cls.name] = attrs
        return attrs

    def _returned_modules(self, fn: ast.FunctionDef) -> list[str]:
        """Ops of the modules a builder function returns (``def _make_layer(...): return nn.Sequential(...)``)."""
        if fn.name in self._in_progress:
            return []
        self._in_progress.add(fn.name)
        try:
            attrs: dict[str, tuple[str, list[str]]] = {}
            local: dict[str, list[str]] = {}
            ops: list[str] = []
            for stmt in _walk_statements(fn.body):
                if isinstance(stmt, ast.Return) and stmt.value is not None:
                    ops.extend(self._init_value(stmt.value, local)[1])
                else:
                    self._bind_init_stmt(stmt, attrs, local)
            return ops
        finally:
            self._in_progress.discard(fn.name)

    def _bind_init_stmt(self, stmt: ast.stmt, attrs, local) -> None:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if stmt.value is None:
                return
            kind, ops = self._init_value(stmt.value, local)
            for t in targets:
                name = _is_self_attr(t)
                if name is not None:
                    attrs[name] = (kind, ops)
                elif isinstance(t, ast.Name):
                    local[t.id] = ops if kind == "module" or isinstance(stmt.value, (ast.List, ast.Tuple)) else []
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            _, ops = self._init_value(stmt.value, local)
            local.setdefault(stmt.target.id, []).extend(ops)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            func = call.func
            # layers.append(nn.Conv2d(...)) / layers.extend([...]) / self.layers.append(...)
            if isinstance(func, ast.Attribute) and func.attr in ("append", "extend", "add_module", "insert"):
                ops: list[str] = []
                for a in call.args:
                    ops.extend(self._init_value(a, local)[1])
                owner = func.value
                if isinstance(owner, ast.Name) and owner.id != "self":
                    local.setdefault(owner.id, []).extend(ops)
                elif _is_self_attr(owner) is not None:
                    kind, prev = attrs.get(owner.attr, ("module", []))
                    attrs[owner.attr] = ("module", prev + ops)
                if isinstance(owner, ast.Name) and owner.id == "self" and func.attr == "add_module" and len(call.args) >= 2:
                    key = call.args[0]
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        attrs[key.value] = ("module", self._init_value(call.args[1], local)[1])
            elif isinstance(func, ast.Attribute) and func.attr in ("register_buffer", "register_parameter"):
                if isinstance(func.value, ast.Name) and func.value.id == "self" and call.args:
                    key = call.args[0]
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        attrs[key.value] = ("buffer" if func.attr == "register_buffer" else "param", [])

    def _init_value(self, value: ast.AST, local: dict[str, list[str]]) -> tuple[str, list[str]]:
        """What an ``__init__`` expression builds: ("module", ops) / ("param"|"tensor"|"value", [])."""
        if isinstance(value, ast.Call):
            op = self.imports.resolve_op(value.func)
            if op in _PARAMETER_CALLS:
                return "param", []
            if op in _CONTAINER_MODULES:
                return "module", self._container_contents(value, local)
            if op is not None:
                head = op.split(".")[0]
                if head == "nn" and op.split(".")[-1][:1].isupper():
                    return "module", [op]
                if head in ("transformers", "einops") and op.split(".")[-1][:1].isupper():
                    return "module", [op]
                return "tensor", []
            if isinstance(value.func, ast.Name) and value.func.id in self.classes:
                return "module", self.class_ops(self.classes[value.func.id])
            key = value.func.id if isinstance(value.func, ast.Name) else None
            if key is None and _is_self_attr(value.func) is not None:
                key = f"self.{value.func.attr}"
            if key is not None and key in self._callables:
                ops = self._returned_modules(self._callables[key])
                return ("module" if ops else "value"), ops
            return "value", []
        if isinstance(value, (ast.List, ast.Tuple)):
            ops: list[str] = []
            for e in value.elts:
                ops.extend(self._init_value(e, local)[1])
            return ("module" if ops else "value"), ops
        if isinstance(value, ast.Starred):
            return self._init_value(value.value, local)
        if isinstance(value, ast.Name) and value.id in local:
            return ("module" if local[value.id] else "value"), list(local[value.id])
        if isinstance(value, (ast.ListComp, ast.GeneratorExp)):
            return self._init_value(value.elt, local)
        return "value", []

    def _container_contents(self, call: ast.Call, local) -> list[str]:
        ops: list[str] = []
        for a in list(call.args) + [k.value for k in call.keywords]:
            if isinstance(a, ast.Call) and self.imports.resolve(a.func) in ("collections.OrderedDict", "OrderedDict"):
                for inner in a.args:
                    for elt in getattr(inner, "elts", []):
                        if isinstance(elt, ast.Tuple) and len(elt.elts) == 2:
                            ops.extend(self._init_value(elt.elts[1], local)[1])
                continue
            if isinstance(a, ast.Dict):
                for v in a.values:
                    ops.extend(self._init_value(v, local)[1])
                continue
            ops.extend(self._init_value(a, local)[1])
        return ops

    # --- forward: operators in evaluation order

    def class_ops(self, cls: ast.ClassDef) -> list[str]:
        if cls.name in self._class_ops:
            return self._class_ops[cls.name]
        if cls.name in self._in_progress:  # recursive helper classes: stop rather than loop
            return []
        self._in_progress.add(cls.name)
        try:
            attrs = self.class_attrs(cls)
            methods = _methods(cls)
            fwd = methods.get("forward")
            ops: list[str] = []
            if fwd is not None:
                _ForwardOps(self, attrs, methods, ops).run(fwd)
            self._class_ops[cls.name] = ops
            return ops
        finally:
            self._in_progress.discard(cls.name)


def _walk_statements(body: list[ast.stmt]):
    """Statements in source order, descending into if/for/while/with/try blocks."""
    for stmt in body:
        yield stmt
        for field_name in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field_name, None)
            if isinstance(inner, list) and not isinstance(stmt, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                yield from _walk_statements(inner)
        for h in getattr(stmt, "handlers", []) or []:
            yield from _walk_statements(h.body)


class _ForwardOps:
    """Walks a forward method and appends the operators it applies, in evaluation order."""

    def __init__(self, res: _FileResolver, attrs, methods, out: list[str]):
        self.res = res
        self.imports = res.imports
        self.attrs = attrs
        self.methods = methods
        self.out = out
        self.local_modules: dict[str, list[str]] = {}  # loop variables / aliases bound to modules
        self.scalars: set[str] = set()  # local names known to hold Python scalars (shapes, sizes)
        self._stack: set[str] = set()

    def run(self, fn: ast.FunctionDef) -> None:
        self._stack.add(fn.name)
        self.stmts(fn.body)
        self._stack.discard(fn.name)

    # statements
    def stmts(self, body: list[ast.stmt]) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s: ast.stmt) -> None:
        if isinstance(s, ast.Assign):
            self.expr(s.value)
            for t in s.targets:
                self._bind_target(t, s.value)
                self._target_exprs(t)
        elif isinstance(s, ast.AnnAssign):
            if s.value is not None:
                self.expr(s.value)
                self._bind_target(s.target, s.value)
        elif isinstance(s, ast.AugAssign):
            self.expr(s.value)
            op = BINOP_TO_TORCH.get(type(s.op))
            if op and not (self.scalar(s.target) and self.scalar(s.value)):
                self.out.append(op)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            self.expr(s.iter)
            bound = self._iter_modules(s.iter)
            if bound is not None:
                for name in _target_names(s.target):
                    self.local_modules[name] = bound
                # the last loop variable of enumerate/zip is the module
            elif isinstance(s.iter, ast.Call) and isinstance(s.iter.func, ast.Name) and s.iter.func.id == "range":
                for name in _target_names(s.target):
                    self.scalars.add(name)
            self.stmts(s.body)
            self.stmts(s.orelse)
        elif isinstance(s, ast.While):
            self.expr(s.test)
            self.stmts(s.body)
            self.stmts(s.orelse)
        elif isinstance(s, ast.If):
            self.expr(s.test)
            self.stmts(s.body)
            self.stmts(s.orelse)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                self.expr(item.context_expr)
            self.stmts(s.body)
        elif isinstance(s, ast.Try):
            self.stmts(s.body)
            for h in s.handlers:
                self.stmts(h.body)
            self.stmts(s.orelse)
            self.stmts(s.finalbody)
        elif isinstance(s, (ast.Return, ast.Expr)):
            if s.value is not None:
                self.expr(s.value)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assert, ast.Raise)):
            return
        else:
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.expr):
                    self.expr(child)

    def _target_exprs(self, t: ast.AST) -> None:
        if isinstance(t, ast.Subscript):
            self.expr(t.value)
            self.expr(t.slice)

    def _bind_target(self, t: ast.AST, value: ast.AST) -> None:
        names = _target_names(t)
        if self.scalar(value) or _is_shape_expr(value):
            self.scalars.update(names)
        else:
            self.scalars.difference_update(names)
        mods = self._module_ref(value)
        for n in names:
            if mods is not None and isinstance(t, ast.Name):
                self.local_modules[n] = mods
            else:
                self.local_modules.pop(n, None)

    def _module_ref(self, node: ast.AST) -> list[str] | None:
        """Ops of the module an expression names (``self.conv``, ``self.blocks[i]``, a loop var)."""
        attr = _is_self_attr(node)
        if attr is not None:
            kind, ops = self.attrs.get(attr, ("value", []))
            return ops if kind == "module" else None
        if isinstance(node, ast.Subscript):
            return self._module_ref(node.value)
        if isinstance(node, ast.Name) and node.id in self.local_modules:
            return self.local_modules[node.id]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.res.classes:
            return self.res.class_ops(self.res.classes[node.func.id])
        return None

    def _iter_modules(self, it: ast.AST) -> list[str] | None:
        mods = self._module_ref(it)
        if mods is not None:
            return mods
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("enumerate", "zip", "reversed"):
            for a in it.args:
                m = self._module_ref(a)
                if m is not None:
                    return m
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr in ("values", "children", "modules"):
            return self._module_ref(it.func.value)
        return None

    # scalars: operands that cannot be tensors (sizes, shapes, literals)
    def scalar(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.scalars or (node.id in self.res.sizes and node.id not in self.local_modules)
        if _is_shape_expr(node):
            return True
        attr = _is_self_attr(node)
        if attr is not None:
            return self.attrs.get(attr, ("value", []))[0] == "value"
        if isinstance(node, ast.BinOp):
            return self.scalar(node.left) and self.scalar(node.right)
        if isinstance(node, ast.UnaryOp):
            return self.scalar(node.operand)
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in _SCALAR_CALLS:
                return True
            dotted = self.imports.resolve(node.func)
            if dotted is not None and dotted.split(".")[0] in ("math", "numpy"):
                return True
        if isinstance(node, (ast.Tuple, ast.List)):
            return all(self.scalar(e) for e in node.elts)
        return False

    # expressions, in evaluation order
    def expr(self, node: ast.AST | None) -> None:
        if node is None:
            return
        if isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, ast.BinOp):
            self.expr(node.left)
            self.expr(node.right)
            op = BINOP_TO_TORCH.get(type(node.op))
            if op and not (self.scalar(node.left) and self.scalar(node.right)):
                self.out.append(op)
        elif isinstance(node, ast.UnaryOp):
            self.expr(node.operand)
            op = UNARYOP_TO_TORCH.get(type(node.op))
            if op and not self.scalar(node.operand):
                self.out.append(op)
        elif isinstance(node, ast.Compare):
            self.expr(node.left)
            prev = node.left
            for cop, right in zip(node.ops, node.comparators):
                self.expr(right)
                op = CMPOP_TO_TORCH.get(type(cop))
                if op and not (self.scalar(prev) and self.scalar(right)):
                    self.out.append(op)
                prev = right
        elif isinstance(node, (ast.Lambda,)):
            return
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.expr, ast.comprehension, ast.keyword)):
                    self.expr(child)

    def _args(self, call: ast.Call) -> None:
        for a in call.args:
            self.expr(a)
        for k in call.keywords:
            self.expr(k.value)

    def call(self, call: ast.Call) -> None:
        func = call.func
        # library function: torch.relu(x), F.gelu(x), nn.functional.softmax(x)
        lib = self.imports.resolve(func)
        if lib is not None:
            self._args(call)
            if lib.split(".")[0] in TENSOR_LIBRARIES:
                self.out.append(canonical_op_name(lib))
            return
        # self.<module>(x), self.blocks[i](x), layer(x) for layer in self.layers
        mods = self._module_ref(func)
        if mods is not None:
            self._args(call)
            self.out.extend(mods)
            return
        # self.<helper method>(x)
        attr = _is_self_attr(func)
        if attr is not None:
            self._args(call)
            m = self.methods.get(attr)
            if m is not None and attr not in self._stack:
                self._inline(m)
            return
        if isinstance(func, ast.Name):
            self._args(call)
            fn = self.res.functions.get(func.id)
            if fn is not None and func.id not in self._stack:
                self._inline(fn)
            return
        if isinstance(func, ast.Attribute):
            # tensor method: receiver first, then arguments, then the method itself
            self.expr(func.value)
            self._args(call)
            if not _is_shape_expr(call) and not self.scalar(func.value):
                op = tensor_method_op(func.attr)
                if op is not None:
                    self.out.append(op)
            return
        self.expr(func)
        self._args(call)

    def _inline(self, fn: ast.FunctionDef) -> None:
        self._stack.add(fn.name)
        try:
            self.stmts(fn.body)
        finally:
            self._stack.discard(fn.name)


def _target_names(t: ast.AST) -> list[str]:
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, (ast.Tuple, ast.List)):
        out: list[str] = []
        for e in t.elts:
            out.extend(_target_names(e))
        return out
    if isinstance(t, ast.Starred):
        return _target_names(t.value)
    return []


def _is_shape_expr(node: ast.AST) -> bool:
    """``x.shape``, ``x.shape[0]``, ``x.size(1)``, ``x.dim()``, ``len(x)``: Python ints, not tensors."""
    if isinstance(node, ast.Attribute) and node.attr in ("shape", "ndim", "dtype", "device", "in_features", "out_features"):
        return True
    if isinstance(node, ast.Subscript):
        return _is_shape_expr(node.value)
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in _SHAPE_METHODS:
            return True
        if isinstance(f, ast.Name) and f.id in ("len", "int"):
            return True
    return False


# ----------------------------------------------------------------------------------------------
# entry point


def _init_params(cls: ast.ClassDef) -> list[str]:
    init = _methods(cls).get("__init__")
    if init is None:
        return []
    a = init.args
    names = [x.arg for x in list(a.posonlyargs) + list(a.args) + list(a.kwonlyargs)]
    if a.vararg:
        names.append(a.vararg.arg)
    if a.kwarg:
        names.append(a.kwarg.arg)
    return names[1:] if names and names[0] == "self" else names


def find_model_class(tree: ast.Module) -> ast.ClassDef:
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == "Model":
            return stmt
    raise TaskParseError("task source has no module-level `class Model`")


def parse_task(source: str, *, with_ops: bool = True) -> TaskFacts:
    """Read a task file into facts (operators in forward order, size constants, the Model AST).

    ``with_ops=False`` skips the operator walk (``facts.ops`` is then empty): dedup derives its own
    canonical operator order and parses thousands of tasks per second."""
    tree = _parse(source)
    model = find_model_class(tree)
    sizes = _module_sizes(tree)
    res = _FileResolver(tree, sizes)
    try:
        ops = list(res.class_ops(model)) if with_ops else []
        attrs = res.class_attrs(model)
    except RecursionError as e:  # pathological nesting; a named reason, not a crash
        raise TaskParseError("task source nests too deeply to analyse") from e
    return TaskFacts(
        tree=tree,
        model_class=model,
        sizes=sizes,
        init_params=_init_params(model),
        ops=ops,
        imports=res.imports,
        attrs=attrs,
    )

