"""Issue 29: the in-flight claims (`opsynth.generate.inflight`) that let a candidate defer the compile
of a forward an earlier candidate in flight traced first. The driver-level guarantee (same rows and
reasons with deferral on or off, re-runs when the earlier one left no row) is in
test_pipeline_compile_skip.py; a worker dying with the actor on it is test_pipeline_driver.py's
killed-worker test."""

from __future__ import annotations

import gc
import time

from opsynth.generate.inflight import ClaimsRef, InflightTraces, earlier_claim


def test_the_lowest_index_holds_a_claim_whatever_order_they_come_in():
    t = InflightTraces()
    assert t.claim("a", 7) == 7  # first: its own
    assert t.claim("a", 9) == 7  # later: defers to 7
    assert t.claim("a", 4) == 4  # an earlier candidate that claims late is not deferred...
    assert t.claim("a", 7) == 4  # ...and holds the claim from then on
    assert t.claim("b", 9) == 9 and t.size() == 2
    assert t.inversions() == 1  # 4 came after 7 had claimed "a": both compile; a late 7 again is not one


def test_a_rejected_claimant_lets_its_claim_go_and_only_its_own():
    """A claimant the verifier rejected will leave no row: later candidates with its forward should
    compile, not defer to it (and be re-sent). Another candidate's claim is not touched."""
    from opsynth.generate.inflight import release_claim

    t = InflightTraces()
    t.claim("a", 4)
    assert not t.release("a", 7) and t.claim("a", 9) == 4  # 7 never held it: 4 still does
    assert t.release("a", 4) and t.claim("a", 9) == 9  # gone: the next one claims it
    assert t.releases() == 1 and not t.release("zz", 1)
    release_claim(_Proxy(t), "a", 9)  # through a proxy, as a candidate does
    assert t.claim("a", 11) == 11 and t.releases() == 2
    release_claim(_Proxy(ConnectionError("gone")), "a", 11)  # a lost actor: the claim stays, nothing raised
    release_claim(None, "a", 11)
    assert t.claim("a", 12) == 11


class _Proxy:
    def __init__(self, traces):
        self.traces = traces

    def release(self, signature, index):
        if isinstance(self.traces, Exception):
            return _Done(self.traces)
        return _Done(self.traces.release(signature, index))


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self, timeout=None):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


class _ActorFuture:
    """What the driver holds for the actor: its future, whose result is the proxy."""

    def __init__(self, traces):
        self.traces = traces

    def result(self, timeout=None):
        return self

    def inversions(self):
        return _Done(self.traces.inversions() if isinstance(self.traces, InflightTraces) else self.traces)

    def releases(self):
        return _Done(self.traces.releases() if isinstance(self.traces, InflightTraces) else self.traces)


def test_the_runs_inversions_add_to_its_compile_deferrals_and_a_silent_actor_adds_nothing():
    from opsynth.generate.driver import _count_claims
    from opsynth.shards.stats import RunStats

    t = InflightTraces()
    for sig, i in (("a", 9), ("a", 3), ("b", 5), ("b", 2), ("b", 8)):
        t.claim(sig, i)
    t.release("a", 3)
    stats = RunStats(compile_deferrals={"deferred": 4, "inverted": 1})  # a resumed run's counts
    _count_claims(_ActorFuture(t), stats)
    assert stats.compile_deferrals == {"deferred": 4, "inverted": 3, "released": 1}
    _count_claims(_ActorFuture(TimeoutError("gone")), stats)
    assert stats.compile_deferrals == {"deferred": 4, "inverted": 3, "released": 1}


def test_a_claims_actor_that_is_gone_is_asked_once_and_the_candidate_compiles():
    gone = ClaimsRef(address="tcp://127.0.0.1:1", key="inflight-gone")  # nothing listens there
    assert earlier_claim(gone, "sig", 3) is None  # compile, as without claims
    t0 = time.perf_counter()
    assert earlier_claim(gone, "sig", 4) is None
    assert time.perf_counter() - t0 < 0.05  # not asked again in this process
    assert earlier_claim(None, "sig", 4) is None and earlier_claim(gone, None, 4) is None


def test_candidates_on_dask_workers_claim_through_the_actor_by_its_plain_reference():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        actor = client.submit(InflightTraces, actor=True, key="inflight-test", pure=False)
        actor.result()
        (address,) = client.who_has(actor)[actor.key]
        ref = ClaimsRef(address=address, key=actor.key)
        first = client.submit(earlier_claim, ref, "sig", 2, key="c2", pure=False).result()
        later = client.submit(earlier_claim, ref, "sig", 5, key="c5", pure=False).result()
        other = client.submit(earlier_claim, ref, "other", 6, key="c6", pure=False).result()
        assert (first, later, other) == (None, 2, None)


def _late_claims(ref):
    """What a candidate still running after the run's end asks: a claim, then letting it go."""
    t0 = time.perf_counter()
    first = earlier_claim(ref, "sig", 9)
    from opsynth.generate.inflight import release_claim

    release_claim(ref, "sig", 9)
    return first, time.perf_counter() - t0


def test_a_candidate_still_running_after_the_run_ends_is_answered_at_once():
    """Cancelled candidates keep running on their workers and ask the claims actor after the driver is
    done with it. The driver closes it and the scheduler keeps it (fire_and_forget): they are answered
    at once, with no deferral. (A deleted actor answered with a KeyError logged on its worker and a
    5-s hang per call, seen as stray errors at the end of a first run.) Worker processes, as a run has."""
    from distributed import Client, LocalCluster

    from opsynth.generate.driver import _close_claims, _count_claims, _start_claims
    from opsynth.shards.stats import RunStats

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        actor, ref = _start_claims(client, "inflight-late")
        assert actor is not None and ref.key.startswith("inflight-late-")
        other = next(w for w in client.scheduler_info()["workers"] if w != ref.address)  # asks only late
        assert client.submit(earlier_claim, ref, "sig", 2, pure=False, workers=[ref.address]).result() is None  # 2 holds it
        stats = RunStats()
        _count_claims(actor, stats)
        _close_claims(actor)
        actor.release()  # what the driver does at the end of the run
        del actor
        gc.collect()  # the proxies the driver made of it are gone, as when its function returns
        time.sleep(1.5)  # the scheduler has let go of what it was going to
        first, took = client.submit(_late_claims, ref, pure=False, workers=[other]).result(timeout=30)
        assert first is None and took < 2.0, (first, took)  # no deferral to 2, and no hang
