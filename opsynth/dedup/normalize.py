"""Canonical token sequence of a task's ``Model`` class: what the author chose is abstracted away.

Kept: library calls and their order (``nn.Conv2d``, ``torch.relu``, ``x.mean(dim=...)``; equivalent
spellings share a token: ``F.relu`` / ``torch.relu`` / ``x.relu()`` / ``nn.ReLU`` all give ``relu``,
``x + y`` gives the same tokens as ``torch.add(x, y)``), keyword-argument names of library calls, the
data flow of ``forward`` and the shape of the code.

Abstracted: every name the author chose. A local variable becomes a reference to the statement that
defined it (``R1`` = the previous statement), a forward parameter its position (``P0``), an ``__init__``
parameter ``P``, ``self.<attr>`` what it holds (``M:conv2d`` for a module, ``PARAM`` for a parameter);
literal values become ``C`` / ``S`` unless asked to keep them; docstrings, comments and ``super()``
calls disappear.

Meaning-preserving reorderings are undone: the statements of each method are emitted in a canonical
topological order of their def-use dependencies (ties broken by their abstract tokens), keyword
arguments are sorted, and the operands of ``+`` and ``*`` are sorted.
"""

from __future__ import annotations

import ast
import builtins

from opsynth.render.parse import (
    BINOP_TO_TORCH,
    TaskFacts,
    canonical_op_name,
    tensor_method_op,
)

__all__ = ["op_key", "model_tokens", "op_keys"]

_BUILTINS = frozenset(dir(builtins))
_COMMUTATIVE = (ast.Add, ast.Mult)
_NO_DEPS = frozenset()


def op_key(op: str) -> str:
    """Spelling-independent operator key: ``nn.ReLU``, ``F.relu``, ``torch.relu``, ``torch.relu_`` -> ``relu``."""
    return op.rsplit(".", 1)[-1].lower().rstrip("_") or op


def op_keys(ops: list[str]) -> list[str]:
    return [op_key(o) for o in ops]


def _is_super_init(stmt: ast.stmt) -> bool:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    f = stmt.value.func
    return (
        isinstance(f, ast.Attribute)
        and f.attr == "__init__"
        and isinstance(f.value, ast.Call)
        and isinstance(f.value.func, ast.Name)
        and f.value.func.id == "super"
    )


_MUTATING_METHODS = frozenset(
    {"append", "extend", "insert", "add_module", "register_buffer", "register_parameter", "update", "pop",
     "clear", "remove", "setdefault", "copy_", "fill_", "zero_"}
)
_SKIP_FIELDS = frozenset({"ctx", "op", "type_comment", "type_ignores"})
_FIELDS: dict[type, tuple[str, ...]] = {}
_BARRIERS = (ast.Expr, ast.Return, ast.Raise, ast.Assert, ast.Global, ast.Nonlocal, ast.Delete)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _fields(t: type) -> tuple[str, ...]:
    f = _FIELDS.get(t)
    if f is None:
        f = _FIELDS[t] = tuple(x for x in t._fields if x not in _SKIP_FIELDS)
    return f


def _mutated(call: ast.Call) -> str | None:
    """``x.append(...)``, ``x.add_(...)``, ``self.layers.extend(...)``: the receiver is changed in place."""
    f = call.func
    if type(f) is not ast.Attribute:
        return None
    m = f.attr
    if m not in _MUTATING_METHODS and not (m.endswith("_") and not m.endswith("__")):
        return None
    recv = f.value
    if type(recv) is ast.Name and recv.id != "self":
        return recv.id
    if type(recv) is ast.Attribute and type(recv.value) is ast.Name and recv.value.id == "self":
        return "self." + recv.attr
    return None


def _deps(stmt: ast.stmt) -> tuple[frozenset, frozenset, bool, dict]:
    """(names defined, names used, barrier, load count per plain name). ``self.x`` counts as ``self.x``.

    A hand-rolled walk (skipping ctx/op nodes) because this runs on every statement of every task."""
    defs: set[str] = set()
    uses: set[str] = set()
    loads: dict[str, int] = {}
    barrier = isinstance(stmt, _BARRIERS)
    if type(stmt) is ast.AugAssign and type(stmt.target) is ast.Name:  # x += y reads x too
        uses.add(stmt.target.id)
        loads[stmt.target.id] = 1
    stack: list = [stmt]
    Name, Attribute, Call, Store, Del = ast.Name, ast.Attribute, ast.Call, ast.Store, ast.Del
    while stack:
        n = stack.pop()
        t = type(n)
        if t is str:  # Global.names and the like
            continue
        if t is Name:
            if type(n.ctx) in (Store, Del):
                defs.add(n.id)
            else:
                uses.add(n.id)
                loads[n.id] = loads.get(n.id, 0) + 1
            continue
        if t is Attribute and type(n.value) is Name and n.value.id == "self":
            (defs if type(n.ctx) in (Store, Del) else uses).add("self." + n.attr)
            continue
        if t is Call:
            m = _mutated(n)
            if m is not None:
                defs.add(m)
        elif n is not stmt and isinstance(n, _SCOPES):
            if not isinstance(n, ast.Lambda):
                defs.add(n.name)
            continue
        for f in _fields(t):
            v = getattr(n, f, None)
            if type(v) is list:
                stack.extend(v)
            elif v is not None and isinstance(v, ast.AST):
                stack.append(v)
    uses.discard("self")
    return frozenset(defs), frozenset(uses), barrier, loads


class _Tokens:
    """Tokenizer for one task's Model class."""

    def __init__(self, facts: TaskFacts, keep_literals: bool):
        self.facts = facts
        self.imports = facts.imports
        self.keep_literals = keep_literals
        self.methods = {
            s.name for s in facts.model_class.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        self.globals = set(facts.sizes)
        for s in facts.tree.body:
            if isinstance(s, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                self.globals.add(s.name)
            elif isinstance(s, ast.Assign):
                for t in s.targets:
                    if isinstance(t, ast.Name):
                        self.globals.add(t.id)
        self._attr_tokens: dict[str, str] = {}
        for name, (kind, ops) in facts.attrs.items():
            if kind == "module":
                self._attr_tokens[name] = "M:" + ",".join(op_key(o) for o in ops)
            else:
                self._attr_tokens[name] = {"param": "PARAM", "buffer": "BUF", "tensor": "TENSOR"}.get(kind, "ATTR")
        # name resolution state for the statement being emitted
        self.params: dict[str, str] = {}
        self.defpos: dict[str, int] = {}
        self.pending: dict[str, list[str]] = {}
        self.cur_defs: set[str] = set()
        self.pos = 0
        self.abstract = False

    # --- names
    def name(self, n: ast.Name, out: list[str]) -> None:
        if isinstance(n.ctx, (ast.Store, ast.Del)):
            out.append("D")
            return
        i = n.id
        if i in self.imports.names:
            out.append("lib:" + op_key(self.imports.names[i]))
        elif self.abstract:
            out.append("P" if i in self.params else ("G" if i in self.globals else ("b:" + i if i in _BUILTINS else "N")))
        elif i in self.cur_defs:
            out.append("R0")
        elif i in self.pending:
            out.extend(self.pending.pop(i))
        elif i in self.defpos:
            out.append(f"R{self.pos - self.defpos[i]}")
        elif i in self.params:
            out.append(self.params[i])
        elif i in self.globals:
            out.append("G")
        elif i in _BUILTINS:
            out.append("b:" + i)
        else:
            out.append("N")

    def lib(self, node: ast.AST) -> str | None:
        dotted = self.imports.resolve(node)
        if dotted is None:
            return None
        return "lib:" + op_key(canonical_op_name(dotted))

    # --- expressions
    def expr(self, n: ast.AST | None, out: list[str]) -> None:
        if n is None:
            out.append("_")
            return
        t = type(n)
        if t is ast.Name:
            self.name(n, out)
        elif t is ast.Constant:
            v = n.value
            if v is None or v is Ellipsis:
                out.append(repr(v))
            elif self.keep_literals:
                out.append(("S:" if isinstance(v, (str, bytes)) else "C:") + repr(v))
            else:
                out.append("S" if isinstance(v, (str, bytes)) else "C")
        elif t is ast.Attribute:
            lib = self.lib(n)
            if lib is not None:
                out.append(lib)
            elif isinstance(n.value, ast.Name) and n.value.id == "self":
                if isinstance(n.ctx, (ast.Store, ast.Del)):
                    out.append("SET")
                elif n.attr in self.methods:
                    out.append("METH")
                else:
                    out.append(self._attr_tokens.get(n.attr, "ATTR"))
            else:
                self.expr(n.value, out)
                out.append("." + n.attr)
        elif t is ast.Call:
            self.call(n, out)
        elif t is ast.BinOp:
            op = BINOP_TO_TORCH.get(type(n.op))
            out.append("CALL")
            out.append("lib:" + op_key(op) if op else "op:" + type(n.op).__name__)
            if isinstance(n.op, _COMMUTATIVE):
                a: list[str] = []
                b: list[str] = []
                self.expr(n.left, a)
                self.expr(n.right, b)
                if b < a:
                    a, b = b, a
                out.extend(a)
                out.extend(b)
            else:
                self.expr(n.left, out)
                self.expr(n.right, out)
            out.append(")")
        elif t is ast.UnaryOp:
            if isinstance(n.op, ast.USub) and isinstance(n.operand, ast.Constant):
                self.expr(n.operand, out)  # -1 is a literal like 1
            else:
                out.append("op:" + type(n.op).__name__)
                self.expr(n.operand, out)
        elif t is ast.Compare:
            out.append("CMP")
            self.expr(n.left, out)
            for o, c in zip(n.ops, n.comparators):
                out.append("op:" + type(o).__name__)
                self.expr(c, out)
        elif t is ast.BoolOp:
            out.append("op:" + type(n.op).__name__)
            for v in n.values:
                self.expr(v, out)
        elif t in (ast.Tuple, ast.List):
            out.append("(" if t is ast.Tuple else "[")
            for e in n.elts:
                self.expr(e, out)
            out.append(")")
        elif t is ast.Subscript:
            out.append("SUB")
            self.expr(n.value, out)
            self.expr(n.slice, out)
        elif t is ast.Slice:
            out.append("SLICE")
            self.expr(n.lower, out)
            self.expr(n.upper, out)
            self.expr(n.step, out)
        elif t is ast.Starred:
            out.append("*")
            self.expr(n.value, out)
        else:
            out.append(t.__name__)
            for c in ast.iter_child_nodes(n):
                if isinstance(c, (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)):
                    continue
                if isinstance(c, ast.keyword):
                    out.append("kw:" + str(c.arg))
                    self.expr(c.value, out)
                elif isinstance(c, ast.arguments):
                    out.append(f"args:{len(c.args)}")
                else:
                    self.expr(c, out)

    def call(self, n: ast.Call, out: list[str]) -> None:
        out.append("CALL")
        f = n.func
        lib = self.lib(f)
        if lib is not None:
            out.append(lib)
        elif isinstance(f, ast.Attribute) and not (isinstance(f.value, ast.Name) and f.value.id == "self"):
            op = tensor_method_op(f.attr)
            # x.mean(dim=1) is torch.mean(x, dim=1): the receiver becomes the first argument
            out.append("lib:" + op_key(op) if op else "." + f.attr)
            self.expr(f.value, out)
        else:
            self.expr(f, out)
        for a in n.args:
            self.expr(a, out)
        for k in sorted(n.keywords, key=lambda k: k.arg or ""):
            out.append("kw:" + (k.arg or "**"))
            self.expr(k.value, out)
        out.append(")")

    # --- statements
    def stmt(self, s: ast.stmt, out: list[str]) -> None:
        t = type(s)
        if t is ast.Assign:
            out.append("=")
            self.expr(s.value, out)
            for tg in s.targets:
                self.expr(tg, out)
                self._mark_defs(tg)
        elif t is ast.AnnAssign:
            out.append("=")
            self.expr(s.value, out)
            self.expr(s.target, out)
            self._mark_defs(s.target)
        elif t is ast.AugAssign:
            # x += y is x = x + y
            out.append("=")
            load = _as_load(s.target)
            self.expr(ast.BinOp(left=load, op=s.op, right=s.value), out)
            self.expr(s.target, out)
            self._mark_defs(s.target)
        elif t is ast.Return:
            out.append("return")
            self.expr(s.value, out)
        elif t is ast.Expr:
            out.append("expr")
            self.expr(s.value, out)
        elif t in (ast.For, ast.AsyncFor):
            out.append("for")
            self.expr(s.iter, out)
            self.expr(s.target, out)
            self._mark_defs(s.target)
            self.block(s.body, out)
            if s.orelse:
                out.append("else")
                self.block(s.orelse, out)
            out.append("endfor")
        elif t is ast.While:
            out.append("while")
            self.expr(s.test, out)
            self.block(s.body, out)
            out.append("endwhile")
        elif t is ast.If:
            out.append("if")
            self.expr(s.test, out)
            self.block(s.body, out)
            if s.orelse:
                out.append("else")
                self.block(s.orelse, out)
            out.append("endif")
        elif t in (ast.With, ast.AsyncWith):
            out.append("with")
            for it in s.items:
                self.expr(it.context_expr, out)
                if it.optional_vars is not None:
                    self.expr(it.optional_vars, out)
                    self._mark_defs(it.optional_vars)
            self.block(s.body, out)
            out.append("endwith")
        elif t in (ast.FunctionDef, ast.AsyncFunctionDef):
            out.append(f"def:{len(s.args.args)}")
            self.cur_defs.add(s.name)
            self.block(s.body, out)
            out.append("enddef")
        elif t is ast.Pass:
            out.append("pass")
        else:
            out.append(t.__name__)
            for c in ast.iter_child_nodes(s):
                if isinstance(c, ast.expr):
                    self.expr(c, out)
                elif isinstance(c, ast.stmt):
                    self.stmt(c, out)

    def block(self, body: list[ast.stmt], out: list[str]) -> None:
        for s in body:
            if not _is_docstring(s):
                self.stmt(s, out)

    def _mark_defs(self, target: ast.AST) -> None:
        if self.abstract:
            return
        for n in ast.walk(target):
            if isinstance(n, ast.Name):
                self.cur_defs.add(n.id)

    # --- methods
    def method(self, fn: ast.FunctionDef, numbered_params: bool) -> list[str]:
        args = [a.arg for a in list(fn.args.posonlyargs) + list(fn.args.args)][1:]
        args += [a.arg for a in fn.args.kwonlyargs]
        for extra in (fn.args.vararg, fn.args.kwarg):
            if extra is not None:
                args.append(extra.arg)
        self.params = {a: (f"P{i}" if numbered_params else "P") for i, a in enumerate(args)}
        body = [s for s in fn.body if not (_is_super_init(s) or _is_docstring(s))]
        out = [f"args:{len(args)}"]
        for d in list(fn.args.defaults) + [d for d in fn.args.kw_defaults if d is not None]:
            self.abstract = True
            self.expr(d, out)
        order = self._canonical_order(body)
        self.abstract = False
        seq = [body[i] for i in order]
        info = [self._info[i] for i in order]
        inline = _single_use_definitions(seq, info)
        self.defpos = {}
        self.pending = {}
        pos = 0
        for k, stmt in enumerate(seq):
            self.pos = pos
            self.cur_defs = set()
            if k in inline:
                # x = f(y) used once later: its expression is emitted where x is used, so
                # "x = conv(x); x = relu(x); return x" and "return relu(conv(x))" give the same tokens
                name, value = inline[k]
                buf: list[str] = []
                self.expr(value, buf)
                self.defpos.pop(name, None)
                self.pending[name] = buf
                continue
            self.stmt(stmt, out)
            for d in self.cur_defs:
                self.defpos[d] = pos
                self.pending.pop(d, None)
            pos += 1
        self.pending = {}
        self.cur_defs = set()
        return out

    def _canonical_order(self, body: list[ast.stmt]) -> list[int]:
        """A topological order of the statements' def-use dependencies, ties broken by abstract tokens."""
        n = len(body)
        info = [_deps(s) for s in body]
        self._info = info
        if n <= 1:
            return list(range(n))
        preds: list[set[int]] = [set() for _ in range(n)]
        for j in range(n):
            dj, uj, bj, _ = info[j]
            for i in range(j):
                di, ui, bi, _ = info[i]
                if bi or bj or (di & uj) or (ui & dj) or (di & dj):
                    preds[j].add(i)
        succ: list[list[int]] = [[] for _ in range(n)]
        indeg = [len(p) for p in preds]
        for j, p in enumerate(preds):
            for i in p:
                succ[i].append(j)
        # Kahn's algorithm; tie-break keys (the statement's tokens with names abstracted) are only
        # computed when two statements are ready at once, which a plain chain never needs.
        keys: dict[int, str] = {}
        ready = [i for i in range(n) if indeg[i] == 0]
        order: list[int] = []
        while ready:
            if len(ready) == 1:
                i = ready.pop()
            else:
                for r in ready:
                    if r not in keys:
                        self.abstract = True
                        toks: list[str] = []
                        self.stmt(body[r], toks)
                        keys[r] = " ".join(toks)
                i = min(ready, key=lambda r: (keys[r], r))
                ready.remove(i)
            order.append(i)
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    ready.append(j)
        self.abstract = False
        return order


_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)


def _definition(stmt: ast.stmt) -> tuple[str, ast.AST] | None:
    """``x = e`` / ``x: T = e`` / ``x += e`` with a plain name: (name, the value x gets)."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
        return stmt.target.id, stmt.value
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id, ast.BinOp(left=ast.Name(id=stmt.target.id, ctx=ast.Load()), op=stmt.op, right=stmt.value)
    return None


def _single_use_definitions(seq: list[ast.stmt], info: list[tuple]) -> dict[int, tuple[str, ast.AST]]:
    """Positions of definitions whose value is read exactly once, by a later simple statement, with
    nothing in between that redefines what the value reads or has side effects: safe to inline."""
    out: dict[int, tuple[str, ast.AST]] = {}
    n = len(seq)
    for k in range(n - 1):
        d = _definition(seq[k])
        if d is None:
            continue
        name = d[0]
        reads = info[k][1]
        total, user = 0, -1
        for m in range(k + 1, n):
            c = info[m][3].get(name, 0)
            if c:
                total += c
                user = m
            if name in info[m][0] or total > 1:
                break
        if total != 1 or not isinstance(seq[user], _SIMPLE):
            continue
        if any(info[m][2] or (info[m][0] & reads) for m in range(k + 1, user)):
            continue
        out[k] = d
    return out


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _as_load(node: ast.AST) -> ast.AST:
    if isinstance(node, ast.Name):
        return ast.Name(id=node.id, ctx=ast.Load())
    if isinstance(node, ast.Attribute):
        return ast.Attribute(value=node.value, attr=node.attr, ctx=ast.Load())
    if isinstance(node, ast.Subscript):
        return ast.Subscript(value=node.value, slice=node.slice, ctx=ast.Load())
    return node


def model_tokens(facts: TaskFacts, keep_literals: bool = False) -> list[str]:
    """Canonical tokens of the Model class: ``__init__``, ``forward``, then other methods in a fixed order."""
    cls = facts.model_class
    tk = _Tokens(facts, keep_literals)
    fns = {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    out = ["class"]
    for name in ("__init__", "forward"):
        if name in fns:
            out.append("def:" + name)
            out.extend(tk.method(fns[name], numbered_params=(name == "forward")))
    others = sorted(
        (tk.method(fn, numbered_params=True) for name, fn in fns.items() if name not in ("__init__", "forward")),
        key=" ".join,
    )
    for toks in others:
        out.append("def")
        out.extend(toks)
    return out
