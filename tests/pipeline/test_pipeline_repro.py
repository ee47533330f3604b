"""Same seed and settings, same rows, even when every timing is off by a random factor of up to
25 %: two runs of 50+ tasks on the CPU (small sampler, aot_eager, the real CPU band), side by side
on a busy machine and each with its own injected noise, write byte-identical rows apart from the two
measured columns. The second run samples and sizes its candidates in a preparing process
(`prepare_processes=1`, as a GPU run does by default), the first in the Dask worker's threads: where
they are prepared does not change the rows either. And the rows hold when a fresh process
re-measures them (benchmarks/recheck_gpu.py on the CPU)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from pipeline_cli import NOISE, REPO, generate_cmd, kill_marked, run_env, start_generate

from opsynth.generate.state import STATE_FILE
from opsynth.shards import read_rows

N_TASKS = 50
# The acceptance window's top at 900 ms, not 90: two generations side by side on a 2-core machine beside
# the rest of the suite read up to 3x a quiet re-measure (this file's recheck: median 0.35), so a task
# aimed below 50 ms (seed 5000000056, nn.Linear + F.normalize: 65, 80, 86, 98 and 111 ms across CI runs)
# flipped at a 90 ms edge whatever the injected noise did. band_margin 20 keeps sizing's top target where
# it was (1000 / 20 = 50 ms; the bottom one rises from 0.1 to 1 ms).
RUN = [f"n_tasks={N_TASKS}", "seed=5", "sampler=small", "verify=cpu", "verify.compile_backend=aot_eager",
       "verify.cpu_max_ms=1000", "verify.band_margin=20", "cluster.n_workers=1", "cluster.threads_per_worker=2", "progress=false"]
MEASURED = ("eager_ms", "compile_ms")  # measurements: they differ from run to run by design


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, kernelbench_parquet):
    base = tmp_path_factory.mktemp("repro")
    outs, procs, markers = [base / "a", base / "b"], [], []
    try:
        for out, extra in zip(outs, ([], ["prepare_processes=1"])):
            markers.append(f"repro-{out.name}-{os.getpid()}")
            procs.append(start_generate(generate_cmd(out, *RUN, *extra), run_env(kernelbench_parquet, markers[-1], **NOISE),
                                        base / f"{out.name}.log"))
        for out, p in zip(outs, procs):
            assert p.wait(timeout=1500) == 0, (base / f"{out.name}.log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for m in markers:
            kill_marked(m)
    return outs


def _without_measurements(out) -> bytes:
    """The rows' Parquet bytes with the measured columns dropped (same writer settings each time)."""
    (shard,) = sorted((out / "data").glob("*.parquet"))
    table = pq.read_table(shard).drop_columns(list(MEASURED))
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(None), buf, compression="zstd")
    return buf.getvalue()


def _why_rows_differ(a, b, rows_a, rows_b) -> str:
    """The seeds only one run kept, and what the other run said of each (its rejection examples)."""
    seeds = {o: {r["seed"] for r in rows} for o, rows in ((a, rows_a), (b, rows_b))}
    lines = []
    for kept, other in ((a, b), (b, a)):
        said = {e["seed"]: e for e in json.loads((other / STATE_FILE).read_text())["examples"]}
        for seed in sorted(seeds[kept] - seeds[other]):
            row = next(r for r in (rows_a if kept == a else rows_b) if r["seed"] == seed)
            lines.append(f"seed {seed} kept by {kept.name} (eager {row['eager_ms']:.4g} ms), "
                         f"{other.name} said: {json.dumps(said.get(seed, 'no example recorded'))[:600]}")
    return "\n".join(lines) or "same seeds, different row contents"


@pytest.mark.slow
def test_same_seed_same_rows_under_timing_noise(two_runs):
    a, b = two_runs
    rows_a, rows_b = read_rows(a), read_rows(b)
    assert len(rows_a) == len(rows_b) == N_TASKS
    strip = [{k: v for k, v in r.items() if k not in MEASURED} for r in rows_a], \
            [{k: v for k, v in r.items() if k not in MEASURED} for r in rows_b]
    assert strip[0] == strip[1], _why_rows_differ(a, b, rows_a, rows_b)
    assert _without_measurements(a) == _without_measurements(b)  # byte-identical
    # ... and b's candidates were prepared in its preparing process, a's in its worker's threads
    waits = [json.loads((o / "report.json").read_text())["run"]["stage_seconds"].get("prepare_wait", 0.0) for o in (a, b)]
    assert waits[0] == 0.0 < waits[1], waits
    # The noise was there: the measured runtimes themselves differ between the runs.
    differ = sum(ra["eager_ms"] != rb["eager_ms"] for ra, rb in zip(rows_a, rows_b))
    assert differ >= N_TASKS - 2, differ
    # And so were the same decisions on the way: every rejection, the same candidates.
    sa, sb = (json.loads((o / STATE_FILE).read_text()) for o in (a, b))
    assert sa["ledger"] == sb["ledger"] and sa["next_index"] == sb["next_index"]
    assert sa["stats"]["rejected"] == sb["stats"]["rejected"]
    ra, rb = (json.loads((o / "report.json").read_text())["run"] for o in (a, b))
    for r in (ra, rb):  # each run measured the device once and summed up the cost model
        assert r["measured_peaks"] and r["reference_rates"]["device_kind"] == "cpu"
        assert r["cost_model"]["rows"] == N_TASKS
    assert ra["reference_rates"] == rb["reference_rates"]


@pytest.mark.slow
def test_rows_hold_when_re_measured_in_a_fresh_process(two_runs, tmp_path):
    out_json = tmp_path / "recheck.json"
    proc = subprocess.run([sys.executable, "benchmarks/recheck_gpu.py", str(two_runs[0]), "--device", "cpu",
                           "--sample", "20", "--repeats", "10", "--out", str(out_json)],
                          cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(out_json.read_text())
    assert rep["device"] == "cpu" and rep["rows_checked"] == 20 and len(rep["rows"]) == 20
    assert rep["band_ms"] == [0.05, 1000.0]
    failed = [r for r in rep["rows"] if not r["pass"]]
    assert rep["pass_share"] == 1.0, failed
    assert all(r["deterministic"] and r["finite"] and r["input_sensitive"] for r in rep["rows"])
    assert "pass_share 1.000" in proc.stdout
    # The spread issue 29 asks for beside the median: deciles of the same ratios.
    ratios = sorted(r["ratio"] for r in rep["rows"])
    assert rep["ratio_p10"] <= rep["ratio_median"] <= rep["ratio_p90"]
    assert ratios[0] <= rep["ratio_p10"] <= ratios[2] and ratios[-3] <= rep["ratio_p90"] <= ratios[-1]


def test_noise_injection_multiplies_each_timing(monkeypatch):
    """The hook the tests above rely on: independent factors, inside the bounds, only when asked."""
    from opsynth.runtime import timing

    monkeypatch.delenv(timing.NOISE_ENV, raising=False)
    assert timing.noise_factor() == 1.0
    monkeypatch.setenv(timing.NOISE_ENV, NOISE[timing.NOISE_ENV])
    factors = [timing.noise_factor() for _ in range(2000)]
    assert all(0.8 <= f <= 1.25 for f in factors)
    assert min(factors) < 0.82 and max(factors) > 1.22 and len(set(factors)) == len(factors)
    monkeypatch.setenv(timing.NOISE_ENV, "bad")
    with pytest.raises(ValueError, match="LO,HI"):
        timing.noise_factor()
