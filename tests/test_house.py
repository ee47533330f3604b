"""The house (docs/INTERFACES.md): every `opsynth` import in `opsynth/`, at module level or inside a
function, goes where its room may import, or is a named exception; no import cycle joins two rooms.

The checker reads the tables between the `house` markers of docs/INTERFACES.md (the one copy) and
is run here against the real tree and against small planted trees, where it must find the
violation (a control: a checker that finds nothing would pass the real tree too)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INTERFACES = REPO / "docs" / "INTERFACES.md"
UNIVERSAL = {"config"}  # the shared builder: a leaf every room may import (INTERFACES.md says why)


def _section(text: str, name: str) -> list[list[str]]:
    m = re.search(rf"<!-- {name}:begin -->(.*?)<!-- {name}:end -->", text, re.S)
    assert m, f"docs/INTERFACES.md has no {name} section"
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in m.group(1).strip().splitlines()]
    return [r for r in rows[2:] if r and r[0]]  # past the header and its rule


def read_house(text: str) -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """(room -> rooms it may import, {(importer module, imported module)} exceptions)."""
    ticks = re.compile(r"`([^`]+)`")
    table = {ticks.findall(r[0])[0]: set(ticks.findall(r[2])) for r in _section(text, "house")}
    exceptions = {(ticks.findall(r[0])[0], ticks.findall(r[1])[0]) for r in _section(text, "house-exceptions")}
    return table, exceptions


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "opsynth" or len(parts) == 1:
        return None  # not ours, or the package itself (its __init__ holds a version string)
    return parts[1]


@dataclass(frozen=True)
class Import:
    importer: str  # module name
    imported: str  # the module it names (for `from X import y`: X, or X.y when y is a module of X)
    where: str  # path:line


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_in(root: Path, package: str = "opsynth") -> list[Import]:
    """Every import of an `opsynth` module in `root/package`, wherever it sits in the file."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        mod = _module_name(root, path)
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the importer's package
                    base = mod.split(".")[: len(mod.split(".")) - node.level + (1 if is_pkg else 0)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # `from opsynth import cli` / `from opsynth.generate import driver`: the submodules named
                names = [f"{target}.{a.name}" if (root / Path(*f"{target}.{a.name}".split("."))).with_suffix(".py").exists()
                         or (root / Path(*f"{target}.{a.name}".split(".")) / "__init__.py").exists() else target
                         for a in node.names]
            for name in names:
                if name.split(".")[0] == package:
                    found.append(Import(mod, name, f"{path.relative_to(root)}:{node.lineno}"))
    return found


def violations(found: list[Import], table: dict[str, set[str]], exceptions: set[tuple[str, str]]) -> list[str]:
    bad = []
    for imp in found:
        src, dst = room_of(imp.importer), room_of(imp.imported)
        if src is None or dst is None or src == dst or dst in UNIVERSAL:
            continue
        if src not in table:
            bad.append(f"{imp.where}: {imp.importer} is in no room of the house table")
        elif dst not in table[src] and not any(imp.importer == a and (imp.imported + ".").startswith(b + ".")
                                               for a, b in exceptions):
            bad.append(f"{imp.where}: {src} may not import {dst} ({imp.importer} -> {imp.imported})")
    return bad


def stale_exceptions(found: list[Import], exceptions: set[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, b in exceptions
                  if not any(i.importer == a and (i.imported + ".").startswith(b + ".") for i in found))


def room_cycles(found: list[Import]) -> list[list[str]]:
    """Cycles in the graph of rooms (an edge for each import between two rooms)."""
    edges: dict[str, set[str]] = {}
    for imp in found:
        src, dst = room_of(imp.importer), room_of(imp.imported)
        if src and dst and src != dst:
            edges.setdefault(src, set()).add(dst)
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return cycles


def module_cycles(found: list[Import]) -> list[list[str]]:
    """Cycles between modules (a package counts as its `__init__`), inside a room too."""
    import networkx as nx

    graph = nx.DiGraph((i.importer, i.imported) for i in found if i.importer != i.imported)
    return sorted(sorted(c) for c in nx.simple_cycles(graph))


# --- the real tree ---------------------------------------------------------------------------------

def test_every_room_of_the_package_is_in_the_house_table():
    table, _ = read_house(INTERFACES.read_text())
    rooms = {p.stem if p.is_file() else p.name for p in (REPO / "opsynth").iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert rooms == set(table), (sorted(rooms - set(table)), sorted(set(table) - rooms))


def test_no_import_runs_against_the_house_table():
    table, exceptions = read_house(INTERFACES.read_text())
    found = imports_in(REPO)
    assert len(found) > 100  # the walk sees the tree (module level and inside functions)
    assert violations(found, table, exceptions) == []
    assert stale_exceptions(found, exceptions) == [], "exceptions no import needs: delete them from INTERFACES.md"


def test_no_import_cycle_joins_two_rooms():
    assert room_cycles(imports_in(REPO)) == []


def test_no_import_cycle_joins_two_modules():
    """Inside a room too (the sandbox and its fork server, evaluate and the build service were one)."""
    assert module_cycles(imports_in(REPO)) == []


# --- planted trees: the checker must find what it is for -----------------------------------------

TABLE = """<!-- house:begin -->
| room | holds | may import |
|---|---|---|
| `config` | x | — |
| `graph` | x | — |
| `verify` | x | `graph` |
<!-- house:end -->
<!-- house-exceptions:begin -->
| importer | imports | why |
|---|---|---|
| `opsynth.graph.legacy` | `opsynth.verify.old` | planted |
<!-- house-exceptions:end -->
"""


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, src in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src)
    for d in ("opsynth", "opsynth/graph", "opsynth/verify"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
        (tmp_path / d / "__init__.py").touch()
    return tmp_path


def test_a_planted_import_inside_a_function_is_found(tmp_path):
    table, exceptions = read_house(TABLE)
    root = _tree(tmp_path, {
        "opsynth/verify/ok.py": "from opsynth.graph import thing\nfrom . import sibling\nfrom opsynth.config import build\n",
        "opsynth/graph/bad.py": "import os\n\ndef f():\n    from opsynth.verify.ok import thing\n    return thing\n",
    })
    bad = violations(imports_in(root), table, exceptions)
    assert bad == ["opsynth/graph/bad.py:4: graph may not import verify (opsynth.graph.bad -> opsynth.verify.ok)"]


def test_a_relative_and_a_from_package_import_are_resolved_to_their_room(tmp_path):
    table, exceptions = read_house(TABLE)
    root = _tree(tmp_path, {
        "opsynth/verify/ok.py": "x = 1\n",
        "opsynth/graph/rel.py": "from ..verify import ok\n",
        "opsynth/graph/pkg.py": "def f():\n    from opsynth import verify\n",
    })
    bad = violations(imports_in(root), table, exceptions)
    assert len(bad) == 2 and all("graph may not import verify" in b for b in bad), bad


def test_a_named_exception_is_allowed_and_a_stale_one_is_reported(tmp_path):
    table, exceptions = read_house(TABLE)
    used = _tree(tmp_path / "a", {"opsynth/verify/old.py": "x = 1\n", "opsynth/graph/legacy.py": "import opsynth.verify.old\n"})
    assert violations(imports_in(used), table, exceptions) == [] and stale_exceptions(imports_in(used), exceptions) == []
    unused = _tree(tmp_path / "b", {"opsynth/graph/legacy.py": "x = 1\n"})
    assert stale_exceptions(imports_in(unused), exceptions) == [("opsynth.graph.legacy", "opsynth.verify.old")]


def test_a_planted_cycle_between_rooms_is_found(tmp_path):
    root = _tree(tmp_path, {
        "opsynth/verify/a.py": "from opsynth.graph import b\n",
        "opsynth/graph/b.py": "def f():\n    import opsynth.verify.a\n",
    })
    assert room_cycles(imports_in(root)) == [["graph", "verify", "graph"]]


def test_a_planted_cycle_inside_a_room_is_found(tmp_path):
    root = _tree(tmp_path, {
        "opsynth/runtime/a.py": "from opsynth.runtime import b\n",
        "opsynth/runtime/b.py": "def f():\n    from opsynth.runtime.a import g\n",
    })
    assert room_cycles(imports_in(root)) == []
    assert module_cycles(imports_in(root)) == [["opsynth.runtime.a", "opsynth.runtime.b"]]
