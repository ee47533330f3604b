"""On-disk cache of the mined catalog, so each process (Dask workers, tests) skips the probing.

The key covers the torch and transformers versions and the catalog code itself, so an upgrade or
an edit to the mining rules re-mines instead of reading a stale catalog.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from .spec import Catalog, OpSpec


def cache_dir() -> Path:
    root = os.environ.get("OPSYNTH_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "opsynth")
    return Path(root).expanduser()


def cache_key(torch_version: str, transformers_version: str | None) -> str:
    h = hashlib.sha256(f"{torch_version}|{transformers_version}".encode())
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def load(key: str) -> Catalog | None:
    path = cache_dir() / f"catalog-{key}.json"
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ops = {}
    for name, s in d["ops"].items():
        for k in ("ranks", "required", "tunable"):
            s[k] = tuple(s[k])
        ops[name] = OpSpec(**s)
    return Catalog(ops=ops, excluded=d["excluded"], torch_version=d["torch_version"],
                   transformers_version=d["transformers_version"])


def save(key: str, catalog: Catalog) -> None:
    d = {"ops": {n: s.to_dict() for n, s in catalog.ops.items()}, "excluded": catalog.excluded,
         "torch_version": catalog.torch_version, "transformers_version": catalog.transformers_version}
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(d, f)
        os.replace(tmp, cache_dir() / f"catalog-{key}.json")
    except OSError:
        pass  # a read-only home only costs re-mining
