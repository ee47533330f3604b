"""Eager and torch.compile timings, cached per (task, device, torch version, timing settings).

A JSON file under the cache dir, updated under an exclusive file lock so that concurrent evaluators
(trainer workers) can share it. Only the trusted parent writes it. Each entry records the process
that measured it and carries an HMAC under a key kept in `<cache>/trust/` (a folder no child can
see: the sandbox covers it with an empty tmpfs). An entry that does not verify (written by anything
but an evaluator holding the key, or edited since) is ignored and re-measured, never used.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import time
import json
import logging
import os
from pathlib import Path


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"cpu-{os.cpu_count()}"


def cache_key(cfg, task_code: str, device: str, mode: str | None = None) -> str:
    """The entry of this task's baselines; a train-mode task's is its own (an eval-mode task keeps
    the key it had before tasks had modes)."""
    import torch

    from opsynth.render.task_file import check_mode

    warm, reps = cfg.timing(device)
    parts = [
        hashlib.sha256(task_code.encode()).hexdigest(),
        _device_name(device),
        torch.__version__,
        f"w{warm}r{reps}l2{int(cfg.flush_l2)}t{cfg.resolved_cpu_threads(device)}c{int(cfg.compile_baseline)}",
    ]
    if check_mode(mode) != "eval":
        parts.append(f"mode={check_mode(mode)}")
    return "|".join(parts)


def _locked(path: Path):
    from opsynth.runtime.timing import file_lock

    path.parent.mkdir(parents=True, exist_ok=True)
    return file_lock(str(path) + ".lock")


def _path(cfg) -> Path:
    return cfg.resolved_cache_dir() / "baselines.json"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def trust_key(cfg) -> bytes:
    """This cache's signing key, made on first use (readable by the owner only, hidden from children)."""
    d = cfg.resolved_cache_dir() / "trust"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / "baselines.key"
    if not path.is_file():
        with _locked(path):
            if not path.is_file():
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(32))
                os.replace(tmp, path)
    return path.read_text().strip().encode()


def _sign(key: bytes, cache_k: str, entry: dict) -> str:
    body = json.dumps({"k": cache_k, **{f: entry.get(f) for f in ("eager_ms", "compile_ms", "measured_by")}}, sort_keys=True)
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def lookup(cfg, task_code: str, device: str, mode: str | None = None) -> dict | None:
    """The cached timings for this task, or None when absent or when the entry does not verify."""
    path = _path(cfg)
    k = cache_key(cfg, task_code, device, mode)
    with _locked(path):
        entry = _read(path).get(k)
    if not isinstance(entry, dict):
        return None
    if not hmac.compare_digest(str(entry.get("sig", "")), _sign(trust_key(cfg), k, entry)):
        logging.getLogger(__name__).warning("cached baseline for task %s does not verify: measuring it again", k[:12])
        return None
    return entry


def store(cfg, task_code: str, device: str, eager_ms: float | None, compile_ms: float | None,
          mode: str | None = None) -> None:
    if eager_ms is None:
        return
    path = _path(cfg)
    with _locked(path):
        data = _read(path)
        k = cache_key(cfg, task_code, device, mode)
        entry = {
            "eager_ms": eager_ms,
            "compile_ms": compile_ms,
            "measured_by": {"host": socket.gethostname(), "pid": os.getpid(), "at": round(time.time(), 3), "by": "opsynth.reward.evaluate"},
        }
        entry["sig"] = _sign(trust_key(cfg), k, entry)
        data[k] = entry
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
