"""benchmarks/generate_throughput.py's timing tally: the seconds of timing per accepted row and per
timed candidate, the timed candidates that were rejected afterwards (by the verifier, by reason, and
by the committer), and how each timing stopped, as the H200 window reports them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import generate_throughput
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return generate_throughput


def _timed(op, runs, stop, spent, warmup=1):
    return {"op": op, "ms": spent / runs, "runs": runs, "warmup": warmup, "stop": stop, "spent_ms": spent}


def _rec(accepted, reason, timing_s, timed=()):
    return {"accepted": accepted, "reason": reason, "stage_s": {"timing": timing_s} if timing_s else {},
            "timed": list(timed)}


def test_the_tally_counts_timed_then_rejected_candidates(bench):
    t = bench.TimingTally()
    for i in range(3):  # verifier-accepted: an eager and a compile timing each
        t.add(_rec(True, None, 0.2, [_timed("eager", 5, "precise", 50.0), _timed("compile", 5, "precise", 25.0)]))
    t.add(_rec(False, "too_slow", 0.4, [_timed("eager", 2, "far_high", 300.0)]))
    t.add(_rec(False, "compile_mismatch", 0.1, [_timed("eager", 20, "cap", 60.0)]))
    t.add(_rec(False, "input_insensitive", 0.0))  # rejected by the checks: never timed
    s = t.summary(accepted=2)  # one of the three verifier-accepted rows was a duplicate
    assert (s["records"], s["timed_candidates"], s["verifier_accepted_timed"]) == (6, 5, 3)
    assert s["timing_s"] == pytest.approx(1.1) and s["timing_s_per_timed_candidate"] == pytest.approx(0.22)
    assert s["timing_s_per_accepted"] == pytest.approx(0.55)
    assert s["timed_then_rejected"] == 3 and s["timed_then_rejected_after_verifier"] == 1
    assert s["timed_then_rejected_by_verifier_reasons"] == {"compile_mismatch": 1, "too_slow": 1}
    assert s["timing_s_on_verifier_rejected"] == pytest.approx(0.5)
    assert s["stops"] == {"cap": 1, "far_high": 1, "precise": 6}
    assert s["per_timing"]["eager"] == {"timings": 5, "runs_mean": 7.4, "warmup_mean": 1.0, "timed_ms_mean": 102.0}
    assert s["timed_runs_s"] == pytest.approx(0.585) and s["timed_runs_share_of_timing"] == pytest.approx(0.532)


def test_the_floors_show_the_timing_per_timed_candidate(bench):
    t = bench.TimingTally()
    t.add(_rec(True, None, 0.3, [_timed("eager", 5, "precise", 50.0)]))
    t.add(_rec(False, "too_fast", 0.1, [_timed("eager", 2, "far_low", 1.0)]))
    d = {"accepted": 1, "stage_seconds": {"timing": 0.4, "eager_checks": 0.2}, "sustained_s": 1.0,
         "timing": t.summary(accepted=1)}
    f = bench.floors(d)
    assert f["timing_floor_s_per_accepted"] == pytest.approx(0.4)
    assert f["timing_s_per_timed_candidate"] == pytest.approx(0.2)
    assert (f["timed_candidates"], f["timed_then_rejected"]) == (2, 1)
    assert f["timed_then_rejected_by_verifier_reasons"] == {"too_fast": 1}
    assert f["timed_runs_per_timing"] == {"eager": 3.5} and f["timing_stops"] == {"far_low": 1, "precise": 1}
    bench.print_floors(f)  # prints without a KeyError


def test_the_compile_tally_reports_compiles_and_compile_seconds_per_accepted_row(bench):
    """Issue 29: what the next H200 window prints for compile: compiles, graphs and compile seconds
    per accepted row (rejected candidates' compiles count against the rows), and per compile what
    of its section was Dynamo compiling and waiting for the memory share."""
    t = bench.CompileTally()
    split = {"dynamo_s": 1.0, "backend_s": 0.8, "share_wait_s": 0.1}
    for accepted, reason, n, graphs, s in [(True, None, 1, 1, 1.5), (True, None, 1, 2, 2.5),
                                           (False, "compile_mismatch", 1, 1, 2.0),
                                           (False, "semantic_duplicate", 0, 0, 0.0), (False, "too_fast", 0, 0, 0.0)]:
        t.add({"accepted": accepted, "reason": reason, "compiles": n, "graphs": graphs,
               "compile_split": split if n else {}, "stage_s": {"compile": s} if s else {}})
    out = t.summary(accepted=1)  # one of the two the verifier accepted was a duplicate at commit
    assert (out["compiles"], out["graphs"], out["compile_s"]) == (3, 4, 6.0)
    assert (out["compiles_per_accepted"], out["graphs_per_accepted"], out["compile_s_per_accepted"]) == (3.0, 4.0, 6.0)
    assert out["graphs_per_compile"] == {1: 2, 2: 1} and out["compile_s_per_compile"] == 2.0
    assert out["compiled_then_rejected_by_verifier"] == {"compile_mismatch": 1}
    assert out["compiled_then_rejected_after_verifier"] == 1
    assert out["split_s_per_compile"] == split
    f = bench.floors({"accepted": 1, "stage_seconds": {"compile": 6.0}, "compile": out})
    assert (f["compiles_per_accepted"], f["compile_s_per_accepted"]) == (3.0, 6.0)
