"""The policy: any Hugging Face causal LM, or a tiny smoke-test model built here with no download.

The smoke policy exists so that the whole training loop (prompts, generation, reward environment,
feedback turns, GRPO update, checkpoints) runs on a machine without internet. Its tokenizer is a
byte-level BPE trained on the prompt brief, the shards' own code and its warm-start programs; its
model is a randomly initialised Qwen2 of a few hundred thousand parameters, warm-started
(supervised) to answer its tasks with real C++ or CUDA programs (`opsynth.train.warm_start`: every
task it can write for, or a few), until sampling at the trainer's temperature writes them with a
set probability, so that from the first step its first turns build, run and are judged correct on
a measurable share of tasks, and GRPO has groups whose episodes differ. It learns little general
about kernels (the same operator chain at other sizes, yes; a new chain, hardly): it is a
demonstration of the loop.
Both are cached under the run's output folder and reused when the same recipe asks again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

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
    # Supervised warm start on this many training tasks' programs (0: none; None: every task
    # opsynth.train.warm_start can write a program for).
    warm_start_tasks: int | None = 4
    warm_start_steps: int = 2000  # at most; stops at warm_start_rate once greedy writes every program
    warm_start_lr: float = 1e-2
    warm_start_batch: int = 16  # examples per optimiser step
    # Stop once sampling at the trainer's temperature writes each program with this probability on
    # average (exactly: the mean of exp(sum of the program's token log-probs at that temperature)).
    # Below 1 on purpose: GRPO needs groups whose episodes differ.
    warm_start_rate: float = 0.6
    # Each warm-start task is also shown at this many other batch sizes, with the same program
    # (opsynth.train.warm_start.size_variant_examples), so the policy answers its tasks at new sizes.
    warm_start_size_variants: int = 2
    # With turns > 1, also warm-start second turns (opsynth.train.warm_start.revision_examples):
    # after feedback on a first answer, the program again. Without them every second turn is text
    # with no program in it, and GRPO pushes that text around with the episode's advantage.
    warm_start_revisions: bool = True

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings", "warm_start_steps", "warm_start_batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"policy.smoke.{name} must be an integer >= 1, got {v!r}")
        if self.warm_start_tasks is not None and (isinstance(self.warm_start_tasks, bool) or self.warm_start_tasks < 0):
            raise ValueError(f"policy.smoke.warm_start_tasks must be >= 0 or null (every task), got {self.warm_start_tasks!r}")
        if isinstance(self.warm_start_size_variants, bool) or self.warm_start_size_variants < 0:
            raise ValueError(f"policy.smoke.warm_start_size_variants must be >= 0, got {self.warm_start_size_variants!r}")
        if not 0.0 < float(self.warm_start_rate) <= 1.0:
            raise ValueError(f"policy.smoke.warm_start_rate must be in (0, 1], got {self.warm_start_rate!r}")
        if not float(self.warm_start_lr) > 0:
            raise ValueError(f"policy.smoke.warm_start_lr must be > 0, got {self.warm_start_lr!r}")


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


TOKEN_UNITS = ("word", "line", "text")


def train_smoke_tokenizer(texts: Iterable[str], vocab_size: int, merge_across_words: bool = False,
                          unit: str | None = None, passages: Sequence[str] = ()):
    """A byte-level BPE fitted on `texts`, wrapped as a transformers fast tokenizer (left padding).

    `unit` is what a merge may not cross: `word` (the GPT-2 split), `line` (a merge may span spaces
    but not a newline, so a line the corpus repeats becomes one token, in the prompt's copy of the
    task as in the program's; every digit is a token of its own, so a task at another size reads as
    the same tokens but for its numbers) or `text` (nothing: a passage the corpus repeats becomes a few tokens);
    `merge_across_words=True` is `text`. `passages` are long strings made one token each wherever
    they occur (the prompt's brief, the program's shared extension).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    unit = unit or ("text" if merge_across_words else "word")
    if unit not in TOKEN_UNITS:
        raise ValueError(f"unit must be one of {TOKEN_UNITS}, got {unit!r}")
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=unit == "word")
    tok.pre_tokenizer = byte_level if unit != "line" else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex("\n"), behavior="merged_with_previous"),
         pre_tokenizers.Split(Regex("[0-9]"), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = list(texts)
    for p in passages:  # what the passages cover needs no merges
        texts = [t.replace(p, "\n") for t in texts]
    tok.train_from_iterator(texts, trainer=trainer)
    if passages:
        tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in passages])
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


def _recipe_key(cfg: SmokePolicyConfig, texts: list[str], examples: list[tuple[str, str]], extra: Any = None) -> str:
    h = hashlib.sha256(json.dumps([asdict(cfg), extra, WARM_START_VERSION], sort_keys=True, default=str).encode())
    for t in texts + [p + "\x00" + c for p, c in examples]:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()[:16]


WARM_START_VERSION = 5  # bumped when the recipe's code changes what it builds (the cache key includes it)


def program_log_probs(model, batch: list[tuple[list[int], list[int]]], pad_id: int, temperature: float = 1.0):
    """Per example, the sum of its completion's token log-probs under sampling at `temperature`
    (exp of it: the probability that sampling writes exactly that completion), and whether greedy
    decoding would write it (every completion token is the arg-max given the ones before it).
    `batch` holds (prompt ids, completion ids) pairs; one forward pass, left-padded."""
    import torch

    device = next(model.parameters()).device
    width = max(len(p) + len(c) for p, c in batch)
    keep = max(len(c) for _, c in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), keep), -100, dtype=torch.long)
    for i, (p, c) in enumerate(batch):
        n = len(p) + len(c)
        ids[i, width - n:] = torch.tensor(p + c)
        mask[i, width - n:] = 1
        labels[i, keep - len(c):] = torch.tensor(c)
    ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
    # Only the last keep + 1 positions' logits: those that predict the completion tokens.
    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep + 1).logits[:, :-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    on = labels != -100
    tok_logp = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * on
    greedy = ((logits.argmax(-1) == labels) | ~on).all(dim=1)
    return tok_logp.sum(dim=1), greedy


def warm_start(model, tokenizer, examples: list[tuple[str, str]], steps: int, lr: float, target_rate: float = 0.6,
               temperature: float = 1.0, batch_size: int = 16, seed: int = 0, log=print,
               variants: list[tuple[str, str]] = (), revisions: list[tuple[str, str, str, str]] = ()) -> dict[str, Any]:
    """Supervised fine-tuning on (prompt, completion) pairs (`examples`, one per task, and
    `variants`: more prompts with those answers) and second turns (`revisions`: (prompt, first
    answer, feedback, answer), laid out in tokens as a multi-turn episode lays them out: the first
    answer's tokens and end-of-sequence, then `TurnCodec`'s plain-text feedback tokens), the loss
    on the completion's tokens only, in
    shuffled minibatches, until sampling at `temperature` writes each completion with probability
    `target_rate` on average over the last pass through them and greedy decoding writes every one
    (or `steps` run out). Stopping there,
    not at certainty, leaves sampling some variety for GRPO. On a GPU when there is one (the model
    comes back on the CPU); on the CPU with one thread, faster for a model this small."""
    import torch

    eos = tokenizer.eos_token_id
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    seqs = [(ids(p), ids(c) + [eos]) for p, c in [*examples, *variants]]
    if revisions:
        from opsynth.train.episodes import TurnCodec

        codec = TurnCodec(tokenizer, chat=False)
        seqs += [(ids(p) + ids(first) + [eos] + codec.feedback_ids(fb), ids(c) + [eos]) for p, first, fb, c in revisions]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # intra-op threads cost more than they save on matrices this small
    try:
        info = _fit(model, tokenizer, seqs, steps, lr, target_rate, temperature, batch_size, seed, device)
    finally:
        torch.set_num_threads(threads)
        model.eval()
        model.to("cpu")
    log(f"[train] smoke warm start: {info['steps']} steps on {len(examples)} programs"
        + (f" ({len(variants)} more prompts at other sizes)" if variants else "")
        + (f" (and {len(revisions)} second turns)" if revisions else "")
        + f", loss {info['loss']:.3f}, sampling at temperature {temperature:g} writes a program exactly with "
        f"probability {info['sample_rate']:.2f} on average; greedy decoding reproduces {info['greedy_reproduced']} "
        f"of {len(seqs)}")
    return {**info, "examples": len(examples), "variants": len(variants), "revisions": len(revisions),
            "temperature": temperature,
            "completion_tokens": [len(c) for _, c in seqs[:len(examples)]]}


def _fit(model, tokenizer, seqs, steps: int, lr: float, target_rate: float, temperature: float, batch_size: int,
         seed: int, device: str) -> dict[str, Any]:
    """The warm start's loop (see `warm_start`): steps, last loss, sampling rate, greedy reproduction."""
    import math
    import random

    import torch

    pad = tokenizer.pad_token_id
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    rng = random.Random(seed)
    rate = {}  # example -> probability of sampling its completion, when last seen
    greedy = {}
    model.train()
    step, loss_v = 0, float("nan")
    while step < steps:
        order = list(range(len(seqs)))
        rng.shuffle(order)
        for k in range(0, len(order), batch_size):
            idx = order[k:k + batch_size]
            logp, exact = program_log_probs(model, [seqs[i] for i in idx], pad)
            loss = -logp.sum() / sum(len(seqs[i][1]) for i in idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            loss_v = float(loss.detach())
            with torch.no_grad():
                t_logp = logp.detach() if temperature == 1.0 else program_log_probs(
                    model, [seqs[i] for i in idx], pad, temperature)[0]
            for i, lp, g in zip(idx, t_logp.tolist(), exact.tolist()):
                rate[i], greedy[i] = math.exp(lp), bool(g)
            if step >= steps:
                break
        # Both: the mean sampling rate, and greedy decoding writing every program exactly (a pass can
        # reach the rate with one of 40 still a token off under greedy decoding; seen in CI).
        if len(rate) == len(seqs) and sum(rate.values()) / len(rate) >= target_rate and all(greedy.values()):
            break
    return {"steps": step, "loss": loss_v, "sample_rate": sum(rate.values()) / len(rate) if rate else 0.0,
            "reproduces": bool(greedy) and all(greedy.values()), "greedy_reproduced": sum(greedy.values())}


def smoke_policy(texts: Iterable[str], cache_dir: str, cfg: SmokePolicyConfig | None = None,
                 examples: Iterable[tuple[str, str]] = (), passages: Sequence[str] = (), temperature: float = 1.0,
                 variants: Iterable[tuple[str, str]] = (), revisions: Iterable[tuple[str, str, str, str]] = ()):
    """Build (or reload from `cache_dir`) the smoke-test tokenizer and model for these texts,
    warm-started on `examples` ((prompt, completion) pairs, one per task; `variants`: more prompts
    with those answers) until sampling at `temperature` writes them (see `warm_start`). With examples the tokenizer merges within lines and makes each of
    `passages` (the prompt's brief, the programs' shared extension) one token, so the model reads and
    writes only a task's own lines, a repeated line as one token."""
    from transformers import AutoModelForCausalLM

    cfg = cfg or SmokePolicyConfig()
    texts, examples, passages, variants = list(texts), list(examples), list(passages), list(variants)
    revisions = list(revisions)
    key = _recipe_key(cfg, texts, examples + variants, extra={"passages": passages, "temperature": temperature,
                                                              **({"revisions": revisions} if revisions else {})})
    stamp = os.path.join(cache_dir, "smoke_recipe.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f).get("key") == key:
                return AutoModelForCausalLM.from_pretrained(cache_dir), load_tokenizer(cache_dir)
    if examples:
        tok = train_smoke_tokenizer(texts + [c for _, c in examples], cfg.vocab_size, unit="line", passages=passages)
    else:
        tok = train_smoke_tokenizer(texts, cfg.vocab_size)
    model = build_smoke_model(tok, cfg)
    info: dict[str, Any] = {}
    if examples:
        info = warm_start(model, tok, examples, cfg.warm_start_steps, cfg.warm_start_lr, target_rate=cfg.warm_start_rate,
                          temperature=temperature, batch_size=cfg.warm_start_batch, seed=cfg.seed, variants=variants,
                          revisions=revisions)
    os.makedirs(cache_dir, exist_ok=True)
    tok.save_pretrained(cache_dir)
    model.save_pretrained(cache_dir)
    with open(stamp, "w") as f:
        json.dump({"key": key, "config": asdict(cfg), "warm_start": info,
                   "note": "smoke-test policy: random weights" + (", warm-started on C++ programs" if examples else "")}, f)
    return model, tok


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False):
    """The tokenizer of a policy folder or Hub id, padding on the left (as generation needs).

    A tokenizer saved as a plain `tokenizers` one (`tokenizer_class` TokenizersBackend: the smoke
    policy's, and so a training run's `final/` of it) loads exactly as saved: `AutoTokenizer` would
    pick the class of the model's type (Qwen2Tokenizer) and replace its pre-tokenizer, so the same
    text would become other tokens than the policy was trained on."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = os.path.join(name_or_path, "tokenizer_config.json")
    if os.path.isfile(config):
        with open(config) as f:
            if json.load(f).get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast"):
                return PreTrainedTokenizerFast.from_pretrained(name_or_path, padding_side="left")
    return AutoTokenizer.from_pretrained(name_or_path, padding_side="left", trust_remote_code=trust_remote_code)


def _torch_dtype(name: str):
    import torch

    return {"auto": "auto", "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def load_policy(cfg: PolicyConfig, output_dir: str, corpus: Iterable[str] = (),
                warm_start_examples: Iterable[tuple[str, str]] = (), passages: Sequence[str] = (),
                temperature: float = 1.0, warm_start_variants: Iterable[tuple[str, str]] = (),
                warm_start_revisions: Iterable[tuple[str, str, str, str]] = ()):
    """(model, tokenizer, chat) for a policy config.

    `corpus` (task code and the brief) and `warm_start_examples` ((prompt, completion) pairs) are
    only read for the smoke policy, whose tokenizer is trained on them and which is warm-started on
    the pairs (until sampling at `temperature` writes them; `passages`: see `smoke_policy`). Hub ids
    and local folders load through `from_pretrained`; the tokenizer pads on the
    left, as generation needs.
    """
    if cfg.name_or_path == SMOKE_NAME:
        model, tok = smoke_policy(corpus, os.path.join(output_dir, "smoke_policy"), cfg.smoke, warm_start_examples,
                                  passages=passages, temperature=temperature, variants=warm_start_variants,
                                  revisions=warm_start_revisions)
    else:
        from transformers import AutoModelForCausalLM

        kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code, "dtype": _torch_dtype(cfg.dtype)}
        if cfg.attn_implementation:
            kwargs["attn_implementation"] = cfg.attn_implementation
        model = AutoModelForCausalLM.from_pretrained(cfg.name_or_path, **kwargs)
        tok = load_tokenizer(cfg.name_or_path, cfg.trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    chat = bool(getattr(tok, "chat_template", None)) if cfg.chat == "auto" else bool(cfg.chat)
    return model, tok, chat
