"""Turn a Hydra/OmegaConf node (or a plain dict) into the library's dataclass configs, with errors
that name the offending key instead of a bare TypeError."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


def to_plain(node: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(node, (DictConfig, ListConfig)):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:
        pass
    return node


def build(cls, node: Mapping | None, group: str):
    """`cls(**node)`, refusing unknown keys with a message naming the config group."""
    values = dict(to_plain(node) or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {group} setting(s) {unknown}; known: {sorted(known)}")
    return cls(**values)


def generate_config(cfg: Mapping):
    """A `GenerateConfig` from the composed `conf/generate.yaml`."""
    from opsynth.cluster import ClusterConfig
    from opsynth.dedup import DedupConfig
    from opsynth.graph import SamplerConfig
    from opsynth.pipeline import GenerateConfig
    from opsynth.verify import VerifyConfig

    plain = dict(to_plain(cfg))
    groups = {"sampler": SamplerConfig, "verify": VerifyConfig, "cluster": ClusterConfig}
    kw: dict[str, Any] = {k: build(c, plain.pop(k, None), k) for k, c in groups.items()}
    kw["dedup"] = DedupConfig.from_any(plain.pop("dedup", None))
    plain.pop("hydra", None)
    top = build(GenerateConfig, plain, "generate")
    for k, v in kw.items():
        setattr(top, k, v)
    return top
