"""The policy: any Hugging Face causal LM, or a tiny smoke-test model built here with no download.

The smoke policy exists so that the whole training loop (prompts, generation, reward environment,
GRPO update, checkpoints) runs on a machine without internet. Its tokenizer is a byte-level BPE
trained on the shards' own code and the prompt brief; its model is a randomly initialised Qwen2 of a
few hundred thousand parameters. It learns nothing useful about kernels: it is a plumbing test.
Both are cached under the run's output folder and reused when the same recipe asks again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

SMOKE_NAME = "smoke"
PAD, EOS = "<|pad|>", "<|endoftext|>"


@dataclass
class SmokePolicyConfig:
    """Sizes of the smoke-test policy (tokenizer and model), all tiny on purpose."""

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 8192
    seed: int = 0


@dataclass
class PolicyConfig:
    """Which policy to train: `name_or_path` is `smoke`, a Hub id or a local checkpoint folder."""

    name_or_path: str = SMOKE_NAME
    dtype: str = "auto"  # "auto", "bfloat16", "float16" or "float32"
    chat: str | bool = "auto"  # use the chat template when the tokenizer has one
    attn_implementation: str | None = None  # e.g. "flash_attention_2" / "sdpa" on a GPU
    trust_remote_code: bool = False
    smoke: SmokePolicyConfig = field(default_factory=SmokePolicyConfig)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "PolicyConfig":
        d = dict(d or {})
        smoke = SmokePolicyConfig(**(d.pop("smoke", None) or {}))
        return cls(**d, smoke=smoke)


def train_smoke_tokenizer(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE fitted on `texts`, wrapped as a transformers fast tokenizer (left padding)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, padding_side="left", truncation_side="left"
    )


def build_smoke_model(tokenizer, cfg: SmokePolicyConfig):
    """A randomly initialised tiny Qwen2 sized to `tokenizer`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(cfg.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model


def _recipe_key(cfg: SmokePolicyConfig, texts: list[str]) -> str:
    h = hashlib.sha256(json.dumps(asdict(cfg), sort_keys=True).encode())
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()[:16]


def smoke_policy(texts: Iterable[str], cache_dir: str, cfg: SmokePolicyConfig | None = None):
    """Build (or reload from `cache_dir`) the smoke-test tokenizer and model for these texts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = cfg or SmokePolicyConfig()
    texts = list(texts)
    key = _recipe_key(cfg, texts)
    stamp = os.path.join(cache_dir, "smoke_recipe.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f).get("key") == key:
                tok = AutoTokenizer.from_pretrained(cache_dir, padding_side="left")
                return AutoModelForCausalLM.from_pretrained(cache_dir), tok
    tok = train_smoke_tokenizer(texts, cfg.vocab_size)
    model = build_smoke_model(tok, cfg)
    os.makedirs(cache_dir, exist_ok=True)
    tok.save_pretrained(cache_dir)
    model.save_pretrained(cache_dir)
    with open(stamp, "w") as f:
        json.dump({"key": key, "config": asdict(cfg), "note": "smoke-test policy: random weights"}, f)
    return model, tok


def _torch_dtype(name: str):
    import torch

    return {"auto": "auto", "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def load_policy(cfg: PolicyConfig, output_dir: str, corpus: Iterable[str] = ()):
    """(model, tokenizer, chat) for a policy config.

    `corpus` (task code and the brief) is only read for the smoke policy, whose tokenizer is
    trained on it. Hub ids and local folders load through `from_pretrained`; the tokenizer pads on
    the left, as generation needs.
    """
    if cfg.name_or_path == SMOKE_NAME:
        model, tok = smoke_policy(corpus, os.path.join(output_dir, "smoke_policy"), cfg.smoke)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code, "dtype": _torch_dtype(cfg.dtype)}
        if cfg.attn_implementation:
            kwargs["attn_implementation"] = cfg.attn_implementation
        model = AutoModelForCausalLM.from_pretrained(cfg.name_or_path, **kwargs)
        tok = AutoTokenizer.from_pretrained(
            cfg.name_or_path, padding_side="left", trust_remote_code=cfg.trust_remote_code
        )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    chat = bool(getattr(tok, "chat_template", None)) if cfg.chat == "auto" else bool(cfg.chat)
    return model, tok, chat
