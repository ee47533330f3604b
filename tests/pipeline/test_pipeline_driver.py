"""The driver loop of `opsynth.generate.driver.run` against an in-process Dask cluster, with candidate
processing replaced by a stand-in that finishes in *reverse* order: rows are still committed in
candidate order, the run stops at n_tasks or max_candidates, and a resumed run continues exactly
where the first one stopped. (The real candidate path is covered by test_pipeline_candidate.py and,
end to end, by test_pipeline_e2e.py and test_pipeline_resume.py.)"""

from __future__ import annotations

import json
import os
import threading
import time
from types import SimpleNamespace

import pytest

from opsynth.generate import candidate, driver
from opsynth.generate import state as statefile
from opsynth.generate.config import GenerateConfig, candidate_seed
from opsynth.generate.state import STATE_FILE
from opsynth.cluster import ClusterHandle, cluster_workers
from opsynth.dedup import DedupConfig, NearDupIndex
from opsynth.graph import Sampler, SamplerConfig
from opsynth.render import render_task, task_id
from opsynth.shards import read_rows

N_CANDIDATES = 40


@pytest.fixture(scope="module")
def tasks():
    return sampled_tasks(SamplerConfig(scale=0.1), N_CANDIDATES)


def sampled_tasks(sampler_cfg, n: int) -> dict:
    """Real sampled and rendered tasks (no verification) for candidates 0..n-1 of seed 0."""
    from opsynth.catalog import load_catalog

    catalog = load_catalog()
    sampler = Sampler(sampler_cfg, catalog)
    out = {}
    for i in range(n):
        st = sampler.sample(candidate_seed(0, i))
        code = render_task(st.graph, catalog)
        out[i] = {"st": st, "code": code, "task_id": task_id(code), "signature": st.graph.signature(),
                  "ops": st.graph.ops(), "graph": st.graph.to_json()}
    return out


def _accepts(i: int) -> bool:
    return i % 3 != 1  # a fixed pattern of rejections, so commit order is visible in the rows


@pytest.fixture
def fake(monkeypatch, tasks, tmp_path):
    """Stand-in for process_candidate: later candidates finish first; `fake.accept` decides by index;
    `fake.calls()` lists the candidates processed. (Dask pickles the function even in-process, so
    calls are recorded in a file, not in a list.)"""
    return install_fake(monkeypatch, tasks, tmp_path)


def install_fake(monkeypatch, tasks, folder):
    """The `fake` fixture's stand-in, patched in with `monkeypatch` and logging its calls in `folder`
    (also for module-scoped fixtures, with a pytest.MonkeyPatch.context())."""
    log = folder / "calls.txt"
    fake = SimpleNamespace(accept=_accepts, before_verifier=lambda i: False,
                           calls=lambda: [int(x) for x in log.read_text().split()] if log.exists() else [])

    def process(index, seed, sampler_cfg, verify_cfg, dedup_cfg, kb_check=True, committed=None, prepare_processes=None, claims=None):
        with open(log, "a") as f:
            f.write(f"{index}\n")
        (folder / "prepare_processes.txt").write_text(repr(prepare_processes))
        time.sleep(max(0.0, 0.2 - 0.02 * (index % 10)))
        t = tasks[index]  # everything precomputed: the stand-in does no parsing of its own
        rec = {"index": index, "seed": seed, "accepted": False, "reason": None, "row": None,
               "signature": t["signature"], "evidence": None}
        if not fake.accept(index):
            if fake.before_verifier(index):  # rejected at sizing, as a real record of one says
                rec.update(reason="predicted_oom", evidence={"stage": "size"}, verifier_ran=False)
            else:
                rec.update(reason="too_fast", evidence={"eager_ms": 0.01}, verifier_ran=True)
            return rec
        rec["accepted"] = True
        rec["row"] = {"code": t["code"], "ops": t["ops"], "data_source": t["st"].data_source,
                      "task_id": t["task_id"], "num_ops": t["st"].num_ops, "graph": t["graph"],
                      "input_shapes": "[]", "eager_ms": 1.0,
                      "compile_ms": 1.0, "device": "cpu", "torch_version": "test", "kb_max_similarity": None,
                      "kb_nearest": None, "seed": seed, "mode": "eval", "trace_signature": t["signature"],
                      "dtype": t["st"].dtype, "task_pass": t["st"].task_pass}  # the sampled task's kind
        return rec

    def start_cluster(cfg, run_dir=None):
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=1, threads_per_worker=4, processes=False, dashboard_address=None)
        return ClusterHandle(Client(cluster), cluster, "local", 4, False)

    monkeypatch.setattr(driver, "process_candidate", process)
    monkeypatch.setattr(driver, "start_cluster", start_cluster)
    monkeypatch.setattr(driver, "measure_peaks", _fake_peaks)
    return fake


def _fake_peaks(sampler_cfg, verify_cfg, dedup_cfg, kb_check=True):
    return {"kind": "cpu", "measured": {"device": "cpu", "tflops": 0.1, "gbps": 10.0, "gelems": 1.0, "kernel_us": 2.0},
            "reference": {"tflops": 0.18, "gbps": 14.0, "gelems": 1.6, "kernel_us": 1.8}}


def _cfg(out, n_tasks, **kw):
    """Without mixture quotas unless asked: these tests follow the commit order (`_expected`);
    test_pipeline_quota.py has the quotas."""
    kw.setdefault("mixture_quota", False)
    cfg = GenerateConfig(n_tasks=n_tasks, output_dir=str(out), kb_check=False, progress=False,
                                  write_card=False, flush_every=1, **kw)
    cfg.sampler.scale = 0.1
    return cfg


def _expected(tasks, n_tasks) -> tuple[list[str], int]:
    """What an uninterrupted run must write: accepted candidates in index order, minus within-run
    duplicates (the same index the committer uses), up to n_tasks; and the next candidate index."""
    rows, neardup = [], NearDupIndex.from_config(DedupConfig())
    for i in range(N_CANDIDATES):
        code, sig = tasks[i]["code"], tasks[i]["st"].graph.signature()
        if _accepts(i) and neardup.add(task_id(code), code, signature=sig) is None:
            rows.append(task_id(code))
            if len(rows) == n_tasks:
                return rows, i + 1
    raise AssertionError("not enough candidates")


def _run_with_deadline(cfg, seconds=120):
    box = {}
    t = threading.Thread(target=lambda: box.update(summary=driver.run(cfg)), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"run() did not return within {seconds} s"
    return box["summary"]


def test_rows_are_committed_in_candidate_order(tmp_path, tasks, fake):
    summary = _run_with_deadline(_cfg(tmp_path / "ds", 8))
    rows, next_index = _expected(tasks, 8)
    assert [r["task_id"] for r in read_rows(tmp_path / "ds", columns=["task_id"])] == rows
    assert summary["accepted"] == 8 and summary["candidates"] == next_index
    assert summary["rejected"].get("too_fast") == sum(1 for i in range(next_index) if not _accepts(i))
    state = json.loads((tmp_path / "ds" / STATE_FILE).read_text())
    # one past the candidate that brought the 8th row: nothing after it was committed
    assert state["finished"] is True and state["next_index"] == next_index


def test_each_candidate_is_sent_the_runs_prepare_processes(tmp_path, tasks, fake):
    _run_with_deadline(_cfg(tmp_path / "ds", 2, prepare_processes=3))
    assert (tmp_path / "prepare_processes.txt").read_text() == "3"


def test_a_resumed_run_continues_where_the_first_stopped(tmp_path, tasks, fake):
    out = tmp_path / "ds"
    _run_with_deadline(_cfg(out, 4))
    rows4, next4 = _expected(tasks, 4)
    assert [r["task_id"] for r in read_rows(out, columns=["task_id"])] == rows4
    first_calls = len(fake.calls())
    summary = _run_with_deadline(_cfg(out, 9))
    rows9, next9 = _expected(tasks, 9)
    assert [r["task_id"] for r in read_rows(out, columns=["task_id"])] == rows9
    assert min(fake.calls()[first_calls:]) == next4, "the rerun starts at the first uncommitted candidate"
    assert summary["accepted"] == 9 and summary["candidates"] == next9


def test_the_run_stops_at_max_candidates_when_nothing_is_accepted(tmp_path, fake):
    fake.accept = lambda i: False
    summary = _run_with_deadline(_cfg(tmp_path / "ds", 3, max_candidates=5), seconds=60)
    assert summary["accepted"] == 0 and summary["rejected"] == {"too_fast": 5}
    assert summary["rows"] == 0  # the CLI turns this shortfall into exit code 3
    assert max(fake.calls()) == 4, "no candidate past max_candidates may be submitted"
    assert json.loads((tmp_path / "ds" / STATE_FILE).read_text())["next_index"] == 5


def test_stop_ends_the_run_early_and_every_result_reaches_on_result(tmp_path, tasks, fake):
    """What the throughput benchmark relies on: `stop` ends a run at the next result (rows written
    and state saved as at any stop), and `on_result` sees each record as it arrives."""
    stop, seen = threading.Event(), []

    def on_result(rec):
        seen.append(rec["index"])
        if len(seen) == 5:
            stop.set()

    out = tmp_path / "ds"
    box = {}
    t = threading.Thread(target=lambda: box.update(summary=driver.run(_cfg(out, 30), on_result=on_result, stop=stop)),
                         daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive()
    summary = box["summary"]
    assert len(seen) == 5 and summary["rows"] < 30
    rows = [r["task_id"] for r in read_rows(out, columns=["task_id"])]
    if rows:  # results arrive out of order: the first five may commit nothing yet
        assert rows == _expected(tasks, len(rows))[0]  # a prefix of the uninterrupted run
    assert "writing" in summary["stage_seconds"]
    state = json.loads((out / STATE_FILE).read_text())
    assert state["next_index"] == summary["candidates"]


def test_rows_on_disk_ahead_of_the_state_are_neither_rewritten_nor_miscounted(tmp_path, tasks, fake, monkeypatch):
    """A crash between a shard write and the next state save leaves rows the state does not know
    about. Simulated here by restoring an earlier state file after a run: the rerun must skip those
    rows and still end with the rows *and the counts* of an uninterrupted run."""
    snapshots = []
    save = statefile.save_state
    monkeypatch.setattr(statefile, "save_state", lambda out, state: (snapshots.append(json.dumps(state)), save(out, state)))
    crashed, ref = tmp_path / "crashed", tmp_path / "ref"
    _run_with_deadline(_cfg(crashed, 5))
    early = next(json.loads(s) for s in snapshots if json.loads(s)["stats"]["accepted"] == 2)
    (crashed / STATE_FILE).write_text(json.dumps(early))  # the state of 2 rows; 5 are on disk

    got = _run_with_deadline(_cfg(crashed, 8))
    want = _run_with_deadline(_cfg(ref, 8))
    assert read_rows(crashed, columns=["task_id"]) == read_rows(ref, columns=["task_id"])
    for key in ("accepted", "rejected", "candidates", "categories"):
        assert got[key] == want[key], key
    assert got["resumed_rows"] == 5 and want["resumed_rows"] == 0  # rows in the files when each run started
    assert got["rows"] == got["accepted"] == 8


def test_a_candidate_that_kills_its_dask_worker_twice_is_rejected_and_the_run_goes_on(tmp_path, monkeypatch):
    """Real worker processes (cluster=local). The sandbox normally absorbs crashes; should a
    candidate take its Dask worker down anyway, Dask retries it once on a restarted worker and the
    second death is a rejection with reason killed_worker, not a failed run."""

    def process(index, seed, sampler_cfg, verify_cfg, dedup_cfg, kb_check=True, committed=None, prepare_processes=None, claims=None):  # nested: pickled by value
        if index == 1:
            os._exit(1)
        return {"index": index, "seed": seed, "accepted": False, "reason": "too_fast", "row": None,
                "signature": None, "evidence": None}

    def peaks(sampler_cfg, verify_cfg, dedup_cfg, kb_check=True):  # nested: no verify sandboxes for this test
        return {"kind": "cpu", "measured": {}, "reference": {}}

    monkeypatch.setattr(driver, "process_candidate", process)
    monkeypatch.setattr(driver, "measure_peaks", peaks)
    cfg = _cfg(tmp_path / "ds", 1, max_candidates=3)
    cfg.cluster.n_workers, cfg.cluster.threads_per_worker = 1, 1  # one candidate at a time: only 1 dies
    summary = _run_with_deadline(cfg, seconds=180)
    # The killer is always rejected; a neighbour whose result was lost with the worker may be
    # caught too (its recomputation can land next to the second death), so only bounds are exact.
    assert summary["rejected"].get("killed_worker", 0) >= 1
    assert set(summary["rejected"]) <= {"too_fast", "killed_worker"}
    assert sum(summary["rejected"].values()) == 3 and summary["candidates"] == 3


@pytest.mark.parametrize("gpus,scale,band_min", [(0, 0.1, 0.05), (1, 1.0, 1.0)])
def test_sampler_scale_null_is_resolved_by_the_device_that_verifies(tmp_path, fake, monkeypatch, gpus, scale, band_min):
    """README: `sampler.scale=null` means 1.0 on a GPU, 0.1 on a CPU (verify=auto, the default).
    What reaches the candidates is checked, and the band the run records for its card."""
    import opsynth.cluster

    monkeypatch.setattr(opsynth.cluster, "visible_gpus", lambda: gpus)
    seen = tmp_path / "scales.txt"
    inner = driver.process_candidate  # the stand-in; the scale is decided where a worker builds its sampler
    import opsynth.verify.pool

    monkeypatch.setattr(opsynth.verify.pool, "detect_device", lambda want: "cuda" if gpus else "cpu")

    def spy(index, seed, sampler_cfg, verify_cfg, *args, **kw):
        assert sampler_cfg["scale"] is None  # not decided on the launching machine
        scfg = candidate._worker_sampler_config(sampler_cfg, verify_cfg["device"])  # what _context does
        with open(seen, "a") as f:
            f.write(f"{scfg.scale}\n")
        return inner(index, seed, sampler_cfg, verify_cfg, *args, **kw)

    monkeypatch.setattr(driver, "process_candidate", spy)
    cfg = _cfg(tmp_path / "ds", 2)
    cfg.sampler.scale = None
    assert cfg.verify.device == "auto"
    summary = _run_with_deadline(cfg)
    assert {float(x) for x in seen.read_text().split()} == {scale}
    assert summary["thresholds"]["eager_ms_min"] == band_min


def test_flush_every_above_one_writes_shards_and_state_every_that_many_rows(tmp_path, fake, monkeypatch):
    """README: `flush_every` N writes the shards and the resume state at least every N accepted rows
    (and not at every row: a flush rewrites the open shard)."""
    saves = []
    save = statefile.save_state

    def record(out, state):
        from opsynth.shards import count_rows

        saves.append((state["stats"]["accepted"], count_rows(out), state.get("finished", False)))
        save(out, state)

    monkeypatch.setattr(statefile, "save_state", record)
    cfg = _cfg(tmp_path / "ds", 7)
    cfg.flush_every = 3
    _run_with_deadline(cfg)
    during = [(accepted, on_disk) for accepted, on_disk, finished in saves if not finished]
    # at 3 and 6 rows, then at the end of the loop (7); every save has the rows it counts on disk
    assert [a for a, _ in during] == [3, 6, 7], saves
    assert all(accepted == on_disk for accepted, on_disk in during), saves
    assert saves[-1] == (7, 7, True)


def test_cluster_scheduler_runs_on_an_existing_dask_cluster_and_leaves_it_running(tmp_path, tasks):
    """README: `cluster=scheduler cluster.address=tcp://host:8786` uses a cluster someone else
    started. Here a real Dask scheduler with one worker process is started by the test; the run
    must connect to it, do its candidates on that worker, and leave the cluster up when done."""
    from distributed import Client, LocalCluster

    log = tmp_path / "calls.txt"
    plain = {i: {k: t[k] for k in ("code", "task_id", "signature", "ops", "graph")} | {
        "data_source": t["st"].data_source, "num_ops": t["st"].num_ops} for i, t in tasks.items()}

    def process(index, seed, sampler_cfg, verify_cfg, dedup_cfg, kb_check=True, committed=None, prepare_processes=None, claims=None):  # nested: pickled by value
        import os

        with open(log, "a") as f:
            f.write(f"{index} {os.getpid()}\n")
        t = plain[index]
        row = {"code": t["code"], "ops": t["ops"], "data_source": t["data_source"], "task_id": t["task_id"],
               "num_ops": t["num_ops"], "graph": t["graph"], "input_shapes": "[]", "eager_ms": 1.0,
               "compile_ms": 1.0, "device": "cpu", "torch_version": "test", "kb_max_similarity": None,
               "kb_nearest": None, "seed": seed, "mode": "eval", "trace_signature": t["signature"], "dtype": "float32", "task_pass": "forward"}
        return {"index": index, "seed": seed, "accepted": True, "reason": None, "row": row,
                "signature": t["signature"], "evidence": None}

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None) as external, \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr(driver, "process_candidate", process)
        with Client(external) as probe:
            worker_pids = set(probe.run(os.getpid).values())
        cfg = _cfg(tmp_path / "ds", 3)
        cfg.cluster.kind, cfg.cluster.address = "scheduler", external.scheduler_address
        cfg.validate()
        summary = _run_with_deadline(cfg, seconds=180)
        assert summary["accepted"] == 3 and summary["rows"] == 3
        pids = {int(line.split()[1]) for line in log.read_text().splitlines()}
        assert pids == worker_pids and os.getpid() not in pids, (pids, worker_pids)
        with Client(external.scheduler_address, timeout=10) as after:  # still up, worker still there
            assert len(cluster_workers(after)) == 1


def test_a_local_cluster_is_quiet_when_port_8787_is_taken(recwarn):
    """Another run (or an open Dask dashboard) holds 8787: starting ours must not warn about it."""
    import socket

    from opsynth.cluster import ClusterConfig, start_cluster

    blocker = socket.socket()
    try:
        blocker.bind(("", 8787))
        blocker.listen()
    except OSError:
        pass  # already taken by someone else: the same situation
    try:
        handle = start_cluster(ClusterConfig(kind="local", n_workers=1, threads_per_worker=1))
        handle.close()
    finally:
        blocker.close()
    assert not [w for w in recwarn if "8787" in str(w.message)], [str(w.message) for w in recwarn]
