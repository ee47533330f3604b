"""The policy: any Hugging Face causal LM, or a tiny smoke-test model built here with no download.

The smoke policy exists so that the whole training loop (prompts, generation, reward environment,
feedback turns, GRPO update, checkpoints) runs on a machine without internet. Its tokenizer is a
byte-level BPE trained on the prompt brief, the shards' own code and its warm-start programs; its
model is a randomly initialised Qwen2 of a few hundred thousand parameters, warm-started
(supervised) to answer a few of its tasks with real C++ programs (`opsynth.train.warm_start`), so
that from the first step its completions build, run and are judged, and some score 1 or more. It
learns nothing general about kernels: it is a demonstration of the loop.
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

    vocab_size: int = 4096
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 8192
    seed: int = 0
    warm_start_tasks: int = 4  # supervised warm start on this many tasks' C++ programs (0: none)
    warm_start_steps: int = 200  # at most; it stops once greedy decoding reproduces every program
    warm_start_lr: float = 3e-3


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
        """From a plain mapping (conf/policy/*.yaml): the shared builder, so an unknown or mistyped
        key is an error naming `policy.<key>` (or `policy.smoke.<key>`)."""
        from opsynth.config import build, to_plain

        d = dict(to_plain(d) or {})
        smoke = d.pop("smoke", None)
        if not isinstance(smoke, SmokePolicyConfig):
            smoke = build(SmokePolicyConfig, smoke, "policy.smoke")
        return build(cls, {**d, "smoke": smoke}, "policy")


def train_smoke_tokenizer(texts: Iterable[str], vocab_size: int, merge_across_words: bool = False):
    """A byte-level BPE fitted on `texts`, wrapped as a transformers fast tokenizer (left padding).

    `merge_across_words`: no split into words first, so a merge may span spaces and newlines and a
    passage the corpus repeats (the brief, the warm-start programs' shared C++) becomes a few tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not merge_across_words)
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


def _recipe_key(cfg: SmokePolicyConfig, texts: list[str], examples: list[tuple[str, str]]) -> str:
    h = hashlib.sha256(json.dumps(asdict(cfg), sort_keys=True).encode())
    for t in texts + [p + "\x00" + c for p, c in examples]:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()[:16]


def warm_start(model, tokenizer, examples: list[tuple[str, str]], steps: int, lr: float, target_loss: float = 0.15,
               log=print) -> dict[str, Any]:
    """Supervised fine-tuning on (prompt, completion) pairs, the loss on the completion's tokens
    only, until the loss is under `target_loss` and greedy decoding reproduces every completion (or
    `steps` run out). Stopping there, not at zero loss, leaves sampling some variety for GRPO."""
    import torch

    eos = tokenizer.eos_token_id
    seqs = []
    for prompt, completion in examples:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [eos]
        seqs.append((torch.tensor([p + c]), torch.tensor([[-100] * len(p) + c]), len(p), c))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    loss_v, done, step = float("nan"), False, 0
    for step in range(1, steps + 1):
        total = 0.0
        opt.zero_grad()
        for ids, labels, _, _ in seqs:
            loss = model(input_ids=ids, labels=labels).loss / len(seqs)
            loss.backward()
            total += float(loss.detach())
        opt.step()
        loss_v = total
        if loss_v < target_loss or step == steps:
            done = all(_reproduces(model, ids[:, :n], c) for ids, _, n, c in seqs)
            if done or step == steps:
                break
    log(f"[train] smoke warm start: {step} steps, loss {loss_v:.3f}, greedy decoding reproduces "
        f"{'every' if done else 'not every'} program")
    model.eval()
    return {"steps": step, "loss": loss_v, "reproduces": done, "examples": len(seqs),
            "completion_tokens": [len(c) for _, _, _, c in seqs]}


def _reproduces(model, prompt_ids, completion: list[int]) -> bool:
    import torch

    with torch.no_grad():
        out = model.generate(input_ids=prompt_ids, attention_mask=torch.ones_like(prompt_ids),
                             max_new_tokens=len(completion), do_sample=False)
    return out[0, prompt_ids.shape[1]:].tolist() == completion


def smoke_policy(texts: Iterable[str], cache_dir: str, cfg: SmokePolicyConfig | None = None,
                 examples: Iterable[tuple[str, str]] = ()):
    """Build (or reload from `cache_dir`) the smoke-test tokenizer and model for these texts,
    warm-started on `examples` ((prompt, completion) pairs)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = cfg or SmokePolicyConfig()
    texts, examples = list(texts), list(examples)
    key = _recipe_key(cfg, texts, examples)
    stamp = os.path.join(cache_dir, "smoke_recipe.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f).get("key") == key:
                tok = AutoTokenizer.from_pretrained(cache_dir, padding_side="left")
                return AutoModelForCausalLM.from_pretrained(cache_dir), tok
    tok = train_smoke_tokenizer(texts + [c for _, c in examples], cfg.vocab_size, merge_across_words=bool(examples))
    model = build_smoke_model(tok, cfg)
    info: dict[str, Any] = {}
    if examples:
        info = warm_start(model, tok, examples, cfg.warm_start_steps, cfg.warm_start_lr)
    os.makedirs(cache_dir, exist_ok=True)
    tok.save_pretrained(cache_dir)
    model.save_pretrained(cache_dir)
    with open(stamp, "w") as f:
        json.dump({"key": key, "config": asdict(cfg), "warm_start": info,
                   "note": "smoke-test policy: random weights" + (", warm-started on C++ programs" if examples else "")}, f)
    return model, tok


def _torch_dtype(name: str):
    import torch

    return {"auto": "auto", "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def load_policy(cfg: PolicyConfig, output_dir: str, corpus: Iterable[str] = (),
                warm_start_examples: Iterable[tuple[str, str]] = ()):
    """(model, tokenizer, chat) for a policy config.

    `corpus` (task code and the brief) and `warm_start_examples` ((prompt, completion) pairs) are
    only read for the smoke policy, whose tokenizer is trained on them and which is warm-started on
    the pairs. Hub ids and local folders load through `from_pretrained`; the tokenizer pads on the
    left, as generation needs.
    """
    if cfg.name_or_path == SMOKE_NAME:
        model, tok = smoke_policy(corpus, os.path.join(output_dir, "smoke_policy"), cfg.smoke, warm_start_examples)
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
