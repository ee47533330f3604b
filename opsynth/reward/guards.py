"""Runtime guards around ModelNew.forward, inside the candidate child. These are the authority;
the static pre-check only saves time on the obvious cases.

- OpAudit: a TorchDispatchMode that poisons (NaN-fills) every uninitialised allocation in checked
  calls, so an output that was never written cannot pass off stale memory as a result; and records every aten/prims op executed while armed (also ops that
  C++ extension code calls through the dispatcher, e.g. at::matmul); only creation, view, copy and
  metadata ops are allowed. The extension's own pybind functions never reach the dispatcher.
- torch.nn.functional and Tensor -> numpy/list escapes raise while armed (CUDA-Agent blocks F).
- HarnessSnapshot: identities of timers, synchronisation and harness functions, the code objects
  they run and the C pointers behind builtin timers, captured before the candidate runs, compared
  after each phase.
- ExtensionTracker: wraps what load_inline / load return so calls into the candidate's compiled
  functions are counted (the CPU "kernel launched" check), and puts builds in a content-addressed dir.
"""

from __future__ import annotations

import builtins
import functools
import json
import json.encoder
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
        self.watch_upcast = False  # a reduced-precision task: record widening conversions (upcasts)
        self.upcasts: list[str] = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if self.armed:
            ns = getattr(func, "namespace", "aten")
            name = getattr(func, "_opname", str(func))
            if ns in TORCH_NAMESPACES and name not in ALLOWED_OPS:
                self.violations.append(f"{ns}.{name}")
                raise ForbiddenOp(f"torch op {ns}.{name} called inside ModelNew.forward")
        out = func(*args, **(kwargs or {}))
        if self.armed and self.watch_upcast and getattr(func, "_opname", "") in CONVERSION_OPS:
            why = widening(func, args, out)
            if why:
                self.upcasts.append(why)
        if self.armed and self.poison and getattr(func, "_opname", "") in EMPTY_OPS and isinstance(out, torch.Tensor):
            poison_fill(out)
        return out


EMPTY_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
# Allowed ops that can change a tensor's dtype: on a reduced-precision task, one that widens a
# floating tensor of more than one element (bf16 -> float32) is a float32 computation in the making.
CONVERSION_OPS = {"_to_copy", "to", "copy_", "_copy_from", "_copy_from_and_resize"}


def widening(func, args, out) -> str | None:
    """'aten.<op> <from> -> <to> of shape ...' when this conversion widens a floating tensor, else None."""
    name = getattr(func, "_opname", "")
    if name == "copy_" and len(args) >= 2:
        dst, src = args[0], args[1]
    elif name in ("_copy_from", "_copy_from_and_resize") and len(args) >= 2:
        src, dst = args[0], args[1]
    else:
        src, dst = (args[0] if args else None), out
    if not (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)):
        return None
    if not (src.is_floating_point() and dst.is_floating_point()) or src.numel() <= 1:
        return None
    if torch.finfo(dst.dtype).bits <= torch.finfo(src.dtype).bits:
        return None
    return (f"aten.{name} widened a {str(src.dtype).removeprefix('torch.')} tensor of shape {tuple(src.shape)} "
            f"to {str(dst.dtype).removeprefix('torch.')}")


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
                    obj = orig.__new__(orig, *a, **k)
                    # torch.cuda.current_stream() builds its answer through this class (the name is
                    # looked up in torch.cuda's globals): a handle on the stream forward is timed on,
                    # which a CUDA launch needs, is not a side stream. Any other stream is.
                    if audit.armed and not is_current_stream(obj):
                        audit.stream_use.append(f"torch.cuda.{name}")
                    return obj

            return Watched

        @functools.wraps(orig)
        def watched(*a, **k):
            if audit.armed:
                audit.stream_use.append(f"torch.cuda.{name}")
            return orig(*a, **k)

        return watched


def is_current_stream(stream) -> bool:
    """Whether `stream` is its device's current stream, read from torch's C++ state (not through
    torch.cuda.current_stream, which constructs a Stream and would come back here)."""
    try:
        import torch

        sid, dev, dtype = torch._C._cuda_getCurrentStream(stream.device_index)[:3]
        return (stream.stream_id, stream.device_index, stream.device_type) == (sid, dev, dtype)
    except Exception:  # anything unreadable counts as a side stream
        return False


TIMER_NAMES = {
    "time": ["time", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time", "sleep",
             "thread_time", "time_ns", "clock_gettime", "clock_gettime_ns"],
    "statistics": ["median", "mean", "fmean", "quantiles"],
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


def _native_words(obj) -> tuple | None:
    """The C function pointers behind a builtin function or C method (None for anything else):
    native code that rewrites them keeps the object's identity, so identities alone miss it."""
    import ctypes

    kind = type(obj).__name__
    try:
        if kind == "builtin_function_or_method":  # PyCFunctionObject: m_ml at 16, vectorcall at 48
            ml = ctypes.c_void_p.from_address(id(obj) + 16).value
            vc = ctypes.c_void_p.from_address(id(obj) + 48).value
        elif kind == "method_descriptor":  # PyMethodDescrObject: d_method at 40, vectorcall at 48
            ml = ctypes.c_void_p.from_address(id(obj) + 40).value
            vc = ctypes.c_void_p.from_address(id(obj) + 48).value
        else:
            return None
        meth = ctypes.c_void_p.from_address(ml + 8).value if ml else None  # PyMethodDef.ml_meth
        return (ml, meth, vc)
    except (ValueError, OSError):
        return None


def _code_state(fn) -> tuple:
    """What a Python function runs: its code object (and that code's bytes, which native code could
    edit in place), defaults and closure contents. Identity of the function alone misses
    `f.__code__ = g.__code__`."""
    code = fn.__code__
    cells = tuple(id(c.cell_contents) if _cell_full(c) else None for c in (fn.__closure__ or ()))
    return (code, hash(code.co_code), code.co_consts, fn.__defaults__, repr(fn.__kwdefaults__), cells)


def _cell_full(c) -> bool:
    try:
        c.cell_contents
        return True
    except ValueError:
        return False


def _functions(owner, label: str, depth: int = 0):
    """Python functions reachable from a module or class (methods of classes defined there too)."""
    home = owner.__name__ if isinstance(owner, types.ModuleType) else owner.__module__
    for n, v in list(vars(owner).items()):
        if n.startswith("__") and n not in ("__call__", "__init__", "__enter__", "__exit__"):
            continue
        if isinstance(v, (staticmethod, classmethod)):
            v = v.__func__
        if isinstance(v, property):
            for part, f in (("fget", v.fget), ("fset", v.fset)):
                if isinstance(f, types.FunctionType):
                    yield f"{label}.{n}.{part}", f
        elif isinstance(v, types.FunctionType):
            yield f"{label}.{n}", v
        elif isinstance(v, type) and depth < 2 and v.__module__ == home:  # classes defined there, not imported
            yield from _functions(v, f"{label}.{n}", depth + 1)


def _classes(owner, label: str, depth: int = 0):
    """(class, label) of the classes defined in a module (or nested in them, two levels), not imported."""
    home = owner.__name__ if isinstance(owner, types.ModuleType) else owner.__module__
    for n, v in list(vars(owner).items()):
        if isinstance(v, type) and depth < 2 and v.__module__ == home:
            yield v, f"{label}.{n}"
            yield from _classes(v, f"{label}.{n}", depth + 1)


def _class_methods(owner, label: str):
    """(class, name, label) of the functions, static and class methods and properties of the classes
    `_classes` finds, as `_functions` finds them."""
    for cls, cls_label in _classes(owner, label):
        for an, av in list(vars(cls).items()):
            if an.startswith("__") and an not in ("__call__", "__init__", "__enter__", "__exit__"):
                continue
            if isinstance(av, (types.FunctionType, staticmethod, classmethod, property)):
                yield cls, an, f"{cls_label}.{an}"


class HarnessSnapshot:
    """Identities of the functions the harness relies on; any change means the candidate patched one.

    Also what those functions run: the code objects of every Python function in the harness's
    modules, of the timers written in Python (torch.cuda.synchronize, Event.elapsed_time, statistics)
    and of nn.Module's call path; and the C function pointers behind builtin timers (time.perf_counter).

    `class_methods` (False only for tests' controls: RewardConfig.disabled_guards "harness_class_methods")
    is what a harness object's method lookups resolve to: the methods of the classes defined in the
    harness modules, every attribute of those classes (an added `__getattribute__` bypasses the
    methods it leaves in place), and the class of each watched instance (`timer.__class__ = Sub`
    keeps the instance's attributes and Timer's methods as they were).

    Bind `changed` and `hooks_changed` before the candidate runs and call those: looked up on the
    instance at check time they are class attributes of a harness class like any other, which a
    candidate can rebind to find nothing (tests/reward/candidates/cpu/snapshot_patch.py)."""

    def __init__(self, extra_modules: list = (), class_methods: bool = True):
        self.entries: dict[str, tuple[object, str, object]] = {}
        self.code: dict[str, tuple[object, tuple]] = {}
        self.native: dict[str, tuple[object, tuple]] = {}
        self.hooks = _hook_state()
        self.watched: dict[str, tuple[object, dict, type]] = {}
        self.class_methods = class_methods
        self.classes: dict[str, tuple[type, dict]] = {}  # label -> (class, its attributes as they were)
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
            # what the child's reply goes through (rounds.Channel.request: json.dumps; run_rounds:
            # float(ms)): rebinding either shaves the reported time without touching a harness name
            json: ["dumps", "loads"],
            json.encoder: ["c_make_encoder", "encode_basestring_ascii", "JSONEncoder"],
            json.encoder.JSONEncoder: ["encode", "iterencode", "default"],
            builtins: ["float", "int", "min", "max", "sum", "sorted", "len", "round", "abs"],
        }
        for owner, names in others.items():
            for n in names:
                if hasattr(owner, n):
                    self.entries[f"{getattr(owner, '__name__', owner)}.{n}"] = (owner, n, getattr(owner, n), "harness")
        for m in extra_modules:
            for n, v in list(vars(m).items()):
                if not n.startswith("__"):
                    self.entries[f"{m.__name__}.{n}"] = (m, n, v, "harness")
            if not class_methods:
                continue
            # and the methods of the classes defined there: `Timer.time_call = fast` rebinds no module
            # name and leaves the old function's code as it was
            for owner, n, label in _class_methods(m, m.__name__):
                self.entries[label] = (owner, n, getattr(owner, n), "harness")
            for cls, label in _classes(m, m.__name__):
                self.classes[label] = (cls, dict(vars(cls)))
        import statistics

        for label, (owner, n, v, kind) in list(self.entries.items()):
            fn = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
            if isinstance(fn, types.FunctionType):
                self.code[label] = (fn, _code_state(fn), kind)
            words = _native_words(fn)
            if words is not None:
                self.native[label] = (fn, words, kind)
        for m in [*extra_modules, statistics]:
            for label, fn in _functions(m, m.__name__):
                self.code.setdefault(label, (fn, _code_state(fn), "timer" if m is statistics else "harness"))
        for owner in (torch.cuda.Event, torch.nn.Module):
            for label, fn in _functions(owner, f"{owner.__module__}.{owner.__qualname__}", depth=2):
                self.code.setdefault(label, (fn, _code_state(fn), "timer" if owner is torch.cuda.Event else "harness"))

    def watch(self, label: str, obj) -> None:
        """Also check an instance's attributes (a Timer's bound synchronise and event type) and its class."""
        self.watched[label] = (obj, dict(vars(obj)), type(obj))

    def hooks_changed(self) -> str | None:
        """'harness_patched:<hook>' when a way to run code in the harness's own time was set up (cheap:
        checked after every timed call), or None. A gc callback with the collection threshold at 1
        runs at nearly every allocation the harness makes: between writing a call's inputs and the
        clock it computed that call's outputs, and the timed call only copied them out
        (tests/reward/candidates/cpu/precompute.py, registered from C++)."""
        now = _hook_state()
        for name, (before, after) in zip(("gc.callbacks", "gc.set_threshold", "gc.enable/disable", "signal.setitimer"),
                                         zip(self.hooks, now)):
            if before != after:
                return f"harness_patched:{name}"
        return None

    def changed(self) -> str | None:
        """'timer_patched:<name>' / 'harness_patched:<name>', or None when nothing was touched."""
        import sys

        if sys.gettrace() is not None or sys.getprofile() is not None:
            return "timer_patched:sys.settrace"
        hooked = self.hooks_changed()
        if hooked:
            return hooked
        for label, (fn, state, kind) in self.code.items():
            if _code_state(fn) != state:
                return f"{'timer' if kind == 'timer' else 'harness'}_patched:{label}.__code__"
        for label, (fn, words, kind) in self.native.items():
            if _native_words(fn) != words:
                return f"{'timer' if kind == 'timer' else 'harness'}_patched:{label} (native)"
        for label, (obj, attrs, cls) in self.watched.items():
            now = vars(obj)
            if now.keys() != attrs.keys() or any(now[k] is not v for k, v in attrs.items()):
                return f"timer_patched:{label}"
            if self.class_methods and type(obj) is not cls:
                return f"timer_patched:{label}.__class__"
        for label, (cls, attrs) in self.classes.items():
            now = vars(cls)
            if now.keys() != attrs.keys():
                added = sorted(now.keys() - attrs.keys()) or sorted(attrs.keys() - now.keys())
                return f"harness_patched:{label}.{added[0]}"
            for k, v in attrs.items():
                if now[k] is not v:
                    return f"harness_patched:{label}.{k}"
        for label, (owner, n, orig, kind) in self.entries.items():
            try:
                now = getattr(owner, n)
            except AttributeError:
                now = None
            if now is not orig and not (isinstance(owner, type) and now == orig):
                return f"{'timer' if kind == 'timer' else 'harness'}_patched:{label}"
        return None


def _hook_state() -> tuple:
    """What lets code run at times the harness does not call it: gc's callbacks (by identity), its
    thresholds and switch, and the interval timers that deliver signals."""
    import gc
    import signal

    timers = tuple(signal.getitimer(w) for w in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF))
    return tuple(id(c) for c in gc.callbacks), gc.get_threshold(), gc.isenabled(), tuple(t != (0.0, 0.0) for t in timers)


def new_python_threads(baseline: set[int]) -> list[str]:
    return [t.name for t in threading.enumerate() if t.ident not in baseline and t.is_alive()]


class ExtensionTracker:
    """Intercepts torch.utils.cpp_extension.load_inline / load in the candidate's child.

    The child never compiles: the call's arguments go to the trusted build service over the child's
    build channel (`opsynth.reward.builds`), which answers with a library in the read-only extension
    cache, built from exactly that text (or found there from an earlier candidate). The returned
    module is wrapped so calls into its functions are counted while the audit is armed.

    No path reaches the build service: sources and the headers of include folders travel as text,
    read only from inside the candidate's own folder (real paths, symlinks resolved), so a build is
    keyed by everything it reads and never reads another folder. Flags travel as written: the
    service checks them (`build_flags`) and answers a refusal at once, before any compiler runs.
    """

    # Upload limits for one build (headers of include folders): beyond them the compiler reports the
    # missing header, as it would for a file that is not there.
    MAX_UPLOAD_FILES = 512
    MAX_UPLOAD_BYTES = 16 * 2**20

    def __init__(self, audit: OpAudit, build_fd: int | None, root: str | None = None):
        self.audit = audit
        self.build_fd = build_fd
        self.root = root  # the candidate's own folder (default: the working folder at install time)
        self.calls = 0
        self.build_failed: str | None = None
        self.build_s = 0.0
        self.modules: list[str] = []
        self.builds: list[dict] = []  # per extension: name, cached, build_s
        self._chan = None

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

    def _request(self, req: dict) -> dict:
        import json
        import os

        if self.build_fd is None:
            return {"ok": False, "error": "no build service in this child"}
        if self._chan is None:
            self._chan = os.fdopen(self.build_fd, "r+b", buffering=0)
        self._chan.write(json.dumps(req).encode() + b"\n")
        line = b""
        while not line.endswith(b"\n"):
            chunk = self._chan.readline()
            if not chunk:
                return {"ok": False, "error": "the build service closed the channel"}
            line += chunk
        return json.loads(line)

    # -- uploads: paths never travel, files do (only from inside the candidate's own folder) ----------

    def _inside(self, path) -> str | None:
        """The real path of `path` when it lies inside the candidate's folder (symlinks resolved)."""
        import os

        if not isinstance(path, str) or not path:
            return None
        real = os.path.realpath(path)
        return real if os.path.commonpath([real, self.root]) == self.root else None

    def _read(self, path: str, files: dict, name: str) -> None:
        import os

        size = sum(len(t) for t in files.values())
        if len(files) >= self.MAX_UPLOAD_FILES or size + os.path.getsize(path) > self.MAX_UPLOAD_BYTES:
            return
        with open(path, errors="replace") as f:
            files[name] = f.read()

    def _upload_includes(self, paths, files: dict) -> list:
        """Include folders inside the candidate's folder travel as their headers, under `inc<k>/`,
        and the include path becomes that relative name (the build child writes the files into its
        own folder). Any other path is passed on as written, for the build service to refuse."""
        import os

        from opsynth.reward.build_flags import HEADER_SUFFIXES, MAX_DEPTH

        paths = [paths] if isinstance(paths, str) else list(paths or [])
        out = []
        for k, p in enumerate(paths):
            real = self._inside(p)
            if real is None:
                out.append(p)
                continue
            name = f"inc{k}"
            out.append(name)
            for dirpath, dirnames, filenames in os.walk(real):  # symlinked folders are not followed
                rel_dir = os.path.relpath(dirpath, real)
                if rel_dir.count(os.sep) >= MAX_DEPTH - 2:
                    dirnames[:] = []
                for fn in sorted(filenames):
                    fp = os.path.join(dirpath, fn)
                    inner = self._inside(fp)
                    if fn.endswith(HEADER_SUFFIXES) and inner and os.path.commonpath([inner, real]) == real:
                        self._read(inner, files, os.path.normpath(f"{name}/{rel_dir}/{fn}"))
        return out

    def _upload_sources(self, srcs: list, files: dict) -> None:
        """load()'s sources and the headers beside them, by file name; a source outside the
        candidate's folder travels as its path, which the build service refuses."""
        import os

        from opsynth.reward.build_flags import HEADER_SUFFIXES

        dirs = []
        for p in srcs:
            real = self._inside(p)
            if real is None or not os.path.isfile(real):
                files[str(p)] = ""
                continue
            self._read(real, files, os.path.basename(p))
            dirs.append(os.path.dirname(real))
        for d in dict.fromkeys(dirs):  # headers beside the sources travel too (a workspace's kernels/*.cuh)
            for fn in sorted(os.listdir(d)):
                fp = os.path.join(d, fn)
                if fn.endswith(HEADER_SUFFIXES) and fn not in files and self._inside(fp) and os.path.isfile(fp):
                    self._read(os.path.realpath(fp), files, fn)

    def _build(self, req: dict, is_python_module: bool):
        import time

        import torch.utils.cpp_extension as ce

        t0 = time.perf_counter()
        try:
            reply = self._request(req)
        finally:
            self.build_s += time.perf_counter() - t0
        if not reply.get("ok"):
            self.build_failed = str(reply.get("error", "build failed"))[-4000:]
            raise RuntimeError(f"Error building extension '{req.get('name')}': {self.build_failed}")
        self.builds.append({"name": req.get("name"), "cached": bool(reply.get("cached")), "build_s": reply.get("build_s"),
                            "headers": reply.get("headers"),  # lean_cuda, light, ... (opsynth.reward.light_headers)
                            # where a build's wall went: its compilers, quiet windows, its fork server's start
                            **{k: reply.get(k) for k in ("compile_s", "paused_s", "server_wait_s") if reply.get(k) is not None}})
        return ce._import_module_from_library(reply["name"], reply["dir"], is_python_module)

    def install(self) -> None:
        import inspect
        import os

        import torch.utils.cpp_extension as ce

        orig_inline, orig_load = ce.load_inline, ce.load
        sig_inline, sig_load = inspect.signature(orig_inline), inspect.signature(orig_load)
        tracker = self
        if self.root is None:  # before any candidate code runs, the working folder is its own
            self.root = os.path.realpath(os.getcwd())

        def _plain(bound) -> dict:
            args = dict(bound.arguments)
            args.pop("build_directory", None)
            args.pop("verbose", None)
            extra = args.pop("kwargs", None)
            if extra:
                args.update(extra)
            return args

        @functools.wraps(orig_inline)
        def load_inline(*args, **kwargs):
            bound = sig_inline.bind(*args, **kwargs)
            a = _plain(bound)
            name = a.pop("name")
            is_py = a.get("is_python_module", True)
            req = {"kind": "inline", "name": name, "args": a}
            if a.get("extra_include_paths"):
                req["files"] = {}
                a["extra_include_paths"] = tracker._upload_includes(a["extra_include_paths"], req["files"])
            mod = tracker._build(req, is_py)
            return tracker._wrap_module(mod)

        @functools.wraps(orig_load)
        def load(*args, **kwargs):
            bound = sig_load.bind(*args, **kwargs)
            a = _plain(bound)
            name = a.pop("name")
            sources = a.pop("sources")
            srcs = [sources] if isinstance(sources, str) else list(sources)
            files: dict = {}
            tracker._upload_sources(srcs, files)
            if a.get("extra_include_paths"):
                a["extra_include_paths"] = tracker._upload_includes(a["extra_include_paths"], files)
            is_py = a.get("is_python_module", True)
            mod = tracker._build({"kind": "files", "name": name, "files": files, "args": a}, is_py)
            return tracker._wrap_module(mod)

        ce.load_inline = load_inline
        ce.load = load
