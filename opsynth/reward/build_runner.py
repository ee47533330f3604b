"""Build child: compile one extension from its source text, never import or run it.

Runs only trusted programs (torch's build helper, ninja, the compilers) on the candidate's source
strings, so what it produces depends on that text alone: the parent can cache it under the hash of
the text, and its writes to the compiler cache (ccache) are the compilers' own. Loading the result
(which runs the candidate's static initialisers) happens only in the candidate's own child.
"""

from __future__ import annotations

import copy
import os
import time

from opsynth.runtime.child import child_main


def _no_import(name, path, is_python_module):
    """Stands in for torch's loader: report where the library is instead of loading it."""
    return os.path.join(path, f"{name}.so")


def _in_upload(src_dir: str, rel: str) -> str:
    """`rel` (a name the service checked) as a path inside this build's upload folder."""
    p = os.path.realpath(os.path.join(src_dir, rel))
    if os.path.commonpath([p, src_dir]) != src_dir:
        raise ValueError(f"{rel!r} is not inside the build's own folder")
    return p


def _write_upload(src_dir: str, files: dict) -> list[str]:
    """The candidate's files (sources, headers of its include folders), written into this build's folder."""
    paths = []
    for fname, text in sorted(files.items()):
        p = _in_upload(src_dir, fname)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
        paths.append(p)
    return paths


def _flag_list(flags) -> list[str]:
    return [flags] if isinstance(flags, str) else list(flags or [])


def _compile(req: dict, pch_dir: str | None, build_name: str, out: str, first_include: str | None = None,
             lean: bool = False) -> str:
    """Build one request in `out`; the library's path (raises what torch's build raises).
    `first_include`: a folder searched before every other (the light torch/extension.h's).
    `lean`: the CUDA translation units get the lean torch/types.h (`light_headers.lean_types_h`),
    written into `out` for the operators their sources name."""
    import torch.utils.cpp_extension as ce

    os.makedirs(out, exist_ok=True)
    args = copy.deepcopy(req.get("args") or {})  # load_inline appends to a cpp_sources list it is given
    if pch_dir:
        args["extra_cflags"] = [f"-I{pch_dir}", *_flag_list(args.get("extra_cflags"))]
    if lean:
        from opsynth.reward.light_headers import LEAN_MACRO, cuda_texts, lean_types_h

        lean_dir = os.path.join(out, "lean_include")
        os.makedirs(os.path.join(lean_dir, "torch"), exist_ok=True)
        with open(os.path.join(lean_dir, "torch", "types.h"), "w") as f:
            f.write(lean_types_h(cuda_texts(req), ce.include_paths()[0]))
        # nvcc's flags only: -I is searched before torch's -isystem folders, wherever it stands
        args["extra_cuda_cflags"] = [*_flag_list(args.get("extra_cuda_cflags")), f"-D{LEAN_MACRO}", f"-I{lean_dir}"]
    # Include paths are names inside the upload (build_flags checked them): this build's folder only.
    src_dir = os.path.realpath(os.path.join(out, "src"))
    os.makedirs(src_dir, exist_ok=True)
    paths = _write_upload(src_dir, req.get("files") or {})
    inc = [_in_upload(src_dir, p) for p in (args.pop("extra_include_paths", None) or [])]
    if first_include:
        inc = [first_include, *inc]  # -I, before torch's own -isystem folders, for gcc and nvcc alike
    if req["kind"] == "inline":
        return ce.load_inline(name=build_name, build_directory=out, extra_include_paths=inc, verbose=False, **args)
    srcs = [p for p in paths if p.endswith((".cu", ".cpp", ".cc", ".cxx"))]
    return ce.load(name=build_name, sources=srcs, build_directory=out, extra_include_paths=inc + [src_dir], verbose=False, **args)


def run(job: dict) -> dict:
    import torch.utils.cpp_extension as ce

    ce._import_module_from_library = _no_import  # build only (this process runs no candidate code)
    req = job["request"]
    t0 = time.perf_counter()
    headers, so = "as_written", None
    light_dir = job.get("light_dir")
    lean = bool(light_dir and job.get("lean_cuda"))
    if lean:  # the lean torch/types.h in CUDA units first, the light header if that fails
        try:
            so = _compile(req, None, job["build_name"], os.path.join(job["out_dir"], "lean"), first_include=light_dir, lean=True)
            headers = "lean_cuda"
        except Exception as e:  # built with the light header below
            print(f"[build] with the lean torch/types.h: {type(e).__name__}; building with the light torch/extension.h", flush=True)
            headers = "light_after_lean_failed"
            ce.JIT_EXTENSION_VERSIONER.entries.pop(job["build_name"], None)
    lean_s = round(time.perf_counter() - t0, 3) if lean else None
    if light_dir and so is None:  # opsynth.reward.light_headers: the light torch/extension.h first, as written if that fails
        try:
            so = _compile(req, None, job["build_name"], os.path.join(job["out_dir"], "light"), first_include=light_dir)
            headers = "light" if headers == "as_written" else headers
        except Exception as e:  # built as written below; the candidate hears only about its own sources
            print(f"[build] with the light torch/extension.h: {type(e).__name__}; building the sources as written", flush=True)
            headers = "as_written_after_light_failed"
    light_s = round(time.perf_counter() - t0, 3) if light_dir else None
    if so is None:
        # torch numbers a second build of one name in a process as a new version (`<name>_v1`, its
        # module's init function renamed too): this one is the first of its name, as the service expects.
        ce.JIT_EXTENSION_VERSIONER.entries.pop(job["build_name"], None)
        try:
            so = _compile(req, job.get("pch_dir"), job["build_name"], job["out_dir"])
        except Exception as e:  # the compiler's own words are the candidate's feedback
            text = f"{type(e).__name__}: {e}"
            print(text[-8000:], flush=True)
            return {"reason": "build_error", "detail": text[-6000:], "build_s": round(time.perf_counter() - t0, 3),
                    "headers": headers, "light_attempt_s": light_s, "lean_attempt_s": lean_s}
    if not isinstance(so, str) or not os.path.isfile(so):
        return {"reason": "build_error", "detail": f"the build produced no library ({so!r})", "headers": headers}
    return {"reason": "ok", "so": so, "build_s": round(time.perf_counter() - t0, 3), "headers": headers,
            "light_attempt_s": light_s, "lean_attempt_s": lean_s}


if __name__ == "__main__":
    child_main(run)
