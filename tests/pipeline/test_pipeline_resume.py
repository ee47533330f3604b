"""A generate run killed midway (SIGKILL of the driver) and rerun ends with exactly the rows of an
uninterrupted run with the same seed: same tasks, same code, same order, no duplicates, the same
mixture quotas filled, with every timing of both runs off by a random factor of up to 25 %. The
kill must not leave Dask workers or verifier sandboxes running, nor the output folder locked."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from collections import Counter

import pytest
from pipeline_cli import (FAST, NOISE, generate_cmd, kill_marked, marked_pids, run_env, run_generate,
                          start_generate, wait_gone)

from opsynth.generate.quota import REASON, apportion
from opsynth.generate.state import STATE_FILE
from opsynth.shards import count_rows, read_rows
from opsynth.shards.writer import LOCK_NAME

N_TASKS = 6
RUN = [f"n_tasks={N_TASKS}", "flush_every=1", "seed=3", *FAST]


def _progress(out) -> tuple[dict, int]:
    try:
        state = json.loads((out / STATE_FILE).read_text())
        return state, count_rows(out)
    except (OSError, ValueError):  # not written yet
        return {}, 0


def _lock_is_free(out) -> bool:
    with open(out / LOCK_NAME, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return True


@pytest.mark.slow
def test_killed_run_resumes_to_the_rows_of_an_uninterrupted_run(tmp_path, kernelbench, marker):
    killed, ref = tmp_path / "killed", tmp_path / "uninterrupted"
    ref_marker = marker + "-ref"
    # The reference runs alongside the run we kill (the test takes one run's time less): contention
    # and the injected noise change timings, never sizes, and acceptance has a margin at the band edges.
    ref_proc = start_generate(generate_cmd(ref, *RUN), run_env(kernelbench, ref_marker, **NOISE), tmp_path / "ref.log")
    proc = start_generate(generate_cmd(killed, *RUN), run_env(kernelbench, marker, **NOISE), tmp_path / "killed.log")
    try:
        deadline = time.monotonic() + 300
        while True:
            state, rows = _progress(killed)
            if state.get("next_index", 0) > 0 and 0 < rows < N_TASKS and not state.get("finished"):
                break
            assert proc.poll() is None, "the run ended before it could be killed:\n" + (tmp_path / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no progress within 300 s"
            time.sleep(0.1)
        children = [p for p in marked_pids(marker) if p != proc.pid]
        assert children, "expected Dask workers and verifier sandboxes under the driver"
        os.kill(proc.pid, signal.SIGKILL)  # the driver only, as a crash or an OOM kill would
        proc.wait()

        # Dask workers exit when their nanny's pipe closes, sandboxes when their parent is gone.
        survivors = wait_gone(marker, timeout=30)
        assert not survivors, f"processes of the killed run still alive 30 s after the kill: {survivors}"
        assert _lock_is_free(killed), "the writer's folder lock outlived the killed driver"
        state, rows_at_kill = _progress(killed)
        assert 0 < rows_at_kill < N_TASKS

        resumed = run_generate(generate_cmd(killed, *RUN), run_env(kernelbench, marker, **NOISE), timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert ref_proc.wait(timeout=300) == 0, (tmp_path / "ref.log").read_text()[-3000:]
    finally:
        for p in (proc, ref_proc):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        kill_marked(ref_marker)

    cols = ["task_id", "code", "seed", "ops"]
    got, want = read_rows(killed, columns=cols), read_rows(ref, columns=cols)
    assert len(want) == N_TASKS
    assert [r["task_id"] for r in got] == [r["task_id"] for r in want]
    assert got == want
    assert len({r["task_id"] for r in got}) == N_TASKS, "duplicate rows after the resume"
    assert sorted(p.name for p in (killed / "data").iterdir()) == sorted(p.name for p in (ref / "data").iterdir())

    # The run's counts survive the kill as well: the report equals the uninterrupted one's.
    rep_got = json.loads((killed / "report.json").read_text())["run"]
    rep_want = json.loads((ref / "report.json").read_text())["run"]
    for key in ("accepted", "rejected", "candidates", "mixture_quota"):
        assert rep_got[key] == rep_want[key], key
    # Both filled the mixture by quota (on by default): the slots' counts are their quotas exactly, the
    # resumed run counting the rows on disk before the kill.
    quotas = apportion(N_TASKS, rep_want["target_mixture"])
    assert Counter(r["data_source"] for r in read_rows(killed, columns=["data_source"])) == +Counter(quotas)
    assert rep_want["mixture_quota"]["quotas"] == quotas and rep_want["rejected"].get(REASON, 0) > 0
    # The resumed run's card and report say what it found and what it added, counted in the files.
    assert rep_got["resumed_rows"] == rows_at_kill and rep_got["run_added_rows"] == N_TASKS - rows_at_kill
    assert rep_got["runs"] == 2 and rep_want["runs"] == 1
    assert f"| rows present when the last run started | {rows_at_kill} |" in (killed / "README.md").read_text()
