"""Mixture quotas (`opsynth.generate.quota`): each `data_source` slot ends at its share of n_tasks
even when one slot passes verification far more often than another, decided from committed counts
in candidate order, so a resumed run ends with the rows of an uninterrupted one; a slot that never
passes is given up (its rows go to the others), or, with give-up off, the run stops at
max_candidates naming it.

The driver runs against the stand-in candidate processing of test_pipeline_driver.py (in-process
Dask, no sandboxes), over candidates sampled with a two-slot mixture: `torch#1` always passes,
`torch#2` one candidate in three."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter

import pytest
import test_pipeline_driver as driver_tests

from opsynth.dedup import DedupConfig, NearDupIndex
from opsynth.generate import driver
from opsynth.generate.config import GenerateConfig
from opsynth.generate.quota import REASON, MixtureQuota, apportion
from opsynth.generate.state import STATE_FILE
from opsynth.graph import OPS6K_MIXTURE, SamplerConfig, source_name
from opsynth.shards import read_rows

fake = driver_tests.fake  # the stand-in, over this module's `tasks`
MIX = {"1": 0.5, "2": 0.5}
N_CANDIDATES = 90
N_TASKS = 10  # quotas 5 and 5


@pytest.fixture(scope="module")
def tasks():
    return driver_tests.sampled_tasks(SamplerConfig(scale=0.1, mixture=dict(MIX)), N_CANDIDATES)


def _passes(tasks):
    """torch#1 passes every time, torch#2 one candidate in three."""
    return lambda i: tasks[i]["st"].data_source == "torch#1" or i % 3 == 0


def _cfg(out, **kw):
    kw.setdefault("mixture_quota", True)
    kw.setdefault("max_candidates", N_CANDIDATES)
    cfg = driver_tests._cfg(out, kw.pop("n_tasks", N_TASKS), max_in_flight=4, **kw)
    cfg.sampler.mixture = dict(MIX)
    return cfg


def _expected(tasks, accept, quotas: dict | None, n_tasks=N_TASKS, give_up=0):
    """The rule, written out independently: candidates in order; one whose slot holds its quota is
    `mixture_slot_full` whatever its verdict; the rest as before (verdict, then dedup). A slot
    rejected `give_up` times in a row drops to its rows and the others share the rest."""
    rows, rejected, neardup = [], Counter(), NearDupIndex.from_config(DedupConfig())
    quotas = dict(quotas) if quotas else None
    held, misses, dead = Counter(), Counter(), set()
    for i in range(N_CANDIDATES):
        t = tasks[i]
        slot = t["st"].data_source
        if quotas is not None and held[slot] >= quotas[slot]:
            rejected[REASON] += 1
            continue
        ok = accept(i) and neardup.add(t["task_id"], t["code"], signature=t["signature"]) is None
        if ok:
            rows.append(t["task_id"])
            held[slot] += 1
            misses[slot] = 0
            if len(rows) == n_tasks:
                return rows, rejected, i + 1
        else:
            rejected["other"] += 1
            misses[slot] += 1
            if give_up and quotas is not None and misses[slot] >= give_up and slot not in dead:
                dead.add(slot)
                quotas[slot] = held[slot]
                live = [s for s in quotas if s not in dead]
                for s in live:  # two slots, equal shares: the live one takes what is left
                    quotas[s] = max(quotas[s], (n_tasks - sum(quotas[d] for d in dead)) // len(live))
    return rows, rejected, N_CANDIDATES


def _sources(out):
    return Counter(r["data_source"] for r in read_rows(out, columns=["data_source"]))


# -- the apportionment -----------------------------------------------------------------------------

def test_quotas_apportion_by_largest_remainder_and_sum_to_n_tasks():
    ops6k = {source_name(k): v for k, v in OPS6K_MIXTURE.items()}
    assert apportion(6, ops6k) == {"torch#1": 0, "torch#2": 5, "torch#3": 1, "torch#4": 0, "torch#5": 0,
                                   "transformers#1": 0}
    for n in (7, 500, 1000, 1234):
        q = apportion(n, ops6k)
        assert sum(q.values()) == n
        total = sum(ops6k.values())
        assert all(abs(q[s] - n * v / total) < 1 for s, v in ops6k.items()), q
        if n >= 500:  # within 1 point of the target in every slot
            assert all(abs(q[s] / n - v / total) < 0.01 for s, v in ops6k.items())
    assert apportion(10, {"b": 1.0, "a": 1.0, "c": 1.0}) == {"a": 4, "b": 3, "c": 3}  # a tie goes by name
    assert apportion(4, {"a": 0.0, "b": 2.0}) == {"a": 0, "b": 4}


def test_a_given_up_slot_keeps_its_rows_and_the_live_slots_share_the_rest():
    q = MixtureQuota(100, {"a": 0.5, "b": 0.3, "c": 0.2}, counts=Counter(a=10, c=3), give_up=3)
    assert q.quotas == {"a": 50, "b": 30, "c": 20}
    assert not q.note("c", False) and not q.note("c", False)
    q.note("c", True)  # a row resets the misses
    assert [q.note("c", False) for _ in range(3)] == [False, False, True]
    assert q.given_up == ["c"] and q.quotas["c"] == 4 and q.full("c")
    assert q.quotas["a"] + q.quotas["b"] == 96 and q.quotas["a"] >= 50 and q.quotas["b"] >= 30
    # What the state carries rebuilds the same quotas (the counts come from the rows).
    again = MixtureQuota(100, q.shares, counts=q.counts, give_up=3, **q.to_state())
    assert again.quotas == q.quotas and again.given_up == ["c"]
    assert MixtureQuota(10, {"a": 1.0}, give_up=0).note("a", False) is False  # give_up=0: never


# -- the driver ------------------------------------------------------------------------------------

def test_a_slot_that_passes_more_often_ends_at_its_quota(tmp_path, tasks, fake):
    accept = fake.accept = _passes(tasks)
    want, rejected, next_index = _expected(tasks, accept, {"torch#1": 5, "torch#2": 5})
    summary = driver_tests._run_with_deadline(_cfg(tmp_path / "quota"))
    assert [r["task_id"] for r in read_rows(tmp_path / "quota", columns=["task_id"])] == want
    assert _sources(tmp_path / "quota") == {"torch#1": 5, "torch#2": 5}
    assert summary["rejected"][REASON] == rejected[REASON] and summary["candidates"] == next_index
    assert summary["mixture_quota"]["quotas"] == {"torch#1": 5, "torch#2": 5}
    assert summary["target_mixture"] == {"torch#1": 0.5, "torch#2": 0.5}
    # Candidates of a full slot were not sent to a worker (the outcome is the same, the work is not).
    assert len(fake.calls()) < next_index

    # Control: without quotas the slot that passes more often takes more than its share.
    summary = driver_tests._run_with_deadline(_cfg(tmp_path / "free", mixture_quota=False))
    assert [r["task_id"] for r in read_rows(tmp_path / "free", columns=["task_id"])] == _expected(tasks, accept, None)[0]
    assert _sources(tmp_path / "free")["torch#1"] >= 7 and REASON not in summary["rejected"]


def test_a_stopped_run_resumes_to_the_rows_and_counts_of_an_uninterrupted_one(tmp_path, tasks, fake):
    fake.accept = _passes(tasks)
    stop, seen = threading.Event(), []

    def on_result(rec):
        seen.append(rec["index"])
        if len(seen) == 14:  # torch#1 is full by then: the resumed run must count its rows on disk
            stop.set()

    out, ref = tmp_path / "resumed", tmp_path / "ref"
    box = {}
    t = threading.Thread(target=lambda: box.update(s=driver.run(_cfg(out), on_result=on_result, stop=stop)), daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive()
    first = _sources(out)
    assert first["torch#1"] == 5 and sum(first.values()) < N_TASKS, first  # stopped with one slot full
    got = driver_tests._run_with_deadline(_cfg(out))
    want = driver_tests._run_with_deadline(_cfg(ref))
    assert read_rows(out, columns=["task_id", "data_source"]) == read_rows(ref, columns=["task_id", "data_source"])
    for key in ("accepted", "rejected", "candidates", "mixture_quota"):
        assert got[key] == want[key], key


def test_a_slot_that_never_passes_is_given_up_and_the_others_fill_the_run(tmp_path, tasks, fake, caplog):
    accept = fake.accept = lambda i: tasks[i]["st"].data_source == "torch#1"
    want, rejected, next_index = _expected(tasks, accept, {"torch#1": 5, "torch#2": 5}, give_up=6)
    with caplog.at_level(logging.WARNING, logger="opsynth.generate"):
        summary = driver_tests._run_with_deadline(_cfg(tmp_path / "ds", mixture_give_up=6))
    assert [r["task_id"] for r in read_rows(tmp_path / "ds", columns=["task_id"])] == want
    assert _sources(tmp_path / "ds") == {"torch#1": 10}
    assert summary["mixture_quota"]["given_up"] == ["torch#2"] and summary["candidates"] == next_index
    assert "mixture slot torch#2 given up" in caplog.text
    state = json.loads((tmp_path / "ds" / STATE_FILE).read_text())
    assert state["mixture_quota"]["given_up"] == ["torch#2"]


def test_with_give_up_off_a_dead_slot_stops_the_run_at_max_candidates_naming_it(tmp_path, tasks, fake, caplog):
    fake.accept = lambda i: tasks[i]["st"].data_source == "torch#1"
    with caplog.at_level(logging.WARNING, logger="opsynth.generate"):
        summary = driver_tests._run_with_deadline(_cfg(tmp_path / "ds", mixture_give_up=0, max_candidates=40))
    assert summary["rows"] == 5 and summary["candidates"] == 40
    assert "mixture slots below their quota: torch#2 0/5" in caplog.text
    # Once torch#1 was full only torch#2's candidates ran.
    slots = {tasks[i]["st"].data_source for i in fake.calls() if i > 20}
    assert slots <= {"torch#2"}, slots


# -- settings --------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad,name", [({"mixture_quota": "yes"}, "mixture_quota"), ({"mixture_give_up": -1}, "mixture_give_up"),
                                      ({"mixture_give_up": 2.5}, "mixture_give_up")])
def test_bad_quota_settings_are_one_line_naming_them(bad, name):
    with pytest.raises(ValueError, match=name) as e:
        GenerateConfig(**bad)
    assert "\n" not in str(e.value)


def test_the_shipped_config_turns_quotas_on():
    from test_pipeline_config import _compose

    from opsynth.generate.config import generate_config

    cfg = generate_config(_compose())
    assert cfg.mixture_quota is True and cfg.mixture_give_up == 200
    assert generate_config(_compose("mixture_quota=false")).mixture_quota is False
    with pytest.raises(ValueError, match="mixture_quota"):
        generate_config(_compose("mixture_quota=maybe"))


def test_rows_on_disk_ahead_of_the_state_count_toward_their_slot_once(tmp_path, tasks, fake, monkeypatch):
    """A crash between a shard write and the next state save (simulated by restoring an earlier
    state file): the slots' counts come from the rows the state lists, the rows ahead of it count
    when their candidates come again, and the run ends with the rows and counts of an uninterrupted one."""
    from opsynth.generate import state as statefile

    fake.accept = _passes(tasks)
    snapshots = []
    save = statefile.save_state
    monkeypatch.setattr(statefile, "save_state", lambda out, state: (snapshots.append(json.dumps(state)), save(out, state)))
    crashed, ref = tmp_path / "crashed", tmp_path / "ref"
    driver_tests._run_with_deadline(_cfg(crashed))
    early = next(json.loads(s) for s in snapshots if json.loads(s)["stats"]["rejected"].get(REASON))
    assert early["stats"]["accepted"] < N_TASKS
    (crashed / STATE_FILE).write_text(json.dumps(early))  # a state with a full slot; all rows are on disk
    got = driver_tests._run_with_deadline(_cfg(crashed))
    want = driver_tests._run_with_deadline(_cfg(ref))
    assert read_rows(crashed, columns=["task_id"]) == read_rows(ref, columns=["task_id"])
    for key in ("accepted", "rejected", "candidates", "mixture_quota"):
        assert got[key] == want[key], key
