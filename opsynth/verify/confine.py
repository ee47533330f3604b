"""The verifier's workers in the runtime's sandbox (`verify.sandbox`): what the pool prepares, and
what a worker does first.

The pool (trusted) decides everything, once per pool, under its temp dir::

    box/worker<i>/   worker i's scratch: its HOME, TMPDIR (tmp/) and working folder
    box/cache/       the pool's compile caches (inductor, triton, XDG), shared by its workers

Under root the tree is handed to one unprivileged uid for all the pool's workers
(`sandbox.child_ids`, `hand_over`). A worker's environment starts from `sandbox.base_env` (an
allow-list: no HF_TOKEN, no cloud keys) with the caches pointed into the box, and the worker passes
the pool's request to `isolation.enter` before it imports torch (which starts a thread, and an
ordinary user's `unshare` needs a single-threaded process) or runs any task code: every mount
read-only except its scratch and the caches, no network, only its own processes in /proc, no
capabilities, no_new_privs, the system-call filter. Sharing the caches between a pool's workers adds
no exposure: tasks served by one worker already share its process.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Besides base_env's allow-list, settings a user may give the verifier's workers (thread counts,
# compiler and timing-noise switches); a name that looks like a secret is dropped all the same.
PASS_PREFIX = ("OPSYNTH_", "TORCH", "PYTORCH_", "TRITON_", "OMP_", "MKL_", "KMP_")
# base_env keeps freed heap for the reward's poison check; the verifier measures host memory by RSS,
# which that would change, so its workers keep glibc's defaults.
DROP = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
# Folders of the user's that hold credentials: covered by an empty tmpfs (as an ordinary user the
# worker keeps its uid and could read them otherwise; under root they are behind /root's skeleton too).
SECRET_DIRS = ("~/.cache/huggingface", "~/.ssh", "~/.aws", "~/.config/gcloud", "~/.docker", "~/.kube")

PR_SET_DUMPABLE = 4


@dataclass
class Box:
    """The folders, uid and sandbox request of one pool's confined workers."""

    root: Path
    ids: tuple[int, int] | None

    @classmethod
    def prepare(cls, pool_tmp: str, n_workers: int) -> "Box":
        from opsynth.runtime import sandbox

        root = Path(pool_tmp) / "box"
        for d in ("inductor", "triton", "xdg"):
            (root / "cache" / d).mkdir(parents=True, exist_ok=True)
        for i in range(n_workers):
            (root / f"worker{i}" / "tmp").mkdir(parents=True, exist_ok=True)
        ids = None
        if os.getuid() == 0:
            ids = sandbox.child_ids()  # one uid for the pool's workers, none the reward's children use
            sandbox.hand_over([str(root)], ids, recursive=True)
        return cls(root, ids)

    def scratch(self, index: int) -> Path:
        return self.root / f"worker{index}"

    def env(self, index: int) -> dict[str, str]:
        """Worker `index`'s environment before the pool's own settings: secret-free, caches in the box."""
        from opsynth.runtime.sandbox import SECRET_NAME, base_env

        env = base_env()
        for k in DROP:
            env.pop(k, None)
        env.update({k: v for k, v in os.environ.items() if k.startswith(PASS_PREFIX) and not SECRET_NAME.search(k)})
        scratch, cache = self.scratch(index), self.root / "cache"
        env.update(HOME=str(scratch), TMPDIR=str(scratch / "tmp"), XDG_CACHE_HOME=str(cache / "xdg"),
                   TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"),
                   USER="opsynth-sandbox", LOGNAME="opsynth-sandbox")
        return env

    def request(self, index: int, readable: list[str] = ()) -> dict:
        """What worker `index` passes to `isolation.enter` (JSON-able); `readable`: paths it must
        still reach as the sandbox uid besides the interpreter and the package (the timing lock)."""
        from opsynth.runtime import isolation
        from opsynth.runtime.sandbox import REPO_ROOT

        writable = [str(self.scratch(index)), str(self.root / "cache")]
        needed = isolation.readable_paths([*readable, *writable])
        hidden = []
        for d in SECRET_DIRS:
            p = os.path.realpath(os.path.expanduser(d))
            if os.path.isdir(p) and not any(n == p or n.startswith(p + "/") for n in map(os.path.realpath, needed)):
                hidden.append(p)
        return {
            "scratch": str(self.scratch(index)),
            "writable": writable,
            "hidden": hidden,
            "must_not_write": [str(REPO_ROOT), sys.prefix, str(self.root.parent), tempfile.gettempdir()],
            "readable": list(readable),
            "ids": list(self.ids) if self.ids else None,
            "private": isolation.private_folders(switched=self.ids is not None and os.getuid() == 0),
        }


def enter(request: dict) -> None:
    """In the worker, first thing (single-threaded, no task code yet): confine this process.

    Returns in the confined process (`isolation.enter` forks once; the process the pool started
    waits for it and exits with its status). Raises if any part of the sandbox cannot be set up.
    """
    import ctypes
    import resource

    from opsynth.runtime import isolation

    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # an import started one (torch does): confinement must come first
        raise RuntimeError(f"the worker runs {threads} threads before confining itself; it must be single-threaded")
    ids = tuple(request["ids"]) if request.get("ids") else None
    isolation.enter(request["writable"], request["hidden"], request["must_not_write"],
                    isolation.readable_paths(request["readable"]), ids, private=request.get("private"))
    # Changing uid made the process non-dumpable, which gives /proc/self to root: the memory probe
    # could no longer reset its high-water mark (clear_refs). Dumpable again, without core files;
    # other processes cannot use it (ptrace and process_vm_* are filtered, /proc shows only this one).
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    os.chdir(request["scratch"])
    tempfile.tempdir = None
