"""A shared precompiled `torch/extension.h` for candidate builds (gcc on Linux only).

Every `load_inline` build compiles a `main.cpp` whose first line includes `torch/extension.h`, and
parsing that header is most of the C++ side of a build (on a 2-core Xeon: 19 s of a 32 s -O3 compile
of the bindings; 6.5 s with the header precompiled). Reward evaluation builds thousands of distinct
candidates, so the header is worth precompiling once.

torch has a `use_pch` switch, but it writes `extension.h.gch` into torch's own install directory,
racing when many builds run at once and failing on a read-only install. This one lives in the reward
cache: one header per exact compiler command (flags included; gcc rejects a PCH built with other
flags), built once under a file lock, published with an atomic rename. Builds only gain an
`-I<dir>` flag: gcc looks for `torch/extension.h.gch` in that directory first and, if the PCH does
not fit, silently falls back to the real header (a symlink next to it), so the worst case is the
old build time, never a wrong build.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import shlex
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from opsynth.reward.light_headers import LIGHT_EXTENSION_H

PCH_TIMEOUT_S = 600.0
PCH_DIR_ENV = "OPSYNTH_RL_PCH_DIR"


def first_include(text: str) -> str | None:
    """The first header a C++ source includes; gcc uses a PCH only for that one."""
    import re

    m = re.search(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', text, re.M)
    return m.group(1) if m else None


def pch_root(cache_dir: str | os.PathLike) -> str:
    """Where PCHs live: $OPSYNTH_RL_PCH_DIR when set (one PCH for several reward caches), else the cache.

    A PCH depends only on the compiler, torch and the flags, so sharing it across caches is safe.
    """
    return os.environ.get(PCH_DIR_ENV) or str(cache_dir)


def _torch_cflags(extra_cflags: list[str], with_cuda: bool) -> list[str] | None:
    """The exact C++ flags torch would use for this build, read from the ninja file it writes.

    Asking torch (rather than copying its rules) keeps the PCH valid across torch versions, whose
    flags change (the C++ standard, ABI macros, include sets).
    """
    import torch.utils.cpp_extension as ce

    writer = getattr(ce, "_write_ninja_file_to_build_library", None)
    if writer is None:
        return None
    with tempfile.TemporaryDirectory(prefix="opsynth_pchflags_") as d:
        src = os.path.join(d, "main.cpp")
        Path(src).write_text("")
        args = {
            "path": os.path.join(d, "build.ninja"),
            "name": "opsynth_pch_probe",
            "sources": [src],
            "extra_cflags": list(extra_cflags),
            "extra_cuda_cflags": [],
            "extra_sycl_cflags": [],
            "extra_ldflags": [],
            "extra_include_paths": [],
            "with_cuda": with_cuda,
            "with_sycl": False,
            "is_standalone": False,
        }
        params = inspect.signature(writer).parameters
        writer(**{k: v for k, v in args.items() if k in params})
        for line in Path(args["path"]).read_text().splitlines():
            if line.startswith("cflags = "):
                flags = shlex.split(line[len("cflags = ") :])
                # The extension's name is a macro the header never reads; gcc accepts the PCH with
                # any value of it, so one PCH serves every extension.
                return [f for f in flags if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    return None


def _without_include_paths(flags: list[str]) -> list[str]:
    out, skip_next = [], False
    for f in flags:
        if skip_next:
            skip_next = False
        elif f in ("-I", "-isystem", "-iquote", "-idirafter"):
            skip_next = True  # the path is the next argument
        elif not f.startswith(("-I", "-isystem", "-iquote", "-idirafter")):
            out.append(f)
    return out


def _compiler() -> tuple[str, str] | None:
    import torch.utils.cpp_extension as ce

    if not sys.platform.startswith("linux"):
        return None
    return _gcc_version(ce.get_cxx_compiler())


@functools.lru_cache(maxsize=8)
def _gcc_version(cxx: str) -> tuple[str, str] | None:
    """(cxx, its --version) when it is gcc; once per compiler and process: a build asks for the
    light header's folder and both PCHs, and each asked for a compiler subprocess."""
    import torch.utils.cpp_extension as ce

    try:
        if not ce.check_compiler_is_gcc(cxx):
            return None  # clang's PCH works differently (-include-pch); not worth a second path
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except Exception:
        return None
    return cxx, version


def _locate(root, extra_cflags, with_cuda: bool, say, light: bool = False):
    """(base dir, header, cxx, flags) of the PCH for these flags, or None when none can be had.
    `light`: of opsynth's lighter torch/extension.h (`light_headers`), which `_put_header` writes."""
    import torch

    # Include paths do not affect whether gcc accepts a PCH, and they differ per candidate (scratch
    # dirs): leave them out, or every candidate would get a PCH of its own.
    extra_cflags = _without_include_paths([str(f).strip() for f in (extra_cflags or [])])
    from opsynth.reward.build_flags import check_host_flags

    if check_host_flags(extra_cflags):  # this runs the compiler unconfined: allow-listed flags only
        return None
    try:
        comp = _compiler()
        if comp is None:
            return None
        cxx, version = comp
        flags = _torch_cflags(extra_cflags, with_cuda)
    except Exception as e:  # torch internals moved: no PCH, same build as before
        say(f"[pch] unavailable: {type(e).__name__}: {e}")
        return None
    if not flags:
        return None
    header = Path(torch.utils.cpp_extension.include_paths("cpu")[0]) / "torch" / "extension.h"
    if not header.is_file():
        return None
    what = (cxx, version, torch.__version__, str(header), flags) + ((LIGHT_EXTENSION_H,) if light else ())
    key = hashlib.sha256(repr(what).encode()).hexdigest()[:16]
    return Path(root) / "pch" / key, header, cxx, flags


def _put_header(base: Path, header: Path, light: bool) -> Path:
    """`base/torch/extension.h`: torch's own (a link: gcc wants the header beside its .gch) or
    opsynth's light one (a file, written once and atomically); its path."""
    (base / "torch").mkdir(parents=True, exist_ok=True)
    dest = base / "torch" / "extension.h"
    if light:
        if not dest.is_file() or dest.read_text() != LIGHT_EXTENSION_H:
            tmp = dest.with_name(f".extension.h.{os.getpid()}.{threading.get_ident()}")  # threads of one process too
            tmp.write_text(LIGHT_EXTENSION_H)
            os.replace(tmp, dest)
    elif not dest.exists():
        try:
            dest.symlink_to(header)
        except FileExistsError:
            pass
    return dest


def light_include_dir(root: str | os.PathLike, extra_cflags=None, with_cuda: bool = False) -> str:
    """The folder to put first on a light build's include path: its `torch/extension.h` is the light
    one, with the PCH for these flags beside it once built (`pch_include_dir(..., light=True)`).
    Always a folder, also where no PCH can be had (then one shared by every flag set)."""
    loc = _locate(root, extra_cflags, with_cuda, lambda m: None, light=True)
    base = loc[0] if loc is not None else Path(root) / "pch" / "light-no-pch"
    _put_header(base, loc[1] if loc else Path(), light=True)
    return str(base)


def pch_ready(root: str | os.PathLike, extra_cflags=None, with_cuda: bool = False, light: bool = False) -> str | None:
    """The PCH's include dir when it is built, "" when none can be had, None when it is not built yet."""
    loc = _locate(root, extra_cflags, with_cuda, lambda m: None, light)
    if loc is None:
        return ""
    base = loc[0]
    if (base / "torch" / "extension.h.gch").is_file():
        return str(base)
    return "" if (base / "FAILED").is_file() else None


def pch_include_dir(root: str | os.PathLike, extra_cflags=None, with_cuda: bool = False, log=None,
                    light: bool = False) -> str | None:
    """Directory to put first on the include path (`-I`) so that this build uses the shared PCH.

    Builds the PCH on first use (one builder per flag set; others wait on the lock). Returns None
    when no PCH can be had (not gcc, torch internals changed, the build failed): the caller then
    builds as usual. Called only by the trusted parent (the build service), never by a candidate.
    """
    say = log or (lambda msg: None)
    loc = _locate(root, extra_cflags, with_cuda, say, light)
    if loc is None:
        return None
    base, header, cxx, flags = loc
    key = base.name
    gch = base / "torch" / "extension.h.gch"
    failed = base / "FAILED"
    if gch.is_file():
        return str(base)
    if failed.is_file():
        return None
    from opsynth.runtime.timing import file_lock

    base.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(str(base.parent / f"{key}.lock")):  # the first builder compiles; the rest wait, then reuse it
        if gch.is_file():
            return str(base)
        if failed.is_file():
            return None
        source = _put_header(base, header, light)
        tmp = gch.with_name(f"extension.h.gch.tmp{os.getpid()}")
        cmd = [cxx, "-x", "c++-header", str(source if light else header), "-o", str(tmp), *flags]
        say(f"[pch] building {gch} (once per compiler and flag set)")
        from opsynth.reward import quiet

        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            quiet.register(proc.pid, "pch")  # paused while anything is timed
            try:
                _, stderr = proc.communicate(timeout=PCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise
            finally:
                quiet.unregister(proc.pid)
            err = (stderr or "")[-2000:] if proc.returncode != 0 else ""
        except (OSError, subprocess.TimeoutExpired) as e:
            err = f"{type(e).__name__}: {e}"
        if err or not tmp.is_file():
            failed.write_text(" ".join(cmd) + "\n" + err)
            tmp.unlink(missing_ok=True)
            say(f"[pch] build failed, building without it: {err[-500:]}")
            return None
        os.replace(tmp, gch)
    return str(base)
