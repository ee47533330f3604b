"""One candidate, start to finish, on a Dask worker: the stage chain.

Each stage is one function over a `Candidate` record: `sample` (the op graph from the candidate's
seed), `size` (its batch size from the cost model, never a clock), `render` (the task source),
`check_kernelbench` (decontamination: milliseconds, so before the seconds of verification),
`verify` (eager, compile, determinism, the runtime band; torch.compile is skipped for a candidate
whose traced forward is already among the committed rows' signatures it was sent with, or was claimed
first by an earlier candidate in flight: the committer decides semantic duplicates whatever the
compile says) and `make_row` (the shard row, a
`TaskRow` whose fields are exactly `opsynth.shards.schema.COLUMNS`). A stage returns False when it
rejected the candidate (the record then carries a named reason); `process_candidate` only runs
them in order. The heavy objects (catalog, verify pool, KernelBench index) are built once per
worker process (`_context`) and reused.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from opsynth.generate.config import CPU_SCALE
from opsynth.graph import SamplerConfig
from opsynth.shards.schema import COLUMNS
from opsynth.verify import VerifyConfig


@dataclass
class TaskRow:
    """One shard row, as `opsynth.shards.schema.SCHEMA` lays it out (checked below at import)."""

    code: str
    ops: list[str]
    data_source: str
    task_id: str
    num_ops: int
    graph: str
    input_shapes: str
    eager_ms: float
    compile_ms: float
    device: str
    torch_version: str
    kb_max_similarity: float | None
    kb_nearest: str | None
    seed: int
    mode: str
    trace_signature: str | None
    dtype: str
    task_pass: str

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


if tuple(f.name for f in fields(TaskRow)) != COLUMNS:  # the schema grew or moved a column: follow it here
    raise ImportError(f"opsynth.generate.candidate.TaskRow {[f.name for f in fields(TaskRow)]} "
                      f"is not the shard schema's columns {list(COLUMNS)}")


@dataclass
class Candidate:
    """What the stages know about one candidate. `to_record()` is what travels back to the driver
    (a plain dict: Dask pickles it, the state file's examples quote it)."""

    index: int
    seed: int
    accepted: bool = False
    reason: str | None = None
    evidence: Any = None
    signature: str | None = None  # of the sampled graph, sizes excluded (within-run dedup)
    stage_s: dict[str, float] = field(default_factory=dict)  # seconds per stage (verify/stages.py names the verifier's)
    row: TaskRow | None = None
    # Filled by the stages before verification, in this process or a preparing one (`opsynth.generate.
    # prepare`: these plain fields are what crosses back from there, `PREPARED`); not sent back.
    source: str | None = None
    kb_row: dict[str, Any] = field(default_factory=lambda: {"kb_max_similarity": None, "kb_nearest": None})
    ops: list[str] | None = None
    data_source: str | None = None
    num_ops: int | None = None
    graph_json: str | None = None  # the sized graph
    predicted_ms: float | None = None
    reserve_mb: float | None = None  # the device memory its verification is predicted to hold (x safety)
    # Objects of this process's stages only (None after a preparing process).
    sampled: Any = None  # opsynth.graph.SampledTask
    size: Any = None  # opsynth.verify.sizing.SizeChoice
    graph: Any = None  # the sized OpGraph
    verified: Any = None  # opsynth.verify.VerifyResult
    committed: frozenset | None = None  # trace signatures of rows committed before this candidate was sent
    claims: Any = None  # the run's in-flight claims actor (`opsynth.generate.inflight`), None: compile regardless
    deferred_to: int | None = None  # the earlier in-flight candidate whose forward this one's matched
    gpu: int | None = None

    def reject(self, reason: str, evidence: Any) -> bool:
        self.reason, self.evidence = reason, evidence
        return False

    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"index": self.index, "seed": self.seed, "accepted": self.accepted, "reason": self.reason,
                               "row": self.row.to_dict() if self.row is not None else None,
                               "signature": self.signature, "evidence": self.evidence, "stage_s": self.stage_s,
                               "verifier_ran": self.verified is not None}  # False: decided before the GPU (quota.py)
        if self.verified is not None and self.verified.signature:  # the eager checks passed: the committer's
            rec["trace_signature"] = self.verified.signature  # semantic-duplicate test comes before compile's verdict
        if self.deferred_to is not None:  # not compiled: the driver re-sends it unless a committed row has its forward
            rec["deferred_to"] = self.deferred_to
        if self.predicted_ms is not None:
            rec["predicted_ms"] = self.predicted_ms
        if self.verified is not None:
            rec["gpu_sections"], rec["gpu"] = self.verified.gpu_sections, self.gpu
            rec["device_sections"] = self.verified.device_sections
            rec["timed"] = self.verified.timed
            rec["compiles"], rec["graphs"] = self.verified.compiles, self.verified.graphs
            rec["compile_split"] = self.verified.compile_split
        if self.accepted:
            rec["calib_steps"] = self.verified.calib_steps
        return rec


@contextlib.contextmanager
def _timed(cand: Candidate, stage: str):
    t = time.perf_counter()
    try:
        yield
    finally:
        cand.stage_s[stage] = cand.stage_s.get(stage, 0.0) + time.perf_counter() - t


def sample(ctx: dict, cand: Candidate) -> bool:
    """The op graph of the candidate's seed (`sampling_failed` when the sampler gives none)."""
    from opsynth.graph import SamplingError

    with _timed(cand, "sampling"):
        try:
            st = cand.sampled = ctx["sampler"].sample(cand.seed)
        except SamplingError as e:
            return cand.reject("sampling_failed", str(e))
        cand.signature = st.graph.signature()  # sizes are not part of it
        cand.ops, cand.data_source, cand.num_ops = st.graph.ops(), st.data_source, st.num_ops
    return True


def size(ctx: dict, cand: Candidate) -> bool:
    """Its batch size from the seed and the cost model (`too_fast`, `too_slow`, `mem_cap`, ...),
    within the memory one verifier request may use on this worker's pool (`predicted_oom` when
    no batch size that reaches the target fits: the candidate never reaches the verifier)."""
    from opsynth.generate.prepare import budget_for
    from opsynth.graph.cost import with_batch
    from opsynth.verify.sizing import choose_batch

    with _timed(cand, "sizing"):
        pool = ctx["pool"]
        cand.size = choose_batch(cand.sampled.graph, ctx["catalog"], cand.seed, ctx["verify_cfg"], pool.device,
                                 budget_mb=budget_for(pool, cand.data_source))
        if cand.size.reason:
            return cand.reject(cand.size.reason, cand.size.evidence())
        cand.graph = with_batch(cand.sampled.graph, cand.size.batch)
        cand.predicted_ms = cand.size.predicted_ms
        if cand.size.budget_mb is not None:  # admission on: what sizing admitted it against, for the pool's gate
            cand.reserve_mb = cand.size.predicted_request_mb * ctx["verify_cfg"].safety(pool.device)
    return True


def render(ctx: dict, cand: Candidate) -> bool:
    """The task source of the sized graph (counted with sizing, as the report always has)."""
    from opsynth.render import render_task

    with _timed(cand, "sizing"):
        cand.source = render_task(cand.graph, ctx["catalog"])
        cand.graph_json = cand.graph.to_json()
    return True


def check_kernelbench(ctx: dict, cand: Candidate) -> bool:
    """Decontamination against KernelBench (skipped with kb_check=false)."""
    if ctx["kb"] is None:
        return True
    with _timed(cand, "kb_check"):
        m = ctx["kb"].check(cand.source)
        cand.kb_row = m.as_row()
    if m.rejected:
        return cand.reject(m.reason, {"nearest": m.nearest, "similarity": m.max_similarity,
                                      "op_sequence_match": m.op_sequence_match})
    return True


def verify(ctx: dict, cand: Candidate) -> bool:
    """The verifier's checks and timing in its sandboxed pool (the verifier names its stages). A
    candidate whose traced forward matches a committed row's stops once its eager checks passed,
    before its timing and torch.compile: the committer decides semantic duplicates before the
    verifier's verdict, so timing or compiling it changes nothing. So does one whose forward an
    earlier in-flight candidate claimed first (`deferred_to`: the driver re-sends it if that forward
    has no committed row when its turn comes); the claim is asked again before compile, which
    catches an earlier candidate that claimed while this one was timed. A claimant the verifier
    then rejects lets its claim go, so later candidates with its forward need not defer to it."""
    from opsynth.dedup.semantic import REASON as SEMANTIC
    from opsynth.generate.inflight import earlier_claim, release_claim
    from opsynth.verify.result import TIMING_SKIPPED

    known = cand.committed
    claimed: str | None = None  # the forward this candidate holds the in-flight claim of

    def go_timing(facts: dict) -> bool:
        nonlocal claimed
        sig = facts.get("signature")
        if known and sig in known:
            return False
        cand.deferred_to = earlier_claim(cand.claims, sig, cand.index)
        if cand.deferred_to is None and sig and cand.claims is not None:
            claimed = sig
        return cand.deferred_to is None

    def go_compile(facts: dict) -> bool:  # an earlier candidate may have claimed it since
        sig = facts.get("signature")
        if claimed is None or sig != claimed:
            return go_timing(facts)  # not asked before timing (no claims then): ask here, as before
        cand.deferred_to = earlier_claim(cand.claims, sig, cand.index)
        return cand.deferred_to is None

    asks = bool(known) or cand.claims is not None
    res = ctx["pool"].verify(cand.source, go_compile=go_compile if asks else None,
                             go_timing=go_timing if asks else None, reserve_mb=cand.reserve_mb)
    cand.stage_s.update(res.stage_s)
    cand.verified, cand.gpu = res, ctx.get("gpu")
    if claimed is not None and (not res.accepted or cand.deferred_to is not None):
        release_claim(cand.claims, claimed, cand.index)
    if res.reason in ("compile_skipped", TIMING_SKIPPED):
        stage = "before_timing" if res.reason == TIMING_SKIPPED else "before_compile"
        evidence = {"stage": stage, "trace_signature": res.signature}
        if cand.deferred_to is not None:
            evidence["deferred_to"] = cand.deferred_to
        return cand.reject(SEMANTIC, evidence)
    if not res.accepted:
        return cand.reject(res.reason, _short(res.evidence))
    return True


def make_row(ctx: dict, cand: Candidate) -> bool:
    """The accepted task's shard row, from the source as verified."""
    from opsynth.render import task_id
    from opsynth.render.task_file import task_kind

    res = cand.verified
    kind = task_kind(res.source)  # what the code states is what the row says
    cand.row = TaskRow(
        code=res.source,
        ops=list(cand.ops),
        data_source=cand.data_source,
        task_id=task_id(res.source),
        num_ops=cand.num_ops,
        graph=cand.graph_json,
        input_shapes=json.dumps(_input_shapes(res.source, kind.dtype)),
        eager_ms=float(res.eager_ms),
        compile_ms=float(res.compile_ms) if res.compile_ms is not None else float("nan"),
        device=res.device or "",
        torch_version=res.torch_version or "",
        kb_max_similarity=cand.kb_row["kb_max_similarity"],
        kb_nearest=cand.kb_row["kb_nearest"],
        seed=int(cand.seed),
        mode=res.mode,
        trace_signature=res.signature,
        dtype=kind.dtype,
        task_pass=kind.task_pass,
    )
    cand.accepted = True
    return True


# Before verification (what a preparing process runs: opsynth.generate.prepare), then on this process's pool.
PREPARE_STAGES: tuple[Callable[[dict, Candidate], bool], ...] = (sample, size, render, check_kernelbench)
VERIFY_STAGES: tuple[Callable[[dict, Candidate], bool], ...] = (verify, make_row)
STAGES = PREPARE_STAGES + VERIFY_STAGES
# What the stages before verification leave on a candidate, as plain values: all that crosses back from a
# preparing process, and all that the later stages and the record read of them.
PREPARED = ("reason", "evidence", "signature", "stage_s", "source", "kb_row", "ops", "data_source", "num_ops",
            "graph_json", "predicted_ms", "reserve_mb")


def prepare(ctx: dict, cand: Candidate) -> bool:
    """The stages before verification, here; False when one of them rejected the candidate."""
    return all(stage(ctx, cand) for stage in PREPARE_STAGES)  # stops at the first rejection


def process_candidate(index: int, seed: int, sampler_cfg: dict, verify_cfg: dict, dedup_cfg: dict,
                      kb_check: bool = True, committed: frozenset | None = None,
                      prepare_processes: int | None = None, claims: Any = None) -> dict:
    """Sample, render, check against KernelBench and verify one candidate. Never raises for a bad
    candidate: every outcome is a record with `accepted` and, when rejected, a named `reason`.
    committed: trace signatures of rows committed before this candidate (any subset of them is
    sound: the committer's index only grows); a match skips torch.compile.
    prepare_processes: processes of this worker that run the stages before verification
    (`opsynth.generate.prepare`; None: its default for the device, 0: these threads run them).
    claims: the run's in-flight claims (`opsynth.generate.inflight`); a forward an earlier candidate
    claimed first skips torch.compile and the record says `deferred_to` (None: no deferring)."""
    cand = Candidate(index=index, seed=seed, committed=committed, claims=claims)
    with _timed(cand, "worker_start"):  # the first candidate of a process starts its verify pool
        ctx = _context(sampler_cfg, verify_cfg, dedup_cfg, kb_check, prepare_processes)
    pool, preparers = ctx["pool"], ctx.get("prep")
    ready = (preparers.prepare(cand, pool.budgets_mb, lambda: prepare(ctx, cand)) if preparers is not None
             else prepare(ctx, cand))
    if ready:
        for stage in VERIFY_STAGES:
            if not stage(ctx, cand):
                break
    return cand.to_record()


def measure_peaks(sampler_cfg: dict, verify_cfg: dict, dedup_cfg: dict, kb_check: bool = True) -> dict:
    """The verifying device's peak rates, measured by one of this worker's verify sandboxes (once
    per run; recorded, never used for sizes), with the cost model's reference rates for it and the
    memory budget per verifier request that sizing admitted candidates against."""
    ctx = _context(sampler_cfg, verify_cfg, dedup_cfg, kb_check)
    pool = ctx["pool"]
    return {"kind": pool.device, "measured": pool.measure_peaks(),
            "reference": ctx["verify_cfg"].rates(pool.device).to_dict(),
            "task_mem_budget_mb": round(pool.task_mem_budget_mb, 1),
            "task_mem_budget_mb_by_source": {k: round(v, 1) for k, v in pool.budgets_mb.items() if k != "*"}}


def _short(evidence) -> Any:
    s = json.dumps(evidence, default=str)
    return evidence if len(s) < 2000 else s[:2000]


def _input_shapes(source: str, float_dtype: str = "float32") -> list[dict]:
    """Shapes and dtypes of get_inputs() for the calibrated source, read without running it
    (inputs are `torch.randn(<constants>)` / `torch.randint(lo, hi, (<constants>,))` calls; float
    ones in the task's precision)."""
    import ast

    from opsynth.render import parse_task

    facts = parse_task(source)
    fn = next(n for n in facts.tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_inputs")
    ret = next(n for n in ast.walk(fn) if isinstance(n, ast.Return))
    out = []
    for call in getattr(ret.value, "elts", []):
        if not isinstance(call, ast.Call):
            continue
        fname = ast.unparse(call.func)
        args = call.args
        if fname == "torch.randint" and len(args) >= 3:
            dims, dtype = getattr(args[2], "elts", [args[2]]), "int64"
        else:
            dims, dtype = args, float_dtype
        shape = []
        for d in dims:
            v = facts.sizes.get(d.id) if isinstance(d, ast.Name) else getattr(d, "value", None)
            shape.append(v)
        out.append({"shape": shape, "dtype": dtype})
    return out


# ---------------------------------------------------------------------------------------------
# The per-process context: built once per worker process, rebuilt only when its settings change.
# ---------------------------------------------------------------------------------------------

_CTX: dict[str, Any] = {}
_CTX_LOCK = threading.Lock()
_AST_LOCK = threading.RLock()


def serialize_ast_parse() -> None:
    """Make `ast.parse` one-at-a-time in this process (idempotent).

    Candidates run in a Dask worker's threads, and each parses Python source (render, task_id, the
    KernelBench check, the verifier's calibration). On CPython before 3.13, concurrent `ast.parse`
    calls can fail with "SystemError: AST constructor recursion depth mismatch" when a garbage
    collection switches threads mid-conversion (python/cpython#106905): a good candidate would
    become a timing-dependent rejection, and a resumed run would no longer match an uninterrupted
    one. Parsing a task takes milliseconds against seconds of verification, so the lock costs
    nothing measurable."""
    import ast

    if sys.version_info >= (3, 13) or getattr(ast.parse, "_opsynth_serialized", False):
        return
    original = ast.parse

    @functools.wraps(original)
    def parse(*args, **kwargs):
        with _AST_LOCK:
            return original(*args, **kwargs)

    parse._opsynth_serialized = True  # type: ignore[attr-defined]
    ast.parse = parse


_KEEP = object()  # `_context`: leave the preparing processes as they are (a new pool gets the default)


def _context(sampler_cfg: dict, verify_cfg: dict, dedup_cfg: dict, kb_check: bool,
             prepare_processes: Any = _KEEP) -> dict:
    """The per-process sampler, verify pool, KernelBench index and preparing processes for these
    settings. Each part is rebuilt only when its own settings change (a new verify pool costs a
    torch import per worker; a new sampler or index costs milliseconds to seconds)."""
    def key(*parts) -> str:
        return json.dumps(parts, sort_keys=True, default=str)

    serialize_ast_parse()
    with _CTX_LOCK:
        _ensure_sampler(sampler_cfg, verify_cfg)  # and the catalog
        if _CTX.get("kb_key") != key(dedup_cfg, kb_check):
            from opsynth.dedup import KernelBenchIndex

            _CTX.update(kb=KernelBenchIndex.from_config(dedup_cfg) if kb_check else None, kb_key=key(dedup_cfg, kb_check))
        if _CTX.get("pool_key") != key(verify_cfg):
            from opsynth.verify import WorkerPool

            if _CTX.get("pool") is not None:
                _CTX["pool"].close()
                _CTX["pool"] = None
            vcfg = VerifyConfig(**verify_cfg)
            gpu = _worker_gpu()
            if gpu is not None and vcfg.cuda_devices is None:
                vcfg.cuda_devices = [gpu]
            if not vcfg.n_workers:
                vcfg.n_workers = _worker_threads()
            n = None if prepare_processes is _KEEP else prepare_processes
            _restart_preparers(sampler_cfg, verify_cfg, dedup_cfg, kb_check, n, force=True)  # they import beside the pool
            # Every source here is a graph the sampler generated: `verify.sandbox=auto` runs it unconfined.
            _CTX.update(pool=WorkerPool(vcfg, sampled=True).start(), pool_key=key(verify_cfg), gpu=gpu, verify_cfg=vcfg)
            if not _CTX.get("atexit"):
                import atexit

                atexit.register(_close_context)
                _CTX["atexit"] = True
        elif prepare_processes is not _KEEP:
            _restart_preparers(sampler_cfg, verify_cfg, dedup_cfg, kb_check, prepare_processes)
        return _CTX


def _restart_preparers(sampler_cfg: dict, verify_cfg: dict, dedup_cfg: dict, kb_check: bool,
                       n: int | None, force: bool = False) -> None:
    """This process's preparing processes for these settings, `n` of them (None: the device's
    default), restarted only when the settings or the count changed, or `force` (a new verify pool);
    the caller holds `_CTX_LOCK`."""
    from opsynth.generate.prepare import Preparers, default_processes
    from opsynth.verify.pool import detect_device

    device = detect_device(verify_cfg["device"])
    n = max(0, default_processes(device) if n is None else int(n))
    pkey = json.dumps((sampler_cfg, verify_cfg, dedup_cfg, kb_check, n), sort_keys=True, default=str)
    if not force and _CTX.get("prep_key") == pkey:
        return
    old = _CTX.pop("prep", None)
    if old is not None:
        old.close()
    _CTX["prep"] = Preparers(n, sampler_cfg, verify_cfg, dedup_cfg, kb_check, device, PREPARED) if n > 0 else None
    _CTX["prep_key"] = pkey


def _ensure_sampler(sampler_cfg: dict, verify_cfg: dict) -> None:
    """The process's catalog and sampler for these settings (the caller holds `_CTX_LOCK`)."""
    if "catalog" not in _CTX:
        from opsynth.catalog import load_catalog, quiet_standalone_modules

        quiet_standalone_modules()  # the cost model's replays build attention modules standalone
        _CTX["catalog"] = load_catalog()
    key = json.dumps((sampler_cfg, verify_cfg["device"]), sort_keys=True, default=str)
    if _CTX.get("sampler_key") != key:
        from opsynth.graph import Sampler

        from opsynth.verify.pool import detect_device

        device = detect_device(verify_cfg["device"])  # the catalog excludes per precision on it
        _CTX.update(sampler=Sampler(_worker_sampler_config(sampler_cfg, verify_cfg["device"]), _CTX["catalog"],
                                    device=device), sampler_key=key)


def slot_plan(sampler_cfg: dict, verify_cfg: dict):
    """This worker's `SlotPlan` (which slot each seed gets, and the slots' expected shares), for the
    driver's mixture quotas: drawn from the sampler the candidates use, with the operators its
    device excludes per precision, without starting a verify pool."""
    serialize_ast_parse()
    with _CTX_LOCK:
        _ensure_sampler(sampler_cfg, verify_cfg)
        return _CTX["sampler"].slots


def _worker_sampler_config(sampler_cfg: dict, verify_device: str) -> SamplerConfig:
    """`sampler.scale=null` is decided here, on the worker, by the device it verifies on: a GPU run
    launched from a machine without one (a Slurm login node) still draws GPU sizes."""
    scfg = SamplerConfig(**sampler_cfg)
    if scfg.scale is None:
        from opsynth.verify.pool import detect_device

        scfg.scale = 1.0 if detect_device(verify_device) == "cuda" else CPU_SCALE
    return scfg


def _close_context() -> None:
    """Stop this process's verify pool (at exit, or from a test)."""
    with _CTX_LOCK:
        pool = _CTX.pop("pool", None)
        _CTX.pop("pool_key", None)
        prep = _CTX.pop("prep", None)
        _CTX.pop("prep_key", None)
    if prep is not None:
        prep.close()
    if pool is not None:
        pool.close()


def _worker_gpu() -> int | None:
    """On a local_cuda cluster each worker pins the GPU matching its name (0, 1, ...)."""
    try:
        from distributed import get_worker

        w = get_worker()
    except Exception:
        return None
    if "GPU" not in (w.state.total_resources if hasattr(w, "state") else getattr(w, "total_resources", {})):
        return None
    try:
        import torch

        n = torch.cuda.device_count()
        return int(w.name) % n if n else None
    except Exception:
        return None


def _worker_threads() -> int:
    try:
        from distributed import get_worker

        return max(1, int(get_worker().state.nthreads))
    except Exception:
        return max(1, os.cpu_count() or 1)


