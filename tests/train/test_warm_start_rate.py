"""The smoke policy's warm start gives it a useful first turn at the sampling temperature.

Tasks come from the generator's own sampler and renderer (CPU sizes); the policy is warm-started
on the programs `opsynth.train.warm_start` writes for the training tasks, then asked, at
temperature 1 as GRPO samples, for a first turn on each task: on the tasks it was warmed on, and
on tasks it was not (the same operator chains at other sizes, which the generator also makes).
A sampled program counts when it is exactly the lowered program, which `test_warm_start.py`
shows the reward environment judges correct (so the rates here are lower bounds), and it must
parse as Python. Control: the same policy without the warm start writes none.
"""

from __future__ import annotations

import ast

import pytest

WARMED, SAMPLES = 12, 4


def _tasks():
    from opsynth.graph.sampler import Sampler, SamplerConfig
    from opsynth.render.parse import task_id
    from opsynth.render.source import render_task
    from opsynth.render.task_file import read_batch_size, set_batch_size
    from opsynth.train.warm_start import lower_task

    sampler = Sampler(SamplerConfig(scale=0.25))
    warmed = []
    for seed in range(400):
        code = render_task(sampler.sample(seed).graph)
        if lower_task(code) is not None:
            warmed.append({"code": code, "task_id": task_id(code)})
        if len(warmed) == WARMED:
            break
    # Not warmed on: the first half of those chains at another batch size (another task, same program),
    # one the warm start's size variants do not use (those double and halve it).
    others = []
    for r in warmed[: WARMED // 2]:
        code = set_batch_size(r["code"], 2 * (read_batch_size(r["code"]) or 1) + 1)
        others.append({"code": code, "task_id": task_id(code)})
    return warmed, others


def _first_turns(model, tok, rows, brief):
    from opsynth.reward.candidate import extract_candidate
    from opsynth.train.prompts import build_prompt
    from opsynth.train.score import hf_generate

    gen = hf_generate(model, tok, max_new_tokens=96, temperature=1.0, batch_size=32)
    prompts = [tok(build_prompt(r["code"], brief), add_special_tokens=False)["input_ids"] for r in rows for _ in range(SAMPLES)]
    out, _ = gen(prompts)
    return [extract_candidate(tok.decode(ids, skip_special_tokens=True)) for ids in out]


def _rate(programs, rows):
    from opsynth.train.warm_start import lower_task

    want = [lower_task(r["code"]) for r in rows for _ in range(SAMPLES)]
    hits = 0
    for got, ok in zip(programs, want):
        if got is not None and got.strip() == ok.strip():
            ast.parse(got)
            hits += 1
    return hits / len(want)


@pytest.mark.slow
def test_warm_started_first_turns_are_correct_on_a_share_of_tasks(tmp_path):
    import torch

    from opsynth.train.policy import SmokePolicyConfig, smoke_policy
    from opsynth.train.prompts import KERNEL_BRIEF, build_prompt
    from opsynth.train.warm_start import passages, size_variant_examples, smoke_examples

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # generation with a model this small: threads only add waiting
    warmed, others = _tasks()
    examples = smoke_examples(warmed, None)
    assert len(examples) == WARMED  # every task it can write for, not a few
    cfg = SmokePolicyConfig(warm_start_tasks=None)
    variants = size_variant_examples(warmed, None, cfg.warm_start_size_variants)
    assert len(variants) == WARMED * cfg.warm_start_size_variants
    seen = {p for p, _ in examples + variants}
    assert not any(build_prompt(r["code"]) in seen for r in others)  # the others really are new prompts
    corpus = [KERNEL_BRIEF] + [r["code"] for r in warmed]
    try:
        model, tok = smoke_policy(corpus, str(tmp_path / "warm"), cfg, examples, passages=passages(), variants=variants)
    finally:
        torch.set_num_threads(threads)
    info = __import__("json").loads((tmp_path / "warm" / "smoke_recipe.json").read_text())["warm_start"]
    assert info["examples"] == WARMED and info["sample_rate"] >= cfg.warm_start_rate, info

    on_warmed = _rate(_first_turns(model, tok, warmed, KERNEL_BRIEF), warmed)
    on_others = _rate(_first_turns(model, tok, others, KERNEL_BRIEF), others)
    assert on_warmed >= 0.3, (on_warmed, info)
    assert on_others > 0, (on_others, on_warmed)

    cold, cold_tok = smoke_policy(corpus, str(tmp_path / "cold"), cfg, ())  # control: no warm start
    assert _rate(_first_turns(cold, cold_tok, warmed, KERNEL_BRIEF), warmed) == 0


def test_a_saved_smoke_tokenizer_reloads_as_it_was_trained(tmp_path):
    """Beside the model's config.json, AutoTokenizer would load the smoke tokenizer as a
    Qwen2Tokenizer with another pre-tokenizer (control); `load_tokenizer` keeps it as trained."""
    from transformers import AutoTokenizer

    from opsynth.train.policy import SmokePolicyConfig, build_smoke_model, load_tokenizer, train_smoke_tokenizer
    from opsynth.train.prompts import KERNEL_BRIEF
    from opsynth.train.warm_start import lower_task, passages

    warmed, _ = _tasks()
    programs = [lower_task(r["code"]) for r in warmed[:4]]
    tok = train_smoke_tokenizer([KERNEL_BRIEF] + [r["code"] for r in warmed] + programs, 1024, unit="line",
                                passages=passages())
    build_smoke_model(tok, SmokePolicyConfig(hidden_size=8, intermediate_size=8, num_attention_heads=2,
                                             num_key_value_heads=1)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    want = tok(programs[0], add_special_tokens=False)["input_ids"]
    assert load_tokenizer(str(tmp_path))(programs[0], add_special_tokens=False)["input_ids"] == want
    assert AutoTokenizer.from_pretrained(str(tmp_path))(programs[0], add_special_tokens=False)["input_ids"] != want
