"""The generate driver: candidates -> Dask workers -> results committed in candidate order.

Candidates are numbered; candidate i is sampled from seed `seed * 1_000_000_007 + i`
(`opsynth.generate.config.candidate_seed`). Workers (`opsynth.generate.candidate`) may finish in
any order, but the driver *commits* results strictly in candidate order, so which tasks are
accepted (and in what row order) depends only on the seed and the config, never on timing of the
scheduler. That is what makes a killed run resumable to exactly the rows of an uninterrupted one:
the state file (`opsynth.generate.state`) records the next candidate to commit whenever the shards
are flushed, and a rerun starts there, with the within-run dedup state rebuilt from the rows
already written.

Sizes come before verification and never from a clock: `opsynth.verify.sizing` picks each
candidate's `batch_size` from its seed and a cost model (FLOPs and bytes counted on meta tensors,
at fixed reference rates); the verifier's timing only accepts or rejects. So the same seed and
settings give the same task code on every run, however loaded the machine.

The state file also carries the *row ledger* (seed and task_id of every committed row) and the
shard files written; a rerun checks the folder against them first (`opsynth.shards.integrity`), so
a deleted or damaged shard is reported by name and refused, or, with `repair=true`, exactly its
missing seeds are regenerated.

Semantic duplicates are decided before the band's and compile's verdicts: a candidate that passed
its eager checks and whose traced forward matches a committed row is a `semantic_duplicate`,
whatever its timing or torch.compile said of it. So each candidate is sent with the signatures
committed so far (`_CommittedFeed`), and a worker stops a match before its timing (the part that
holds the GPU alone) and its compile: which rows are accepted, and every reason, stay the same
whether or not the worker knew (the index only grows; see test_pipeline_compile_skip.py). A worker
also defers a forward an earlier in-flight candidate claimed first (`opsynth.generate.inflight`;
asked before the timing and again before the compile); when such a candidate's turn comes and no
committed row has its forward, the driver sends it again without claims and waits for it
(`_Committer.needs_rerun`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any

from opsynth.cluster import start_cluster
from opsynth.generate import state as statefile
from opsynth.generate.candidate import measure_peaks, process_candidate, slot_plan
from opsynth.generate.config import SEED_STRIDE, GenerateConfig, candidate_seed, describe_run, plain
from opsynth.generate.quota import REASON as SLOT_FULL
from opsynth.generate.quota import AXES, PRE_VERIFIER_MISS, SLOT_AXIS, MixtureQuotas
from opsynth.generate.state import DatasetFolderError, read_ledger, rows_with_ids

log = logging.getLogger("opsynth.generate")

# Accepted rows whose eager time is within this factor of an edge of the acceptance window are
# counted (report: run.cost_model.near_edge_rows): those a 25 % timing error could have rejected.
NEAR_EDGE = 1.25


class _Committer:
    """Applies worker results in candidate order: within-run dedup, shard writes, counts."""

    def __init__(self, cfg: GenerateConfig, writer, stats, state: dict):
        from opsynth.dedup import NearDupIndex, SemanticDupIndex
        from opsynth.graph import OpGraph
        from opsynth.shards import iter_rows

        self.cfg, self.writer, self.stats = cfg, writer, stats
        # Exact duplicates by graph signature, near-duplicates by MinHash-LSH and semantic duplicates
        # by the traced call graph, rebuilt from the rows already written so that a resumed run
        # decides exactly as an uninterrupted one.
        # Near-duplicates are looked for among rows of the same precision and pass (the same chain in
        # bf16, or backward, differs from its float32 forward in one line of code but is another task).
        self.neardup = NearDupIndex.from_config(cfg.dedup)  # float32 forward's
        self._neardup_by_kind = {("float32", "forward"): self.neardup}
        self.semantic = SemanticDupIndex()
        on_disk, self._values_of = [], {}
        for row in iter_rows(cfg.output_dir, columns=["task_id", "code", "graph", "seed", "trace_signature",
                                                      "dtype", "task_pass", "data_source"]):
            self._neardup_for(row).add(row["task_id"], row["code"], signature=OpGraph.from_json(row["graph"]).signature())
            self.semantic.add(row["task_id"], row["trace_signature"])
            on_disk.append((int(row["seed"]), row["task_id"]))
            self._values_of[row["task_id"]] = {axis: row[axis] for axis in AXES}
        # The mixture quotas start with the sampler's slot plan (`use_plan`, from a worker).
        self.plan = None
        self.quota: MixtureQuotas | None = None
        self.quota_grew = False  # a value was given up: the live values' quotas on its axis grew
        self._quota_state = dict(state.get("mixture_quota") or {})
        self._slot_mismatch_warned = False
        self.next_index = int(state.get("next_index", 0))
        self.examples: list[dict] = list(state.get("examples", []))
        self.calib_steps: list[int] = []
        # The row ledger: (seed, task_id) of every row, in row order. The state's, or for rows found
        # without a state file, theirs; rows on disk past the state's ledger (written just before a
        # crash) join it when their candidate is committed again.
        ledger = read_ledger(state)
        self.ledger: list[tuple[int, str]] = ledger if ledger is not None else on_disk
        self.ratios: list[float] = [float(r) for r in state.get("eager_over_predicted", [])]
        self.near_edge = int(state.get("near_edge_rows", 0))
        known = {tid for _, tid in self.ledger}
        self.ahead = {tid for _, tid in on_disk if tid not in known}
        # The last candidate that wrote one of those rows: the run commits at least up to it.
        self.ahead_until = max((seed - cfg.seed * SEED_STRIDE for seed, tid in on_disk if tid in self.ahead),
                               default=-1)

    def use_plan(self, plan) -> None:
        """The sampler's `SlotPlan`: the target is its effective shares, and with
        `mixture_quota=true` each slot's, precision's and pass's quota comes from them; the counts
        are the `data_source`, `dtype` and `task_pass` of the rows committed so far (read from the
        shards), so a resumed run decides as before."""
        from collections import Counter

        self.plan = plan
        self.stats.target_mixture = plan.shares()
        if self.cfg.mixture_quota:
            held = [self._values_of[tid] for _, tid in self.ledger if tid in self._values_of]
            counts = {axis: Counter(v[axis] for v in held) for axis in AXES}
            self.quota = MixtureQuotas(self.cfg.n_tasks, {SLOT_AXIS: plan.shares(), **plan.kind_shares()}, counts,
                                       give_up=self.cfg.mixture_give_up, state=self._quota_state)
            self.summarise_quota()
        self._values_of = {}

    def full_value(self, seed: int) -> tuple[str, str] | None:
        """(axis, value) of the candidate of `seed` that holds its quota, else None (counts only
        grow, and a full value's quota grows only when another value of its axis is given up)."""
        if self.quota is None:
            return None
        return self.quota.full(self.plan.values(seed))

    def value_full(self, seed: int) -> bool:
        return self.full_value(seed) is not None

    def quota_state(self) -> dict:
        """What the state file keeps of the quotas (a run stopped before its plan came keeps the
        state's, unchanged)."""
        return self.quota.to_state() if self.quota is not None else self._quota_state

    def summarise_quota(self) -> None:
        if self.quota is not None:
            self.stats.mixture_quota = self.quota.summary()

    def _neardup_for(self, row: dict):
        from opsynth.dedup import NearDupIndex

        kind = (row["dtype"], row["task_pass"])
        if kind not in self._neardup_by_kind:
            self._neardup_by_kind[kind] = NearDupIndex.from_config(self.cfg.dedup)
        return self._neardup_by_kind[kind]

    @property
    def rows(self) -> int:
        """Rows committed (the ledger's length); rows on disk ahead of the state are not among them."""
        return len(self.ledger)

    def wants_more(self, n_tasks: int) -> bool:
        return self.rows < n_tasks or self.next_index <= self.ahead_until

    def adopt_leftovers(self) -> None:
        """Rows on disk ahead of the state whose candidates did not give them again: keep them, as
        rows no counted candidate made (rare: settings changed between the runs)."""
        if not self.ahead:
            return
        log.warning("%d row(s) on disk were not reproduced by their candidates; kept as found", len(self.ahead))
        for row in rows_with_ids(self.cfg.output_dir, self.ahead):
            self.ledger.append((int(row["seed"]), row["task_id"]))
        self.stats.adopted_rows += len(self.ahead)
        self.ahead = set()

    def commit(self, rec: dict) -> None:
        row = rec.get("row")
        if rec["accepted"] and row["task_id"] in self.ahead:
            # Written before a crash that came ahead of the state save (a full shard is written
            # as soon as it fills): count it as the uninterrupted run did, but do not write it again.
            self._count_accepted(rec, row)
            return
        from opsynth.dedup.semantic import REASON as SEMANTIC

        reason = rec.get("reason")
        values = self.plan.values(rec["seed"]) if self.quota is not None else None
        full = self.quota.full(values) if values is not None else None
        if full is not None:
            # Whatever the worker said (and whether it ran at all: the driver skips such candidates
            # at submit), so that the counts do not depend on when the value filled.
            axis, value = full
            reason, rec["evidence"] = SLOT_FULL, {"axis": axis, "value": value, "quota": self.quota.quota(axis, value)}
        elif not rec["accepted"] and self.semantic.find(rec.get("trace_signature")) is not None:
            # Passed its eager checks, then failed the band or the compile (or skipped them): a semantic duplicate first.
            reason, rec["evidence"] = SEMANTIC, {"duplicate_of": self.semantic.find(rec["trace_signature"]),
                                                 "verifier": rec.get("reason")}
        elif reason == SEMANTIC:
            raise RuntimeError(f"candidate {rec['index']} skipped its compile as a semantic duplicate of a row "
                               "this run has not committed; this is a bug, please report it")
        elif rec["accepted"]:
            neardup = self._neardup_for(row)
            exact_before = neardup.counts["exact_duplicate"]
            same_calls = self.semantic.find(row["trace_signature"])  # a dict lookup: first
            dup = same_calls or neardup.add(row["task_id"], row["code"], signature=rec["signature"])
            if same_calls is not None:
                reason, rec["evidence"] = SEMANTIC, {"duplicate_of": same_calls}
            elif dup is not None:
                exact = neardup.counts["exact_duplicate"] > exact_before
                reason = "duplicate_signature" if exact else "near_duplicate"
                rec["evidence"] = {"duplicate_of": dup}
            else:
                self.semantic.add(row["task_id"], row["trace_signature"])
        if reason:
            if values is not None and reason != SLOT_FULL:
                by = self.stats.rejected_by_slot.setdefault(values[SLOT_AXIS], {})
                by[reason] = by.get(reason, 0) + 1
            # A candidate rejected before the verifier (the record says; one from a lost worker counts whole).
            miss = PRE_VERIFIER_MISS if rec.get("verifier_ran") is False else 1.0
            gave = (self.quota.note(values, accepted=False, miss=miss) if values is not None and reason != SLOT_FULL
                    else None)
            if gave is not None:
                self.quota_grew = True
                axis, value = gave
                q = self.quota.axes[axis]
                why = self.stats.rejected_by_slot.get(value, {}) if axis == SLOT_AXIS else {}
                log.warning("mixture %s %s given up after %d committed candidates in a row carrying it were rejected "
                            "(one rejected before the verifier counts %g) (%d/%d rows); its rows go to the other %s: "
                            "quotas now %s%s", "slot" if axis == SLOT_AXIS else axis, value, q.give_up, PRE_VERIFIER_MISS,
                            q.counts[value], q.n_tasks,
                            "slots" if axis == SLOT_AXIS else f"{axis} values", q.quotas,
                            f"; its rejections: {dict(sorted(why.items(), key=lambda kv: -kv[1]))}" if why else "")
            self.stats.reject(reason)
            if sum(1 for e in self.examples if e["reason"] == reason) < 3:
                self.examples.append({"reason": reason, "index": rec["index"], "seed": rec["seed"],
                                      "evidence": rec.get("evidence")})
            return
        self.writer.write(row)
        self._count_accepted(rec, row)

    def needs_rerun(self, rec: dict) -> bool:
        """A candidate that skipped its compile because an earlier in-flight one had its forward
        (`opsynth.generate.inflight`), and whose turn came with no committed row of that forward and
        a slot with room: only running it to the end decides it."""
        if rec.get("deferred_to") is None:
            return False
        if self.quota is not None and self.quota.full(self.plan.values(rec["seed"])) is not None:
            return False  # mixture_slot_full whatever it would have said
        return self.semantic.find(rec.get("trace_signature")) is None

    def summarise_cost_model(self) -> None:
        """Measured eager time over the cost model's prediction, over the accepted rows."""
        import statistics

        r = sorted(self.ratios)
        if not r:
            return
        self.stats.cost_model = {"rows": len(r), "eager_over_predicted_median": statistics.median(r),
                                 "p10": r[int(0.1 * (len(r) - 1))], "p90": r[int(0.9 * (len(r) - 1))],
                                 "near_edge_rows": self.near_edge}

    def _count_accepted(self, rec: dict, row: dict) -> None:
        self.ledger.append((int(row["seed"]), row["task_id"]))
        self.ahead.discard(row["task_id"])
        if rec.get("predicted_ms"):
            self.ratios.append(round(row["eager_ms"] / rec["predicted_ms"], 4))
        lo, hi = self.cfg.verify.accept_window("cpu" if row["device"] == "cpu" else "cuda")
        if lo <= row["eager_ms"] <= lo * NEAR_EDGE or hi / NEAR_EDGE <= row["eager_ms"] <= hi:
            self.near_edge += 1  # a timing 25 % off could have rejected it
        self.stats.accept()
        if self.quota is not None:
            values = {axis: row[axis] for axis in AXES}
            planned = self.plan.values(row["seed"])
            if values != planned and not self._slot_mismatch_warned:
                self._slot_mismatch_warned = True  # the workers' samplers differ from the one the plan came from
                log.warning("seed %s: its row says %s, the slot plan %s (workers with other catalogs or devices?); "
                            "quotas count the rows' columns", row["seed"], values, planned)
            self.quota.note(values, accepted=True)
        for op in row["ops"]:
            self.stats.categories.setdefault(op, "")
        if rec.get("calib_steps") is not None:
            self.calib_steps.append(rec["calib_steps"])
        if not self.stats.versions.get("torch") and row["torch_version"]:
            self.stats.versions["torch"] = row["torch_version"]
        self.stats.device = row["device"] or self.stats.device


class _CommittedFeed:
    """The committed rows' trace signatures each candidate is submitted with (a worker skips
    torch.compile for a match), sent by value: 17 bytes a row, pickled with each candidate. (A
    scattered future hung the commit: the candidate holding it never came back.) Rebuilt once the
    index grew by a sixteenth since the last time (at least one row); a candidate sent with an older
    copy only compiles a duplicate it could have skipped."""

    def __init__(self, index, on: bool = True) -> None:
        self.index, self.on, self.size, self.snapshot = index, on, 0, None

    def current(self) -> frozenset | None:
        n = len(self.index)
        if self.on and n and n - self.size >= max(1, self.size // 16):
            self.snapshot, self.size = self.index.signatures(), n
        return self.snapshot


def _start_claims(client, key: str):
    """The run's in-flight claims actor (`opsynth.generate.inflight`): (its future and the `ClaimsRef`
    candidates are sent with), or (None, None) when it could not be started (candidates then compile
    as before: time, never rows).

    Kept by the scheduler (`fire_and_forget`) until the cluster goes, not by the future: candidates
    still running when the run ends (cancelled, but their threads go on) ask it after the driver is
    done, and a deleted actor answered each with a KeyError logged on the worker and a 5-s hang
    (seen in test_pipeline_cli_errors). The driver closes it instead (`_close_claims`); the key is
    unique, so a later run on the same cluster never meets a closed one."""
    import uuid

    from distributed import fire_and_forget

    from opsynth.generate.inflight import ClaimsRef, InflightTraces

    try:
        future = client.submit(InflightTraces, actor=True, key=f"{key}-{uuid.uuid4().hex[:8]}", pure=False)
        future.result(timeout=60)
        fire_and_forget(future)
        (address,) = client.who_has(future)[future.key]
        return future, ClaimsRef(address=address, key=future.key)
    except Exception as e:  # noqa: BLE001 - named once; the run goes on without deferring
        log.warning("the in-flight claims actor did not start (%s: %s): candidates with a forward in flight compile "
                    "it again", type(e).__name__, e)
        return None, None


def _count_claims(claims_actor, stats) -> None:
    """Add the claims actor's inversions and released claims (`InflightTraces.inversions`,
    `.releases`) to `compile_deferrals["inverted"]` and `["released"]`; an actor that no longer
    answers adds nothing (a diagnostic, never the run's failure)."""
    try:
        actor = claims_actor.result(timeout=5)
        counts = {"inverted": actor.inversions().result(timeout=5), "released": actor.releases().result(timeout=5)}
    except Exception as e:  # noqa: BLE001
        log.info("the in-flight claims actor did not say its inversions (%s: %s)", type(e).__name__, e)
        return
    for key, n in counts.items():
        if n:
            stats.compile_deferrals[key] = stats.compile_deferrals.get(key, 0) + int(n)


def _close_claims(claims_actor) -> None:
    """Close the run's claims actor (`InflightTraces.close`): late callers are answered, not deferred."""
    try:
        claims_actor.result(timeout=5).close().result(timeout=5)
    except Exception as e:  # noqa: BLE001 - late candidates may then defer: their records are not used
        log.info("the in-flight claims actor did not close (%s: %s)", type(e).__name__, e)


def _check_counts(out: Path, stats, committer, total_rows: int) -> None:
    """The counts the state, summary and card print must be the rows in the files."""
    from opsynth.shards import count_rows

    on_disk = count_rows(out)
    counted = stats.accepted + stats.adopted_rows
    # Rows on disk ahead of the state stay uncounted only when a run was stopped before it got to
    # their candidates again (`stop`); a resume counts them.
    if not (on_disk == total_rows == len(committer.ledger) + len(committer.ahead) and counted == len(committer.ledger)):
        raise DatasetFolderError(f"{out}: the files hold {on_disk} rows but the run counted {counted} "
                                 f"({stats.accepted} accepted + {stats.adopted_rows} found without a state) and its "
                                 f"ledger lists {len(committer.ledger)}; this is a bug, please report it")


def _record_peaks(future, stats) -> None:
    """Record the device's measured rates next to the reference rates sizes were chosen with, and
    say so when the two are far apart (sizes then aim at another device's speed)."""
    try:
        got = future.result()
    except Exception as e:  # noqa: BLE001 - cancelled, or the measurement failed: nothing to record
        log.info("the device's peak rates were not measured: %s", e)
        return
    stats.measured_peaks = got["measured"]
    stats.reference_rates = {"device_kind": got["kind"], **got["reference"]}
    if got.get("task_mem_budget_mb") is not None:  # what sizing admitted candidates against (the card says it)
        stats.thresholds = {**stats.thresholds, "task_mem_budget_mb": got["task_mem_budget_mb"]}
    if got.get("task_mem_budget_mb_by_source"):  # verify.split_by_source: those slots' wider budgets
        stats.thresholds = {**stats.thresholds, "task_mem_budget_mb_by_source": got["task_mem_budget_mb_by_source"]}
    m, r = got["measured"], got["reference"]
    # A CPU probe shares the cores with the run's own work (catalog mining on a cold first run, the
    # other workers' checks and compiles), which slows it: seen 0.05 against 0.18 TFLOP/s on a 2-core
    # machine whose quiet reading is the reference. Its 64 MB copy also read 42 against 14 GB/s there
    # (another minute's memory traffic of the VM's host). Far counts only past 6x either way there.
    band = 6.0 if got["kind"] == "cpu" else 3.0
    far = {k: m[k] / r[k] for k in ("tflops", "gbps") if r.get(k) and m.get(k) and not 1 / band <= m[k] / r[k] <= band}
    if far:
        prefix = "" if got["kind"] == "cuda" else "cpu_"
        fix = " ".join(f"verify.{prefix}cost_{k}={m[k]:.3g}" for k in ("tflops", "gbps"))
        log.warning("%s measured %s, the cost model's reference rates are %s: sizes aim at another device's speed; "
                    "to aim at this one pass %s (sizes, hence rows, then differ from runs with the reference)",
                    m.get("device"), {k: round(m[k], 3) for k in ("tflops", "gbps")},
                    {k: r[k] for k in ("tflops", "gbps")}, fix)


def _check_folder(cfg: GenerateConfig, out: Path, state: dict) -> dict:
    """Refuse, or with `repair=true` repair, a folder whose shards lost rows (returns the state)."""
    from opsynth.shards.integrity import check_folder

    check = check_folder(out, ledger=read_ledger(state), shards=state.get("shards"))
    line = None if check.ok else check.summary(out)
    if check.ok and read_ledger(state) is None and "stats" in state:  # a state from before the ledger
        counted = int(state["stats"].get("accepted", 0)) + int(state["stats"].get("adopted_rows", 0))
        if counted != len(check.rows):
            line = (f"{out}: the state file counts {counted} rows but the shards hold {len(check.rows)} "
                    "(and it has no row ledger to tell which are gone)")
    if line is None:
        return state
    if not cfg.repair:
        raise DatasetFolderError(f"{line}. Rerun with repair=true to regenerate exactly the missing seeds "
                                 "(damaged files are moved to .opsynth-damaged/), or use another output_dir")
    log.warning("%s; repairing (repair=true)", line)
    return _repair(cfg, out, state, check)


def _repair(cfg: GenerateConfig, out: Path, state: dict, check) -> dict:
    """Set damaged shards aside, regenerate exactly the ledger's missing seeds, and rewrite the
    shards in ledger order. A seed that no longer gives its row (other settings, or a task whose
    acceptance is at the edge of the band) is reported and counted as `unreproduced`; the run then
    generates on to n_tasks as usual."""
    from opsynth.shards import RunStats
    from opsynth.shards.integrity import read_rows_of, rewrite_shards, set_aside

    for issue in check.issues:
        if issue.problem != "missing":
            log.warning("moved %s aside to %s", issue.name, set_aside(out, issue.name))
    present = [row for path in check.readable for row in read_rows_of(path)]
    ledger = read_ledger(state)
    stats = RunStats.from_dict(state["stats"]) if "stats" in state else RunStats()
    if ledger is None:  # no way to tell which seeds were lost: keep what reads, as rows of no run
        log.warning("%s: the state file has no row ledger; keeping the %d readable rows", out, len(present))
        rewrite_shards(out, present, cfg.rows_per_shard, cfg.row_group_size)
        return {}
    restored = _regenerate(cfg, out, check.missing)
    lost = [(seed, tid) for seed, tid in check.missing if tid not in restored]
    by_id = {r["task_id"]: r for r in present}
    by_id.update(restored)
    in_ledger = {tid for _, tid in ledger}
    rows = [by_id[tid] for _, tid in ledger if tid in by_id]
    rows += [r for r in present if r["task_id"] not in in_ledger]  # written just before a crash
    rewrite_shards(out, rows, cfg.rows_per_shard, cfg.row_group_size)
    if lost:
        log.warning("%s: %d seed(s) did not give their row again and are dropped: %s", out, len(lost),
                    ", ".join(str(seed) for seed, _ in lost[:20]))
        stats.accepted -= len(lost)
        stats.reject("unreproduced", len(lost))
    stats.repaired_rows += len(restored)
    stats.unreproduced_rows += len(lost)
    state = {**state, "stats": stats.to_dict(),
             "ledger": [f"{seed}:{tid}" for seed, tid in ledger if tid in by_id], "shards": []}
    statefile.save_state(out, state)
    log.info("%s: repaired: %d row(s) regenerated, %d dropped, %d rows in the folder", out, len(restored),
             len(lost), len(rows))
    return state


def _regenerate(cfg: GenerateConfig, out: Path, missing: list[tuple[int, str]]) -> dict[str, dict]:
    """Run the missing seeds' candidates again (on a cluster of their own); task_id -> row for each
    one that gives back the row with the same task_id."""
    if not missing:
        return {}
    with _sigint_ignored_in_children():
        handle = start_cluster(cfg.cluster, run_dir=out)
    try:
        sampler_cfg, verify_cfg, dedup_cfg = plain(cfg.sampler), plain(cfg.verify), plain(cfg.dedup)
        submit_kw = {"resources": {"GPU": 1}} if handle.gpu_resource else {}
        futures = {}
        for seed, tid in missing:
            index = seed - cfg.seed * SEED_STRIDE
            if index < 0:
                log.warning("seed %d is not a candidate of seed=%d; it cannot be regenerated", seed, cfg.seed)
                continue
            futures[tid] = handle.client.submit(process_candidate, index, seed, sampler_cfg, verify_cfg, dedup_cfg,
                                                cfg.kb_check, prepare_processes=cfg.prepare_processes,
                                                key=f"repair-{cfg.seed}-{index}", pure=False, **submit_kw)
        out = {}
        for tid, f in futures.items():
            try:
                rec = f.result()
            except Exception as e:  # noqa: BLE001 - a lost worker: that seed stays missing
                log.warning("regenerating task %s failed: %s", tid, e)
                continue
            if rec["accepted"] and rec["row"]["task_id"] == tid:
                out[tid] = rec["row"]
            else:
                log.warning("seed %d gave %s this time", rec["seed"],
                            f"another task ({rec['row']['task_id']})" if rec["accepted"] else f"a rejection ({rec['reason']})")
        return out
    finally:
        handle.close()


@contextlib.contextmanager
def _sigint_ignored_in_children():
    """Start processes that ignore SIGINT: a Ctrl-C in the terminal goes to the whole process group,
    and Dask workers (and the verify workers they start) would each print a KeyboardInterrupt
    traceback. The driver alone handles it: it saves the state and closes the cluster, which stops
    them. (Processes inherit an ignored SIGINT, and Python then installs no handler for it.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _generate(cfg, writer, stats, committer, out, t_start, prior_wall, as_completed, RunProgress,
              on_result=None, stop=None) -> None:
    with _sigint_ignored_in_children():
        handle = start_cluster(cfg.cluster, run_dir=out)
    client = handle.client
    max_in_flight = cfg.max_in_flight or 4 * handle.slots
    max_candidates = cfg.max_candidates or 200 * cfg.n_tasks
    sampler_cfg, verify_cfg, dedup_cfg = plain(cfg.sampler), plain(cfg.verify), plain(cfg.dedup)
    if handle.gpu_resource and verify_cfg.get("device") == "cpu":
        log.warning("cluster=%s has GPUs but verify.device=cpu: tasks are verified on CPU", handle.kind)
    submit_kw = {"resources": {"GPU": 1}} if handle.gpu_resource else {}
    inflight: dict[int, Any] = {}
    done: dict[int, dict] = {}
    # Candidates not sent to a worker because a value of theirs (slot, precision or pass) held its
    # quota when they came up: committed as `mixture_slot_full`, as they would be after running
    # (counts only grow); sent after all if a given-up value made room before their turn to commit.
    skipped: dict[int, tuple[str, str]] = {}
    next_submit = committer.next_index
    flushed_at = writer.num_rows
    ac = as_completed()
    feed = _CommittedFeed(committer.semantic, on=cfg.skip_duplicate_compiles)
    claims = claims_actor = None  # the in-flight claims actor and where it is, once a worker is up (below)

    def target_in_flight() -> int:
        remaining = max(cfg.n_tasks - committer.rows, 1)
        # Candidates rejected for a full slot say nothing of how often a submitted one passes.
        committed = stats.accepted + stats.num_rejected - stats.rejected.get(SLOT_FULL, 0)
        rate = (stats.accepted + 1) / (committed + 3)  # smoothed acceptance rate
        need = math.ceil(remaining / rate * 1.2) - len(done)
        return max(1, min(max_in_flight, max(need, handle.slots)))

    def submit(i: int, rerun: bool = False) -> None:
        f = client.submit(process_candidate, i, candidate_seed(cfg.seed, i), sampler_cfg, verify_cfg,
                          dedup_cfg, cfg.kb_check, committed=feed.current(), prepare_processes=cfg.prepare_processes,
                          claims=None if rerun else claims, key=f"candidate-{cfg.seed}-{i}{'-rerun' if rerun else ''}",
                          pure=False, **submit_kw)
        inflight[i] = f
        ac.add(f)

    def top_up() -> None:
        nonlocal next_submit
        while len(inflight) < target_in_flight() and next_submit < max_candidates:
            i = next_submit
            next_submit += 1
            full = committer.full_value(candidate_seed(cfg.seed, i))
            if full is not None:
                skipped[i] = full
            else:
                submit(i)

    def reopen() -> None:
        """A value was given up and its axis' others' quotas grew: send the skipped candidates that
        have room again on every axis (they are committed only once their results are in)."""
        committer.quota_grew = False
        for i in sorted(skipped):
            if not committer.value_full(candidate_seed(cfg.seed, i)):
                del skipped[i]
                submit(i)

    def save() -> None:
        writer.flush()
        stats.run_wall_time_s = time.monotonic() - t_start
        stats.wall_time_s = prior_wall + stats.run_wall_time_s
        statefile.save_state(out, statefile.state_record(committer, stats, writer))

    def drain() -> None:
        """Commit, in candidate order, every result and skipped candidate whose turn has come."""
        nonlocal flushed_at
        t_write = time.perf_counter()
        while committer.wants_more(cfg.n_tasks):
            i = committer.next_index
            if i in skipped and not committer.value_full(candidate_seed(cfg.seed, i)):
                del skipped[i]  # its slot has room again (reopen() missed none; this is the guard)
                submit(i)
            if i in skipped:
                axis, value = skipped.pop(i)
                rec = {"index": i, "seed": candidate_seed(cfg.seed, i), "accepted": False, "reason": SLOT_FULL,
                       "row": None, "evidence": {"axis": axis, "value": value, "skipped": True}}
            elif i in done:
                if committer.needs_rerun(done[i]):
                    # Deferred to an earlier candidate that left no row of its forward: run it to the end.
                    stats.compile_deferrals["rerun"] = stats.compile_deferrals.get("rerun", 0) + 1
                    del done[i]
                    submit(i, rerun=True)
                    break
                rec = done.pop(i)
            else:
                break
            committer.commit(rec)
            committer.next_index += 1
            progress.update()
            if writer.num_rows - flushed_at >= cfg.flush_every:
                save()
                flushed_at = writer.num_rows
            if committer.quota_grew:
                reopen()
        stats.stage_seconds["writing"] = stats.stage_seconds.get("writing", 0.0) + time.perf_counter() - t_write

    peaks = client.submit(measure_peaks, sampler_cfg, verify_cfg, dedup_cfg, cfg.kb_check,
                          key=f"peaks-{cfg.seed}-{committer.next_index}", pure=False, **submit_kw)
    peaks.add_done_callback(lambda f: _record_peaks(f, stats))
    progress = RunProgress(stats, total=cfg.n_tasks, disable=not cfg.progress, rows=lambda: writer.num_rows)
    start_index = committer.next_index
    try:
        # The slot of every seed, from a worker's sampler (the catalog's exclusions are the device's).
        plan = client.submit(slot_plan, sampler_cfg, verify_cfg, key=f"slots-{cfg.seed}-{committer.next_index}",
                             pure=False, **submit_kw)
        try:
            committer.use_plan(plan.result())
        except Exception as e:  # noqa: BLE001 - named in one line; the run cannot decide quotas without it
            raise RuntimeError(f"the sampler's slot plan could not be built on a worker: {type(e).__name__}: {e}") from e
        if cfg.skip_duplicate_compiles:  # a worker is up (it built the plan): the claims actor goes on one
            claims_actor, claims = _start_claims(client, f"inflight-{cfg.seed}-{committer.next_index}")
        top_up()
        drain()
        while (committer.wants_more(cfg.n_tasks) and (inflight or committer.next_index < next_submit)
               and not (stop is not None and stop.is_set())):
            if inflight:
                f = next(ac)
                i = next(k for k, v in inflight.items() if v is f)
                del inflight[i]
                try:
                    rec = f.result()
                except Exception as e:  # KilledWorker after a second death, or a bug outside the sandbox
                    from distributed import KilledWorker

                    reason = "killed_worker" if isinstance(e, KilledWorker) else f"pipeline_error:{type(e).__name__}"
                    rec = {"index": i, "seed": candidate_seed(cfg.seed, i), "accepted": False, "reason": reason,
                           "evidence": str(e)[:500]}
                done[i] = rec
                if rec.get("deferred_to") is not None:
                    stats.compile_deferrals["deferred"] = stats.compile_deferrals.get("deferred", 0) + 1
                for k, v in (rec.get("stage_s") or {}).items():
                    stats.stage_seconds[k] = stats.stage_seconds.get(k, 0.0) + v
                if on_result is not None:
                    on_result(rec)
            drain()
            if committer.wants_more(cfg.n_tasks):
                top_up()
                drain()
        if committer.rows < cfg.n_tasks and not (stop is not None and stop.is_set()):
            log.warning("stopped after %d candidates (%d in this run) with %d/%d rows: max_candidates=%d reached",
                        committer.next_index, committer.next_index - start_index, committer.rows, cfg.n_tasks,
                        max_candidates)
            if committer.quota is not None and committer.quota.unfilled():
                log.warning("mixture slots below their quota: %s (a slot, precision or pass is given up after "
                            "mixture_give_up=%d rejections in a row; mixture_quota=false fills without quotas)",
                            ", ".join(f"{s} {n}/{q}" for s, (n, q) in committer.quota.unfilled().items()),
                            cfg.mixture_give_up)
    finally:
        progress.close()
        pending = list(inflight.values()) + ([] if peaks.done() else [peaks])
        if pending:
            client.cancel(pending, force=True)
        if claims_actor is not None:
            _count_claims(claims_actor, stats)
            _close_claims(claims_actor)
            claims_actor.release()  # the scheduler keeps the actor itself (fire_and_forget) for late callers
        save()
        handle.close()


def run(cfg: GenerateConfig, on_result=None, stop: threading.Event | None = None) -> dict:
    """Generate until `cfg.n_tasks` rows are in `cfg.output_dir`; returns the run summary.

    on_result: called with each candidate's record as it arrives (benchmarks read its `stage_s`).
    stop: when set, the run stops at the next result as if `max_candidates` were reached."""
    from distributed import as_completed

    from opsynth.catalog import load_catalog
    from opsynth.shards import RunProgress, RunStats, ShardWriter

    cfg.validate()
    cfg.check_machine()
    out = Path(cfg.output_dir)
    if cfg.kb_check:  # fail fast, on the driver, before anything is written, when the reference is missing
        from opsynth.dedup import load_kernelbench
        from opsynth.dedup.kernelbench import local_reference

        if not cfg.dedup.kb_path and local_reference() is not None:  # found here: every worker reads this file
            cfg.dedup.kb_path = str(local_reference().resolve())
        load_kernelbench(kb_path=cfg.dedup.kb_path, kb_dataset=cfg.dedup.kb_dataset, levels=cfg.dedup.kb_levels)
    out.mkdir(parents=True, exist_ok=True)
    state = statefile.load_state(out)
    catalog = load_catalog()
    t_start = time.monotonic()
    state = _check_folder(cfg, out, state)
    if not state:
        state = statefile.state_from_rows(cfg, out)
    writer = ShardWriter(out, rows_per_shard=cfg.rows_per_shard, row_group_size=cfg.row_group_size)
    try:
        stats = RunStats.from_dict(state["stats"]) if "stats" in state else RunStats()
        prior_wall = stats.wall_time_s
        rows_at_start = writer.num_rows
        if "stats" not in state:  # shards without a state file: rows no counted run made
            stats.adopted_rows = rows_at_start
        committer = _Committer(cfg, writer, stats, state)
        complete = not committer.wants_more(cfg.n_tasks)
        if not (complete and "stats" in state):  # a finished run's record stays as it was made
            describe_run(stats, cfg)
        if complete:
            log.info("%s already holds %d rows (n_tasks=%d): nothing to generate", out, writer.num_rows, cfg.n_tasks)
        else:
            stats.runs += 1
            stats.resumed_rows = rows_at_start  # counted in the files, not carried over
            _generate(cfg, writer, stats, committer, out, t_start, prior_wall, as_completed, RunProgress,
                      on_result, stop)
            if not (stop is not None and stop.is_set()):
                committer.adopt_leftovers()
            stats.run_wall_time_s = time.monotonic() - t_start
            stats.wall_time_s = prior_wall + stats.run_wall_time_s  # a no-op rerun adds no time
            stats.run_added_rows = writer.num_rows - rows_at_start
        for op in list(stats.categories):
            stats.categories[op] = catalog.ops[op].category if op in catalog else "other"
        files = writer.finalize()
        total_rows = writer.num_rows
        _check_counts(out, stats, committer, total_rows)
        statefile.save_state(out, statefile.state_record(committer, stats, writer, finished=True))
    finally:
        writer.close()
    summary = stats.to_dict()
    summary["files"] = [str(f) for f in files]
    summary["rows"] = total_rows  # in the folder, earlier runs included; < n_tasks when max_candidates stopped it
    summary["generated"] = not complete  # False: the folder already held n_tasks rows
    summary["calib_steps_mean"] = (sum(committer.calib_steps) / len(committer.calib_steps)
                                   if committer.calib_steps else None)
    if cfg.write_card:
        from opsynth.graph import OpGraph
        from opsynth.shards import read_rows, write_card, write_report

        write_report(out, stats, rows=read_rows(out), rejections=committer.examples,
                     signature_of=lambda row: OpGraph.from_json(row["graph"]).signature())
        if total_rows:  # a dataset card describes data; with no rows the report says why
            write_card(out, stats, repo_id=cfg.repo_id)
    return summary

