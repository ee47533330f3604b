"""nvcc with its host and device front ends side by side, for the reward's CUDA builds.

One `.cu` of a KernelBench-layout candidate is the build a user waits for (issue 28). nvcc runs its
passes one after another: the host preprocessor, cudafe++ (the host front end), the device
preprocessor, cicc (the device front end), ptxas, fatbinary, then the host compiler. Both front ends
parse the whole translation unit, torch's headers included. Measured with `nvcc --time` on the lean
KernelBench-layout `.cu` (2-core Xeon, nvcc 13, sm_90): preprocess 0.64 s, cudafe++ 8.8 s,
preprocess 0.64 s, cicc 5.4 s, host compile 4.8 s: 20.3 s, of which cicc waits 8.8 s for
nothing it needs except the module id cudafe++ writes first.

So this driver asks nvcc for its own plan (`--dryrun`), writes the module id itself (a name for the
translation unit's anonymous namespace, the same file both front ends read), and runs the host
chain (preprocess, cudafe++) beside the device chain (preprocess, cicc, ptxas, fatbinary), then
the host compile. The commands are nvcc's own, unchanged but for cudafe++ reading the id instead of
writing it. Anything it does not recognise (several sources, `-E`, dependency files, relocatable
device code, `--keep`, a pass it does not know) goes to nvcc as written.

Run by the launcher the build service writes (`builds.compiler_env`, `reward.parallel_nvcc`):
    python -m opsynth.reward.nvcc_parallel REAL_NVCC ARGS...
Written here rather than taken from a library: no maintained tool drives nvcc's passes this way.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading

# Flags after which nvcc does something else than compile one source to one object (or writes files
# of its own): these calls go to nvcc unchanged.
PASS_THROUGH = {
    "-E", "-M", "-MM", "-MD", "-MMD", "-MF", "-MT", "--preprocess", "--generate-dependencies", "--generate-dependencies-with-compile",
    "--dependency-output", "-rdc=true", "--relocatable-device-code=true", "-dc", "--device-c", "-dw", "--device-w", "-dlink",
    "--device-link", "-lib", "--lib", "-link", "--link", "-run", "--run", "-keep", "--keep", "--keep-dir", "-dryrun", "--dryrun",
    "-ptx", "--ptx", "-cubin", "--cubin", "-fatbin", "--fatbin", "-time", "--time", "-save-temps", "--save-temps",
    "-V", "--version", "-h", "--help", "--list-gpu-arch", "--list-gpu-code", "-odir", "--output-directory",
}
ENV_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class Plan:
    """nvcc's commands for one `-c x.cu -o y.o`, sorted into the chains that may run side by side."""

    def __init__(self, env: dict, host: list[str], device: list[str], final: list[str], id_file: str, keep_dir: str):
        self.env, self.host, self.device, self.final, self.id_file, self.keep_dir = env, host, device, final, id_file, keep_dir


def splittable(args: list[str]) -> str | None:
    """The one `.cu` source of a plain compile to an object, or None when the call must go to nvcc as is."""
    if "-c" not in args and "--compile" not in args:
        return None
    if "-o" not in args and not any(a.startswith("--output-file") for a in args):
        return None
    for a in args:
        if a in PASS_THROUGH or a.split("=", 1)[0] in PASS_THROUGH:
            return None
    sources = [a for a in args if a.endswith((".cu", ".cpp", ".cc", ".c", ".cxx")) and not a.startswith("-")]
    if len(sources) != 1 or not sources[0].endswith(".cu"):
        return None
    return sources[0]


def _tool(cmd: str) -> str:
    first = shlex.split(cmd)[0] if cmd.strip() else ""
    return os.path.basename(first.replace("$CICC_PATH/", ""))


def plan(nvcc: str, args: list[str], source: str) -> Plan | None:
    """nvcc's dry run of this call, as chains; None when its shape is not the one this driver knows."""
    keep_dir = tempfile.mkdtemp(prefix="opsynth_nvcc_")
    try:
        dry = subprocess.run([nvcc, "--dryrun", "--keep", "--keep-dir", keep_dir, *args], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        shutil.rmtree(keep_dir, ignore_errors=True)
        return None
    env = dict(os.environ)
    cmds: list[str] = []
    for line in dry.stderr.splitlines():
        if not line.startswith("#$ "):
            continue
        body = line[3:]
        m = ENV_LINE.match(body)
        if m and " " not in m.group(1):
            value = m.group(2).strip()
            if value.startswith('"') and value.endswith('"') and value.count('"') == 2:
                value = value[1:-1]
            env[m.group(1)] = value
            continue
        cmds.append(body)
    host: list[str] = []
    device: list[str] = []
    final: list[str] = []
    id_file = None
    for c in cmds:
        tool = _tool(c)
        if tool == "cudafe++":
            m = re.search(r'--module_id_file_name\s+"([^"]+)"', c)
            if m is None or "--gen_module_id_file" not in c or id_file is not None:
                return _give_up(keep_dir)
            id_file = m.group(1)
            host.append(c.replace("--gen_module_id_file", "", 1))
        elif tool in ("cicc", "ptxas", "fatbinary"):
            device.append(c)
        elif tool == "rm":
            final.append(c)
        elif tool.startswith("--") or tool in ("nvlink", "nvprune", "cuobjdump", "nvdisasm"):
            return _give_up(keep_dir)  # a pass nvcc runs itself (`-- Filter Dependencies --`) or one of rdc
        elif " -E " in f" {c} ":
            (device if "-D__CUDA_ARCH__=" in c else host).append(c)
        elif " -c " in f" {c} ":
            final.append(c)
        else:
            return _give_up(keep_dir)
    if id_file is None or not device or not host or not any(" -c " in f" {c} " for c in final):
        return _give_up(keep_dir)
    return Plan(env, host, device, final, id_file, keep_dir)


def _give_up(keep_dir: str) -> None:
    shutil.rmtree(keep_dir, ignore_errors=True)
    return None


def module_id(source: str) -> str:
    """The translation unit's module id (what cudafe++ would write; it names the anonymous namespace
    of host and device code alike): from the source's path and content, so each unit has its own."""
    with open(source, "rb") as f:
        digest = hashlib.sha256(os.path.abspath(source).encode() + b"\0" + f.read()).hexdigest()[:16]
    return f"_{digest}_opsynth_" + re.sub(r"\W", "_", os.path.basename(source))


def _run_chain(cmds: list[str], env: dict, out: list) -> None:
    for c in cmds:
        r = subprocess.run(c, shell=True, env=env, capture_output=True)  # noqa: S602 - nvcc's own command lines
        out.append((c, r.returncode, r.stdout, r.stderr))
        if r.returncode != 0:
            return


def _emit(results: list) -> int:
    for _c, rc, so, se in results:
        sys.stdout.buffer.write(so)
        sys.stderr.buffer.write(se)
        if rc != 0:
            return rc
    return 0


def run(p: Plan, source: str) -> int:
    """Host and device chains side by side, then the host compile; nvcc's exit code and messages."""
    try:
        with open(p.id_file, "w") as f:
            f.write(module_id(source))
        host_out: list = []
        dev_out: list = []
        t = threading.Thread(target=_run_chain, args=(p.host, p.env, host_out))
        t.start()
        _run_chain(p.device, p.env, dev_out)
        t.join()
        host_rc = next((r[1] for r in host_out if r[1] != 0), 0)
        if host_rc != 0:  # what nvcc would have said: cudafe++ (or the preprocessor) stops it first
            return _emit(host_out)
        rc = _emit(host_out) or _emit(dev_out)
        if rc != 0:
            return rc
        final_out: list = []
        _run_chain(p.final, p.env, final_out)
        return _emit(final_out)
    finally:
        shutil.rmtree(p.keep_dir, ignore_errors=True)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m opsynth.reward.nvcc_parallel REAL_NVCC ARGS...", file=sys.stderr)
        return 2
    nvcc, args = argv[0], argv[1:]
    source = splittable(args)
    p = plan(nvcc, args, source) if source is not None else None
    if p is None:
        os.execv(nvcc, [nvcc, *args])
    return run(p, source)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
