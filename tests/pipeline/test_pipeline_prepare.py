"""The stages before verification in preparing processes (`opsynth.generate.prepare`): a candidate
prepared there carries exactly what it carries when the asking process prepares it (rows do not
depend on where), and a preparing process that dies costs nothing but its restart: the candidate is
prepared in the asking process instead."""

from __future__ import annotations

import dataclasses
import json

import pytest

from opsynth.dedup import DedupConfig
from opsynth.generate import candidate as c
from opsynth.generate.prepare import Preparers
from opsynth.graph import SamplerConfig
from opsynth.verify import VerifyConfig

# GPU sizes, sized for an H200 shared by 16 workers (the cost model runs on meta tensors: no GPU here),
# so that both kinds of outcome come up: predicted_oom at sizing, and candidates that reach the verifier.
BUDGET_MB = VerifyConfig(device="cuda").task_memory_budget_mb("cuda", 140 * 1024, 16)
SEEDS = range(7_000_000, 7_000_024)


@pytest.fixture(scope="module")
def cfgs(kernelbench_parquet):
    return (dataclasses.asdict(SamplerConfig()), dataclasses.asdict(VerifyConfig(device="cuda")),
            dataclasses.asdict(DedupConfig(kb_path=str(kernelbench_parquet))))


@pytest.fixture(scope="module")
def here(cfgs):
    """The asking process's own context for these settings, without a verify pool."""
    sampler, verify, dedup = cfgs
    from opsynth.dedup import KernelBenchIndex
    from opsynth.generate.prepare import SizingPool

    with c._CTX_LOCK:
        c._ensure_sampler(sampler, verify)
        ctx = {"sampler": c._CTX["sampler"], "catalog": c._CTX["catalog"], "verify_cfg": VerifyConfig(**verify),
               "kb": KernelBenchIndex.from_config(dedup), "pool": SizingPool("cuda", BUDGET_MB)}
    return ctx


def _fields(cand) -> dict:
    """What the later stages and the record read of a prepared candidate (timings aside), as JSON."""
    return json.loads(json.dumps({k: getattr(cand, k) for k in c.PREPARED if k != "stage_s"}, default=str))


def _in_process(here, seed: int):
    cand = c.Candidate(index=seed, seed=seed)
    return cand, c.prepare(here, cand)


def test_a_preparing_process_gives_what_the_asking_process_gives(cfgs, here):
    sampler, verify, dedup = cfgs
    prep = Preparers(2, sampler, verify, dedup, True, "cuda", c.PREPARED)
    try:
        outcomes = set()
        for seed in SEEDS:
            want, want_ok = _in_process(here, seed)
            got = c.Candidate(index=seed, seed=seed)
            got.stage_s["worker_start"] = 0.5  # the asking process's own stage stays beside the preparer's
            assert prep.prepare(got, {"*": BUDGET_MB}, lambda: c.prepare(here, got)) is want_ok
            assert _fields(got) == _fields(want), seed
            assert got.stage_s["worker_start"] == 0.5 and got.stage_s["sampling"] > 0 and "prepare_wait" in got.stage_s
            outcomes.add(want.reason)
        assert prep.fallbacks == 0 and prep.replaced == 0
    finally:
        prep.close()
    # Both paths came up: candidates for the verifier (with their task source) and sizing's rejections.
    assert None in outcomes and "predicted_oom" in outcomes, outcomes


def test_a_preparing_process_that_dies_is_replaced_and_its_candidate_prepared_here(cfgs, here):
    sampler, verify, dedup = cfgs
    prep = Preparers(1, sampler, verify, dedup, True, "cuda", c.PREPARED)
    try:
        prep._slots[0].proc.kill()  # before it ever answered
        seed = SEEDS[0]
        want, want_ok = _in_process(here, seed)
        got = c.Candidate(index=seed, seed=seed)
        assert prep.prepare(got, {"*": BUDGET_MB}, lambda: c.prepare(here, got)) is want_ok
        assert _fields(got) == _fields(want)
        assert prep.fallbacks == 1 and prep.replaced == 1
        again = c.Candidate(index=seed, seed=seed)  # the replacement serves the next one
        assert prep.prepare(again, {"*": BUDGET_MB}, lambda: c.prepare(here, again)) is want_ok and _fields(again) == _fields(want)
        assert prep.fallbacks == 1
    finally:
        prep.close()


def test_a_stage_that_raises_there_raises_here(cfgs, here):
    """A bug in a stage is not a rejection: the asking thread raises, as it would preparing in process."""
    sampler, verify, dedup = cfgs
    prep = Preparers(1, sampler, verify, dedup, True, "cuda", c.PREPARED)
    try:
        with pytest.raises(RuntimeError, match="seed"):
            prep.prepare(c.Candidate(index=0, seed="not a seed"), {"*": BUDGET_MB}, lambda: False)
        assert prep.replaced == 0  # the process lives on
    finally:
        prep.close()


def test_prepare_processes_is_checked():
    from opsynth.generate.config import GenerateConfig

    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="prepare_processes"):
            GenerateConfig(prepare_processes=bad)
    assert GenerateConfig(prepare_processes=0).prepare_processes == 0


def test_processes_that_cannot_start_are_given_up_and_the_threads_prepare(cfgs, here, tmp_path):
    """A preparing process that fails at start (here: a KernelBench file it cannot read) is replaced;
    after MAX_FAILED_STARTS in a row no more are started, and every candidate is prepared in process."""
    from opsynth.generate import prepare as p

    sampler, verify, dedup = cfgs
    prep = Preparers(1, sampler, verify, {**dedup, "kb_path": str(tmp_path / "missing.parquet")}, True, "cuda", c.PREPARED)
    try:
        seed = SEEDS[1]
        want, want_ok = _in_process(here, seed)
        for k in range(p.MAX_FAILED_STARTS + 1):
            got = c.Candidate(index=seed, seed=seed)
            assert prep.prepare(got, {"*": BUDGET_MB}, lambda: c.prepare(here, got)) is want_ok and _fields(got) == _fields(want)
        assert prep.disabled and prep.replaced == p.MAX_FAILED_STARTS and prep.fallbacks == p.MAX_FAILED_STARTS
    finally:
        prep.close()


def test_a_slot_split_by_source_is_sized_against_its_wider_budget_in_a_preparing_process_too(cfgs, here):
    """verify.split_by_source (torch#1 at a quarter of an H100 shared by 16 workers): its single-op
    candidates fit where at the per-worker share most are `predicted_oom` (18 of 40 against 10) (the control: the same seeds
    against the one budget); another slot's candidates are sized as before; a preparing process sizes
    them as the asking process does."""
    from opsynth.generate.prepare import SizingPool

    sampler, verify, dedup = cfgs
    wide_cfg = VerifyConfig(**{**verify, "split_by_source": {"torch#1": 4}})
    budgets = {"*": wide_cfg.task_memory_budget_mb("cuda", 80 * 1024, 16),
               "torch#1": wide_cfg.task_memory_budget_mb("cuda", 80 * 1024, 16, "torch#1")}
    assert budgets["torch#1"] > 4 * budgets["*"]
    narrow, wide = dict(here, pool=SizingPool("cuda", budgets["*"])), dict(here, pool=SizingPool("cuda", budgets["*"], budgets))
    by_slot: dict = {}
    for seed in range(7_000_000, 7_001_500):
        cand = c.Candidate(index=seed, seed=seed)
        c.sample(narrow, cand)
        by_slot.setdefault(cand.data_source, []).append(seed)
    single, other = by_slot["torch#1"][:40], by_slot["torch#2"][:12]
    oom = {}
    for name, ctx in (("narrow", narrow), ("wide", wide)):
        got = [c.Candidate(index=s, seed=s) for s in single]
        oom[name] = sum(1 for cand in got if not c.prepare(ctx, cand) and cand.reason == "predicted_oom")
    fit = {k: len(single) - v for k, v in oom.items()}
    assert fit["wide"] >= 1.5 * fit["narrow"] and fit["narrow"] < len(single) / 2, fit  # here 18 against 10 of 40
    for seed in other:  # not listed: the same sizes either way
        a, b = c.Candidate(index=seed, seed=seed), c.Candidate(index=seed, seed=seed)
        c.prepare(narrow, a), c.prepare(wide, b)
        assert _fields(a) == _fields(b), seed
    prep = Preparers(1, sampler, {**verify, "split_by_source": {"torch#1": 4}}, dedup, True, "cuda", c.PREPARED)
    try:
        for seed in single[:6] + other[:2]:
            want = c.Candidate(index=seed, seed=seed)
            want_ok = c.prepare(wide, want)
            got = c.Candidate(index=seed, seed=seed)
            assert prep.prepare(got, budgets, lambda: c.prepare(wide, got)) is want_ok
            assert _fields(got) == _fields(want), seed
        assert prep.fallbacks == 0
    finally:
        prep.close()


def test_bad_split_by_source_settings_are_one_line_naming_them():
    for bad in ({"torch#1": 0}, {"torch#1": True}, {"torch#1": 2.5}, ["torch#1"]):
        with pytest.raises(ValueError, match="split_by_source") as e:
            VerifyConfig(split_by_source=bad)
        assert "\n" not in str(e.value)
    cfg = VerifyConfig(device="cuda", split_by_source={"torch#1": 4, "torch#2": 64})
    base = cfg.task_memory_budget_mb("cuda", 80 * 1024, 16)
    assert cfg.task_memory_budget_mb("cuda", 80 * 1024, 16, "torch#2") == base  # a split only widens
    assert cfg.task_memory_budget_mb("cuda", 80 * 1024, 16, "torch#3") == base
    assert cfg.task_memory_budget_mb("cuda", 80 * 1024, 16, "torch#1") > 4 * base


def test_split_by_source_from_the_command_line():
    from test_pipeline_config import _compose

    from opsynth.generate.config import generate_config

    cfg = generate_config(_compose("verify=cuda", "verify.split_by_source=['torch#1:4','transformers#1:8']"))
    assert cfg.verify.split_by_source == {"torch#1": 4, "transformers#1": 8}
    # On by default on a GPU for the two single-op slots (quota runs gave them up without it), off with null.
    default = {"torch#1": 4, "transformers#1": 4}
    assert generate_config(_compose("verify=cuda")).verify.split_by_source == default
    assert generate_config(_compose()).verify.split_by_source == default  # verify=auto: used when a GPU is there
    assert generate_config(_compose("verify=cuda", "verify.split_by_source=null")).verify.split_by_source == {}


def test_split_by_source_widens_nothing_on_the_cpu():
    """The default split names the single-op slots; a CPU worker's budget is its own address space, so
    no slot gets a wider one (and the card says none did)."""
    from opsynth.verify import WorkerPool

    pool = WorkerPool(VerifyConfig(device="cpu", n_workers=2, split_by_source={"torch#1": 4}))
    assert list(pool.budgets_mb) == ["*"]
