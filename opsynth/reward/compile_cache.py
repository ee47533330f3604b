"""torch.compile's caches for a task's compile baseline, kept from one batch to the next.

Every sandboxed child gets fresh inductor and triton cache folders in its scratch
(`runtime.sandbox.job_env`), so each batch's compile baseline child compiled its task from nothing:
10-40 s, which a candidate that beats eager waits for (reward 3 needs the compiled time). Here
the compile child of a task starts from a copy of that task's store (`seed`, in the child, before
it compiles), and the parent copies what the child's compile wrote back into the store once the
child says it is ready (`harvest`). Measured on 2 CPU cores beside the test suite: a small
Linear/GELU/LayerNorm compiled in 12.3 s cold and 3.4 s from a copied cache; the compile child of
tests/reward/candidates/tasks/chain.py in 22.2 s cold and 14.6 s from its store (inductor's FX graph
cache hit; the caches hold keys, not absolute paths, so a copy in another folder works). What is
left is dynamo's tracing, which no cache skips.

One store per task text (`store_for`): only that task's compile child reads it, and only what that
child wrote goes into it, so a task can at most slow its own compiled baseline, which its code
decides anyway. Candidates never see it. The parent copies regular files only (no links), none
over a size cap, and never over a file the store already has.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

PARTS = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}  # store folder: the child's variable
MAX_FILE_BYTES = 256 * 2**20  # a file larger than this is not kept
MAX_STORE_BYTES = 2 * 2**30  # a store past this takes nothing more


def store_for(cache_dir: Path, task_code: str, device: str) -> Path:
    """The store of this task's compiled baseline on this kind of device (made if missing)."""
    import torch

    key = hashlib.sha256(f"{device}\0{torch.__version__}\0{task_code}".encode()).hexdigest()[:24]
    d = Path(cache_dir) / "compile_cache" / key
    for part in PARTS:
        (d / part).mkdir(parents=True, exist_ok=True)
    return d


def seed(store: str | os.PathLike, env: dict | None = None) -> int:
    """In the compile child, before torch.compile: the store's files into this child's own cache
    folders (from its environment). Returns how many files it copied."""
    env = os.environ if env is None else env
    n = 0
    for part, var in PARTS.items():
        src, dst = Path(store) / part, env.get(var)
        if not dst or not src.is_dir():
            continue
        for root, _dirs, files in os.walk(src):
            rel = Path(root).relative_to(src)
            for name in files:
                Path(dst, rel).mkdir(parents=True, exist_ok=True)
                try:
                    shutil.copy2(Path(root, name), Path(dst, rel, name))
                    n += 1
                except OSError:
                    continue  # a file the parent is still writing: the compile makes it again
    return n


def _size(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def harvest(child_scratch: str | os.PathLike, store: str | os.PathLike) -> int:
    """In the parent, once the compile child is ready: the regular files its caches hold that the
    store lacks, copied in (written aside, then renamed). Returns how many it copied."""
    store = Path(store)
    budget = MAX_STORE_BYTES - _size(store)
    n = 0
    for part in PARTS:
        src = Path(child_scratch) / part
        if not src.is_dir():
            continue
        for root, dirs, files in os.walk(src, followlinks=False):
            rel = Path(root).relative_to(src)
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
            for name in files:
                p = Path(root, name)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES or st.st_size > budget:
                    continue
                dest = store / part / rel / name
                if dest.exists():
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{name}.{os.getpid()}.tmp")
                try:
                    shutil.copyfile(p, tmp, follow_symlinks=False)
                    os.chmod(tmp, 0o644)  # the next compile child runs as another uid (root: one per child)
                    os.replace(tmp, dest)
                except OSError:
                    tmp.unlink(missing_ok=True)
                    continue
                budget -= st.st_size
                n += 1
    return n
