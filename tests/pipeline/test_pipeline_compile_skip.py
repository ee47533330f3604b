"""Issue 29: a candidate whose traced forward matches a committed row skips torch.compile, and that
changes nothing a user sees: the same seed and settings give the same rows and the same rejection
counts with `skip_duplicate_compiles` on or off, however the results come back. The committer
decides semantic duplicates before compile's verdict (a duplicate that fails its compile is a
`semantic_duplicate` either way). Driver loop with a stand-in candidate (as test_pipeline_driver.py),
the real `process_candidate` skip in test_pipeline_candidate.py."""

from __future__ import annotations

import time

import pytest
import test_pipeline_driver as driver_tests

from opsynth.generate import driver
from opsynth.generate.inflight import earlier_claim
from opsynth.shards import read_rows

N = driver_tests.N_CANDIDATES


@pytest.fixture(scope="module")
def tasks():
    from opsynth.graph import SamplerConfig

    return driver_tests.sampled_tasks(SamplerConfig(scale=0.1), N)


def _calls(index: int) -> str:
    return f"calls-{index % 7}"  # seven forwards among the candidates: most are semantic duplicates


def install(monkeypatch, tasks, folder, skip_on: bool = True):
    """The stand-in: later candidates finish first; too_fast for every 6th (no eager facts), a
    compile mismatch for every 5th, else accepted; one line per candidate, 'compile' or 'skip'."""
    driver_tests.install_fake(monkeypatch, tasks, folder)  # the cluster and peaks stand-ins
    log = folder / "compiles.txt"

    def process(index, seed, sampler_cfg, verify_cfg, dedup_cfg, kb_check=True, committed=None, prepare_processes=None,
                claims=None):
        t, sig = tasks[index], _calls(index)
        # Claimed as the candidate starts (the real one claims after its eager checks): in start order,
        # so which candidates defer does not hang on these sleeps.
        first = earlier_claim(claims, sig, index) if index % 6 != 5 else None
        time.sleep(max(0.0, 0.2 - 0.02 * (index % 10)))
        rec = {"index": index, "seed": seed, "accepted": False, "reason": None, "row": None,
               "signature": t["signature"], "evidence": None, "compiles": 0}
        if index % 6 == 5:
            return {**rec, "reason": "too_fast"}
        rec["trace_signature"] = sig  # the eager checks passed
        if committed and sig in committed:
            with open(log, "a") as f:
                f.write("skip\n")
            return {**rec, "reason": "semantic_duplicate"}
        if first is not None:
            with open(log, "a") as f:
                f.write("defer\n")
            return {**rec, "reason": "semantic_duplicate", "deferred_to": first}
        if claims is None and skip_on:
            with open(log, "a") as f:
                f.write("rerun\n")
        with open(log, "a") as f:
            f.write("compile\n")
        rec["compiles"] = 1
        if index % 5 == 2:
            return {**rec, "reason": "compile_mismatch"}
        rec["accepted"] = True
        rec["row"] = {"code": t["code"], "ops": t["ops"], "data_source": t["st"].data_source, "task_id": t["task_id"],
                      "num_ops": t["st"].num_ops, "graph": t["graph"], "input_shapes": "[]", "eager_ms": 1.0,
                      "compile_ms": 1.0, "device": "cpu", "torch_version": "test", "kb_max_similarity": None,
                      "kb_nearest": None, "seed": seed, "mode": "eval", "trace_signature": sig,
                      "dtype": t["st"].dtype, "task_pass": t["st"].task_pass}
        return rec

    monkeypatch.setattr(driver, "process_candidate", process)
    return lambda: log.read_text().split() if log.exists() else []


def _run(tmp_path, monkeypatch, tasks, name: str, skip: bool):
    folder = tmp_path / name
    folder.mkdir()
    compiles = install(monkeypatch, tasks, folder, skip_on=skip)
    cfg = driver_tests._cfg(folder / "ds", 1000, max_candidates=N, skip_duplicate_compiles=skip)
    summary = driver_tests._run_with_deadline(cfg)
    return [r["task_id"] for r in read_rows(folder / "ds")], summary["rejected"], compiles(), summary


def test_skipping_duplicate_compiles_keeps_rows_and_reasons(tmp_path, monkeypatch, tasks):
    """Skips for committed forwards and deferrals to in-flight ones (re-run when that forward left no
    row: here the first candidate of one forward fails its compile) change no row and no count."""
    rows_on, rejected_on, log_on, summary_on = _run(tmp_path, monkeypatch, tasks, "on", True)
    rows_off, rejected_off, log_off, summary_off = _run(tmp_path, monkeypatch, tasks, "off", False)
    assert rows_on == rows_off and rows_on
    assert rejected_on == rejected_off
    assert "skip" not in log_off and log_on.count("skip") > 0, log_on
    defers, reruns = log_on.count("defer"), log_on.count("rerun")
    assert "defer" not in log_off and defers > 0 and reruns > 0, log_on
    assert log_on.count("compile") == log_off.count("compile") - log_on.count("skip") - defers + reruns
    deferrals = dict(summary_on["compile_deferrals"])
    inverted = deferrals.pop("inverted", 0)  # in-flight order: how many depends on timing (test_inflight_claims)
    assert deferrals == {"deferred": defers, "rerun": reruns} and inverted >= 0
    assert summary_off["compile_deferrals"] == {}
    # Semantic duplicates first: a duplicate forward whose compile failed counts as one.
    dups_failing_compile = [i for i in range(N) if i % 6 != 5 and i % 5 == 2
                            and any(_calls(j) == _calls(i) and j % 6 != 5 and j % 5 != 2 for j in range(i))]
    assert dups_failing_compile and rejected_off["compile_mismatch"] == sum(
        1 for i in range(N) if i % 6 != 5 and i % 5 == 2) - len(dups_failing_compile)


def test_a_skipped_candidate_the_committer_cannot_place_is_a_bug_named_in_one_line(tmp_path, tasks, monkeypatch):
    """A worker told a signature the committer never recorded would lose a row: refused loudly."""
    from types import SimpleNamespace

    from opsynth.generate.config import GenerateConfig
    from opsynth.shards import RunStats

    committer = driver._Committer(GenerateConfig(output_dir=str(tmp_path / "ds"), mixture_quota=False),
                                  SimpleNamespace(), RunStats(), {})
    with pytest.raises(RuntimeError, match="this is a bug"):
        committer.commit({"index": 3, "seed": 3, "accepted": False, "reason": "semantic_duplicate",
                          "trace_signature": "never-committed", "row": None})
