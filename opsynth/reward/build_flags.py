"""What a candidate may pass to the compilers through `load_inline` / `load`: an explicit allow-list.

Why a list of what is allowed, not of what is refused: the build child runs only trusted programs,
but its arguments are the candidate's, and gcc and nvcc have many flags that run a program of the
caller's choice (`-wrapper`, `-fplugin`, `-B`, `-specs`, `-ccbin`), write files elsewhere (`-o`,
`-save-temps`, `-MF`, `-fdump-*`), or read more options from a file (`@file`). torch also writes the
flags into a ninja file that runs each command through `/bin/sh`, so a space, `;` or `$` inside one
flag is a second flag or a shell command. Whatever is not listed here is refused before any compiler
starts, with the reason `build_flag_refused:<the argument>`.

Paths never reach a compiler as the candidate wrote them: the candidate's child uploads the files
(sources, and the headers of its include folders, only from inside its own folder), and the trusted
side accepts file names and include paths only as plain relative names inside that upload, which the
build child writes into its own folder. So an include path is always inside the build's own tree.

`check_request` is the authority (called by the trusted build service, `opsynth.reward.builds`, on
every request); `pch` calls `check_host_flags` too before it compiles with a candidate's flags.
"""

from __future__ import annotations

import re

REFUSED = "build_flag_refused:"

_MACRO = r"[A-Za-z_][A-Za-z0-9_]*"
_VALUE = r"[A-Za-z0-9_.+\-]*"  # no quote, space, `$`, `;`, `(`, `,`: nothing the shell or ninja reads
_ARCH = r"(sm|compute|lto)_[0-9]{2,3}[af]?"

# Host compiler (gcc / clang) flags, one token each.
_HOST = [
    r"-O[0-3sgz]?", r"-Ofast",
    r"-std=(c|gnu)(\+\+)?[0-9][0-9a-z]",
    rf"-D{_MACRO}(={_VALUE})?", rf"-U{_MACRO}",
    r"-g[0-3]?", r"-w", r"-pedantic(-errors)?",
    r"-W(no-)?(error=)?[a-z][a-z0-9+\-]*(=[a-z0-9\-]+)?",  # no comma: -Wl, -Wa, -Wp are not warnings
    r"-march=[A-Za-z0-9_.\-]+", r"-mtune=[A-Za-z0-9_.\-]+",
    r"-m(no-)?(sse[0-9.]*|ssse3|avx|avx2|avx512[a-z0-9]*|avxvnni|fma|f16c|bmi|bmi2|popcnt|lzcnt)",
    r"-fPIC", r"-fpic", r"-pthread", r"-fvisibility=(hidden|default)",
    r"-f(no-)?(fast-math|unroll-loops|unroll-all-loops|openmp|openmp-simd|strict-aliasing|tree-vectorize"
    r"|omit-frame-pointer|math-errno|finite-math-only|associative-math|reciprocal-math|inline-functions"
    r"|trapping-math|signed-zeros)",
]
_NOT_WARNINGS = {"-Wl", "-Wa", "-Wp"}  # pass options to the linker, assembler, preprocessor

# nvcc flags, one token each (`-Xptxas`, `-Xcompiler` and the two-token forms are handled below).
_CUDA = [
    r"-O[0-3]", r"-std=c\+\+[0-9][0-9a-z]",
    rf"-D{_MACRO}(={_VALUE})?", rf"-U{_MACRO}",
    r"-g", r"-G", r"-w", r"-lineinfo", r"--generate-line-info",
    r"-W(no-)?(error=)?[a-z][a-z0-9+\-]*",
    r"--?use[_-]fast[_-]math",
    rf"(-arch|--gpu-architecture)=({_ARCH}|native|all|all-major)",
    rf"(-code|--gpu-code)={_ARCH}(,{_ARCH})*",
    rf"(-gencode|--generate-code)=arch=compute_[0-9]{{2,3}}[af]?,code=({_ARCH}|\[{_ARCH}(,{_ARCH})*\])",
    r"--?maxrregcount=[0-9]{1,3}",
    r"--?expt-relaxed-constexpr", r"--?expt-extended-lambda", r"--?extended-lambda",
    r"--?(ftz|prec-div|prec-sqrt|fmad)=(true|false)",
    r"-res-usage", r"--resource-usage", r"--?restrict",
]
# ptxas options (after -Xptxas or in --ptxas-options=, comma-separated).
_PTXAS = [
    r"-v", r"--verbose", r"-O[0-3]", r"--?maxrregcount=[0-9]{1,3}", r"--warn-on-spills", r"-warn-spills",
    r"--warn-on-local-memory-usage", r"-warn-lmem-usage", r"-dlcm=(ca|cg|cs)", r"--def-load-cache=(ca|cg|cs|lu|cv)",
    r"--allow-expensive-optimizations(=(true|false))?",
]
# Linker flags: a few libraries by name, nothing else (no -L, -Wl, scripts, objects).
LINK_LIBS = ("cublas", "cublasLt", "cudart", "curand", "cufft", "cusparse", "m", "gomp", "pthread")

# nvcc options whose value may be the next token: option -> the `=` form it is checked as.
_CUDA_PAIRS = {"-arch": "-arch", "--gpu-architecture": "--gpu-architecture", "-code": "-code", "--gpu-code": "--gpu-code",
               "-gencode": "-gencode", "--generate-code": "--generate-code", "-maxrregcount": "-maxrregcount",
               "--maxrregcount": "--maxrregcount", "-Xptxas": "-Xptxas", "--ptxas-options": "-Xptxas",
               "-Xcompiler": "-Xcompiler", "--compiler-options": "-Xcompiler"}

RESERVED_MACROS = {"TORCH_EXTENSION_NAME"}  # the build service names the extension

# Names in an upload: plain relative paths (no `..`, no leading dot or dash, no shell characters).
_PART = r"[A-Za-z0-9_][A-Za-z0-9_.+\-]{0,99}"
SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx", ".cu")
HEADER_SUFFIXES = (".h", ".hpp", ".hh", ".hxx", ".cuh", ".inl", ".inc")
MAX_DEPTH = 8
_EXT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
_BOOL_ARGS = ("with_cuda", "with_sycl", "is_python_module", "with_pytorch_error_handling", "keep_intermediates",
              "no_implicit_headers", "use_pch")


class Refused(ValueError):
    """One argument the allow-list does not hold; `.what` is the argument as the reason shows it."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def _full(patterns: list[str]) -> re.Pattern:
    return re.compile("|".join(f"(?:{p})" for p in patterns))


_HOST_RE, _CUDA_RE, _PTXAS_RE = _full(_HOST), _full(_CUDA), _full(_PTXAS)
_LINK_RE = re.compile("-l(" + "|".join(map(re.escape, LINK_LIBS)) + ")")
_PATH_RE = re.compile(rf"{_PART}(/{_PART}){{0,{MAX_DEPTH - 1}}}")


def _show(text) -> str:
    """An argument as a reason shows it: printable, one line, at most 80 characters."""
    s = "".join(c if c.isprintable() and not c.isspace() else "\\x%02x" % ord(c) for c in str(text))
    return s if len(s) <= 80 else s[:77] + "..."


def _tokens(value, what: str) -> list[str]:
    """A flag list as torch reads it (a string is one flag; torch strips each flag)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise Refused(f"{what}={type(value).__name__}")
    return [v.strip() for v in value if v.strip()]


def _macro_ok(tok: str) -> bool:
    if tok.startswith(("-D", "-U")):
        return tok[2:].split("=", 1)[0] not in RESERVED_MACROS
    return True


def _host_ok(tok: str) -> bool:
    return bool(_HOST_RE.fullmatch(tok)) and tok not in _NOT_WARNINGS and _macro_ok(tok)


def check_host_flags(flags) -> str | None:
    """None when every flag is on the host compiler's list, else the first one that is not."""
    try:
        for tok in _tokens(flags, "extra_cflags"):
            if not _host_ok(tok):
                return _show(tok)
    except Refused as r:
        return r.what
    return None


def _cuda_tokens(toks: list[str]) -> None:
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok in _CUDA_PAIRS and i + 1 < len(toks):  # `-Xptxas -v`, `-arch sm_90`
            opt, val, shown = _CUDA_PAIRS[tok], toks[i + 1], f"{tok}={toks[i + 1]}"
            i += 2
        else:
            opt, _, val = tok.partition("=")
            opt, shown = _CUDA_PAIRS.get(opt, ""), tok
            i += 1
            if not opt:
                if not (_CUDA_RE.fullmatch(tok) and tok not in _NOT_WARNINGS and _macro_ok(tok)):
                    raise Refused(_show(tok))
                continue
        if opt == "-Xptxas":
            ok = all(_PTXAS_RE.fullmatch(p) for p in val.split(","))
        elif opt == "-Xcompiler":
            ok = all(_host_ok(p) for p in val.split(","))
        else:
            cand = f"{opt}={val}"
            ok = bool(_CUDA_RE.fullmatch(cand))
        if not ok or not val:
            raise Refused(_show(shown))


def _check_flags(args: dict) -> None:
    for key in ("extra_cflags", "extra_sycl_cflags"):
        for tok in _tokens(args.get(key), key):
            if not _host_ok(tok):
                raise Refused(_show(tok))
    _cuda_tokens(_tokens(args.get("extra_cuda_cflags"), "extra_cuda_cflags"))
    for tok in _tokens(args.get("extra_ldflags"), "extra_ldflags"):
        if not _LINK_RE.fullmatch(tok):
            raise Refused(_show(tok))


def safe_relative(path) -> bool:
    """A plain relative name inside an upload: no absolute path, no `..`, no dot files, no shell characters."""
    return isinstance(path, str) and bool(_PATH_RE.fullmatch(path))


def _check_paths(req: dict) -> None:
    files = req.get("files") or {}
    if not isinstance(files, dict):
        raise Refused("files")
    for name, text in files.items():
        if not safe_relative(name) or not isinstance(text, str):
            raise Refused(_show(name))
        top = "/" not in name
        if name.endswith(SOURCE_SUFFIXES):
            if not (top and req.get("kind") == "files"):  # sources: top level of a load() upload only
                raise Refused(_show(name))
        elif not name.endswith(HEADER_SUFFIXES):
            raise Refused(_show(name))
    for inc in _tokens((req.get("args") or {}).get("extra_include_paths"), "extra_include_paths"):
        if not safe_relative(inc):
            raise Refused(_show(inc))


def check_request(req: dict) -> str | None:
    """None when a build request holds only allowed arguments, else `build_flag_refused:<argument>`.

    `req` is a build request as the service normalises it: kind, name, args (load_inline's or
    load's keyword arguments), files (relative name -> text).
    """
    try:
        name = req.get("name")
        if not isinstance(name, str) or not _EXT_NAME.fullmatch(name):
            raise Refused("name=" + _show(name))
        args = req.get("args") or {}
        for key in _BOOL_ARGS:
            if args.get(key) is not None and not isinstance(args[key], bool):
                raise Refused(f"{key}={_show(args[key])}")
        _check_flags(args)
        _check_paths(req)
    except Refused as r:
        return f"build_flag_refused:{r.what}"
    return None
