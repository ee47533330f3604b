"""Candidate formats: a ModelNew source, a CUDA-Agent workspace, or a raw model completion.

A workspace is a folder with `model_new.py` and `kernels/*.cu`, `kernels/*.cpp` (the `*_binding.cpp`
files among them); the candidate runner builds every file under `kernels/` into one extension named
`cuda_extension` and registers it before `model_new.py` runs, so `import cuda_extension` works.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

WORKSPACE_EXTENSION_NAME = "cuda_extension"
KERNEL_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp")

# ```python ... ``` (or ```py, or a bare fence); the closing fence may be missing in a truncated completion.
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_PY_LANGS = {"", "python", "py", "python3"}


@dataclass
class CandidateSpec:
    """What the runner executes: the ModelNew module source, plus kernel files for a workspace."""

    source: str
    kernel_files: dict[str, str] = field(default_factory=dict)  # name -> text (workspace only)
    origin: str = "source"  # "source", "file", "workspace" or "completion"

    def digest(self) -> str:
        h = hashlib.sha256(self.source.encode())
        for name in sorted(self.kernel_files):
            h.update(b"\0" + name.encode() + b"\0" + self.kernel_files[name].encode())
        return h.hexdigest()


def _defines_model_new(code: str) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return "class ModelNew" in code
    return any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in ast.walk(tree))


def extract_candidate(completion: str) -> str | None:
    """The code a completion proposes: the last Python fenced block that defines ModelNew.

    Falls back to the last Python block when none names ModelNew, and to the completion itself when it
    has no fences but is a ModelNew module. None when there is no code at all.
    """
    if not completion or not completion.strip():
        return None
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(completion)]
    py_blocks = [code for lang, code in blocks if lang in _PY_LANGS and code.strip()]
    for code in reversed(py_blocks):
        if _defines_model_new(code):
            return code.strip("\n") + "\n"
    if py_blocks:
        return py_blocks[-1].strip("\n") + "\n"
    if not blocks and _defines_model_new(completion):
        return completion
    return None


def _looks_like_path(s: str) -> bool:
    return "\n" not in s and len(s) < 4096 and Path(s).exists()


def load_workspace(path: Path) -> CandidateSpec:
    model_new = path / "model_new.py"
    if not model_new.is_file():
        raise FileNotFoundError(f"workspace {path} has no model_new.py")
    kernels = {}
    kdir = path / "kernels"
    if kdir.is_dir():
        for f in sorted(kdir.iterdir()):
            if f.is_file() and f.suffix in KERNEL_SUFFIXES:
                kernels[f.name] = f.read_text()
    return CandidateSpec(source=model_new.read_text(), kernel_files=kernels, origin="workspace")


def resolve_candidate(candidate: str | Path) -> CandidateSpec | None:
    """Turn what the caller passed into a CandidateSpec; None when it holds no code."""
    if isinstance(candidate, Path) or (isinstance(candidate, str) and _looks_like_path(candidate)):
        path = Path(candidate)
        if path.is_dir():
            return load_workspace(path)
        text = path.read_text()
        if path.suffix == ".py":
            return CandidateSpec(source=text, origin="file")
        code = extract_candidate(text)
        return CandidateSpec(source=code, origin="completion") if code else None
    text = str(candidate)
    if "```" not in text and _defines_model_new(text):
        return CandidateSpec(source=text, origin="source")
    code = extract_candidate(text)
    return CandidateSpec(source=code, origin="completion") if code else None
