"""Builds paid once: a content-addressed extension cache, ccache for each translation unit, and the
trusted service that answers a candidate child's `load_inline` / `load`.

A candidate's child never compiles. Its `load_inline` (intercepted by `guards.ExtensionTracker`)
sends the call's arguments (source text, flags) to this service over its build channel. The service

1. keys the request by everything that decides the output (sources, flags, torch, compilers) and
   answers from `<cache>/ext/<key>/` when that was built before;
2. otherwise builds it in a build child (`build_runner`: compilers only, no candidate code), with
   ccache in front of the host compiler and nvcc, so a translation unit already compiled for another
   candidate (the torch wrapper most completions of a GRPO group share) is not compiled again, and
   with the shared precompiled header (`pch`) for the wrapper;
3. copies the library into the cache itself, keyed by that hash (the child never writes there),
   and answers with its path; the candidate's child loads it from there, read-only.

Before any of this, every request is checked against the allow-list of `build_flags` (flags,
libraries, file names, include paths, the extension's name); a refused one never reaches a compiler,
and the refusal decides the child's verdict (`BuildSession`), whatever the child reports.

The extension is renamed to a name derived from its C++ side (`opsx_<hash>`), because torch passes
the name to every translation unit (`-DTORCH_EXTENSION_NAME`): two candidates whose wrappers are the
same text then compile the same command line, which ccache can share. Python code sees the module
it asked for; only `module.__name__` differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from opsynth.reward.eval_types import RewardConfig

# Arguments of torch's load_inline / load that reach the build; the rest (verbose, build_directory)
# are the harness's business, and `use_pch` too: torch's own PCH is written into torch's install
# folder, where every later build would read it (the service has its own, built by itself: `pch`).
INLINE_ARGS = (
    "cpp_sources", "cuda_sources", "sycl_sources", "functions", "extra_cflags", "extra_cuda_cflags",
    "extra_sycl_cflags", "extra_ldflags", "extra_include_paths", "with_cuda", "with_sycl",
    "is_python_module", "with_pytorch_error_handling", "keep_intermediates", "no_implicit_headers",
)
CPP_SIDE = ("cpp_sources", "functions", "extra_cflags", "extra_include_paths", "with_cuda", "is_python_module", "with_pytorch_error_handling", "no_implicit_headers")
FLAG_LISTS = ("extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags", "extra_include_paths")
FILE_ARGS = ("extra_cflags", "extra_cuda_cflags", "extra_ldflags", "extra_include_paths", "with_cuda", "is_python_module")


def _h(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class BuildStats:
    """What the service did: extension-level hits and misses, and time spent building."""

    requests: int = 0
    refused: int = 0
    ext_hits: int = 0
    builds: int = 0
    build_errors: int = 0
    build_s: float = 0.0
    light_headers: int = 0  # builds that compiled with the light torch/extension.h (light_headers)
    light_fallbacks: int = 0  # ... that were built again as written after the light attempt failed
    lean_cuda: int = 0  # builds whose CUDA units compiled with the lean torch/types.h (light_headers.lean_types_h)
    lean_fallbacks: int = 0  # ... that were built again with the light header after the lean attempt failed
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def as_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items() if k != "lock"}


def _tool_ids() -> dict:
    """Identity of the compilers and torch, part of every key (a new toolchain builds anew)."""
    import torch

    ids = {"torch": torch.__version__, "cuda": torch.version.cuda, "arch": os.environ.get("TORCH_CUDA_ARCH_LIST", "")}
    for name, cmd in (("cxx", [os.environ.get("CXX", "c++"), "--version"]), ("nvcc", [_nvcc_path() or "nvcc", "--version"])):
        try:
            ids[name] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()[-200:]
        except (OSError, subprocess.TimeoutExpired):
            ids[name] = None
    return ids


def _nvcc_path() -> str | None:
    try:
        from torch.utils.cpp_extension import CUDA_HOME

        if CUDA_HOME and os.path.isfile(os.path.join(CUDA_HOME, "bin", "nvcc")):
            return os.path.join(CUDA_HOME, "bin", "nvcc")
    except Exception:
        pass
    return shutil.which("nvcc")


def find_ccache(setting) -> str | None:
    """The ccache binary to put in front of the compilers (`reward.ccache`: true/"auto", false, or a path)."""
    if setting is False or setting in ("false", "off", "none"):
        return None
    if isinstance(setting, str) and setting not in ("auto", "true"):
        return setting if os.access(setting, os.X_OK) else None
    return os.environ.get("OPSYNTH_CCACHE") or shutil.which("ccache")


CCACHE_DIR_ENV = "OPSYNTH_RL_CCACHE_DIR"


def ccache_dir(cache_dir: str | os.PathLike) -> Path:
    """ccache's folder: $OPSYNTH_RL_CCACHE_DIR when set (one compiler cache for several reward caches:
    a test session, several runs on one host), else the reward cache's own `ccache/`. Build children
    write it either way (a translation unit's object is the compiler's output), so a shared folder
    is shared trust: set it only for caches that trust each other's builds."""
    return Path(os.environ.get(CCACHE_DIR_ENV) or Path(cache_dir) / "ccache")


def _launcher(bindir: Path, name: str, text: str) -> str:
    """`bindir/name`, a shell script with this text, replaced atomically when it differs."""
    bindir.mkdir(parents=True, exist_ok=True)
    launcher = bindir / name
    if not launcher.is_file() or launcher.read_text() != text:
        tmp = bindir / f".{name}.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, launcher)
    return str(launcher)


def _nvcc_launcher(bindir: Path, nvcc: str) -> str:
    """`bindir/nvcc`: nvcc through `opsynth.reward.nvcc_parallel` (its host and device front ends side
    by side). Named nvcc so that ccache in front of it treats it as nvcc; the real nvcc's path is in
    its text, so ccache's content check sees another nvcc as another compiler."""
    return _launcher(bindir, "nvcc", f'#!/bin/sh\nexec "{sys.executable}" -m opsynth.reward.nvcc_parallel "{nvcc}" "$@"\n')


def compiler_env(cache_dir: Path, ccache: str | None, parallel_nvcc: bool = False) -> dict[str, str]:
    """Environment for a build child: ccache as the compilers' launcher, its cache under the reward cache.

    Host compiler through a launcher script in CXX (torch runs CXX as one program), nvcc through
    PYTORCH_NVCC (which torch puts into its ninja file verbatim). torch's own automatic wrapper is
    switched off so ccache is never stacked twice. `parallel_nvcc` (`reward.parallel_nvcc`): nvcc
    through `opsynth.reward.nvcc_parallel`, without torch's dependency files (which nvcc writes in a
    pass of its own; a build folder is built once, so ninja never reads them).
    """
    nvcc = _nvcc_path()
    bindir = cache_dir / "bin"
    env: dict[str, str] = {}
    if parallel_nvcc and nvcc:
        nvcc = _nvcc_launcher(bindir, nvcc)
        env["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] = "1"
        if not ccache:
            env["PYTORCH_NVCC"] = nvcc
    if not ccache:
        return {"TORCH_NO_COMPILER_WRAPPER": "1", **env}
    cxx_real = shutil.which(os.environ.get("CXX", "c++")) or "c++"
    launcher = _launcher(bindir, "c++", f'#!/bin/sh\nexec "{ccache}" "{cxx_real}" "$@"\n')
    env = {
        **env,
        "CXX": launcher,
        "TORCH_NO_COMPILER_WRAPPER": "1",
        "CCACHE_DIR": str(ccache_dir(cache_dir)),
        "CCACHE_CONFIGPATH": _ccache_conf(cache_dir),
        # Paths differ per build folder: make them relative so equal sources hash equal.
        "CCACHE_BASEDIR": os.path.realpath(tempfile.gettempdir()),
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_SLOPPINESS": "pch_defines,time_macros,include_file_mtime,include_file_ctime,system_headers",
        "CCACHE_MAXSIZE": "20G",
        "CCACHE_COMPILERCHECK": "content",
    }
    if nvcc:
        env["PYTORCH_NVCC"] = f"{ccache} {nvcc}"
    return env


def _ccache_conf(cache_dir: Path) -> str:
    """ccache's configuration file, written by this trusted process beside the launcher.

    Build children may write the ccache folder, and ccache would otherwise read `ccache.conf` from
    there (where `prefix_command` or `compiler` would run a program in every later build, and in
    `ccache --print-stats` here). Our settings are in the environment; the file stays empty.
    """
    conf = Path(cache_dir) / "bin" / "ccache.conf"
    if not conf.is_file():
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("")
    return str(conf)


def ccache_stats(ccache: str | None, cache_dir: Path) -> dict:
    """ccache's counters for this cache (direct/preprocessed hits, misses), {} without ccache."""
    if not ccache:
        return {}
    try:
        out = subprocess.run([ccache, "--print-stats"], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "CCACHE_DIR": str(ccache_dir(cache_dir)),
                                  "CCACHE_CONFIGPATH": _ccache_conf(cache_dir)}).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    stats = {}
    for line in out.splitlines():
        k, _, v = line.partition("\t")
        if v.strip().isdigit():
            stats[k] = int(v)
    return stats


def tu_hit_counts(before: dict, after: dict) -> tuple[int, int]:
    """(hits, compiles) of translation units between two ccache snapshots."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    hits = d.get("direct_cache_hit", 0) + d.get("preprocessed_cache_hit", 0)
    misses = d.get("cache_miss", 0)
    return hits, hits + misses




class BuildService:
    """The trusted side of every candidate's builds, shared by all children of one evaluation run."""

    def __init__(self, cfg, device: str, log=None):
        self.cfg = cfg
        self.device = device
        self.cache_dir = cfg.resolved_cache_dir()
        self.root = self.cache_dir / "ext"
        self.root.mkdir(parents=True, exist_ok=True)
        self.ccache = find_ccache(getattr(cfg, "ccache", "auto"))
        self.env = compiler_env(self.cache_dir, self.ccache, bool(getattr(cfg, "parallel_nvcc", False)))
        if self.ccache:
            ccache_dir(self.cache_dir).mkdir(parents=True, exist_ok=True)
        self.stats = BuildStats()
        self._ids = None
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._pch_threads: dict[str, threading.Thread] = {}
        self.log = log or (lambda msg: None)
        self.remote = None  # a Dask client: builds then run on any worker (remote_build, below)

    def session(self) -> "BuildSession":
        """A build handler for one child (`run_child(build_handler=...)`) that remembers refusals."""
        return BuildSession(self)

    # -- keys -------------------------------------------------------------------------------------

    def _tool_key(self) -> dict:
        if self._ids is None:
            self._ids = _tool_ids()
        return self._ids

    @staticmethod
    def normalise(req: dict) -> dict:
        """The request with only the arguments that reach the build, in JSON form; raises ValueError."""
        kind = req.get("kind")
        name = str(req.get("name") or "ext")
        allowed = INLINE_ARGS if kind == "inline" else FILE_ARGS
        args = {k: v for k, v in (req.get("args") or {}).items() if k in allowed and v is not None}
        for k in FLAG_LISTS:  # torch iterates a string flag by character; the allow-list reads it as one flag
            if isinstance(args.get(k), str):
                args[k] = [args[k]]
        json.dumps(args)  # raises TypeError for anything but plain data
        out = {"kind": kind, "name": name, "args": args}
        files = req.get("files") or {}
        if not isinstance(files, dict):
            raise ValueError("files is not a mapping")
        if kind == "files" and not files:
            raise ValueError("load() with no source files")
        if kind not in ("files", "inline"):
            raise ValueError(f"unknown build kind {kind!r}")
        if files:  # names as sent: build_flags.check_request refuses any that is not a plain relative one
            out["files"] = dict(files)
        return out

    def build_name(self, req: dict) -> str:
        if req["kind"] != "inline":
            return req["name"]
        cpp = {k: req["args"].get(k) for k in CPP_SIDE}
        cpp["cuda"] = bool(req["args"].get("cuda_sources"))
        return "opsx_" + _h(cpp)[:16]

    def key(self, req: dict) -> str:
        parts = {"req": req, "build_name": self.build_name(req), "tools": self._tool_key()}
        if not getattr(self.cfg, "light_headers", True):
            parts["headers"] = "as_written"  # libraries built with the lighter headers are not answered then
        return _h(parts)[:32]

    # -- PCH --------------------------------------------------------------------------------------

    def _light(self, req: dict) -> bool:
        """Whether this request is first built with the light torch/extension.h (`light_headers`)."""
        from opsynth.reward.light_headers import may_build_light

        return bool(getattr(self.cfg, "light_headers", True)) and may_build_light(req)

    def _lean(self, req: dict) -> bool:
        """Whether a light build's CUDA units are first built with the lean torch/types.h (`lean_cuda_headers`)."""
        from opsynth.reward.light_headers import may_build_lean

        return bool(getattr(self.cfg, "lean_cuda_headers", True)) and may_build_lean(req)

    def _flags(self, req: dict) -> tuple[list[str], bool]:
        """(the C++ flags, with CUDA) that decide which PCH a request can use."""
        args = req["args"]
        cflags = args.get("extra_cflags") or []
        cflags = [cflags] if isinstance(cflags, str) else list(cflags)
        return cflags, bool(args.get("cuda_sources")) or any(n.endswith(".cu") for n in req.get("files", {}))

    def _pch_dir(self, req: dict, light: bool = False, start: bool = True) -> str | None:
        """The shared PCH for this request's flags (of the light header with `light`) when it is
        built; else start building it (for the next candidates, unless not `start`) and build this one
        without it, so a cold first evaluation never waits for it."""
        if not getattr(self.cfg, "shared_pch", True):
            return None
        from opsynth.reward import pch

        args = req["args"]
        if req["kind"] == "inline":
            cpp = args.get("cpp_sources") or ""
            cpp = cpp if isinstance(cpp, str) else "\n".join(cpp)
            if args.get("no_implicit_headers") and pch.first_include(cpp) != "torch/extension.h":
                return None
        else:
            srcs = [t for n, t in req["files"].items() if n.endswith((".cpp", ".cc", ".cxx"))]
            if not any(pch.first_include(t) == "torch/extension.h" for t in srcs):
                return None
        cflags, with_cuda = self._flags(req)
        ready = pch.pch_ready(pch.pch_root(self.cache_dir), cflags, with_cuda, light)
        if ready is not None or not start:
            return ready or None
        tkey = repr((cflags, with_cuda, light))
        with self._locks_lock:
            t = self._pch_threads.get(tkey)
            if t is None:
                t = threading.Thread(
                    target=pch.pch_include_dir, args=(pch.pch_root(self.cache_dir), cflags, with_cuda, self.log, light),
                    daemon=True)
                self._pch_threads[tkey] = t
                t.start()
        return None

    # -- the service ------------------------------------------------------------------------------

    def handle(self, raw: dict, cache_only: bool = False) -> dict:
        """One build request from a child: {"ok", "dir", "name", "cached"} or {"ok": False, "error"}.
        `cache_only`: the child is inside its timed rounds, where builds are paused (`quiet`): an
        extension built before is answered, anything else is refused rather than waited for."""
        from opsynth.reward import build_flags

        try:
            req = self.normalise(raw)
        except (TypeError, ValueError) as e:
            return {"ok": False, "error": f"unsupported build arguments: {e}"}
        with self.stats.lock:
            self.stats.requests += 1
        refused = build_flags.check_request(req)  # before any key, PCH or compiler sees the arguments
        if refused:
            with self.stats.lock:
                self.stats.refused += 1
            self.log(f"[reward] build of {req['name']!r} refused: {refused}")
            return {"ok": False, "refused": refused,
                    "error": f"{refused}: not on the build service's allow-list of compiler arguments; nothing was compiled"}
        key = self.key(req)
        name = self.build_name(req)
        with self._locks_lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # identical requests in flight build once
            hit = self._lookup(key, name)
            if hit is not None:
                with self.stats.lock:
                    self.stats.ext_hits += 1
                return {"ok": True, "dir": str(hit), "name": name, "cached": True}
            if cache_only:
                return {"ok": False, "error": "no builds during the timed calls: build every extension at import time"}
            if self.remote is not None:
                return self._build_remote(req, key, name)
            return self._build(req, key, name)

    def _publish(self, key: str, name: str, write, meta: dict) -> Path:
        """Put a library into the cache under its key (this trusted process is the only writer)."""
        final = self.root / key
        tmp = self.root / f".{key}.{os.getpid()}.{threading.get_ident()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write(tmp / f"{name}.so")
        (tmp / "meta.json").write_text(json.dumps({"name": name, "key": key, **meta}))
        try:
            os.replace(tmp, final)
        except OSError:  # another process published the same key first: same bytes, keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def _build_remote(self, req: dict, key: str, name: str) -> dict:
        import dataclasses

        t0 = time.perf_counter()
        reply = self.remote.submit(remote_build, req, dataclasses.asdict(self.cfg), self.device, pure=False).result()
        wall = time.perf_counter() - t0
        with self.stats.lock:
            self.stats.builds += 1
            self.stats.build_s += wall
        if not reply.get("ok"):
            with self.stats.lock:
                self.stats.build_errors += 1
            return {"ok": False, "error": reply.get("error", "remote build failed"), "build_s": round(wall, 3)}
        data = reply.pop("so_bytes")
        final = self._publish(key, name, lambda p: p.write_bytes(data), {"request_name": req["name"], "remote": True, "built_s": round(wall, 3)})
        return {"ok": True, "dir": str(final), "name": name, "cached": bool(reply.get("cached")), "build_s": round(wall, 3), "remote": True}

    def _lookup(self, key: str, name: str) -> Path | None:
        d = self.root / key
        return d if (d / f"{name}.so").is_file() and (d / "meta.json").is_file() else None

    def _build(self, req: dict, key: str, name: str) -> dict:
        from opsynth.reward import quiet
        from opsynth.reward.eval_types import BUILD_RUNNERS
        from opsynth.runtime.sandbox import run_child

        scratch = Path(tempfile.mkdtemp(prefix="opsynth_build_"))
        t0 = time.perf_counter()
        try:
            from opsynth.reward import pch

            light_dir = None
            if self._light(req):  # the light header's folder (its PCH beside it once built), torch's own PCH if ready
                self._pch_dir(req, light=True)  # built in the background for the next candidates
                light_dir = pch.light_include_dir(pch.pch_root(self.cache_dir), *self._flags(req))
                pch_dir = self._pch_dir(req, start=False)
            else:
                pch_dir = self._pch_dir(req)
            has_pch = Path(light_dir, "torch", "extension.h.gch").is_file() if light_dir else pch_dir is not None
            self.log(f"[reward] building extension {req['name']} ({'light headers, ' if light_dir else ''}"
                     f"{'with' if has_pch else 'without'} the shared PCH)")
            job = {
                "request": req,
                "build_name": name,
                "out_dir": str(scratch / "build"),
                "pch_dir": pch_dir,
                "light_dir": light_dir,
                "lean_cuda": bool(light_dir) and self._lean(req),
                "cpu_threads": 1,
                "device": self.device,
                "result_path": str(scratch / "build_result.json"),
            }
            writable = [str(ccache_dir(self.cache_dir))] if self.ccache else []
            with quiet.tracked("build") as on_start:  # paused while anything is timed
                res = run_child("opsynth.reward.build_runner", job, scratch, self.cfg.build_timeout_s, self.cfg, warm=BUILD_RUNNERS,
                                light=True, writable=writable, env_extra=self.env, shared_ids=True,
                                readable=[d for d in (pch_dir, light_dir) if d], on_start=on_start)
            wall = time.perf_counter() - t0
            paused = {"paused_s": on_start.paused_s, "server_wait_s": res.server_wait_s}  # where a cold build's wall goes
            with self.stats.lock:
                self.stats.builds += 1
                self.stats.build_s += wall
            if res.reason != "ok":
                with self.stats.lock:
                    self.stats.build_errors += 1
                detail = res.data.get("detail") or res.log
                return {"ok": False, "error": f"{res.reason}: {detail}"[-6000:], "build_s": round(wall, 3), **paused}
            so = Path(res.data["so"])
            if not so.is_file() or not so.resolve().is_relative_to(scratch.resolve()):
                return {"ok": False, "error": "the build child reported a library outside its folder"}
            headers = res.data.get("headers", "as_written")
            final = self._publish(key, name, lambda p: shutil.copy2(so, p),
                                  {"request_name": req["name"], "built_s": round(wall, 3), "pch": bool(pch_dir), "headers": headers})
            with self.stats.lock:
                self.stats.light_headers += headers == "light"
                self.stats.lean_cuda += headers == "lean_cuda"
                self.stats.lean_fallbacks += res.data.get("lean_attempt_s") is not None and headers != "lean_cuda"
                self.stats.light_fallbacks += headers == "as_written_after_light_failed"
            return {"ok": True, "dir": str(final), "name": name, "cached": False, "build_s": round(wall, 3), "headers": headers,
                    "compile_s": res.data.get("build_s"), **paused}
        finally:
            if not getattr(self.cfg, "keep_scratch", False):
                shutil.rmtree(scratch, ignore_errors=True)


class BuildSession:
    """One child's build channel: answers through the service and remembers the first refusal.

    A refused request decides that child's verdict (`overrule`) whatever the child reports: the
    child is the candidate's, and it could catch the error and build something else instead.
    """

    def __init__(self, service: BuildService):
        self.service = service
        self.refused: str | None = None

    def __call__(self, raw: dict, cache_only: bool = False) -> dict:
        reply = self.service.handle(raw, cache_only)
        if reply.get("refused") and self.refused is None:
            self.refused = str(reply["refused"])
        return reply

    def overrule(self, res):
        """The child's result (`sandbox.ChildResult`), with the refusal as its reason when there was one."""
        if self.refused is None:
            return res
        import dataclasses

        detail = f"{self.refused}: refused by the build service before any compiler ran"
        data = {**(res.data or {}), "reason": self.refused, "detail": detail}
        return dataclasses.replace(res, reason=self.refused, data=data, log=(res.log + "\n[reward] " + detail).strip())


_services: dict = {}
_services_lock = threading.Lock()


def build_service(cfg: RewardConfig, device: str, log=None):
    """The build service of this process for a cache and device (one, shared by every batch)."""
    key = (str(cfg.resolved_cache_dir()), device, str(cfg.ccache), cfg.shared_pch)
    with _services_lock:
        svc = _services.get(key)
        if svc is None:
            svc = _services[key] = BuildService(cfg, device, log=log)
        elif log is not None:
            svc.log = log
        return svc


def remote_build(raw: dict, cfg_dict: dict, device: str) -> dict:
    """On any Dask worker: one trusted build; the library travels back as bytes."""
    cfg = RewardConfig.from_dict(cfg_dict)
    svc = build_service(cfg, device)
    reply = svc.handle(raw)
    if reply.get("ok"):
        reply["so_bytes"] = (Path(reply["dir"]) / f"{reply['name']}.so").read_bytes()
    return reply
