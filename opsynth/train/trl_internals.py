"""The one door into TRL's private GRPOTrainer API.

`MultiTurnRollout` (a TRL `rollout_func`) generates turn by turn with the trainer's own
generation, so `use_vllm` and transformers generation both work. TRL has no public call for that:
it goes through `GRPOTrainer._tokenize_prompts(prompts) -> (prompt_ids, images, multimodal_fields)`
(the chat template or the plain tokenizer, as TRL tokenises prompts itself) and
`GRPOTrainer._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations) ->
(completion_ids, logprobs)` (vLLM, continuous batching or `generate` on left-padded ids; logprobs
None without vLLM), plus `_log_metric(name, value)` and the `eos_token_ids` list. A TRL release
may rename or reshape any of them: `check()` compares their signatures with the ones read in the
TRL versions of `TESTED` and refuses to train, in one line, when they differ (a loud stop at start
instead of a silent change of what is trained); `tests/train/test_trl_internals.py` fails when the
installed TRL is not one of `TESTED`, so an upgrade is read against TRL's source before it ships.
"""

from __future__ import annotations

import inspect
from typing import Any

# TRL versions whose GRPOTrainer source these calls were read against.
TESTED = ("1.16.0",)
# The parameters each private method must take (the leading ones, in order), as in TESTED.
SIGNATURES: dict[str, tuple[str, ...]] = {
    "_tokenize_prompts": ("self", "prompts"),
    "_generate_single_turn": ("self", "prompt_ids", "images", "multimodal_fields", "num_generations"),
    "_log_metric": ("self", "name", "value"),
}


class UnsupportedTRL(RuntimeError):
    """The installed TRL's GRPOTrainer internals are not those this adapter was written for."""


def mismatches(trainer_cls: type | None = None) -> list[str]:
    """How `trainer_cls` (default: TRL's GRPOTrainer) differs from `SIGNATURES`; [] when it fits."""
    if trainer_cls is None:
        from trl import GRPOTrainer as trainer_cls
    found = []
    for name, want in SIGNATURES.items():
        fn = getattr(trainer_cls, name, None)
        if fn is None:
            found.append(f"{name} is gone")
            continue
        have = tuple(inspect.signature(fn).parameters)[:len(want)]
        if have != want:
            found.append(f"{name}{have} (expected {want})")
    return found


def check(trainer_cls: type | None = None) -> None:
    """Raise UnsupportedTRL (one line) when the installed TRL's internals differ from SIGNATURES."""
    found = mismatches(trainer_cls)
    if found:
        import trl

        raise UnsupportedTRL(f"trl {trl.__version__}'s GRPOTrainer internals changed ({'; '.join(found)}); "
                             f"opsynth.train.trl_internals was written for trl {', '.join(TESTED)}: install one "
                             "of those or update the adapter")


def tokenize_prompts(trainer: Any, prompts: list[Any]) -> list[list[int]]:
    """The prompts' token ids, tokenised as TRL tokenises them (chat template when conversational)."""
    prompt_ids, _images, _fields = trainer._tokenize_prompts(prompts)
    return [list(p) for p in prompt_ids]


def generate_single_turn(trainer: Any, prompt_ids: list[list[int]]) -> tuple[list[list[int]], Any]:
    """One completion per context through the trainer's own generation: (completion ids, logprobs
    or None). Text-only: no images, no multimodal fields."""
    return trainer._generate_single_turn(prompt_ids, None, {}, 1)


def log_metric(trainer: Any, name: str, value: float) -> None:
    """Add a scalar to the step's logged metrics (averaged over the logging step), when the trainer can."""
    log = getattr(trainer, "_log_metric", None)
    if log is not None:
        log(name, value)


def eos_token_ids(trainer: Any) -> list[int] | None:
    """The token ids that end a completion, as the trainer's generation uses them."""
    return getattr(trainer, "eos_token_ids", None)
