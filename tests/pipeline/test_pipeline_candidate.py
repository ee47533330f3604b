"""`process_candidate` on its own, without Dask: one candidate from seed to record. An accepted
record carries a row that fits the shard schema; a rejected one carries a named reason."""

from __future__ import annotations

import dataclasses
import gc
import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from opsynth.generate import candidate
from opsynth.generate.config import candidate_seed
from opsynth.dedup import DedupConfig
from opsynth.graph import OpGraph, SamplerConfig
from opsynth.render import parse_task, task_id
from opsynth.shards import validate_row
from opsynth.verify import REASONS, VerifyConfig

SEED = candidate_seed(0, 0)  # candidate 0 of seed 0: accepted in the small CPU setting


@pytest.fixture(scope="module")
def cfgs(kernelbench_parquet):
    sampler = dataclasses.asdict(SamplerConfig(scale=0.1))
    # One sandbox, a fast backend, no calibration and a wide band: acceptance does not hinge on timing.
    verify = dataclasses.asdict(VerifyConfig(device="cpu", n_workers=1, compile_backend="eager", calibrate=False,
                                             cpu_min_ms=0.0, cpu_max_ms=1e6))
    dedup = dataclasses.asdict(DedupConfig(kb_path=str(kernelbench_parquet)))
    yield sampler, verify, dedup
    candidate._close_context()


@pytest.fixture(scope="module")
def accepted(cfgs):
    sampler, verify, dedup = cfgs
    return candidate.process_candidate(0, SEED, sampler, verify, dedup, True)


def test_a_good_seed_gives_an_accepted_record_with_a_valid_row(accepted):
    rec = accepted
    assert rec["accepted"] is True and rec["reason"] is None, rec
    assert rec["verifier_ran"] is True
    assert (rec["index"], rec["seed"]) == (0, SEED)
    row = rec["row"]
    assert validate_row(row) == row  # every column present, typed as the schema says, in order
    assert list(row)[:3] == ["code", "ops", "data_source"]
    assert row["task_id"] == task_id(row["code"])
    assert row["seed"] == SEED
    assert row["ops"] == parse_task(row["code"]).ops
    assert row["data_source"] == (f"torch#{row['num_ops']}" if row["data_source"].startswith("torch#")
                                  else "transformers#1")
    assert row["device"] == "cpu" and row["torch_version"]
    assert row["eager_ms"] > 0 and row["compile_ms"] > 0
    assert 0.0 <= row["kb_max_similarity"] <= 0.9 and row["kb_nearest"]
    # A resumed run rebuilds its dedup state from the graph column: it must give the same signature.
    assert rec["signature"] == OpGraph.from_json(row["graph"]).signature()


def test_input_shapes_match_what_get_inputs_makes(accepted):
    """input_shapes is read from the source without running it; running it (in a child) agrees."""
    code = accepted["row"]["code"]
    probe = ("import json, sys, torch\nns = {}\nexec(sys.stdin.read(), ns)\n"
             "print(json.dumps([{'shape': list(t.shape), 'dtype': str(t.dtype).replace('torch.', '')}"
             " for t in ns['get_inputs']()]))")
    out = subprocess.run([sys.executable, "-c", probe], input=code, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(accepted["row"]["input_shapes"]) == json.loads(out.stdout.strip().splitlines()[-1])


def test_a_kernelbench_rejection_names_the_check_and_the_nearest_problem(cfgs, accepted):
    """The threshold is set just below and just above this task's own similarity: only the first
    rejects, and the rejection reports the similarity and nearest problem the accepted row carries."""
    sampler, verify, dedup = cfgs
    sim, nearest = accepted["row"]["kb_max_similarity"], accepted["row"]["kb_nearest"]
    assert 0.05 < sim < 0.9, "the probe needs room below the similarity"
    rec = candidate.process_candidate(0, SEED, sampler, verify, {**dedup, "kb_threshold": sim - 0.01}, True)
    assert rec["accepted"] is False and rec["row"] is None
    assert rec["reason"] == "kb_similarity"
    assert rec["evidence"]["similarity"] == pytest.approx(sim) and rec["evidence"]["nearest"] == nearest
    passed = candidate.process_candidate(0, SEED, sampler, verify, {**dedup, "kb_threshold": sim + 0.01}, True)
    assert passed["accepted"] is True and passed["row"]["kb_max_similarity"] == pytest.approx(sim)


def test_a_sampling_failure_is_a_record_not_an_exception(cfgs):
    sampler, verify, dedup = cfgs
    rec = candidate.process_candidate(5, 5, {**sampler, "max_attempts": 0}, verify, dedup, True)
    assert (rec["accepted"], rec["reason"], rec["index"]) == (False, "sampling_failed", 5)
    assert rec["verifier_ran"] is False  # decided before the GPU: a tenth of a miss toward giving its slot up
    assert "attempts" in rec["evidence"]


def test_kb_check_off_leaves_the_similarity_columns_null_and_the_task_unchanged(cfgs, accepted):
    sampler, verify, dedup = cfgs
    rec = candidate.process_candidate(0, SEED, sampler, verify, dedup, False)
    assert rec["accepted"], rec
    # Same seed, same task: what a resumed run relies on.
    assert rec["row"]["code"] == accepted["row"]["code"] and rec["signature"] == accepted["signature"]
    row = validate_row(rec["row"])
    assert row["kb_max_similarity"] is None and row["kb_nearest"] is None


def test_a_verifier_rejection_is_a_record_with_a_named_reason(cfgs):
    # Last in the module: new verify settings restart the sandbox pool.
    sampler, verify, dedup = cfgs
    impossible = {**verify, "cpu_min_ms": 1e9, "cpu_max_ms": 2e9}  # no task is this slow
    rec = candidate.process_candidate(0, SEED, sampler, impossible, dedup, True)
    assert rec["accepted"] is False and rec["row"] is None
    # The memory one verifier request may hold stops the batch before any target this slow.
    assert rec["reason"] == "predicted_oom" and rec["reason"] in REASONS
    assert rec["evidence"] and rec["verifier_ran"] is False


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="CPython 3.13 fixed the race; the pipeline leaves ast alone")
def test_every_candidate_takes_the_ast_parse_lock(cfgs, accepted):
    """The pipeline itself (not the test) installs the lock: `_context`, which every candidate
    calls first, wraps `ast.parse`, and the wrapper waits for the pipeline's lock."""
    import ast

    sampler, verify, dedup = cfgs
    wrapped = ast.parse
    original = getattr(ast.parse, "__wrapped__", ast.parse)
    ast.parse = original
    try:
        candidate._context(sampler, verify, dedup, True)  # same settings as `accepted`: nothing rebuilds
        assert ast.parse is not original and getattr(ast.parse, "_opsynth_serialized", False)
        done = threading.Event()
        with candidate._AST_LOCK:
            t = threading.Thread(target=lambda: (ast.parse("x = 1"), done.set()))
            t.start()
            assert not done.wait(0.5), "ast.parse ran while the pipeline's lock was held"
        assert done.wait(10)
        t.join()
    finally:
        ast.parse = wrapped


def test_ast_parse_is_safe_in_candidate_threads():
    """Dask runs candidates in threads; CPython < 3.13 can raise SystemError from concurrent
    ast.parse when a GC switches threads mid-conversion (python/cpython#106905). The pipeline
    serialises ast.parse in its worker processes; this is the reproducer that fails without it."""
    import ast

    candidate.serialize_ast_parse()
    source = open(candidate.__file__).read()
    errors = []

    class Cycle:
        def __del__(self):
            pass

    def work():
        for _ in range(40):
            junk = [Cycle() for _ in range(100)]
            for j in junk:
                j.me = j  # garbage that only the cyclic GC frees, so collections run mid-parse
            try:
                ast.parse(source)
            except SystemError as e:
                errors.append(str(e))

    old = gc.get_threshold()
    gc.set_threshold(50, 5, 5)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*old)
    assert not errors, errors[:3]


def test_a_candidate_whose_forward_is_committed_skips_its_timing_and_compile(cfgs, accepted):
    """Issue 29: the committed rows' trace signatures come with the candidate; a match stops once the
    eager checks passed, before its first timing (nothing timed: the device is not held for it) and
    torch.compile (no compile request, no compile seconds), as a `semantic_duplicate` carrying its
    signature for the committer. Another signature changes nothing."""
    sampler, verify, dedup = cfgs
    sig = accepted["row"]["trace_signature"]
    assert accepted["compiles"] == 1 and accepted["graphs"] >= 1 and accepted["trace_signature"] == sig
    assert accepted["timed"] and accepted["stage_s"]["timing"] > 0  # what the duplicate is spared
    rec = candidate.process_candidate(0, SEED, sampler, verify, dedup, True, committed=frozenset({sig}))
    assert (rec["accepted"], rec["reason"], rec["trace_signature"]) == (False, "semantic_duplicate", sig), rec
    assert rec["evidence"]["stage"] == "before_timing" and not rec.get("timed") and rec["stage_s"]["timing"] == 0
    assert rec["compiles"] == 0 and rec["graphs"] == 0 and rec["stage_s"]["compile"] == 0
    assert accepted["compile_split"]["dynamo_s"] > 0 and rec["compile_split"]["dynamo_s"] == 0
    assert rec["stage_s"]["eager_checks"] > 0
    other = candidate.process_candidate(0, SEED, sampler, verify, dedup, True, committed=frozenset({"0" * 16}))
    measured = ("eager_ms", "compile_ms")
    assert other["accepted"] and other["compiles"] == 1
    assert other["compile_split"]["dynamo_s"] > 0  # a later compile in the same worker is counted too
    assert {k: v for k, v in other["row"].items() if k not in measured} == \
        {k: v for k, v in accepted["row"].items() if k not in measured}


class _Claims:
    """The claims actor's proxy, in this process: `claim(...)` gives what `.result(timeout)` reads."""

    def __init__(self, broken: bool = False):
        from opsynth.generate.inflight import InflightTraces

        self.traces, self.broken, self.asked = InflightTraces(), broken, []

    def claim(self, signature, index):
        self.asked.append((signature, index))
        if self.broken:
            raise ConnectionError("the actor's worker is gone")
        first = self.traces.claim(signature, index)
        return SimpleNamespace(result=lambda timeout=None: first)

    def release(self, signature, index):
        done = self.traces.release(signature, index)
        return SimpleNamespace(result=lambda timeout=None: done)


def test_a_candidate_whose_forward_an_earlier_one_claimed_defers_its_compile(cfgs, accepted):
    """Issue 29: an earlier candidate in flight claimed this forward first: stop after the eager checks,
    before torch.compile, with `deferred_to` naming it (the driver re-sends this one if that forward
    leaves no committed row). The first claimant, and any candidate when the claims do not answer,
    compile as before."""
    sampler, verify, dedup = cfgs
    sig = accepted["row"]["trace_signature"]
    claims = _Claims()
    claims.traces.claim(sig, 3)  # candidate 3 got there first
    rec = candidate.process_candidate(7, SEED, sampler, verify, dedup, True, claims=claims)
    assert (rec["accepted"], rec["reason"], rec["deferred_to"]) == (False, "semantic_duplicate", 3), rec
    assert rec["trace_signature"] == sig and rec["evidence"]["deferred_to"] == 3
    assert rec["evidence"]["stage"] == "before_timing" and not rec.get("timed")  # deferred before its timing
    assert rec["compiles"] == 0 and rec["stage_s"]["compile"] == 0 and rec["stage_s"]["eager_checks"] > 0
    first = candidate.process_candidate(2, SEED, sampler, verify, dedup, True, claims=claims)
    assert first["accepted"] and first["compiles"] == 1 and "deferred_to" not in first
    assert claims.traces.claim(sig, 9) == 2  # the lower index holds the claim from now on
    lost = _Claims(broken=True)
    rec = candidate.process_candidate(7, SEED, sampler, verify, dedup, True, claims=lost)
    assert lost.asked == [(sig, 7), (sig, 7)] and rec["accepted"] and rec["compiles"] == 1 and "deferred_to" not in rec


class _LateClaims(_Claims):
    """Candidate `late` claims while the asking candidate is being timed (between its two asks)."""

    def __init__(self, late: int):
        super().__init__()
        self.late = late

    def claim(self, signature, index):
        if len(self.asked) == 1:
            self.traces.claim(signature, self.late)
        return super().claim(signature, index)


def test_an_earlier_candidate_that_claims_while_this_one_is_timed_still_spares_its_compile(cfgs, accepted):
    """Issue 29: with 16 in flight the later of two candidates with one forward often claims first
    (`compile_deferrals.inverted`). Asked again before torch.compile, it defers to the earlier one
    then: timed, never compiled. A claimant the verifier rejects lets its claim go."""
    sampler, verify, dedup = cfgs
    sig = accepted["row"]["trace_signature"]
    claims = _LateClaims(late=2)
    rec = candidate.process_candidate(7, SEED, sampler, verify, dedup, True, claims=claims)
    assert claims.asked == [(sig, 7), (sig, 7)] and claims.traces.inversions() == 1
    assert (rec["reason"], rec["deferred_to"], rec["evidence"]["stage"]) == ("semantic_duplicate", 2, "before_compile")
    assert rec["timed"] and rec["compiles"] == 0 and rec["stage_s"]["compile"] == 0
    assert claims.traces.claim(sig, 9) == 2 and claims.traces.releases() == 0  # 2's claim is not 7's to drop


class _RejectingPool:
    """A verify pool that asks go_timing with `facts`, then rejects the task for `reason`."""

    def __init__(self, facts: dict, reason: str):
        self.facts, self.reason = facts, reason

    def verify(self, source, go_compile=None, reserve_mb=None, go_timing=None):
        from opsynth.verify.result import VerifyResult

        go = go_timing(self.facts)
        return VerifyResult(accepted=False, reason=self.reason if go else "timing_skipped", source=source,
                            evidence={"message": "stand-in"}, **self.facts)


def test_a_claimant_the_verifier_rejects_lets_its_claim_go():
    """A claimant that leaves no row (here: too slow after its claim) drops its claim, so a later
    candidate with that forward times and compiles instead of deferring to it (and being re-sent).
    One that deferred has no claim to drop."""
    facts = {"mode": "eval", "signature": "f" * 16, "calls": ["relu"]}
    claims = _Claims()
    ctx = {"pool": _RejectingPool(facts, "too_slow")}
    cand = candidate.Candidate(index=5, seed=SEED, claims=claims)
    cand.source = "stand-in"
    assert not candidate.verify(ctx, cand) and cand.reason == "too_slow"
    assert claims.asked == [(facts["signature"], 5)] and claims.traces.releases() == 1
    assert claims.traces.claim(facts["signature"], 8) == 8  # 8 is first now: it is not deferred to 5
    later = candidate.Candidate(index=9, seed=SEED, claims=claims)
    later.source = "stand-in"
    assert not candidate.verify(ctx, later) and later.deferred_to == 8 and later.reason == "semantic_duplicate"
    assert claims.traces.releases() == 1 and claims.traces.claim(facts["signature"], 10) == 8  # 8 still holds it


def test_a_candidate_prepared_in_a_preparing_process_gives_the_same_row(cfgs, accepted):
    """`prepare_processes=1`: sampled, sized, rendered and checked against KernelBench in a process of
    its own, then verified here; the row is the in-process one's, measurements aside."""
    sampler, verify, dedup = cfgs
    rec = candidate.process_candidate(0, SEED, sampler, verify, dedup, True, prepare_processes=1)
    measured = ("eager_ms", "compile_ms")
    assert rec["accepted"] is True, rec
    assert {k: v for k, v in rec["row"].items() if k not in measured} == \
        {k: v for k, v in accepted["row"].items() if k not in measured}
    assert rec["signature"] == accepted["signature"] and "prepare_wait" in rec["stage_s"]
    assert candidate._CTX["prep"].fallbacks == 0
    back = candidate.process_candidate(0, SEED, sampler, verify, dedup, True, prepare_processes=0)
    assert candidate._CTX["prep"] is None and "prepare_wait" not in back["stage_s"]
