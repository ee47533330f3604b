"""Eager and torch.compile timings, cached per (task, device, torch version, timing settings).

A JSON file under the cache dir, updated under an exclusive file lock so that concurrent evaluators
(trainer workers) can share it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"cpu-{os.cpu_count()}"


def cache_key(cfg, task_code: str, device: str) -> str:
    import torch

    warm, reps = cfg.timing(device)
    parts = [
        hashlib.sha256(task_code.encode()).hexdigest(),
        _device_name(device),
        torch.__version__,
        f"w{warm}r{reps}l2{int(cfg.flush_l2)}t{cfg.resolved_cpu_threads(device)}c{int(cfg.compile_baseline)}",
    ]
    return "|".join(parts)


def _locked(path: Path):
    from opsynth.verify.timing import file_lock

    path.parent.mkdir(parents=True, exist_ok=True)
    return file_lock(str(path) + ".lock")


def _path(cfg) -> Path:
    return cfg.resolved_cache_dir() / "baselines.json"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def lookup(cfg, task_code: str, device: str) -> dict | None:
    path = _path(cfg)
    with _locked(path):
        return _read(path).get(cache_key(cfg, task_code, device))


def store(cfg, task_code: str, device: str, eager_ms: float | None, compile_ms: float | None) -> None:
    if eager_ms is None:
        return
    path = _path(cfg)
    with _locked(path):
        data = _read(path)
        data[cache_key(cfg, task_code, device)] = {"eager_ms": eager_ms, "compile_ms": compile_ms}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
