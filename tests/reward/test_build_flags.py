"""The build service's allow-list of compiler arguments (opsynth.reward.build_flags) and its use.

Unit tests: each escape a candidate could pass through load_inline / load is refused by name, each
legitimate flag (the ones the repository's own candidates use among them) is kept. End to end on the
CPU backend, with the static check off and isolation off (so only the allow-list stands in the way):
a correct candidate whose load_inline passes `-wrapper` or `-B` to gcc gets -1 with the named reason
and its marker file is never made; with the check bypassed the same candidates do make it.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from opsynth.reward import build_flags
from opsynth.reward.build_flags import check_host_flags, check_request
from opsynth.reward.builds import BuildService, BuildSession
from opsynth.reward.reasons import lookup

CANDS = Path(__file__).parent / "candidates"
REPO = Path(__file__).resolve().parents[2]


def _inline(**args) -> str | None:
    return check_request({"kind": "inline", "name": "ext", "args": args})


# -- the checker ------------------------------------------------------------------------------------

HOST_OK = ["-O0", "-O1", "-O2", "-O3", "-Os", "-Ofast", "-std=c++17", "-std=gnu++20", "-DNDEBUG", "-DBLOCK=256",
           "-DSCALE=0.5f", "-UNDEBUG", "-g", "-w", "-Wall", "-Wextra", "-Wno-unused-variable", "-Werror=return-type",
           "-march=native", "-mtune=native", "-mavx2", "-mfma", "-fopenmp", "-fPIC", "-ffast-math", "-funroll-loops",
           "-fno-strict-aliasing", "-pthread", " -O3 "]
CUDA_OK = ["-O3", "--use_fast_math", "-use_fast_math", "-lineinfo", "-std=c++17", "-DTILE=32",
           "-U__CUDA_NO_HALF_OPERATORS__", "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_80,code=[sm_80,compute_80]",
           "-arch=sm_90a", "--gpu-architecture=sm_80", "--maxrregcount=64", "-maxrregcount=32", "--expt-relaxed-constexpr",
           "--expt-extended-lambda", "--ptxas-options=-v", "-Xptxas=-v,-O3", "-Xcompiler=-fopenmp,-O3", "-Xcompiler=-fPIC",
           "-Wno-deprecated-gpu-targets"]
CUDA_OK_PAIRS = [["-Xptxas", "-v"], ["-Xptxas", "--maxrregcount=64"], ["-Xcompiler", "-fopenmp"], ["-gencode", "arch=compute_80,code=sm_80"],
                 ["-arch", "sm_90"]]
LINK_OK = ["-lcublas", "-lcublasLt", "-lcudart", "-lcurand", "-lcufft", "-lcusparse", "-lm", "-lgomp", "-lpthread"]

# Host-compiler escapes: run a program, load a plugin, write or read files, pass linker options, or
# smuggle a second flag or a shell command into the ninja line.
HOST_BAD = ["-wrapper", "-fplugin=/tmp/p.so", "-fplugin-arg-x-y=z", "-B/tmp/bin/", "-B", "-specs=/tmp/s", "-Wl,-T,/tmp/s.ld",
            "-Wl,--wrap=malloc", "-Wl", "-Wa,-o,/tmp/x", "-Wp,-MD,/tmp/x", "-T", "@/tmp/flags", "-L/usr/lib", "-I/etc",
            "-I../other", "-isystem/tmp", "-iquote/tmp", "-idirafter/tmp", "-include", "-include/tmp/x.h", "-imacros",
            "-o", "-o/tmp/x", "-save-temps", "-save-temps=obj", "-dumpbase", "-dumpdir", "-fdump-tree-all", "-fdump-rtl-all",
            "-MD", "-MMD", "-MF", "-MT", "-M", "-fopt-info-vec=/tmp/x", "-fprofile-generate", "-fprofile-dir=/tmp",
            "-O3 -wrapper", "-O3\t-B/tmp", "-DX=$(touch /tmp/p)", "-DX=1;touch", "-DX=`id`", "-DX=\"s\"", "-DX=a|b",
            "-DTORCH_EXTENSION_NAME=x", "-UTORCH_EXTENSION_NAME", "-x", "c++", "-E", "-print-prog-name=cc1plus",
            "--sysroot=/tmp", "-fuse-ld=/tmp/ld", "-fno-plt\n-wrapper", "/bin/sh"]
CUDA_BAD = ["-ccbin", "-ccbin=/tmp/gcc", "--compiler-bindir=/tmp", "-Xlinker", "-Xlinker=-T", "--linker-options=-T",
            "--run", "-run", "--keep", "--keep-dir", "--keep-dir=/tmp", "--output-directory=/tmp", "-odir", "-o",
            "-save-temps", "--dryrun", "-Xptxas=-wrapper", "-Xcompiler=-fplugin=/tmp/p.so", "-Xcompiler=-O3,-B/tmp",
            "-Xcompiler=-Wl,-T,x", "--compiler-options=-wrapper", "-Xnvlink=-T", "--default-stream=per-thread",
            "-include=/tmp/x.h", "--pre-include=/tmp/x.h", "--options-file=/tmp/o", "-optf", "-I/etc", "-L/tmp",
            "-gencode=arch=compute_90,code=sm_90;id", "-Xptxas", "--use_fast_math -ccbin"]
CUDA_BAD_PAIRS = [["-Xptxas", "-wrapper"], ["-Xcompiler", "-B/tmp"], ["-Xcompiler", "-O3 -wrapper"], ["-arch", "/tmp"]]
LINK_BAD = ["-L/tmp", "-Wl,-rpath,/tmp", "-Wl,-T,x", "-T", "/tmp/s.ld", "x.o", "/tmp/lib.so", "-lfoo", "-l/tmp/x",
            "-lcublas -lfoo", "-shared", "-Xlinker", "-fuse-ld=gold", "-nostdlib", "-static", "@/tmp/f", "-B/tmp"]


@pytest.mark.parametrize("flag", HOST_OK)
def test_legitimate_host_flags_are_kept(flag):
    assert _inline(extra_cflags=[flag]) is None
    assert _inline(extra_cuda_cflags=[f"-Xcompiler={flag.strip()}"]) is None


@pytest.mark.parametrize("flag", CUDA_OK)
def test_legitimate_nvcc_flags_are_kept(flag):
    assert _inline(extra_cuda_cflags=[flag]) is None


@pytest.mark.parametrize("pair", CUDA_OK_PAIRS)
def test_nvcc_flags_with_their_value_as_the_next_argument(pair):
    assert _inline(extra_cuda_cflags=pair) is None


@pytest.mark.parametrize("flag", LINK_OK)
def test_the_fixed_libraries_are_the_only_link_flags(flag):
    assert _inline(extra_ldflags=[flag]) is None


@pytest.mark.parametrize("flag", HOST_BAD)
def test_host_escapes_are_refused_by_name(flag):
    reason = _inline(extra_cflags=["-O3", flag])
    assert reason and reason.startswith("build_flag_refused:"), flag
    assert lookup(reason)[0] == "build_flag_refused:"
    assert "\n" not in reason and " " not in reason and len(reason) < 120
    # the same flag in nvcc's list, and passed to the host compiler through nvcc, is refused as well
    assert _inline(extra_cuda_cflags=[flag]) is not None, flag
    assert _inline(extra_cuda_cflags=["-Xcompiler", flag]) is not None, flag
    assert check_host_flags([flag]) is not None


@pytest.mark.parametrize("flag", CUDA_BAD)
def test_nvcc_escapes_are_refused_by_name(flag):
    assert (_inline(extra_cuda_cflags=["-O3", flag]) or "").startswith("build_flag_refused:"), flag


@pytest.mark.parametrize("pair", CUDA_BAD_PAIRS)
def test_nvcc_pairs_with_a_bad_value_are_refused(pair):
    assert _inline(extra_cuda_cflags=pair) is not None


@pytest.mark.parametrize("flag", LINK_BAD)
def test_link_escapes_are_refused_by_name(flag):
    assert (_inline(extra_ldflags=[flag]) or "").startswith("build_flag_refused:"), flag


def test_the_reason_names_the_first_refused_argument():
    assert _inline(extra_cflags=["-O3", "-wrapper", "/bin/sh,-c,touch /tmp/x"]) == "build_flag_refused:-wrapper"
    assert _inline(extra_cflags=["-O3 -B/tmp"]) == "build_flag_refused:-O3\\x20-B/tmp"  # whitespace shown, never kept
    assert _inline(extra_cuda_cflags=["-Xcompiler", "-fplugin=/p.so"]) == "build_flag_refused:-Xcompiler=-fplugin=/p.so"
    assert _inline(extra_cflags=["-fplugin=/" + "a" * 200]).endswith("...")


def test_flag_lists_must_be_lists_of_strings():
    assert _inline(extra_cflags=[3]) == "build_flag_refused:extra_cflags=list"
    assert _inline(extra_cflags={"-O3": 1}) == "build_flag_refused:extra_cflags=dict"
    assert _inline(with_cuda="yes") == "build_flag_refused:with_cuda=yes"
    assert _inline(extra_cflags="-O3") is None  # one flag, as the service hands it to torch (a list)
    assert BuildService.normalise({"kind": "inline", "name": "e", "args": {"extra_cflags": "-O3"}})["args"]["extra_cflags"] == ["-O3"]


def test_torch_own_pch_switch_never_reaches_the_build():
    """torch's use_pch writes a header into torch's own folder, which every later build reads."""
    req = BuildService.normalise({"kind": "inline", "name": "e", "args": {"cpp_sources": "", "use_pch": True}})
    assert "use_pch" not in req["args"]


@pytest.mark.parametrize("name", ["a-b", "../x", "x;id", "x y", "", "1abc", "x" * 101, None, 5])
def test_the_extension_name_is_a_plain_identifier(name):
    assert (check_request({"kind": "inline", "name": name, "args": {}}) or "").startswith("build_flag_refused:name=")


def test_uploaded_names_and_include_paths_stay_inside_the_upload():
    def files(names, kind="files", inc=()):
        return check_request({"kind": kind, "name": "ext", "args": {"extra_include_paths": list(inc)},
                              "files": {n: "" for n in names}})

    assert files(["a.cpp", "b.cu", "x.h", "inc0/sub/y.cuh"], inc=["inc0", "inc1/deep"]) is None
    for bad in ["/etc/a.cpp", "../a.cpp", "sub/a.cpp", ".hidden.h", "-x.h", "a b.h", "a$b.h", "lib.so", "build.ninja",
                "inc0/../../x.h", "inc0//x.h", "a.cpp/"]:
        assert files(["a.cpp", bad]) == f"build_flag_refused:{build_flags._show(bad)}", bad
    assert files(["a.cpp"], kind="inline") == "build_flag_refused:a.cpp"  # inline uploads carry headers only
    for inc in ["/usr/include", "../x", "inc0/..", ".", "/tmp/opsynth_cand_x/kernels", "a b"]:
        assert files(["a.cpp"], inc=[inc]) is not None, inc


def test_the_repositorys_own_candidates_pass():
    """Every flag list a candidate, benchmark or smoke program in the repository passes is on the list."""
    pattern = re.compile(r"extra_(?:cuda_)?cflags=(\[[^\]]*\])")
    seen = 0
    for path in [*CANDS.rglob("*.py"), *(REPO / "benchmarks").glob("*.py"), REPO / "opsynth/train/warm_start.py",
                 REPO / "tests/train/bandit.py"]:
        for m in pattern.finditer(path.read_text()):
            flags = ast.literal_eval(m.group(1))
            assert _inline(extra_cflags=flags) is None and _inline(extra_cuda_cflags=flags) is None, (path, flags)
            seen += 1
    assert seen >= 8


def test_the_shared_pch_is_never_built_with_a_refused_flag(tmp_path):
    """pch compiles in the trusted process, unconfined: it must check the flags itself too."""
    from opsynth.reward import pch

    assert pch.pch_include_dir(tmp_path, ["-wrapper", "/bin/sh,-c,touch x"]) is None
    assert pch.pch_ready(tmp_path, ["-fplugin=/tmp/p.so"]) == ""
    assert not (tmp_path / "pch").exists()


# -- the service and the per-child session ----------------------------------------------------------


class _Svc:
    """BuildService.handle without a toolchain: refusals come from the real checker."""

    handle = BuildService.handle
    normalise = staticmethod(BuildService.normalise)

    def __init__(self):
        from opsynth.reward.builds import BuildStats

        self.stats, self.log, self.built = BuildStats(), (lambda m: None), []

    def key(self, req):
        self.built.append(req)
        raise AssertionError("a refused request must not be keyed or built")


def test_the_service_refuses_before_keying_or_building():
    svc = _Svc()
    reply = svc.handle({"kind": "inline", "name": "e", "args": {"cpp_sources": "", "extra_cflags": ["-B/tmp"]}})
    assert reply == {"ok": False, "refused": "build_flag_refused:-B/tmp", "error": reply["error"]}
    assert "nothing was compiled" in reply["error"] and svc.built == [] and svc.stats.refused == 1


def test_a_refusal_decides_the_childs_verdict_even_when_the_child_hides_it():
    try:
        from opsynth.runtime.sandbox import ChildResult
    except ImportError:  # before the sandbox moved to the runtime room
        from opsynth.reward.sandbox import ChildResult

    session = BuildSession(_Svc())
    assert session.overrule(ChildResult("ok", {"reason": "ok"})).reason == "ok"  # nothing refused: untouched
    session({"kind": "files", "name": "e", "args": {}, "files": {"/etc/passwd.cpp": ""}})
    session({"kind": "inline", "name": "e", "args": {"extra_ldflags": ["-L/tmp"]}})  # the first refusal is kept
    for child_says in ("ok", "kernel_not_launched", "build_error"):
        res = session.overrule(ChildResult(child_says, {"reason": child_says, "candidate_ms": 0.1}, "log"))
        assert res.reason == "build_flag_refused:/etc/passwd.cpp" and res.data["reason"] == res.reason
        assert "refused by the build service" in res.log


# -- the candidate's side: uploads from its own folder only -----------------------------------------


def _tracker(root: Path):
    from opsynth.reward.guards import ExtensionTracker

    return ExtensionTracker(None, None, root=os.path.realpath(root))


def test_include_folders_inside_the_candidates_folder_travel_as_files(tmp_path):
    own, other = tmp_path / "cand", tmp_path / "other"
    (own / "kernels" / "sub").mkdir(parents=True)
    other.mkdir()
    (own / "kernels" / "a.cuh").write_text("A")
    (own / "kernels" / "sub" / "b.h").write_text("B")
    (own / "kernels" / "notes.txt").write_text("not a header")
    (other / "secret.h").write_text("S")
    os.symlink(other / "secret.h", own / "kernels" / "leak.h")  # a symlink out of the folder
    os.symlink(other, own / "kernels" / "otherdir")  # a folder symlink: not followed
    os.symlink(other, own / "escape")
    t, files = _tracker(own), {}
    paths = t._upload_includes([str(own / "kernels"), str(other), str(own / "escape"), "/usr/include", "../x"], files)
    assert paths == ["inc0", str(other), str(own / "escape"), "/usr/include", "../x"]
    assert files == {"inc0/a.cuh": "A", "inc0/sub/b.h": "B"}
    req = {"kind": "inline", "name": "e", "args": {"extra_include_paths": paths}, "files": files}
    assert check_request(req) == f"build_flag_refused:{build_flags._show(other)}"  # what stayed a path is refused by the service
    req["args"]["extra_include_paths"] = ["inc0"]
    assert check_request(req) is None


def test_load_sources_outside_the_candidates_folder_are_refused(tmp_path):
    own, other = tmp_path / "cand", tmp_path / "other"
    own.mkdir()
    other.mkdir()
    (own / "k.cpp").write_text("K")
    (own / "k.h").write_text("H")
    (other / "o.cpp").write_text("O")
    os.symlink(other / "o.cpp", own / "link.cpp")
    t = _tracker(own)
    files: dict = {}
    t._upload_sources([str(own / "k.cpp")], files)
    assert files == {"k.cpp": "K", "k.h": "H"}
    for src in (str(other / "o.cpp"), str(own / "link.cpp"), str(own / ".." / "other" / "o.cpp")):
        files = {}
        t._upload_sources([str(own / "k.cpp"), src], files)
        assert files[src] == "" and "O" not in files.values()  # never read
        assert check_request({"kind": "files", "name": "e", "args": {}, "files": files}) == f"build_flag_refused:{build_flags._show(src)}"


def test_the_build_child_resolves_names_inside_its_own_folder(tmp_path):
    from opsynth.reward.build_runner import _in_upload, _write_upload

    src = os.path.realpath(tmp_path / "src")
    os.makedirs(src)
    assert _write_upload(src, {"a.cpp": "x", "inc0/sub/b.h": "y"}) == [f"{src}/a.cpp", f"{src}/inc0/sub/b.h"]
    assert Path(src, "inc0/sub/b.h").read_text() == "y"
    for bad in ("../x.h", "/etc/passwd"):
        with pytest.raises(ValueError):
            _in_upload(src, bad)


# -- end to end --------------------------------------------------------------------------------------

PRELUDE = (CANDS / "cpu" / "ext_prelude.py").read_text()
SLOW = (CANDS / "cpu" / "slow_linear.py").read_text()
LINEAR = (CANDS / "tasks" / "matmul_bias.py").read_text()
MARKER_SCRIPT = "#!/bin/sh\ntouch {marker}\nexit 0\n"


def _attack(flags_code: str, setup: str = "") -> str:
    """The correct slow candidate (reward 1 with honest flags) whose load_inline passes extra flags."""
    src = PRELUDE.replace('extra_cflags=["-O3"],', f"extra_cflags=['-O3', *{flags_code}],")
    assert src != PRELUDE
    return src.replace("ext = load_inline(", setup + "\next = load_inline(", 1) + "\n" + SLOW


def _script(rel: str, marker: Path) -> str:
    """Candidate code writing an executable script (in its own scratch) that makes the marker."""
    return (f"import os\n_p = os.path.join(os.getcwd(), {rel!r})\nos.makedirs(os.path.dirname(_p), exist_ok=True)\n"
            f"open(_p, 'w').write({MARKER_SCRIPT.format(marker=marker)!r})\nos.chmod(_p, 0o755)\n")


def _attacks(tmp: Path) -> dict[str, tuple[str, Path]]:
    wrapper_marker, b_marker = tmp / "pwned_wrapper", tmp / "pwned_B"
    return {
        # gcc runs each of its subprograms (cc1plus, as) through the -wrapper program
        "wrapper": (_attack("['-wrapper', os.getcwd() + '/wrap.sh']", _script("wrap.sh", wrapper_marker)), wrapper_marker),
        # gcc looks for cc1plus in the -B folder first: a fake one in the candidate's own scratch
        "B": (_attack("['-B' + os.getcwd() + '/fakebin/']", _script("fakebin/cc1plus", b_marker)), b_marker),
    }


def _cfg(cache: Path, **kw):
    from opsynth.reward import RewardConfig

    base = dict(device="cpu", cache_dir=str(cache), compile_baseline=False, static_check=False, warmup=1, repeats=3,
                cpu_threads=1, isolation="none", shared_pch=False, prebuild=False)
    base.update(kw)
    return RewardConfig(**base)


@pytest.mark.filterwarnings("ignore:reward.isolation=none")
def test_compiler_flag_escapes_are_refused_end_to_end(tmp_path, monkeypatch):
    from opsynth.reward import evaluate_many

    attacks = _attacks(tmp_path)
    names = list(attacks)
    cfg = _cfg(tmp_path / "cache")
    # The same attack, its error caught: the candidate carries on without its extension.
    swallowed = _attack("['-wrapper', '/bin/true']")
    start = swallowed.index("ext = load_inline(")
    end = swallowed.index("\n)\n", start) + 3
    swallowed = swallowed[:start] + "try:\n    " + swallowed[start:end] + "except Exception:\n    ext = None\n" + swallowed[end:]
    results = evaluate_many([(LINEAR, attacks[n][0]) for n in names] + [(LINEAR, swallowed)], cfg)
    for n, r in zip(names, results):
        expected = {"wrapper": "build_flag_refused:-wrapper", "B": "build_flag_refused:-B"}[n]
        assert r.reward == -1 and r.reason.startswith(expected), (n, r.reason, r.log[-2000:])
        assert not attacks[n][1].exists(), n
    # The candidate caught the refusal and carried on without its extension: the refusal still decides.
    assert results[-1].reward == -1 and results[-1].reason == "build_flag_refused:-wrapper", results[-1].log[-2000:]

    # Control: with the allow-list bypassed, the same candidates run their program inside the build.
    monkeypatch.setattr(build_flags, "check_request", lambda req: None)
    results = evaluate_many([(LINEAR, attacks[n][0]) for n in names], _cfg(tmp_path / "cache_control"))
    for n, r in zip(names, results):
        assert attacks[n][1].exists(), (n, r.reason, r.log[-2000:])


def test_the_static_check_gives_the_same_word_early():
    from opsynth.reward.candidate import CandidateSpec
    from opsynth.reward.static_check import static_check

    def spec(src):
        return CandidateSpec(source=src)

    assert static_check(spec(PRELUDE + "\n" + SLOW)) == ("ok", "")
    bad = PRELUDE.replace('extra_cflags=["-O3"],', 'extra_cflags=["-O3", "-fplugin=/tmp/p.so"],') + "\n" + SLOW
    reason, detail = static_check(spec(bad))
    assert reason == "build_flag_refused:-fplugin=/tmp/p.so" and detail.startswith("line ")
    # flags computed at run time are left to the build service
    assert static_check(spec(_attacks(Path("/tmp"))["B"][0]))[0] == "ok"


def test_ccache_reads_its_configuration_from_the_trusted_side_only(tmp_path):
    """Build children write the ccache folder; a `ccache.conf` there (prefix_command=...) would run a
    program in every later build. ccache is pointed at a file only this process writes."""
    from opsynth.reward.builds import compiler_env

    env = compiler_env(tmp_path, "/usr/bin/true")
    conf = Path(env["CCACHE_CONFIGPATH"])
    assert conf.is_file() and conf.read_text() == ""
    assert not conf.resolve().is_relative_to(Path(env["CCACHE_DIR"]).resolve())
    assert conf.parent == Path(env["CXX"]).parent  # beside the launcher, in the read-only part of the cache
