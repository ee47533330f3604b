"""The settings that carry a training run from the smoke policy to a real model: LoRA adapters
(`peft`), TRL's vLLM generation, and how they reach TRL.

Each is a block of `conf/train.yaml` (`lora:`, `vllm:`) built into a dataclass here through the
shared config builder, validated in `__post_init__` (one line naming the setting for a bad value),
and handed to TRL in one place: `peft_config(lora)` becomes GRPOTrainer's `peft_config`,
`vllm_grpo_kwargs(vllm)` becomes GRPOConfig's `use_vllm` / `vllm_*` fields. Gradient checkpointing
is GRPOConfig's own field (`trainer.gradient_checkpointing`); multi-process training is
`accelerate launch` (conf/accelerate/); checkpoints and `resume=true` are the trainer's.

vLLM is not installable on the machines this project is tested on (no wheel for their CUDA /
Python), so the vLLM path is tested as far as the config TRL reads; generating with it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VLLM_MODES = ("colocate", "server")
LORA_BIASES = ("none", "all", "lora_only")


@dataclass
class LoraSettings:
    """LoRA adapters on the policy (peft): only the adapters train, the base weights stay frozen.

    `target_modules`: `all-linear` (every linear layer but the output head, peft's shorthand) or
    a list of module names (e.g. [q_proj, k_proj, v_proj, o_proj])."""

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: Any = "all-linear"
    bias: str = "none"

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise ValueError(f"lora.enabled must be true or false, got {self.enabled!r}")
        for name in ("r", "alpha"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"lora.{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        tm = self.target_modules
        if not isinstance(tm, str):
            tm = list(tm) if isinstance(tm, (list, tuple)) else tm
            if not isinstance(tm, list) or not tm or not all(isinstance(m, str) and m for m in tm):
                raise ValueError(f"lora.target_modules must be 'all-linear' or a list of module names, got {self.target_modules!r}")
            self.target_modules = tm
        elif not tm:
            raise ValueError("lora.target_modules must be 'all-linear' or a list of module names, got ''")
        if self.bias not in LORA_BIASES:
            raise ValueError(f"lora.bias must be one of {LORA_BIASES}, got {self.bias!r}")


@dataclass
class VllmSettings:
    """Generation with vLLM inside TRL (GRPOConfig's `use_vllm` and `vllm_*`), instead of
    transformers' `generate`. `colocate`: vLLM shares each training GPU (its share of memory is
    `gpu_memory_utilization`); `server`: a separate `trl vllm-serve` process at `server_base_url`
    (or `server_host`:`server_port`). The multi-turn rollout generates through the trainer's own
    generation, so either mode serves every turn."""

    enabled: bool = False
    mode: str = "colocate"
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    max_model_length: int | None = None
    enable_sleep_mode: bool = False
    server_base_url: str | None = None
    server_host: str = "0.0.0.0"
    server_port: int = 8000
    server_timeout: float = 240.0
    importance_sampling_correction: bool = True  # TRL's correction for vLLM's and the trainer's logprobs differing

    def __post_init__(self):
        for name in ("enabled", "enable_sleep_mode", "importance_sampling_correction"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"vllm.{name} must be true or false, got {getattr(self, name)!r}")
        if self.mode not in VLLM_MODES:
            raise ValueError(f"vllm.mode must be one of {VLLM_MODES}, got {self.mode!r}")
        if isinstance(self.gpu_memory_utilization, bool) or not 0 < float(self.gpu_memory_utilization) <= 1:
            raise ValueError(f"vllm.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        for name in ("tensor_parallel_size", "server_port"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"vllm.{name} must be an integer >= 1, got {v!r}")
        if self.max_model_length is not None and (not isinstance(self.max_model_length, int) or self.max_model_length < 1):
            raise ValueError(f"vllm.max_model_length must be an integer >= 1 or null, got {self.max_model_length!r}")
        if not float(self.server_timeout) > 0:
            raise ValueError(f"vllm.server_timeout must be > 0, got {self.server_timeout!r}")


# GRPOConfig fields these blocks own: set them here, not in `trainer:`.
VLLM_FIELDS = {"use_vllm": "enabled", "vllm_mode": "mode", "vllm_gpu_memory_utilization": "gpu_memory_utilization",
               "vllm_tensor_parallel_size": "tensor_parallel_size", "vllm_max_model_length": "max_model_length",
               "vllm_enable_sleep_mode": "enable_sleep_mode", "vllm_server_base_url": "server_base_url",
               "vllm_server_host": "server_host", "vllm_server_port": "server_port",
               "vllm_server_timeout": "server_timeout",
               "vllm_importance_sampling_correction": "importance_sampling_correction"}


def vllm_grpo_kwargs(v: VllmSettings) -> dict[str, Any]:
    """GRPOConfig keyword arguments for `v`: `use_vllm` always; the `vllm_*` fields when enabled
    (left at TRL's defaults otherwise, so a run without vLLM reads as TRL's own)."""
    if not v.enabled:
        return {"use_vllm": False}
    return {key: getattr(v, name) for key, name in VLLM_FIELDS.items()}


def peft_config(lora: LoraSettings):
    """The `peft.LoraConfig` for `lora` (None when LoRA is off), for GRPOTrainer's `peft_config`."""
    if not lora.enabled:
        return None
    try:
        from peft import LoraConfig
    except ImportError:
        raise ValueError("lora.enabled=true needs peft (pip install 'opsynth[rl]')") from None
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=float(lora.dropout), bias=lora.bias,
                      target_modules=lora.target_modules, task_type="CAUSAL_LM")


def build_block(cls, node: Any, group: str):
    """`cls` from a YAML block, a dict or an instance, through the shared builder."""
    if isinstance(node, cls):
        return node
    from opsynth.config import build, to_plain

    return build(cls, to_plain(node) or {}, group)

