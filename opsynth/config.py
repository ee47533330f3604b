"""The one config builder: a Hydra/OmegaConf node (or a plain dict) into a library dataclass, with
errors that name the offending key instead of a bare TypeError.

A leaf of the house: it imports no stage. Each stage owns its dataclass (validated in its
`__post_init__`) and builds it through `build`; `opsynth.generate.config.generate_config`
assembles generate's."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any


def to_plain(node: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(node, (DictConfig, ListConfig)):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:
        pass
    return node


def close_match(word: str, choices: Iterable[str]) -> str | None:
    """The choice a misspelled `word` most likely meant (`n_task` -> `n_tasks`), or None."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


_SCALARS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_type(cls, name: str, value: Any, group: str) -> Any:
    """Refuse a value of the wrong scalar type (`n_tasks=abc`) here, where the key is known, rather
    than as a TypeError deep in the run. Only plain `int`, `float`, `bool`, `str` fields (optionally
    `| None`) are checked; anything richer is the dataclass's own business. A number given for a
    string (Hydra reads `output_dir=2024` as an int) becomes that string."""
    ann = {f.name: f.type for f in dataclasses.fields(cls)}.get(name)
    if not isinstance(ann, str):
        ann = getattr(ann, "__name__", "")
    parts = [p.strip() for p in ann.split("|")]
    optional = "None" in parts
    parts = [p for p in parts if p != "None"]
    if len(parts) != 1 or parts[0] not in _SCALARS or (value is None and optional):
        return value
    if parts[0] == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    ok = isinstance(value, _SCALARS[parts[0]]) and not (parts[0] in ("int", "float") and isinstance(value, bool))
    if not ok:
        where = name if group == "generate" else f"{group}.{name}"
        raise ValueError(f"{where} must be {parts[0]}, got {value!r}")
    return value


def build(cls, node: Mapping | None, group: str):
    """`cls(**node)`, refusing unknown keys and mistyped values with a message naming the setting."""
    values = dict(to_plain(node) or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        guesses = [g for g in (close_match(k, known) for k in unknown) if g]
        hint = f" (did you mean {', '.join(repr(g) for g in guesses)}?)" if guesses else ""
        raise ValueError(f"unknown {group} setting(s) {unknown}{hint}; known: {sorted(known)}")
    values = {k: _check_type(cls, k, v, group) for k, v in values.items()}
    return cls(**values)

