"""Quick source pre-check: rejects the obvious hacks before anything is built or run.

Cheap and conservative; the runtime guards in the candidate child are the authority, so anything
missed here is still caught there (tests run each adversarial candidate with this check off too).
"""

from __future__ import annotations

import ast
import re

from opsynth.reward.candidate import CandidateSpec

# torch.<name>(...) calls that create tensors or read metadata; every other torch.<name> call is compute.
TORCH_ALLOWED_CALLS = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "tensor", "as_tensor", "Size", "is_tensor", "device", "dtype", "get_default_dtype",
    "finfo", "iinfo", "broadcast_shapes", "result_type", "promote_types", "no_grad", "inference_mode",
    "is_floating_point", "numel",
}
TORCH_ALLOWED_PREFIXES = ("torch.cuda.", "torch.utils.cpp_extension.", "torch.backends.", "torch.version")
STREAM_CALLS = {"torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream", "torch.cuda.ExternalStream"}
COMPILE_CALLS = ("torch.compile", "torch.jit", "torch._dynamo", "torch._inductor", "torch.fx")
THREAD_MODULES = {"threading", "_thread", "concurrent", "multiprocessing", "asyncio"}
FORBIDDEN_MODULES = {"ctypes", "cffi", "gc", "inspect", "importlib", "builtins", "subprocess", "socket", "signal", "torch._C", "torch.utils._python_dispatch", "torch.overrides", "torch._dynamo", "torch._inductor", "torch.fx"}
NATIVE_SIDE_WORK = re.compile(r"std::thread|pthread_create|std::async|cudaStreamCreate|getStreamFromPool|cudaLaunchHostFunc|std::jthread")
SUBCLASS_HOOKS = {"__torch_dispatch__", "__torch_function__"}
SUBCLASS_CALLS = {"_make_subclass", "_make_wrapper_subclass", "as_subclass"}
TIMER_ROOTS = ("time.", "torch.cuda.", "torch.profiler.", "statistics.")


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Aliases(ast.NodeVisitor):
    """import torch.nn.functional as F / from torch import nn ... -> canonical dotted names."""

    def __init__(self):
        self.map = {"F": "torch.nn.functional"}

    def visit_Import(self, node):
        for a in node.names:
            self.map[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node):
        for a in node.names:
            if node.module:
                self.map[a.asname or a.name] = f"{node.module}.{a.name}"


def _canon(name: str | None, aliases: dict) -> str | None:
    if not name:
        return None
    head, _, rest = name.partition(".")
    if head in aliases:
        return aliases[head] + ("." + rest if rest else "")
    return name


def _imported_modules(tree) -> list[str]:
    mods = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            mods += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module:
            mods.append(n.module)
            mods += [f"{n.module}.{a.name}" for a in n.names]
    return mods


def _check_call(name: str) -> str | None:
    if name in STREAM_CALLS:
        return "side_stream"
    if name.startswith(COMPILE_CALLS):
        return f"forbidden_op:{name}"
    if name.startswith("torch.nn.functional."):
        return f"forbidden_op:F.{name.rsplit('.', 1)[-1]}"
    if name.startswith("torch.ops."):
        ns = name.split(".")[2] if name.count(".") >= 2 else ""
        if ns in ("aten", "prims", "quantized", "mkldnn", "cudnn"):
            return f"forbidden_op:{name}"
        return None
    if name.startswith("torch.") and not name.startswith(TORCH_ALLOWED_PREFIXES):
        short = name[len("torch."):]
        if "." not in short and short not in TORCH_ALLOWED_CALLS:
            return f"forbidden_op:{name}"
        if short.startswith(("linalg.", "special.", "fft.", "nn.functional.", "sparse.")):
            return f"forbidden_op:{name}"
    return None


def _runtime_functions(tree):
    """Functions whose bodies run during forward: every def except __init__ and @triton.jit kernels."""
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name != "__init__":
            decos = {(_dotted(d.func) if isinstance(d, ast.Call) else _dotted(d)) or "" for d in n.decorator_list}
            if any(d.endswith(("jit", "autotune", "heuristics")) for d in decos):
                continue
            yield n


def _literal_build_args(tree) -> tuple[str | None, str]:
    """An early word on literal compiler flags and names of load_inline / load calls: the build
    service refuses the same ones (opsynth.reward.build_flags, the authority) before compiling."""
    from opsynth.reward.build_flags import check_request

    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and (_dotted(n.func) or "").split(".")[-1] in ("load_inline", "load")):
            continue
        args = {}
        for kw in n.keywords:
            if kw.arg in ("name", "extra_cflags", "extra_cuda_cflags", "extra_ldflags", "extra_sycl_cflags"):
                try:
                    args[kw.arg] = ast.literal_eval(kw.value)
                except (ValueError, SyntaxError, TypeError):
                    continue
        name = args.pop("name", "ext")
        reason = check_request({"kind": "inline", "name": name if isinstance(name, str) else "ext", "args": args})
        if reason:
            return reason, f"line {n.lineno}: {reason}"
    return None, ""


def static_check(spec: CandidateSpec, enabled: bool = True) -> tuple[str, str]:
    """('ok', '') or (reason, detail)."""
    if not enabled:
        return "ok", ""
    try:
        tree = ast.parse(spec.source)
    except SyntaxError as e:
        return "syntax_error", f"line {e.lineno}: {e.msg}"
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    model_new = next((c for c in classes if c.name == "ModelNew"), None)
    if model_new is None:
        return "no_model_new", "no class ModelNew"
    al = _Aliases()
    al.visit(tree)
    aliases = al.map

    for mod in _imported_modules(tree):
        root = mod.split(".")[0]
        if root in THREAD_MODULES:
            return "side_stream", f"imports {mod}"
        if mod in FORBIDDEN_MODULES or root in FORBIDDEN_MODULES:
            return f"forbidden_import:{mod}", f"imports {mod}"

    for c in classes:
        for b in c.bases:
            bn = _canon(_dotted(b), aliases) or ""
            if bn.split(".")[-1] == "Model":
                return "uses_model", f"class {c.name} subclasses Model"
            if bn in ("torch.Tensor", "torch._tensor.Tensor"):
                return "tensor_subclass", f"class {c.name} subclasses torch.Tensor"
        for item in c.body:
            if isinstance(item, ast.FunctionDef) and item.name in SUBCLASS_HOOKS:
                return "tensor_subclass", f"class {c.name} defines {item.name}"
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id == "Model":
            return "uses_model", f"line {n.lineno}: refers to Model"
        if isinstance(n, ast.Attribute) and n.attr in SUBCLASS_CALLS:
            return "tensor_subclass", f"line {n.lineno}: {n.attr}"
        if isinstance(n, ast.Attribute) and n.attr in ("settrace", "setprofile", "_getframe"):
            return "timer_patched", f"line {n.lineno}: sys.{n.attr}"
        targets = []
        if isinstance(n, ast.Assign):
            targets = n.targets
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)):
            targets = [n.target]
        for t in targets:
            if isinstance(t, ast.Attribute):
                tn = _canon(_dotted(t), aliases) or ""
                if tn.startswith(TIMER_ROOTS):
                    return "timer_patched", f"line {n.lineno}: assigns {tn}"
                if tn.startswith("torch."):
                    return "harness_patched", f"line {n.lineno}: assigns {tn}"
        if isinstance(n, ast.Call):
            fn = _canon(_dotted(n.func), aliases) or ""
            if fn == "setattr" and n.args:
                tgt = _canon(_dotted(n.args[0]), aliases) or ""
                if tgt == "time" or tgt.startswith(("time.", "torch")):
                    return "timer_patched", f"line {n.lineno}: setattr on {tgt}"
            if fn in STREAM_CALLS:
                return "side_stream", f"line {n.lineno}: {fn}"
            if fn.startswith(COMPILE_CALLS):
                return f"forbidden_op:{fn}", f"line {n.lineno}: {fn}"

    for f in _runtime_functions(tree):
        for n in ast.walk(f):
            if isinstance(n, ast.Try):
                handlers_reraise = all(
                    h.body and all(isinstance(s, ast.Raise) for s in h.body) for h in n.handlers
                )
                if not handlers_reraise:
                    return "fallback", f"line {n.lineno}: try/except in {f.name} (a fallback path)"
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult):
                return "forbidden_op:matmul", f"line {n.lineno}: '@' in {f.name}"
            if isinstance(n, ast.Call):
                fn = _canon(_dotted(n.func), aliases)
                reason = _check_call(fn) if fn else None
                if reason:
                    return reason, f"line {n.lineno}: {fn} in {f.name}"
    reason, detail = _literal_build_args(tree)
    if reason:
        return reason, detail
    # A try around building the extension usually hides a fallback for when the build fails.
    for n in tree.body:
        if isinstance(n, ast.Try) and any(
            isinstance(c, ast.Call) and (_dotted(c.func) or "").split(".")[-1] in ("load_inline", "load")
            for c in ast.walk(n)
        ):
            if not all(h.body and all(isinstance(s, ast.Raise) for s in h.body) for h in n.handlers):
                return "fallback", f"line {n.lineno}: try/except around the extension build"

    native = "\n".join(
        [s.value for s in ast.walk(tree) if isinstance(s, ast.Constant) and isinstance(s.value, str)]
        + list(spec.kernel_files.values())
    )
    m = NATIVE_SIDE_WORK.search(native)
    if m:
        return "side_stream", f"native code uses {m.group(0)}"
    return "ok", ""
