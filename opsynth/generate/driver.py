"""The generate pipeline: sample -> render -> (KernelBench check) -> verify on Dask workers,
then dedup -> write on the driver, until `n_tasks` tasks are accepted.

Candidates are numbered; candidate i is sampled from seed `seed * 1_000_000_007 + i`. Workers may
finish in any order, but the driver *commits* results strictly in candidate order, so which tasks
are accepted (and in what row order) depends only on the seed and the config, never on timing of
the scheduler. That is what makes a killed run resumable to exactly the rows of an uninterrupted
one: `.opsynth-state.json` records the next candidate to commit whenever the shards are flushed,
and a rerun starts there, with the within-run dedup state rebuilt from the rows already written.

Sizes come before verification and never from a clock: `opsynth.verify.sizing` picks each
candidate's `batch_size` from its seed and a cost model (FLOPs and bytes counted on meta tensors,
at fixed reference rates); the verifier's timing only accepts or rejects. So the same seed and
settings give the same task code on every run, however loaded the machine.

The KernelBench check runs on the worker *before* verification: it costs milliseconds against
seconds of eager and compiled runs.

The state file also carries the *row ledger* (seed and task_id of every committed row) and the
shard files written; a rerun checks the folder against them first (`opsynth.shards.integrity`), so
a deleted or damaged shard is reported by name and refused, or, with `repair=true`, exactly its
missing seeds are regenerated.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opsynth.cluster import ClusterConfig, start_cluster
from opsynth.dedup import DedupConfig
from opsynth.graph import SamplerConfig
from opsynth.verify import VerifyConfig

log = logging.getLogger("opsynth.pipeline")

# Hidden, and not "state.json": `datasets.load_dataset(folder)` refuses a folder holding a
# state.json (it takes it for a `save_to_disk` folder). The push uploads only data and card.
STATE_FILE = ".opsynth-state.json"
SEED_STRIDE = 1_000_000_007
CPU_SCALE = 0.1  # sampler size scale when verifying on CPU and sampler.scale is null
# Accepted rows whose eager time is within this factor of an edge of the acceptance window are
# counted (report: run.cost_model.near_edge_rows): those a 25 % timing error could have rejected.
NEAR_EDGE = 1.25


@dataclass
class GenerateConfig:
    n_tasks: int = 20
    output_dir: str = "data/opsynth-ops"
    seed: int = 0
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    kb_check: bool = True  # decontaminate against KernelBench
    rows_per_shard: int = 10_000
    row_group_size: int = 1_000
    flush_every: int = 50  # commit shards and state at least every this many accepted rows
    max_in_flight: int = 0  # 0: 4 x the cluster's slots
    # Stop after this many candidates in all (resumed runs included, so a resumed run stops where an
    # uninterrupted one would) even if n_tasks is not reached (0: 200 x n_tasks).
    max_candidates: int = 0
    repo_id: str | None = None  # named in the dataset card's loading example
    progress: bool = True
    write_card: bool = True
    # A folder whose shards lost rows the state file lists (a shard deleted, truncated, unreadable)
    # is refused; repair=true regenerates exactly the missing seeds and sets damaged files aside.
    repair: bool = False

    def validate(self) -> None:
        if self.n_tasks < 1:
            raise ValueError(f"n_tasks must be >= 1, got {self.n_tasks}")
        if not self.output_dir:
            raise ValueError("output_dir must be a folder path")
        blocked = next((p for p in [Path(self.output_dir), *Path(self.output_dir).parents]
                        if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            raise ValueError(f"output_dir={self.output_dir}: {blocked} is a file, not a folder; give a new folder "
                             "or the folder of an earlier run (to resume it)")
        if self.flush_every < 1:
            raise ValueError("flush_every must be >= 1")
        self.sampler.validate()
        self.cluster.validate()
        self.verify.check_compile_backend()
        _check_output_dir(Path(self.output_dir), self.write_card)

    def check_machine(self) -> None:
        """What this machine must have for these settings (validate() checks the settings alone):
        verify=cuda on a local cluster needs a GPU, or the local workers start and fail candidate
        after candidate. (On Slurm or a scheduler the workers have their own devices.)"""
        if self.verify.device == "cuda" and self.cluster.kind in ("local", "local_cuda"):
            from opsynth.cluster import visible_gpus

            if visible_gpus() == 0:
                raise ValueError("verify=cuda, but this machine has no GPU that torch can see "
                                 "(torch.cuda.device_count() is 0); use verify=auto or verify=cpu here, or a "
                                 "cluster whose workers have GPUs (cluster=slurm_gpu, cluster=scheduler)")


def _check_output_dir(out: Path, write_card: bool) -> None:
    """A folder the run can write, and nothing of the user's that the run would overwrite."""
    existing = next(p for p in [out, *out.parents] if p.exists())
    try:  # a probe, not a guess from permission bits: root passes os.access on /proc
        probe = tempfile.mkdtemp(prefix=".opsynth-probe-", dir=existing)
        os.rmdir(probe)
    except OSError as e:
        raise ValueError(f"output_dir={out}: cannot write in {existing} ({e.strerror or type(e).__name__}); "
                         "give a folder you can write to") from None
    card = out / "README.md"
    if write_card and card.is_file():
        from opsynth.shards.card import is_dataset_card

        if not is_dataset_card(card):
            raise ValueError(f"output_dir={out} holds a README.md that is not an opsynth dataset card, and the run "
                             "would replace it with one; move it away or give another output_dir")


def candidate_seed(seed: int, index: int) -> int:
    return seed * SEED_STRIDE + index


class DatasetFolderError(RuntimeError):
    """The output folder is not what its state file says (a shard deleted, truncated or unreadable,
    an unreadable state file); the one-line message names the file and what to do."""


# ---------------------------------------------------------------------------------------------
# Worker side: one candidate, start to finish. Runs inside a Dask worker process; the heavy
# objects (catalog, verify pool, KernelBench index) are built once per process and reused.
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


def _context(sampler_cfg: dict, verify_cfg: dict, dedup_cfg: dict, kb_check: bool) -> dict:
    """The per-process sampler, verify pool and KernelBench index for these settings. Each part is
    rebuilt only when its own settings change (a new verify pool costs a torch import per worker;
    a new sampler or index costs milliseconds to seconds)."""
    def key(*parts) -> str:
        return json.dumps(parts, sort_keys=True, default=str)

    serialize_ast_parse()
    with _CTX_LOCK:
        if "catalog" not in _CTX:
            from opsynth.catalog import load_catalog, quiet_standalone_modules

            quiet_standalone_modules()  # the cost model's replays build attention modules standalone
            _CTX["catalog"] = load_catalog()
        if _CTX.get("sampler_key") != key(sampler_cfg, verify_cfg["device"]):
            from opsynth.graph import Sampler

            _CTX.update(sampler=Sampler(_worker_sampler_config(sampler_cfg, verify_cfg["device"]), _CTX["catalog"]),
                        sampler_key=key(sampler_cfg, verify_cfg["device"]))
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
            # Every source here is a graph the sampler generated: `verify.sandbox=auto` runs it unconfined.
            _CTX.update(pool=WorkerPool(vcfg, sampled=True).start(), pool_key=key(verify_cfg), gpu=gpu, verify_cfg=vcfg)
            if not _CTX.get("atexit"):
                import atexit

                atexit.register(_close_context)
                _CTX["atexit"] = True
        return _CTX


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


def process_candidate(index: int, seed: int, sampler_cfg: dict, verify_cfg: dict, dedup_cfg: dict,
                      kb_check: bool = True) -> dict:
    """Sample, render, check against KernelBench and verify one candidate. Never raises for a bad
    candidate: every outcome is a record with `accepted` and, when rejected, a named `reason`."""
    from opsynth.graph import SamplingError
    from opsynth.render import render_task, task_id

    stage_s: dict[str, float] = {}  # seconds per stage (verify/stages.py names the verifier's)
    rec: dict[str, Any] = {"index": index, "seed": seed, "accepted": False, "reason": None, "row": None,
                           "signature": None, "evidence": None, "stage_s": stage_s}
    t0 = time.perf_counter()
    ctx = _context(sampler_cfg, verify_cfg, dedup_cfg, kb_check)
    t1 = time.perf_counter()
    stage_s["worker_start"] = t1 - t0  # the first candidate of a process starts its verify pool
    try:
        st = ctx["sampler"].sample(seed)
    except SamplingError as e:
        stage_s["sampling"] = time.perf_counter() - t1
        rec.update(reason="sampling_failed", evidence=str(e))
        return rec
    from opsynth.graph.cost import with_batch
    from opsynth.verify.sizing import choose_batch

    rec["signature"] = st.graph.signature()  # sizes are not part of it
    t_size = time.perf_counter()
    stage_s["sampling"] = t_size - t1
    size = choose_batch(st.graph, ctx["catalog"], seed, ctx["verify_cfg"], ctx["pool"].device)
    if size.reason:
        stage_s["sizing"] = time.perf_counter() - t_size
        rec.update(reason=size.reason, evidence=size.evidence())
        return rec
    graph = with_batch(st.graph, size.batch)
    rec["predicted_ms"] = size.predicted_ms
    src = render_task(graph, ctx["catalog"])
    t2 = time.perf_counter()
    stage_s["sizing"] = t2 - t_size  # the cost model's search, and rendering the sized graph
    kb_row = {"kb_max_similarity": None, "kb_nearest": None}
    if ctx["kb"] is not None:
        m = ctx["kb"].check(src)
        kb_row = m.as_row()
        stage_s["kb_check"] = time.perf_counter() - t2
        if m.rejected:
            rec.update(reason=m.reason, evidence={"nearest": m.nearest, "similarity": m.max_similarity,
                                                  "op_sequence_match": m.op_sequence_match})
            return rec
    res = ctx["pool"].verify(src)
    stage_s.update(res.stage_s)
    rec["gpu_sections"], rec["gpu"] = res.gpu_sections, ctx.get("gpu")
    if not res.accepted:
        rec.update(reason=res.reason, evidence=_short(res.evidence))
        return rec
    rec["accepted"] = True
    rec["row"] = {
        "code": res.source,
        "ops": st.graph.ops(),
        "data_source": st.data_source,
        "task_id": task_id(res.source),
        "num_ops": st.num_ops,
        "graph": graph.to_json(),
        "input_shapes": json.dumps(_input_shapes(res.source)),
        "eager_ms": float(res.eager_ms),
        "compile_ms": float(res.compile_ms) if res.compile_ms is not None else float("nan"),
        "device": res.device or "",
        "torch_version": res.torch_version or "",
        **kb_row,
        "seed": int(seed),
    }
    rec["calib_steps"] = res.calib_steps
    return rec


def measure_peaks(sampler_cfg: dict, verify_cfg: dict, dedup_cfg: dict, kb_check: bool = True) -> dict:
    """The verifying device's peak rates, measured by one of this worker's verify sandboxes (once
    per run; recorded, never used for sizes), with the cost model's reference rates for it."""
    ctx = _context(sampler_cfg, verify_cfg, dedup_cfg, kb_check)
    pool = ctx["pool"]
    return {"kind": pool.device, "measured": pool.measure_peaks(),
            "reference": ctx["verify_cfg"].rates(pool.device).to_dict()}


def _short(evidence) -> Any:
    s = json.dumps(evidence, default=str)
    return evidence if len(s) < 2000 else s[:2000]


def _input_shapes(source: str) -> list[dict]:
    """Shapes and dtypes of get_inputs() for the calibrated source, read without running it
    (inputs are `torch.randn(<constants>)` / `torch.randint(lo, hi, (<constants>,))` calls)."""
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
            dims, dtype = args, "float32"
        shape = []
        for d in dims:
            v = facts.sizes.get(d.id) if isinstance(d, ast.Name) else getattr(d, "value", None)
            shape.append(v)
        out.append({"shape": shape, "dtype": dtype})
    return out


# ---------------------------------------------------------------------------------------------
# Driver side.
# ---------------------------------------------------------------------------------------------

def _load_state(out: Path) -> dict:
    p = out / STATE_FILE
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise DatasetFolderError(f"{p} is unreadable ({e}); delete it to restart the run from the shards") from e


def _ledger(state: dict) -> list[tuple[int, str]] | None:
    """The state's row ledger as (seed, task_id) pairs; None for a state without one."""
    if "ledger" not in state:
        return None
    out = []
    for entry in state["ledger"]:
        seed, _, tid = str(entry).partition(":")
        out.append((int(seed), tid))
    return out


def _state_record(committer, stats, writer, finished: bool = False) -> dict:
    """Everything the state file holds: where to resume, the counts, the row ledger (one
    "seed:task_id" per row, in row order) and the shards as written (to name a deleted one)."""
    import pyarrow.parquet as pq

    from opsynth.shards import list_shards

    committer.summarise_cost_model()
    shards = [{"name": sh.path.name, "rows": pq.ParquetFile(sh.path).metadata.num_rows}
              for sh in list_shards(writer.output_dir)]
    rec = {"next_index": committer.next_index, "stats": stats.to_dict(), "examples": committer.examples,
           "ledger": [f"{seed}:{tid}" for seed, tid in committer.ledger], "shards": shards,
           "eager_over_predicted": committer.ratios, "near_edge_rows": committer.near_edge}
    if finished:
        rec["finished"] = True
    return rec


def _save_state(out: Path, state: dict) -> None:
    tmp = out / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    os.replace(tmp, out / STATE_FILE)


def _plain(cfg) -> dict:
    return {k: v for k, v in asdict(cfg).items()}


class _Committer:
    """Applies worker results in candidate order: within-run dedup, shard writes, counts."""

    def __init__(self, cfg: GenerateConfig, writer, stats, state: dict):
        from opsynth.dedup import NearDupIndex
        from opsynth.graph import OpGraph
        from opsynth.shards import iter_rows

        self.cfg, self.writer, self.stats = cfg, writer, stats
        # Exact duplicates by graph signature and near-duplicates by MinHash-LSH, rebuilt from the
        # rows already written so that a resumed run decides exactly as an uninterrupted one.
        self.neardup = NearDupIndex.from_config(cfg.dedup)
        on_disk = []
        for row in iter_rows(cfg.output_dir, columns=["task_id", "code", "graph", "seed"]):
            self.neardup.add(row["task_id"], row["code"], signature=OpGraph.from_json(row["graph"]).signature())
            on_disk.append((int(row["seed"]), row["task_id"]))
        self.next_index = int(state.get("next_index", 0))
        self.examples: list[dict] = list(state.get("examples", []))
        self.calib_steps: list[int] = []
        # The row ledger: (seed, task_id) of every row, in row order. The state's, or for rows found
        # without a state file, theirs; rows on disk past the state's ledger (written just before a
        # crash) join it when their candidate is committed again.
        ledger = _ledger(state)
        self.ledger: list[tuple[int, str]] = ledger if ledger is not None else on_disk
        self.ratios: list[float] = [float(r) for r in state.get("eager_over_predicted", [])]
        self.near_edge = int(state.get("near_edge_rows", 0))
        known = {tid for _, tid in self.ledger}
        self.ahead = {tid for _, tid in on_disk if tid not in known}
        # The last candidate that wrote one of those rows: the run commits at least up to it.
        self.ahead_until = max((seed - cfg.seed * SEED_STRIDE for seed, tid in on_disk if tid in self.ahead),
                               default=-1)

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
        for row in _rows_with_ids(self.cfg.output_dir, self.ahead):
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
        reason = rec.get("reason")
        if rec["accepted"]:
            exact_before = self.neardup.counts["exact_duplicate"]
            dup = self.neardup.add(row["task_id"], row["code"], signature=rec["signature"])
            if dup is not None:
                exact = self.neardup.counts["exact_duplicate"] > exact_before
                reason = "duplicate_signature" if exact else "near_duplicate"
                rec["evidence"] = {"duplicate_of": dup}
        if reason:
            self.stats.reject(reason)
            if sum(1 for e in self.examples if e["reason"] == reason) < 3:
                self.examples.append({"reason": reason, "index": rec["index"], "seed": rec["seed"],
                                      "evidence": rec.get("evidence")})
            return
        self.writer.write(row)
        self._count_accepted(rec, row)

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
        for op in row["ops"]:
            self.stats.categories.setdefault(op, "")
        if rec.get("calib_steps") is not None:
            self.calib_steps.append(rec["calib_steps"])
        if not self.stats.versions.get("torch") and row["torch_version"]:
            self.stats.versions["torch"] = row["torch_version"]
        self.stats.device = row["device"] or self.stats.device


def _rows_with_ids(output_dir, ids: set[str]) -> list[dict]:
    from opsynth.shards import iter_rows

    return [r for r in iter_rows(output_dir, columns=["seed", "task_id"]) if r["task_id"] in ids]


def verify_device(cfg: GenerateConfig) -> str:
    """"cuda" or "cpu": where the verifier runs with these settings (`verify.device=auto` picks the
    GPU when the driver sees one). It decides `sampler.scale=null` and which runtime band applies."""
    if cfg.verify.device in ("cpu", "cuda"):
        return cfg.verify.device
    from opsynth.cluster import visible_gpus

    return "cuda" if visible_gpus() > 0 else "cpu"


def _describe_run(stats, cfg: GenerateConfig) -> None:
    """Record the settings of this run in its stats (the card and report print them). The runtime
    band and memory cap are those in force on the device that verifies (the CPU band on a CPU run)."""
    from opsynth.shards.stats import default_versions

    stats.n_tasks = cfg.n_tasks
    stats.seed = cfg.seed
    stats.cluster = cfg.cluster.kind
    stats.target_mixture = {(f"torch#{k}" if k != "transformers" else "transformers#1"): float(v)
                            for k, v in cfg.sampler.mixture.items()}
    device = verify_device(cfg)
    limits = cfg.verify.limits(device)
    stats.thresholds = {
        "verify_device": device, "eager_ms_min": limits.min_ms, "eager_ms_max": limits.max_ms,
        "kb_similarity_max": cfg.dedup.kb_threshold if cfg.kb_check else None,
        "kb_op_sequence": cfg.dedup.op_sequence_action if cfg.kb_check else None,
        "near_dup_threshold": cfg.dedup.neardup_threshold, "mem_cap_gb": limits.mem_cap_gb,
        "compile_backend": cfg.verify.compile_backend, "atol": cfg.verify.atol, "rtol": cfg.verify.rtol,
        "edge_margin": cfg.verify.edge_margin, "edge_margin_low": cfg.verify.edge_margin_low,
    }
    stats.versions = {**default_versions(), **stats.versions}
    stats.config = {"n_tasks": cfg.n_tasks, "seed": cfg.seed, "sampler": _plain(cfg.sampler),
                    "verify": _plain(cfg.verify), "dedup": _plain(cfg.dedup), "cluster": cfg.cluster.kind}


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
    state = _load_state(out)
    catalog = load_catalog()
    t_start = time.monotonic()
    state = _check_folder(cfg, out, state)
    if not state:
        state = _state_from_rows(cfg, out)
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
            _describe_run(stats, cfg)
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
        _save_state(out, _state_record(committer, stats, writer, finished=True))
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
    m, r = got["measured"], got["reference"]
    far = {k: m[k] / r[k] for k in ("tflops", "gbps") if r.get(k) and m.get(k) and not 1 / 3 <= m[k] / r[k] <= 3}
    if far:
        prefix = "" if got["kind"] == "cuda" else "cpu_"
        fix = " ".join(f"verify.{prefix}cost_{k}={m[k]:.3g}" for k in ("tflops", "gbps"))
        log.warning("%s measured %s, the cost model's reference rates are %s: sizes aim at another device's speed; "
                    "to aim at this one pass %s (sizes, hence rows, then differ from runs with the reference)",
                    m.get("device"), {k: round(m[k], 3) for k in ("tflops", "gbps")},
                    {k: r[k] for k in ("tflops", "gbps")}, fix)


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


def _state_from_rows(cfg: GenerateConfig, out: Path) -> dict:
    """A state rebuilt from the rows of a folder whose state file is gone (deleted, or a copy made
    without hidden files): every row carries its seed, so its candidate, and the run resumes after
    the last one, as the lost state would have had it. Rejection counts of the earlier runs are gone.
    {} for a folder without rows (a new run). Rows of another `seed` are refused, not adopted."""
    from opsynth.shards import RunStats, iter_rows, list_shards

    rows = [(int(r["seed"]), r["task_id"]) for r in iter_rows(out, columns=["seed", "task_id"])]
    if not rows:
        return {}
    indices = [seed - cfg.seed * SEED_STRIDE for seed, _ in rows]
    if min(indices) < 0 or max(indices) >= SEED_STRIDE:
        raise DatasetFolderError(
            f"{out} holds {len(rows)} rows but no {STATE_FILE}, and their seeds are not candidates of seed={cfg.seed}; "
            "rerun with the seed they were made with, or use another output_dir")
    stats = RunStats(accepted=len(rows), candidates=len(rows))
    _describe_run(stats, cfg)
    import pyarrow.parquet as pq

    state = {"next_index": max(indices) + 1, "stats": stats.to_dict(), "examples": [],
             "ledger": [f"{seed}:{tid}" for seed, tid in rows],
             "shards": [{"name": sh.path.name, "rows": pq.ParquetFile(sh.path).metadata.num_rows}
                        for sh in list_shards(out)], "rebuilt_from_rows": True}
    _save_state(out, state)
    log.warning("%s had no %s: rebuilt it from its %d rows (candidates up to %d); the run goes on from candidate %d "
                "(the earlier runs' rejection counts are not known)", out, STATE_FILE, len(rows), max(indices),
                max(indices) + 1)
    return state


def _check_folder(cfg: GenerateConfig, out: Path, state: dict) -> dict:
    """Refuse, or with `repair=true` repair, a folder whose shards lost rows (returns the state)."""
    from opsynth.shards.integrity import check_folder

    check = check_folder(out, ledger=_ledger(state), shards=state.get("shards"))
    line = None if check.ok else check.summary(out)
    if check.ok and _ledger(state) is None and "stats" in state:  # a state from before the ledger
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
    ledger = _ledger(state)
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
    _save_state(out, state)
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
        sampler_cfg, verify_cfg, dedup_cfg = _plain(cfg.sampler), _plain(cfg.verify), _plain(cfg.dedup)
        submit_kw = {"resources": {"GPU": 1}} if handle.gpu_resource else {}
        futures = {}
        for seed, tid in missing:
            index = seed - cfg.seed * SEED_STRIDE
            if index < 0:
                log.warning("seed %d is not a candidate of seed=%d; it cannot be regenerated", seed, cfg.seed)
                continue
            futures[tid] = handle.client.submit(process_candidate, index, seed, sampler_cfg, verify_cfg, dedup_cfg,
                                                cfg.kb_check, key=f"repair-{cfg.seed}-{index}", pure=False, **submit_kw)
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
    sampler_cfg, verify_cfg, dedup_cfg = _plain(cfg.sampler), _plain(cfg.verify), _plain(cfg.dedup)
    if handle.gpu_resource and verify_cfg.get("device") == "cpu":
        log.warning("cluster=%s has GPUs but verify.device=cpu: tasks are verified on CPU", handle.kind)
    submit_kw = {"resources": {"GPU": 1}} if handle.gpu_resource else {}
    inflight: dict[int, Any] = {}
    done: dict[int, dict] = {}
    next_submit = committer.next_index
    flushed_at = writer.num_rows
    ac = as_completed()

    def target_in_flight() -> int:
        remaining = max(cfg.n_tasks - committer.rows, 1)
        committed = stats.accepted + stats.num_rejected
        rate = (stats.accepted + 1) / (committed + 3)  # smoothed acceptance rate
        need = math.ceil(remaining / rate * 1.2) - len(done)
        return max(1, min(max_in_flight, max(need, handle.slots)))

    def top_up() -> None:
        nonlocal next_submit
        while len(inflight) < target_in_flight() and next_submit < max_candidates:
            i = next_submit
            f = client.submit(process_candidate, i, candidate_seed(cfg.seed, i), sampler_cfg, verify_cfg,
                              dedup_cfg, cfg.kb_check, key=f"candidate-{cfg.seed}-{i}", pure=False, **submit_kw)
            inflight[i] = f
            ac.add(f)
            next_submit += 1

    def save() -> None:
        writer.flush()
        stats.run_wall_time_s = time.monotonic() - t_start
        stats.wall_time_s = prior_wall + stats.run_wall_time_s
        _save_state(out, _state_record(committer, stats, writer))

    peaks = client.submit(measure_peaks, sampler_cfg, verify_cfg, dedup_cfg, cfg.kb_check,
                          key=f"peaks-{cfg.seed}-{committer.next_index}", pure=False, **submit_kw)
    peaks.add_done_callback(lambda f: _record_peaks(f, stats))
    progress = RunProgress(stats, total=cfg.n_tasks, disable=not cfg.progress, rows=lambda: writer.num_rows)
    start_index = committer.next_index
    try:
        top_up()
        while committer.wants_more(cfg.n_tasks) and inflight and not (stop is not None and stop.is_set()):
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
            for k, v in (rec.get("stage_s") or {}).items():
                stats.stage_seconds[k] = stats.stage_seconds.get(k, 0.0) + v
            if on_result is not None:
                on_result(rec)
            t_write = time.perf_counter()
            while committer.next_index in done and committer.wants_more(cfg.n_tasks):
                committer.commit(done.pop(committer.next_index))
                committer.next_index += 1
                progress.update()
                if writer.num_rows - flushed_at >= cfg.flush_every:
                    save()
                    flushed_at = writer.num_rows
            stats.stage_seconds["writing"] = stats.stage_seconds.get("writing", 0.0) + time.perf_counter() - t_write
            if committer.wants_more(cfg.n_tasks):
                top_up()
        if committer.rows < cfg.n_tasks and not (stop is not None and stop.is_set()):
            log.warning("stopped after %d candidates (%d in this run) with %d/%d rows: max_candidates=%d reached",
                        committer.next_index, committer.next_index - start_index, committer.rows, cfg.n_tasks,
                        max_candidates)
    finally:
        progress.close()
        pending = list(inflight.values()) + ([] if peaks.done() else [peaks])
        if pending:
            client.cancel(pending, force=True)
        save()
        handle.close()
