"""Runtime guards around ModelNew.forward, inside the candidate child. These are the authority;
the static pre-check only saves time on the obvious cases.

- OpAudit: a TorchDispatchMode that poisons (NaN-fills) every uninitialised allocation in checked
  calls, so an output that was never written cannot pass off stale memory as a result; and records every aten/prims op executed while armed (also ops that
  C++ extension code calls through the dispatcher, e.g. at::matmul); only creation, view, copy and
  metadata ops are allowed. The extension's own pybind functions never reach the dispatcher.
- torch.nn.functional and Tensor -> numpy/list escapes raise while armed (CUDA-Agent blocks F).
- HarnessSnapshot: identities of timers, synchronisation and harness functions, captured before the
  candidate runs, compared after each phase.
- ExtensionTracker: wraps what load_inline / load return so calls into the candidate's compiled
  functions are counted (the CPU "kernel launched" check), and puts builds in a content-addressed dir.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import types

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

# Namespaces of torch's own compute; ops of any other namespace are the candidate's (TORCH_LIBRARY).
TORCH_NAMESPACES = {"aten", "prims", "quantized", "_quantized", "mkldnn", "mkl", "onednn", "cudnn", "_c10d_functional", "c10d", "rngprims", "inductor", "torchvision"}

# Creation, views, layout/copies and metadata: no arithmetic.
ALLOWED_OPS = {
    # creation
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "scalar_tensor",
    "fill_", "zero_", "resize_", "resize_as_", "lift_fresh", "lift_fresh_copy", "lift",
    # views
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "as_strided_", "permute",
    "transpose", "transpose_", "t", "t_", "expand", "expand_as", "squeeze", "squeeze_", "unsqueeze",
    "unsqueeze_", "select", "slice", "narrow", "split", "split_with_sizes", "chunk", "unbind",
    "flatten", "unflatten", "view_as", "movedim", "alias", "detach", "detach_", "diagonal", "unfold",
    "_conj", "_neg_view", "view_as_real", "view_as_complex",
    # layout / copies (no arithmetic)
    "contiguous", "clone", "copy_", "_to_copy", "to", "_copy_from", "_copy_from_and_resize",
    "record_stream", "_pin_memory", "pin_memory",
    # metadata
    "size", "stride", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "storage_offset",
    "is_contiguous", "dim", "numel", "is_same_size", "_has_compatible_shallow_copy_type",
    "is_pinned", "_local_scalar_dense", "item", "result_type", "is_nonzero",
}


class ForbiddenOp(RuntimeError):
    pass


class OpAudit(TorchDispatchMode):
    """Records torch compute ops run while armed, and raises so they do not silently succeed."""

    def __init__(self):
        super().__init__()
        self.armed = False
        self.poison = False  # fill fresh torch.empty* results with NaN (checked calls, not timed ones)
        self.violations: list[str] = []
        self.stream_use: list[str] = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if self.armed:
            ns = getattr(func, "namespace", "aten")
            name = getattr(func, "_opname", str(func))
            if ns in TORCH_NAMESPACES and name not in ALLOWED_OPS:
                self.violations.append(f"{ns}.{name}")
                raise ForbiddenOp(f"torch op {ns}.{name} called inside ModelNew.forward")
        out = func(*args, **(kwargs or {}))
        if self.armed and self.poison and getattr(func, "_opname", "") in EMPTY_OPS and isinstance(out, torch.Tensor):
            poison_fill(out)
        return out


EMPTY_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


def poison_fill(t: "torch.Tensor") -> None:
    """What uninitialised memory holds in a checked call: NaN (or the integer maximum)."""
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).max)


class Blocker:
    """Wraps module attributes so that they raise (and are recorded) while the audit is armed."""

    def __init__(self, audit: OpAudit):
        self.audit = audit

    def _wrap(self, label: str, fn):
        audit = self.audit

        @functools.wraps(fn)
        def blocked(*a, **k):
            if audit.armed:
                audit.violations.append(label)
                raise ForbiddenOp(f"{label} called inside ModelNew.forward")
            return fn(*a, **k)

        return blocked

    def install(self) -> None:
        for name in dir(F):
            obj = getattr(F, name)
            if callable(obj) and not isinstance(obj, type) and not name.startswith("__") and isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
                setattr(F, name, self._wrap(f"F.{name}", obj))
        for name in ("numpy", "tolist", "__array__"):
            if hasattr(torch.Tensor, name):
                setattr(torch.Tensor, name, self._wrap(f"Tensor.{name}", getattr(torch.Tensor, name)))
        # Threads started in forward escape both the timer and this (thread-local) dispatch mode.
        import _thread

        self._thread_start = threading.Thread.start
        audit = self.audit
        orig_start = threading.Thread.start

        def start(th, *a, **k):
            if audit.armed:
                audit.stream_use.append("threading.Thread.start")
            return orig_start(th, *a, **k)

        threading.Thread.start = start
        _thread.start_new_thread = self._stream_wrap_fn("_thread.start_new_thread", _thread.start_new_thread)
        # Python-side streams: work put on them escapes the current stream's events.
        if hasattr(torch, "cuda"):
            for name in ("Stream", "stream", "set_stream"):
                if hasattr(torch.cuda, name):
                    orig = getattr(torch.cuda, name)
                    setattr(torch.cuda, name, self._stream_wrap(name, orig))

    def _stream_wrap_fn(self, label, orig):
        audit = self.audit

        @functools.wraps(orig)
        def watched(*a, **k):
            if audit.armed:
                audit.stream_use.append(label)
            return orig(*a, **k)

        return watched

    def _stream_wrap(self, name, orig):
        audit = self.audit

        if isinstance(orig, type):
            class Watched(orig):  # type: ignore[misc, valid-type]
                def __new__(cls, *a, **k):
                    if audit.armed:
                        audit.stream_use.append(f"torch.cuda.{name}")
                    return orig.__new__(orig, *a, **k)

            return Watched

        @functools.wraps(orig)
        def watched(*a, **k):
            if audit.armed:
                audit.stream_use.append(f"torch.cuda.{name}")
            return orig(*a, **k)

        return watched


TIMER_NAMES = {
    "time": ["time", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time", "sleep"],
    "torch.cuda": ["synchronize", "Event", "current_stream", "default_stream", "Stream", "stream", "set_stream", "_lazy_init"],
    "torch.cuda.Event": ["record", "elapsed_time", "synchronize", "query", "wait"],
    "torch.cuda.Stream": ["synchronize", "wait_event", "wait_stream", "query", "record_event"],
}


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    obj = importlib.import_module(parts[0])
    for p in parts[1:]:
        obj = getattr(obj, p)
    return obj


class HarnessSnapshot:
    """Identities of the functions the harness relies on; any change means the candidate patched one."""

    def __init__(self, extra_modules: list = ()):
        self.entries: dict[str, tuple[object, str, object]] = {}
        for owner_path, names in TIMER_NAMES.items():
            try:
                owner = _resolve(owner_path)
            except Exception:
                continue
            for n in names:
                if n in vars(owner) if isinstance(owner, type) else hasattr(owner, n):
                    self.entries[f"{owner_path}.{n}"] = (owner, n, getattr(owner, n), "timer")
        others = {
            torch: ["save", "load", "manual_seed", "no_grad", "equal", "allclose", "empty", "empty_like"],
            torch.Tensor: ["copy_", "clone", "cpu", "to", "detach", "data_ptr", "__eq__", "numel", "__class__"],
            torch.nn.Module: ["__call__", "_call_impl", "load_state_dict", "state_dict"],
            torch.profiler: ["profile"],
            TorchDispatchMode: ["__enter__", "__exit__"],
        }
        for owner, names in others.items():
            for n in names:
                if hasattr(owner, n):
                    self.entries[f"{getattr(owner, '__name__', owner)}.{n}"] = (owner, n, getattr(owner, n), "harness")
        for m in extra_modules:
            for n, v in list(vars(m).items()):
                if not n.startswith("__"):
                    self.entries[f"{m.__name__}.{n}"] = (m, n, v, "harness")

    def changed(self) -> str | None:
        """'timer_patched:<name>' / 'harness_patched:<name>', or None when nothing was touched."""
        import sys

        if sys.gettrace() is not None or sys.getprofile() is not None:
            return "timer_patched:sys.settrace"
        for label, (owner, n, orig, kind) in self.entries.items():
            try:
                now = getattr(owner, n)
            except AttributeError:
                now = None
            if now is not orig and not (isinstance(owner, type) and now == orig):
                return f"{'timer' if kind == 'timer' else 'harness'}_patched:{label}"
        return None


def new_python_threads(baseline: set[int]) -> list[str]:
    return [t.name for t in threading.enumerate() if t.ident not in baseline and t.is_alive()]


def _first_include(path: str | None = None, text: str | None = None) -> str | None:
    """The first header a C++ source (a file, or text) includes; gcc uses a PCH only for that one."""
    import re

    if text is None:
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError:
            return None
    m = re.search(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', text, re.M)
    return m.group(1) if m else None


class ExtensionTracker:
    """Intercepts torch.utils.cpp_extension.load_inline / load.

    Builds go to <cache>/torch_extensions/<name>_<hash of sources and flags>, so identical extension
    sources (even in different candidates) build once, and different ones never clobber each other.
    The returned module is wrapped so calls into its functions are counted while the audit is armed.
    """

    def __init__(self, audit: OpAudit, ext_root: str, pch_root: str | None = None):
        self.audit = audit
        self.ext_root = ext_root
        self.pch_root = pch_root  # None: no shared precompiled header (see opsynth.reward.pch)
        self.calls = 0
        self.build_failed: str | None = None
        self.build_s = 0.0
        self.modules: list[str] = []

    def _build_dir(self, name: str, key: str) -> str:
        import os

        d = os.path.join(self.ext_root, f"{name}_{hashlib.sha256(key.encode()).hexdigest()[:16]}")
        os.makedirs(d, exist_ok=True)
        return d

    def _wrap_module(self, mod):
        if not isinstance(mod, types.ModuleType):
            return mod
        tracker = self
        proxy = types.ModuleType(mod.__name__)
        for n in dir(mod):
            v = getattr(mod, n)
            if callable(v) and not n.startswith("__") and not isinstance(v, type):
                def counted(*a, __f=v, **k):
                    if tracker.audit.armed:
                        tracker.calls += 1
                    return __f(*a, **k)

                setattr(proxy, n, counted)
            else:
                setattr(proxy, n, v)
        self.modules.append(mod.__name__)
        return proxy

    def _with_pch(self, skip: bool, kwargs: dict, with_cuda: bool) -> dict:
        """kwargs plus `-I<shared PCH dir>` in extra_cflags, when a shared PCH can be had.

        Applied after the build key is taken, so builds with and without the PCH share a cache entry.
        """
        if not self.pch_root or skip:  # e.g. options passed positionally: leave the call alone
            return kwargs
        from opsynth.reward.pch import pch_include_dir

        cflags = kwargs.get("extra_cflags") or []
        if isinstance(cflags, str):
            cflags = [cflags]
        d = pch_include_dir(self.pch_root, cflags, with_cuda=with_cuda, log=lambda m: print(m, flush=True))
        if d is None:
            return kwargs
        return {**kwargs, "extra_cflags": [f"-I{d}", *cflags]}

    def _timed_build(self, fn, name, build_dir, with_cuda, skip_pch, sources, /, *a, **k):
        """Build (or import an earlier build of) one extension.

        A finished build leaves a marker; later loads import the .so directly, skipping torch's
        ninja round trip (about a second a candidate, which adds up over thousands of rewards).
        """
        import os
        import time

        import torch.utils.cpp_extension as ce

        t0 = time.perf_counter()
        marker = os.path.join(build_dir, ".opsynth_built")
        try:
            if os.path.exists(marker) and os.path.exists(os.path.join(build_dir, f"{name}.so")):
                try:
                    return ce._import_module_from_library(name, build_dir, k.get("is_python_module", True))
                except Exception:
                    pass
            k = self._with_pch(skip_pch, k, with_cuda)  # only for real builds: a cached one needs no PCH
            mod = fn(name, sources, *a, build_directory=build_dir, **k)
            with open(marker, "w") as f:
                f.write(name)
            return mod
        except BaseException as e:
            self.build_failed = f"{type(e).__name__}: {e}"[-4000:]
            raise
        finally:
            self.build_s += time.perf_counter() - t0

    def install(self) -> None:
        import torch.utils.cpp_extension as ce

        orig_inline, orig_load = ce.load_inline, ce.load
        tracker = self

        def _key(*parts) -> str:
            return repr(parts)

        @functools.wraps(orig_inline)
        def load_inline(name, cpp_sources, cuda_sources=None, *args, **kwargs):
            kwargs.pop("build_directory", None)
            key = _key(name, cpp_sources, cuda_sources, args, sorted((k, repr(v)) for k, v in kwargs.items()), torch.__version__)
            bdir = tracker._build_dir(name, key)
            with_cuda = kwargs.get("with_cuda")
            with_cuda = bool(cuda_sources) if with_cuda is None else bool(with_cuda)
            # main.cpp starts with torch/extension.h, unless no_implicit_headers leaves that to the source
            cpp_text = cpp_sources if isinstance(cpp_sources, str) else "\n".join(cpp_sources or [])
            skip_pch = bool(args) or (bool(kwargs.get("no_implicit_headers")) and _first_include(text=cpp_text) != "torch/extension.h")
            mod = tracker._timed_build(orig_inline, name, bdir, with_cuda, skip_pch, cpp_sources, cuda_sources, *args, **kwargs)
            return tracker._wrap_module(mod)

        @functools.wraps(orig_load)
        def load(name, sources, *args, **kwargs):
            kwargs.pop("build_directory", None)
            srcs = [sources] if isinstance(sources, str) else list(sources)
            contents = []
            for s in srcs:
                with open(s, "rb") as f:
                    contents.append(hashlib.sha256(f.read()).hexdigest())
            key = _key(name, contents, args, sorted((k, repr(v)) for k, v in kwargs.items()), torch.__version__)
            bdir = tracker._build_dir(name, key)
            with_cuda = kwargs.get("with_cuda")
            with_cuda = any(s.endswith((".cu", ".cuh")) for s in srcs) if with_cuda is None else bool(with_cuda)
            # gcc uses a PCH only for a translation unit's first include: skip sources that do not
            # start with torch/extension.h (a workspace's raw kernels and pybind11-only bindings).
            use_pch = not args and any(_first_include(s) == "torch/extension.h" for s in srcs if s.endswith((".cpp", ".cc", ".cxx")))
            mod = tracker._timed_build(orig_load, name, bdir, with_cuda, not use_pch, srcs, *args, **kwargs)
            return tracker._wrap_module(mod)

        ce.load_inline = load_inline
        ce.load = load
