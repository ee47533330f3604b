"""Seed modules mined from `transformers` (used only when it is installed).

Activations come from `transformers.activations.ACT2CLS`; norms, MLPs and attention blocks are the
classes of a few decoder families whose names match those roles. Each candidate is kept only if it
runs on a (batch, seq, hidden) meta tensor with nothing but the hidden states, as a standalone
one-operator task (the way Ops-6K uses transformers modules).
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings

import torch

from .call import apply, is_float_tensor
from .spec import OpSpec

FAMILIES = ("llama", "qwen2", "mistral", "gemma", "t5", "gpt2", "bert", "phi3", "opt", "gpt_neox")
ROLES = re.compile(r"(RMSNorm|LayerNorm|MLP|Attention|SelfAttention)$")
# Small config sizes used for every config-built module (the sampler scales them).
CONFIG_DEFAULTS = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "n_embd": 256, "n_head": 4, "d_model": 256, "d_ff": 688,
                   "num_heads": 4, "d_kv": 64, "ffn_dim": 688}


def _config_class(module) -> str | None:
    for name, obj in vars(module).items():
        if name.endswith("Config") and inspect.isclass(obj):
            return f"{obj.__module__}.{name}"
    return None


def mine_transformers(excluded: dict) -> list[OpSpec]:
    try:
        import transformers.activations as acts
    except Exception:
        return []
    specs: list[OpSpec] = []
    for key, cls in sorted(acts.ACT2CLS.items()):
        cls = cls[0] if isinstance(cls, tuple) else cls
        name = f"transformers.{cls.__name__}"
        if not cls.__module__.startswith("transformers."):
            # ACT2CLS also maps names to torch's own classes ("relu" -> nn.ReLU): such a task is a
            # torch task (its code says nn.ReLU), already covered by the torch seed of that name.
            excluded[name] = f"torch's {cls.__module__}.{cls.__name__}, not a transformers module"
            continue
        if any(s.name == name for s in specs):
            continue
        specs.append(OpSpec(name=name, kind="module", import_path=f"{cls.__module__}.{cls.__name__}",
                            category="transformers", pattern="unary", ranks=(3,), source="transformers"))
    for fam in FAMILIES:
        try:
            mod = importlib.import_module(f"transformers.models.{fam}.modeling_{fam}")
        except Exception as e:
            excluded[f"transformers.{fam}"] = f"import failed: {type(e).__name__}"
            continue
        config_path = _config_class(mod)
        for cname, cls in sorted(vars(mod).items()):
            if not (inspect.isclass(cls) and issubclass(cls, torch.nn.Module) and ROLES.search(cname)
                    and cls.__module__ == mod.__name__):
                continue
            params = [p for p in inspect.signature(cls.__init__).parameters.values()
                      if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            required = tuple(p.name for p in params if p.default is inspect.Parameter.empty)
            if required == ("config",) or required == ("config", "layer_idx"):
                specs.append(OpSpec(name=f"transformers.{cname}", kind="module",
                                    import_path=f"{mod.__name__}.{cname}", category="transformers",
                                    pattern="unary", ranks=(3,), required=tuple(CONFIG_DEFAULTS),
                                    config_class=config_path, tuple_output="Attention" in cname,
                                    source="transformers"))
            elif required and required[0] in ("hidden_size", "dim"):
                specs.append(OpSpec(name=f"transformers.{cname}", kind="module",
                                    import_path=f"{mod.__name__}.{cname}", category="transformers",
                                    pattern="unary", ranks=(3,), required=("hidden_size",) if required[0] == "hidden_size"
                                    else ("dim",), source="transformers"))
            else:
                excluded[f"transformers.{cname}"] = f"constructor needs {required}"
    kept = []
    for spec in specs:
        if _runs(spec):
            kept.append(spec)
        else:
            excluded[spec.name] = "does not run on hidden states alone"
    return kept


def config_params(spec: OpSpec, hidden: int, scale: float = 1.0) -> dict:
    """Constructor values for a transformers seed on hidden size `hidden`."""
    if spec.config_class:
        vals = {k: v for k, v in CONFIG_DEFAULTS.items()}
        for k in ("hidden_size", "n_embd", "d_model"):
            vals[k] = hidden
        ff = max(8, int(round(hidden * 2.6875)))
        for k in ("intermediate_size", "d_ff", "ffn_dim"):
            vals[k] = ff
        vals["d_kv"] = hidden // vals["num_heads"]
        return vals
    if spec.required == ("dim",):
        return {"dim": hidden}
    if spec.required == ("hidden_size",):
        return {"hidden_size": hidden}
    return {}


def _runs(spec: OpSpec) -> bool:
    try:
        params = config_params(spec, 64)
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = torch.randn(2, 8, 64)
            out = apply(spec, x, params)
        return is_float_tensor(out) and tuple(out.shape) == (2, 8, 64)
    except Exception:
        return False
