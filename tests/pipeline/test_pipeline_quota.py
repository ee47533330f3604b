"""Mixture quotas (`opsynth.generate.quota`): each `data_source` slot ends at its share of n_tasks
even when one slot passes verification far more often than another, decided from committed counts
in candidate order, so a resumed run ends with the rows of an uninterrupted one; a slot that never
passes is given up (its rows go to the others), or, with give-up off, the run stops at
max_candidates naming it.

The precision (`dtype`) and pass (`task_pass`) have quotas of their own, on the same rule: a
candidate with any full value is rejected, a value that never passes is given up, and a
combination that never passes (bf16 backward) cannot stall the run.

The driver runs against the stand-in candidate processing of test_pipeline_driver.py (in-process
Dask, no sandboxes), over candidates sampled with a two-slot mixture: `torch#1` always passes,
`torch#2` one candidate in three (the `kinds` tests: also half fp32 and bf16, half forward and
backward, bf16 and backward passing less often)."""

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
from opsynth.generate.quota import AXES, PRE_VERIFIER_MISS, REASON, MixtureQuota, MixtureQuotas, apportion
from opsynth.generate.state import STATE_FILE
from opsynth.graph import OPS6K_MIXTURE, SamplerConfig, source_name
from opsynth.shards import read_rows

fake = driver_tests.fake  # the stand-in, over this module's `tasks`
MIX = {"1": 0.5, "2": 0.5}
N_CANDIDATES = 90
N_TASKS = 10  # quotas 5 and 5


KINDS = {"dtypes": {"fp32": 0.5, "bf16": 0.5}, "passes": {"forward": 0.5, "backward": 0.5}}
N_KIND_CANDIDATES = 120
N_KIND_TASKS = 12  # quotas 6 and 6 on every axis


@pytest.fixture(scope="module")
def tasks(request):
    """The candidates; `@pytest.mark.parametrize("tasks", ["kinds"], indirect=True)`: with KINDS."""
    if getattr(request, "param", None) == "kinds":
        return driver_tests.sampled_tasks(SamplerConfig(scale=0.1, mixture=dict(MIX), **KINDS), N_KIND_CANDIDATES)
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
    one = MixtureQuota(10, {"a": 1.0}, give_up=2)  # an axis' last live value: its rows have nowhere to go
    assert [one.note("a", False) for _ in range(5)] == [False] * 5 and one.given_up == [] and one.quotas == {"a": 10}


def test_an_axis_with_one_value_has_no_quota_and_the_slots_decide_as_before():
    """The default (fp32 forward only): the multi-axis quotas are the slot quotas alone, note for note,
    and what the state and summary carry is what they carried before the other axes."""
    import random

    shares = {"torch#1": 0.5, "torch#2": 0.3, "torch#3": 0.2}
    multi = MixtureQuotas(50, {"data_source": shares, "dtype": {"float32": 1.0}, "task_pass": {"forward": 1.0}},
                          give_up=3)
    alone = MixtureQuota(50, shares, give_up=3)
    assert list(multi.axes) == ["data_source"]
    rng = random.Random(0)
    for _ in range(300):
        v = {"data_source": rng.choice(list(shares)), "dtype": "float32", "task_pass": "forward"}
        assert (multi.full(v) is not None) == alone.full(v["data_source"])
        if alone.full(v["data_source"]):
            continue
        ok = rng.random() < (0.9 if v["data_source"] == "torch#1" else 0.2)
        gave = multi.note(v, ok)
        assert (gave is not None) == alone.note(v["data_source"], ok)
    assert alone.given_up and multi.slot.quotas == alone.quotas and multi.slot.counts == alone.counts
    assert multi.to_state() == alone.to_state() and "axes" not in multi.summary()
    assert multi.summary() == {**alone.summary(), "give_up_after": 3, "pre_verifier_miss": PRE_VERIFIER_MISS,
                               "reason": REASON}


def test_the_state_carries_every_axis_and_an_old_state_is_the_slot_axis():
    shares = {"data_source": {"torch#1": 0.5, "torch#2": 0.5}, "dtype": {"float32": 0.5, "bfloat16": 0.5},
              "task_pass": {"forward": 0.75, "backward": 0.25}}
    old = MixtureQuotas(8, shares, state={"misses": {"torch#2": 2}, "given_up": ["torch#2"]}, give_up=5)
    assert old.slot.given_up == ["torch#2"] and old.slot.misses["torch#2"] == 2
    assert old.axes["dtype"].given_up == [] and old.axes["task_pass"].quotas == {"forward": 6, "backward": 2}
    counts = {"data_source": Counter({"torch#1": 3}), "dtype": Counter({"float32": 2, "bfloat16": 1}),
              "task_pass": Counter({"forward": 3})}
    shares["data_source"] = {"torch#1": 1.0}  # one slot: never given up, so the dtype axis is
    q = MixtureQuotas(8, shares, counts, give_up=2)
    v = {"data_source": "torch#1", "dtype": "bfloat16", "task_pass": "backward"}
    assert q.note(v, False) is None and q.note(v, False) == ("dtype", "bfloat16")
    again = MixtureQuotas(8, shares, counts, give_up=2, state=json.loads(json.dumps(q.to_state())))
    assert again.summary() == q.summary() and again.axes["dtype"].quotas == {"float32": 7, "bfloat16": 1}
    assert q.to_state()["axes"]["task_pass"]["misses"] == {"backward": 2}


def test_at_most_one_value_is_given_up_per_candidate():
    """A combination that never passes misses its values together: giving them all up at once would
    drop backward's quota too, though fp32 backward could fill it once bf16 is given up."""
    shares = {"data_source": {"torch#1": 1.0}, "dtype": {"float32": 0.5, "bfloat16": 0.5},
              "task_pass": {"forward": 0.5, "backward": 0.5}}
    q = MixtureQuotas(4, shares, {"dtype": Counter({"float32": 2}), "task_pass": Counter({"forward": 2})}, give_up=2)
    dead = {"data_source": "torch#1", "dtype": "bfloat16", "task_pass": "backward"}
    assert q.full({**dead, "dtype": "float32"}) == ("dtype", "float32")  # only bf16 backward can commit
    assert q.note(dead, False) is None and q.note(dead, False) == ("dtype", "bfloat16")
    assert q.axes["task_pass"].given_up == [] and q.axes["task_pass"].misses["backward"] == 2
    assert q.full({**dead, "dtype": "float32"}) is None  # fp32 backward fills backward now
    assert q.note({**dead, "dtype": "float32"}, True) is None and q.axes["task_pass"].misses["backward"] == 0
    assert q.unfilled() == {"dtype=float32": (3, 4), "task_pass=backward": (1, 2), "torch#1": (1, 4)}


def test_the_plan_gives_the_precision_and_pass_shares_and_each_seed_its_values():
    from opsynth.graph import Sampler

    sampler = Sampler(SamplerConfig(scale=0.1, dtypes={"fp32": 0.4, "bf16": 0.4, "fp16": 0.2},
                                    passes={"forward": 0.75, "backward": 0.25}))
    shares = sampler.slots.kind_shares()
    assert shares["dtype"] == pytest.approx({"float32": 0.4, "bfloat16": 0.4, "float16": 0.2})
    assert shares["task_pass"] == pytest.approx({"forward": 0.75, "backward": 0.25})
    drawn = Counter(sampler.slots.values(s)["dtype"] for s in range(4000))
    assert abs(drawn["float16"] / 4000 - 0.2) < 0.02
    for seed in range(12):
        st = sampler.sample(seed)
        assert sampler.slots.values(seed) == {"data_source": st.data_source, "dtype": st.dtype, "task_pass": st.task_pass}


# -- the driver ------------------------------------------------------------------------------------

def test_a_slot_that_passes_more_often_ends_at_its_quota(tmp_path, tasks, fake):
    accept = fake.accept = _passes(tasks)
    want, rejected, next_index = _expected(tasks, accept, {"torch#1": 5, "torch#2": 5})
    summary = driver_tests._run_with_deadline(_cfg(tmp_path / "quota"))
    assert [r["task_id"] for r in read_rows(tmp_path / "quota", columns=["task_id"])] == want
    assert _sources(tmp_path / "quota") == {"torch#1": 5, "torch#2": 5}
    assert summary["rejected"][REASON] == rejected[REASON] and summary["candidates"] == next_index
    assert summary["mixture_quota"]["quotas"] == {"torch#1": 5, "torch#2": 5}
    # fp32 forward only: the slots alone have quotas (no other axis in the summary or the state).
    assert "axes" not in summary["mixture_quota"]
    assert set(json.loads((tmp_path / "quota" / STATE_FILE).read_text())["mixture_quota"]) == {"misses", "given_up"}
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


def _miss_runs(tasks, passes, slot, until):
    """The lengths of `slot`'s runs of rejected candidates, in candidate order, before its `until`-th pass."""
    runs, run, held = [], 0, 0
    for i in range(N_CANDIDATES):
        if tasks[i]["st"].data_source != slot:
            continue
        if passes(i):
            runs.append(run)
            run, held = 0, held + 1
            if held == until:
                return runs
        else:
            run += 1
    return runs + [run]


@pytest.mark.parametrize("before_verifier", [True, False], ids=["rejected-before-the-verifier", "rejected-by-it"])
def test_a_slot_rejected_before_the_verifier_fills_where_one_rejected_by_it_is_given_up(tmp_path, tasks, fake,
                                                                                      before_verifier):
    """torch#2 passes one candidate in five. Its others rejected at sizing (as single-op candidates are
    `predicted_oom` on a GPU shared by 16 workers: no GPU time spent) count a tenth of a miss, and it
    fills; the same pattern rejected by the verifier counts whole, and a run of misses gives it up."""
    passes = fake.accept = lambda i: tasks[i]["st"].data_source == "torch#1" or i % 5 == 0
    fake.before_verifier = lambda i: before_verifier
    runs = _miss_runs(tasks, passes, "torch#2", until=5)
    give_up = max(runs)
    assert len(runs) == 5 and give_up >= 2, runs  # the premise: torch#2 fills in this window, one run reaches give_up
    summary = driver_tests._run_with_deadline(_cfg(tmp_path / "ds", mixture_give_up=give_up))
    sources = _sources(tmp_path / "ds")
    if before_verifier:
        assert summary["mixture_quota"]["given_up"] == [] and sources == {"torch#1": 5, "torch#2": 5}, summary
    else:
        assert summary["mixture_quota"]["given_up"] == ["torch#2"] and sources["torch#2"] < 5, summary
    assert summary["mixture_quota"]["pre_verifier_miss"] == PRE_VERIFIER_MISS
    # why each slot's candidates were rejected (a slot-full rejection is not the slot's own)
    by_slot = summary["rejected_by_slot"]
    assert set(by_slot) == {"torch#2"} and sum(by_slot["torch#2"].values()) >= give_up, by_slot
    assert "mixture_slot_full" not in by_slot["torch#2"]


def test_misses_before_the_verifier_add_up_to_a_give_up_exactly_and_survive_a_resume():
    q = MixtureQuota(100, {"a": 0.5, "b": 0.5}, give_up=2)
    for _ in range(19):
        assert q.note("a", accepted=False, miss=PRE_VERIFIER_MISS) is False
    resumed = MixtureQuota(100, {"a": 0.5, "b": 0.5}, give_up=2, **json.loads(json.dumps(q.to_state())))
    assert resumed.misses["a"] == pytest.approx(1.9) and not resumed.given_up
    assert resumed.note("a", accepted=False, miss=PRE_VERIFIER_MISS) is True  # the 20th tenth: exactly 2
    assert resumed.given_up == ["a"]
    q.note("b", accepted=False, miss=PRE_VERIFIER_MISS)
    q.note("b", accepted=True)
    assert q.misses["b"] == 0  # a pass ends the run, as before


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


# -- the precision and pass axes ------------------------------------------------------------------

KIND_SHARES = {"data_source": {"torch#1": 0.5, "torch#2": 0.5}, "dtype": {"bfloat16": 0.5, "float32": 0.5},
               "task_pass": {"backward": 0.5, "forward": 0.5}}


def _values(t) -> dict:
    return {"data_source": t["st"].data_source, "dtype": t["st"].dtype, "task_pass": t["st"].task_pass}


def _kind_passes(tasks):
    """fp32 forward always passes; bf16 two candidates in three, backward one in two (bf16 backward
    one in three): left alone, the rows lean to fp32 and forward."""
    return lambda i: ((tasks[i]["st"].dtype == "float32" or i % 3 != 1)
                      and (tasks[i]["st"].task_pass == "forward" or i % 2 == 0))


def _kind_cfg(out, **kw):
    kw.setdefault("n_tasks", N_KIND_TASKS)
    kw.setdefault("max_candidates", N_KIND_CANDIDATES)
    cfg = _cfg(out, **kw)
    cfg.sampler.dtypes, cfg.sampler.passes = dict(KINDS["dtypes"]), dict(KINDS["passes"])
    return cfg


def _expected_axes(tasks, accept, quota=True, give_up=0, n_tasks=N_KIND_TASKS):
    """The rule on three axes, written out: candidates in order; one with a value (slot, dtype or
    pass) at its quota is `mixture_slot_full`; the rest by verdict, then dedup (the same trace
    signature in any kind, a near-duplicate in the same kind). A rejected candidate is a miss for
    each of its values; the first axis whose value has `give_up` misses in a row, is not full and
    is not its axis' last live value gives it up: it keeps its rows, its axis' live values share
    the rest. Returns (rows, rejections, candidates committed, final quotas)."""
    quotas = {a: apportion(n_tasks, KIND_SHARES[a]) for a in AXES} if quota else None
    rows, rejected, seen, neardup = [], Counter(), set(), {}
    held, misses, dead = {a: Counter() for a in AXES}, {a: Counter() for a in AXES}, {a: set() for a in AXES}
    for i in range(N_KIND_CANDIDATES):
        t, v = tasks[i], _values(tasks[i])
        if quota and any(held[a][v[a]] >= quotas[a][v[a]] for a in AXES):
            rejected[REASON] += 1
            continue
        near = neardup.setdefault((v["dtype"], v["task_pass"]), NearDupIndex.from_config(DedupConfig()))
        ok = accept(i) and t["signature"] not in seen and near.add(t["task_id"], t["code"], signature=t["signature"]) is None
        if ok:
            seen.add(t["signature"])
            rows.append(t["task_id"])
            for a in AXES:
                held[a][v[a]] += 1
                misses[a][v[a]] = 0
            if len(rows) == n_tasks:
                return rows, rejected, i + 1, quotas
            continue
        rejected["other"] += 1
        for a in AXES:
            misses[a][v[a]] += 1
        for a in AXES if quota and give_up else ():
            x = v[a]
            others = [y for y in quotas[a] if y not in dead[a] and y != x]
            if misses[a][x] >= give_up and x not in dead[a] and held[a][x] < quotas[a][x] and others:
                dead[a].add(x)
                quotas[a][x] = held[a][x]
                seats = apportion(n_tasks - sum(quotas[a][d] for d in dead[a]), {y: KIND_SHARES[a][y] for y in others})
                for y, q in seats.items():
                    quotas[a][y] = max(quotas[a][y], q)
                break
    return rows, rejected, N_KIND_CANDIDATES, quotas


def _kinds(out):
    rows = read_rows(out, columns=list(AXES))
    return {a: Counter(r[a] for r in rows) for a in AXES}


KINDS_TASKS = pytest.mark.parametrize("tasks", ["kinds"], indirect=True)


@KINDS_TASKS
def test_a_precision_and_pass_mixture_ends_at_each_axis_quota(tmp_path, tasks, fake):
    accept = fake.accept = _kind_passes(tasks)
    want, rejected, next_index, _ = _expected_axes(tasks, accept)
    summary = driver_tests._run_with_deadline(_kind_cfg(tmp_path / "quota"))
    assert [r["task_id"] for r in read_rows(tmp_path / "quota", columns=["task_id"])] == want
    assert _kinds(tmp_path / "quota") == {a: Counter({v: 6 for v in KIND_SHARES[a]}) for a in AXES}
    assert summary["rejected"][REASON] == rejected[REASON] and summary["candidates"] == next_index
    q = summary["mixture_quota"]
    assert q["quotas"] == {"torch#1": 6, "torch#2": 6}
    assert q["axes"] == {"dtype": {"quotas": {"bfloat16": 6, "float32": 6}, "rows": {"bfloat16": 6, "float32": 6},
                                   "given_up": []},
                         "task_pass": {"quotas": {"backward": 6, "forward": 6}, "rows": {"backward": 6, "forward": 6},
                                       "given_up": []}}
    # The full axis is named in the examples, and candidates of a full value were not sent to a worker.
    state = json.loads((tmp_path / "quota" / STATE_FILE).read_text())
    full = [e["evidence"] for e in state["examples"] if e["reason"] == REASON]
    assert full and all(e["axis"] in AXES and e["quota"] == 6 for e in full), full
    assert len(fake.calls()) < next_index

    # Control: without quotas the rows lean to fp32 and forward, the kinds that pass more often.
    summary = driver_tests._run_with_deadline(_kind_cfg(tmp_path / "free", mixture_quota=False))
    assert [r["task_id"] for r in read_rows(tmp_path / "free", columns=["task_id"])] == _expected_axes(
        tasks, accept, quota=False)[0]
    free = _kinds(tmp_path / "free")
    assert free["dtype"]["float32"] >= 8 and free["task_pass"]["forward"] >= 8, free
    assert REASON not in summary["rejected"]


@KINDS_TASKS
def test_a_stopped_kinds_run_resumes_to_the_rows_and_counts_of_an_uninterrupted_one(tmp_path, tasks, fake):
    fake.accept = _kind_passes(tasks)
    stop, seen = threading.Event(), []

    def on_result(rec):
        seen.append(rec["index"])
        if len(seen) == 24:
            stop.set()

    out, ref = tmp_path / "resumed", tmp_path / "ref"
    box = {}
    t = threading.Thread(target=lambda: box.update(s=driver.run(_kind_cfg(out), on_result=on_result, stop=stop)),
                         daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive()
    first = _kinds(out)
    assert 0 < sum(first["dtype"].values()) < N_KIND_TASKS and 6 in first["dtype"].values(), first  # a value full
    got = driver_tests._run_with_deadline(_kind_cfg(out))
    want = driver_tests._run_with_deadline(_kind_cfg(ref))
    cols = ["task_id", *AXES]
    assert read_rows(out, columns=cols) == read_rows(ref, columns=cols)
    for key in ("accepted", "rejected", "candidates", "mixture_quota"):
        assert got[key] == want[key], key


def _dead_combination(tasks):
    return lambda i: not (tasks[i]["st"].dtype == "bfloat16" and tasks[i]["st"].task_pass == "backward")


def _dead_value(tasks):
    return lambda i: tasks[i]["st"].dtype == "float32"


@KINDS_TASKS
@pytest.mark.parametrize("dead,given_up", [(_dead_combination, {"dtype": ["bfloat16"]}),
                                           (_dead_value, {"dtype": ["bfloat16"]})])
def test_a_combination_or_value_that_never_passes_is_given_up_and_the_run_finishes(tmp_path, tasks, fake, caplog,
                                                                                   dead, given_up):
    """bf16 backward never passing: once fp32 and forward are full only bf16 backward candidates are
    left to commit; bf16 is given up (one value per candidate), fp32 takes its rows and backward
    still fills. (Control: with give-up off the same run stops at max_candidates short of rows.)"""
    accept = fake.accept = dead(tasks)
    want, rejected, next_index, quotas = _expected_axes(tasks, accept, give_up=4)
    with caplog.at_level(logging.WARNING, logger="opsynth.generate"):
        summary = driver_tests._run_with_deadline(_kind_cfg(tmp_path / "ds", mixture_give_up=4))
    assert [r["task_id"] for r in read_rows(tmp_path / "ds", columns=["task_id"])] == want
    assert summary["rows"] == N_KIND_TASKS and summary["candidates"] == next_index < N_KIND_CANDIDATES
    got = _kinds(tmp_path / "ds")
    assert got["task_pass"] == {"forward": 6, "backward": 6} and got["data_source"] == {"torch#1": 6, "torch#2": 6}
    assert got["dtype"]["bfloat16"] < 6
    q = summary["mixture_quota"]
    assert {a: q["axes"][a]["given_up"] for a in ("dtype",)} == given_up and q["given_up"] == []
    assert q["axes"]["dtype"]["quotas"] == quotas["dtype"] and q["axes"]["task_pass"]["given_up"] == []
    assert "mixture dtype bfloat16 given up" in caplog.text
    state = json.loads((tmp_path / "ds" / STATE_FILE).read_text())
    assert state["mixture_quota"]["axes"]["dtype"]["given_up"] == ["bfloat16"]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="opsynth.generate"):
        summary = driver_tests._run_with_deadline(_kind_cfg(tmp_path / "off", mixture_give_up=0))
    assert summary["rows"] < N_KIND_TASKS and summary["candidates"] == N_KIND_CANDIDATES
    assert "dtype=bfloat16" in caplog.text and "below their quota" in caplog.text
