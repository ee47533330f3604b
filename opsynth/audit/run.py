"""The audit: every row through the generator's checks, in the generator's order, one verdict each.

Per row, cheapest first, as a candidate goes through the generator: KernelBench decontamination
(on the source), then the verifier's eager and compile checks in a confined worker (rows are
untrusted code; `verify.sandbox=auto` confines them), then, in row order, the committer's dedup:
semantic duplicates by traced call graph, exact duplicates (graph signature when the row has an
opsynth `graph`, else the normalised source) and near-duplicates by MinHash. Reasons are the
generator's own strings (`opsynth.verify.REASONS`, `kb_*`, `semantic_duplicate`, ...).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from opsynth.audit.config import AuditConfig
from opsynth.audit.rows import RowsUnavailable, is_local, load_rows

VERDICTS = "verdicts.parquet"
SUMMARY = "audit.json"


class AuditError(ValueError):
    """A source or setting the audit cannot work with; the message is one line."""


def out_dir(cfg: AuditConfig) -> Path:
    if cfg.out:
        return Path(cfg.out)
    return Path(cfg.source) / "audit" if is_local(cfg.source) and Path(cfg.source).is_dir() else Path("audit") / cfg.source


def _prepared(code: str, max_batch: int) -> str:
    """The source as audited: at most `max_batch` rows of batch when asked (the task contract's rewrite)."""
    from opsynth.render.task_file import read_batch_size, set_batch_size

    if not max_batch:
        return code
    bs = read_batch_size(code)
    return set_batch_size(code, max_batch) if bs is not None and bs > max_batch else code


def _kb_verdict(kb, code: str) -> tuple[str | None, dict]:
    from opsynth.render.parse import TaskParseError

    if kb is None:
        return None, {}
    try:
        m = kb.check(code)
    except TaskParseError as e:  # not a task the fingerprint reads; the verifier says what it is
        return None, {"kb": f"not checked: {e}"}
    return m.reason, {"kb_nearest": m.nearest, "kb_max_similarity": m.max_similarity}


def _graph_signature(row: dict) -> str | None:
    """The generator's exact-dedup key for an opsynth row (its op graph's signature), else None."""
    if not row.get("graph"):
        return None
    try:
        from opsynth.graph import OpGraph

        return OpGraph.from_json(row["graph"]).signature()
    except Exception:  # noqa: BLE001 - a foreign `graph` column: dedup falls back to the source
        return None


def _task_id(code: str) -> str:
    """The generator's task_id (hash of the normalised code); of the raw text for a source that does not parse."""
    import hashlib

    from opsynth.render import task_id

    try:
        return task_id(code)
    except (SyntaxError, ValueError):
        return hashlib.sha256(code.encode()).hexdigest()[:16]


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="audit", unit="row", disable=not enabled, dynamic_ncols=True)


def audit(cfg: AuditConfig) -> dict[str, Any]:
    """Audit `cfg.source`; write `audit.json` and `verdicts.parquet` under `out_dir(cfg)`; return the summary."""
    from opsynth.dedup import DedupConfig, KernelBenchIndex, NearDupIndex, SemanticDupIndex
    from opsynth.dedup.semantic import REASON as SEMANTIC
    from opsynth.render.parse import TaskParseError
    from opsynth.verify import WorkerPool

    if not cfg.source:
        raise AuditError("source= is required: an opsynth folder, a Parquet file or a Hub dataset id")
    t0 = time.monotonic()
    try:
        rows = load_rows(cfg.source, cfg.split, cfg.revision, cfg.limit)
    except RowsUnavailable as e:
        raise AuditError(str(e)) from None
    dedup_cfg = DedupConfig(kb_path=cfg.kb_path)
    kb = None
    if cfg.kb_check:
        from opsynth.dedup.kernelbench import local_reference

        if not dedup_cfg.kb_path and local_reference() is not None:
            dedup_cfg.kb_path = str(local_reference().resolve())
        kb = KernelBenchIndex.from_config(dedup_cfg)
    verdicts: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        code = row["code"]
        ops = row.get("ops")
        verdicts.append({"index": i, "task_id": row.get("task_id") or _task_id(code),
                         "data_source": row.get("data_source"), "ops": list(ops) if ops is not None else None,
                         "kept": False, "reason": None, "detail": None, "duplicate_of": None,
                         "mode": None, "declared_mode": row.get("mode"), "trace_signature": None, "calls": None})
    bar = _progress(len(rows), cfg.progress)
    futures = {}
    with WorkerPool(cfg.verify_config()) as pool:
        for v, row in zip(verdicts, rows):
            reason, ev = _kb_verdict(kb, row["code"])
            if reason:
                v.update(reason=reason, detail=json.dumps(ev))
                bar.update()
                continue
            try:
                src = _prepared(row["code"], cfg.max_batch)
            except ValueError as e:
                src = row["code"]
                v["detail"] = f"max_batch not applied: {e}"
            fut = pool.submit(src)
            fut.add_done_callback(lambda _f: bar.update())
            futures[v["index"]] = fut
        for i, fut in futures.items():
            res = fut.result()
            v = verdicts[i]
            v.update(mode=res.mode, trace_signature=res.signature, calls=res.calls)
            if not res.accepted:
                v.update(reason=res.reason, detail=str(res.evidence.get("message", ""))[:500])
    bar.close()
    # The committer's dedup, in row order, over the rows that passed everything else.
    semantic, near = SemanticDupIndex(), NearDupIndex.from_config(dedup_cfg)
    for v, row in zip(verdicts, rows):
        if v["reason"]:
            continue
        key = f"{v['index']}:{v['task_id']}"
        earlier = semantic.find(v["trace_signature"])
        if earlier is not None:
            v.update(reason=SEMANTIC, duplicate_of=earlier)
            continue
        exact_before = near.counts["exact_duplicate"]
        try:
            dup = near.add(key, row["code"], signature=_graph_signature(row))
        except (TaskParseError, ValueError):
            dup = None  # a source the near-dup view cannot read: its call graph was still compared
        if dup is not None:
            exact = near.counts["exact_duplicate"] > exact_before
            v.update(reason="duplicate_signature" if exact else "near_duplicate", duplicate_of=dup)
            continue
        semantic.add(key, v["trace_signature"])
        v["kept"] = True
    summary = _summary(cfg, verdicts, time.monotonic() - t0)
    out = out_dir(cfg)
    _write(out, verdicts, summary)
    summary["out"] = str(out)
    return summary


def _summary(cfg: AuditConfig, verdicts: list[dict], wall_s: float) -> dict[str, Any]:
    kept = [v for v in verdicts if v["kept"]]
    op_names = {op for v in kept for op in (v["ops"] if v["ops"] is not None else (v["calls"] or []))}
    modes = Counter(v["mode"] for v in kept)
    declared = [v for v in kept if v["declared_mode"]]
    by_source = Counter(v["data_source"] for v in kept if v["data_source"])
    return {
        "source": cfg.source,
        "rows": len(verdicts),
        "kept": len(kept),
        "kept_share": len(kept) / len(verdicts) if verdicts else None,
        "rejected": dict(Counter(v["reason"] for v in verdicts if not v["kept"]).most_common()),
        "distinct_op_names": len(op_names),
        "distinct_signatures": len({v["trace_signature"] for v in kept}),
        "modes": {m: modes.get(m, 0) for m in ("train", "eval")},
        "mode_disagreements": sum(1 for v in declared if v["declared_mode"] != v["mode"]),
        "mixture": {s: {"rows": n, "share": n / len(kept)} for s, n in sorted(by_source.items())},
        "wall_s": round(wall_s, 1),
        "settings": asdict(cfg),
    }


def _write(out: Path, verdicts: list[dict], summary: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("index", pa.int64()), ("task_id", pa.string()), ("data_source", pa.string()),
                        ("ops", pa.list_(pa.string())), ("kept", pa.bool_()), ("reason", pa.string()),
                        ("detail", pa.string()), ("duplicate_of", pa.string()), ("mode", pa.string()),
                        ("declared_mode", pa.string()), ("trace_signature", pa.string()),
                        ("calls", pa.list_(pa.string()))])
    pq.write_table(pa.Table.from_pylist(verdicts, schema=schema), out / VERDICTS)
    (out / SUMMARY).write_text(json.dumps(summary, indent=1, default=str) + "\n")


def format_table(summary: dict[str, Any]) -> str:
    """The audit's result as a plain-text table (what the command prints)."""
    n = summary["rows"] or 1
    lines = [f"audit of {summary['source']}", "", f"{'':<28}{'rows':>8}{'share':>9}"]

    def line(label: str, count: int) -> None:
        lines.append(f"{label:<28}{count:>8,}{count / n:>9.1%}")

    line("rows", summary["rows"])
    line("kept", summary["kept"])
    for reason, count in summary["rejected"].items():
        line(f"  rejected: {reason}", count)
    lines += ["", f"distinct op names (kept)    {summary['distinct_op_names']:>8,}",
              f"distinct signatures (kept)  {summary['distinct_signatures']:>8,}",
              f"mode of kept rows           train {summary['modes']['train']:,}, eval {summary['modes']['eval']:,}"]
    if summary.get("mode_disagreements"):
        lines.append(f"rows whose `mode` column disagrees with the audit: {summary['mode_disagreements']:,}")
    return "\n".join(lines)
