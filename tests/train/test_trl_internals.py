"""The adapter in front of TRL's private GRPOTrainer calls: the TRL versions it was read against,
the signatures it relies on, and a refusal (not a silent change) when a TRL release moves them."""

from __future__ import annotations

import types

import pytest

from opsynth.train import trl_internals


def test_the_installed_trl_is_one_the_adapter_was_read_against():
    """Fails on a TRL upgrade: read GRPOTrainer's `_tokenize_prompts` / `_generate_single_turn`
    in the new release, update SIGNATURES if needed, then add the version to TESTED."""
    import trl

    assert trl.__version__ in trl_internals.TESTED, (trl.__version__, trl_internals.TESTED)


def test_the_installed_grpo_trainer_has_the_signatures_the_adapter_calls():
    assert trl_internals.mismatches() == []
    trl_internals.check()


def test_a_trl_whose_internals_moved_is_refused_in_one_line():
    from trl import GRPOTrainer

    class Renamed(GRPOTrainer):  # a release that reshapes one call and drops another
        def _tokenize_prompts(self, batch):
            return super()._tokenize_prompts(batch)

        _log_metric = None

    found = trl_internals.mismatches(Renamed)
    assert any(f.startswith("_tokenize_prompts") for f in found) and "_log_metric is gone" in found, found
    assert not any(f.startswith("_generate_single_turn") for f in found)
    with pytest.raises(trl_internals.UnsupportedTRL, match="_tokenize_prompts") as e:
        trl_internals.check(Renamed)
    assert "\n" not in str(e.value)


def test_prompts_are_tokenised_as_trl_tokenises_them():
    """Through TRL's own `_tokenize_prompts` (plain-text prompts: the tokenizer's ids, unpadded)."""
    from trl import GRPOTrainer

    from opsynth.train.policy import train_smoke_tokenizer

    tok = train_smoke_tokenizer(["def forward(self, x): return x", "torch.relu(x) + 1"], vocab_size=300)
    trainer = types.SimpleNamespace(processing_class=tok)
    trainer._tokenize_prompts = types.MethodType(GRPOTrainer._tokenize_prompts, trainer)
    prompts = ["def forward(self, x):", "torch.relu(x)"]
    assert trl_internals.tokenize_prompts(trainer, prompts) == [tok(p)["input_ids"] for p in prompts]


def test_generation_goes_to_the_trainer_one_completion_per_context():
    calls = []
    trainer = types.SimpleNamespace(_generate_single_turn=lambda *a: calls.append(a) or ([[7]], None))
    assert trl_internals.generate_single_turn(trainer, [[1, 2]]) == ([[7]], None)
    assert calls == [([[1, 2]], None, {}, 1)]
