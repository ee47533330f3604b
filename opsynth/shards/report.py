"""The run report: `report.json` and PNG plots of what a run made and what it rejected.

Plots use matplotlib's object API (`Figure`, rendered by the Agg canvas) instead of pyplot, so
writing a report never touches the global backend or figure state of the calling process.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from opsynth.shards.card import PLOTS_DIR, _source_key
from opsynth.shards.stats import RunStats
from opsynth.shards.writer import read_rows

REPORT_NAME = "report.json"
EXAMPLES_PER_REASON = 5
_MAX_EXAMPLE_CHARS = 500


def summarize(values: Iterable[float]) -> dict[str, Any]:
    """count, min, p10, median, p90, max and mean of the finite values (None fields when empty)."""
    a = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if a.size == 0:
        return {"count": 0, "min": None, "p10": None, "median": None, "p90": None, "max": None, "mean": None}
    p10, med, p90 = np.percentile(a, [10, 50, 90])
    return {"count": int(a.size), "min": float(a.min()), "p10": float(p10), "median": float(med),
            "p90": float(p90), "max": float(a.max()), "mean": float(a.mean())}


def mixture(rows: list[Mapping[str, Any]], target: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """data_source -> rows, achieved fraction, target fraction (normalised) and the difference."""
    counts = Counter(r["data_source"] for r in rows)
    n = len(rows)
    tsum = sum(target.values())
    out = {}
    for src in sorted(set(counts) | set(target), key=_source_key):
        achieved = counts.get(src, 0) / n if n else None
        tgt = target[src] / tsum if src in target and tsum else None
        out[src] = {"rows": counts.get(src, 0), "achieved": achieved, "target": tgt,
                    "delta": achieved - tgt if achieved is not None and tgt is not None else None}
    return out


def category_coverage(rows: list[Mapping[str, Any]], categories: Mapping[str, str]) -> tuple[dict[str, int], list[str]]:
    """Rows that use each catalog category at least once (every known category listed, even at 0),
    and the ops seen in rows that the category map does not know."""
    cover = Counter({c: 0 for c in categories.values()})
    unknown: set[str] = set()
    for r in rows:
        cats = set()
        for op in r["ops"]:
            if op in categories:
                cats.add(categories[op])
            else:
                unknown.add(op)
        cover.update(cats)
    return dict(sorted(cover.items(), key=lambda kv: (-kv[1], kv[0]))), sorted(unknown)


def diversity(rows: list[Mapping[str, Any]], signature_of: Callable[[Mapping[str, Any]], str] | None = None,
              block: int = 1000) -> dict[str, Any]:
    """Distinct operator sequences (the `ops` column) and graph signatures (when `signature_of`
    gives a row's), in all and per 1,000 rows, and how many *new* ones each successive block of
    `block` rows brought: a run whose later blocks bring as many new sequences as its first does
    not lose diversity with scale."""
    seqs: set[tuple[str, ...]] = set()
    sigs: set[str] = set()
    new_seq: list[int] = []
    new_sig: list[int] = []
    for i, r in enumerate(rows):
        if i % block == 0:
            new_seq.append(0)
            new_sig.append(0)
        key = tuple(r["ops"])
        if key not in seqs:
            seqs.add(key)
            new_seq[-1] += 1
        if signature_of is not None:
            sig = signature_of(r)
            if sig not in sigs:
                sigs.add(sig)
                new_sig[-1] += 1
    n = len(rows)

    def per_k(c: int) -> float | None:
        return round(1000 * c / n, 1) if n else None

    return {
        "distinct_op_sequences": len(seqs),
        "distinct_op_sequences_per_1000_rows": per_k(len(seqs)),
        "distinct_graph_signatures": len(sigs) if signature_of is not None else None,
        "distinct_graph_signatures_per_1000_rows": per_k(len(sigs)) if signature_of is not None else None,
        "block_rows": block,
        "new_op_sequences_per_block": new_seq,
        "new_graph_signatures_per_block": new_sig if signature_of is not None else None,
    }


def by_kind(rows: list[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rows, eager and compile runtimes per precision and pass (`float32/forward`, `bfloat16/backward`, ...)."""
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(f"{r.get('dtype', 'float32')}/{r.get('task_pass', 'forward')}", []).append(r)
    return {k: {"rows": len(g), "eager_ms": summarize(r["eager_ms"] for r in g),
                "compile_ms": summarize(r["compile_ms"] for r in g)} for k, g in sorted(groups.items())}


def kind_mixture(rows: list[Mapping[str, Any]], quota: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """For each quota axis but the slot's (`dtype`, `task_pass`, when the run had more than one
    value): value -> rows in the folder and the quota it was filled to; {} without such axes."""
    out = {}
    for axis, q in (quota.get("axes") or {}).items():
        counts = Counter(r.get(axis) for r in rows)
        out[axis] = {v: {"rows": counts.get(v, 0), "quota": n, "given_up": v in (q.get("given_up") or [])}
                     for v, n in (q.get("quotas") or {}).items()}
    return out


def _clip(v: Any) -> Any:
    if isinstance(v, str) and len(v) > _MAX_EXAMPLE_CHARS:
        return v[:_MAX_EXAMPLE_CHARS] + "…"
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return _clip(str(v))


def rejection_summary(stats: RunStats, rejections: Iterable[Mapping[str, Any]] | None) -> dict[str, Any]:
    """Counts by reason (from stats, or from the records when stats has none) and a few examples each."""
    records = list(rejections or [])
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping) or not rec.get("reason"):
            raise ValueError(f"rejection record {i} must be a mapping with a non-empty 'reason': {rec!r}")
    counts = Counter(stats.rejected) if stats.rejected else Counter(r["reason"] for r in records)
    examples: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        bucket = examples.setdefault(rec["reason"], [])
        if len(bucket) < EXAMPLES_PER_REASON:
            bucket.append({k: _clip(v) for k, v in rec.items()})
    total = sum(counts.values())
    return {
        "total": total,
        "counts": dict(counts.most_common()),
        "share": {r: c / total for r, c in counts.most_common()} if total else {},
        "examples": examples,
    }


# -- plots ---------------------------------------------------------------------------------------


def _figure(width: float = 7.0, height: float = 4.0):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _log_bins(values: np.ndarray, n: int = 40) -> np.ndarray:
    lo, hi = float(values.min()), float(values.max())
    if hi <= lo:
        lo, hi = lo / 1.5, hi * 1.5
    return np.geomspace(lo, hi, n + 1)


def _vline(ax, x: Any, label: str | None) -> None:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        ax.axvline(float(x), color="black", linestyle="--", linewidth=1, label=label)


def _count_axis(axis) -> None:
    """Whole numbers only on an axis that counts tasks (no half-task ticks)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


# Tick values tried on a log axis, finest last: a narrow range (speedups of 0.8-1.5) would
# otherwise get matplotlib's default of one or two labelled decades.
_LOG_STEPS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0), (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0))


def _log_axis(axis, lo: float, hi: float, min_ticks: int = 4) -> None:
    """Labelled ticks at round values (1, 2, 5, ... or finer) covering [lo, hi] on a log axis."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    lo, hi = float(lo), float(hi)
    ticks: list[float] = []
    for steps in _LOG_STEPS:
        decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
        ticks = [s * 10.0 ** d for d in decades for s in steps if lo <= s * 10.0 ** d <= hi]
        if len(ticks) >= min_ticks:
            break
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _plot_mixture(mix: dict[str, dict[str, Any]], path: Path) -> None:
    fig, ax = _figure()
    if not mix:
        _empty(ax, "rows")
    else:
        names = list(mix)
        x = np.arange(len(names))
        ax.bar(x - 0.2, [100 * (m["achieved"] or 0) for m in mix.values()], 0.4, label="achieved")
        ax.bar(x + 0.2, [100 * (m["target"] or 0) for m in mix.values()], 0.4, label="target")
        ax.set_xticks(x, names)
        ax.set_ylabel("% of rows")
        ax.legend()
    ax.set_title("Operator-count mixture: achieved vs target")
    fig.savefig(path)
    return fig


def _plot_barh(counts: Mapping[str, int], title: str, xlabel: str, what: str, path: Path) -> None:
    items = list(counts.items())
    fig, ax = _figure(7.0, max(3.0, 0.3 * len(items) + 1.2))
    if not items:
        _empty(ax, what)
    else:
        names = [k for k, _ in items][::-1]
        ax.barh(names, [v for _, v in items][::-1])
        _count_axis(ax.xaxis)
        ax.set_xlabel(xlabel)
    ax.set_title(title)
    fig.savefig(path)
    return fig


def compile_label(th: Mapping[str, Any]) -> str:
    """`torch.compile (aot_eager)`: the backend that timed the compiled column, as the run set it."""
    backend = th.get("compile_backend")
    return f"torch.compile ({backend})" if backend else "torch.compile"


def _plot_runtimes(eager: np.ndarray, compiled: np.ndarray, th: Mapping[str, Any], path: Path):
    """Histogram of eager and compiled runtimes with the eager band that was in force (the CPU band
    on a CPU run: `th` holds the band of the device that verified)."""
    fig, ax = _figure()
    both = np.concatenate([eager, compiled])
    both = both[both > 0]
    if both.size == 0:
        _empty(ax, "runtimes")
    else:
        bins = _log_bins(both)
        ax.hist(eager[eager > 0], bins=bins, alpha=0.6, label="eager")
        ax.hist(compiled[compiled > 0], bins=bins, alpha=0.6, label=compile_label(th))
        ax.set_xscale("log")
        device = th.get("verify_device")
        _vline(ax, th.get("eager_ms_min"), f"eager band ({device})" if device else "eager band")
        _vline(ax, th.get("eager_ms_max"), None)
        _log_axis(ax.xaxis, *ax.get_xlim())
        _count_axis(ax.yaxis)
        ax.set_xlabel("median runtime (ms)")
        ax.set_ylabel("tasks")
        ax.legend()
    ax.set_title("Runtimes")
    fig.savefig(path)
    return fig


def _plot_speedup(speedup: np.ndarray, path: Path, th: Mapping[str, Any] | None = None):
    fig, ax = _figure()
    s = speedup[speedup > 0]
    if s.size == 0:
        _empty(ax, "runtimes")
    else:
        ax.hist(s, bins=_log_bins(s))
        ax.set_xscale("log")
        _vline(ax, 1.0, "no speedup")
        lo, hi = ax.get_xlim()
        _log_axis(ax.xaxis, min(lo, 0.95), max(hi, 1.05))
        ax.set_xlim(min(lo, 0.95), max(hi, 1.05))
        _count_axis(ax.yaxis)
        ax.set_xlabel("eager_ms / compile_ms")
        ax.set_ylabel("tasks")
        ax.legend()
    ax.set_title(f"{compile_label(th or {})} speedup over eager")
    fig.savefig(path)
    return fig


def _plot_similarity(sim: np.ndarray, th: Mapping[str, Any], path: Path) -> None:
    fig, ax = _figure()
    if sim.size == 0:
        _empty(ax, "KernelBench similarities")
    else:
        ax.hist(sim, bins=np.linspace(0.0, 1.0, 41))
        _count_axis(ax.yaxis)
        _vline(ax, th.get("kb_similarity_max"), "rejection threshold")
        ax.set_xlabel("max AST similarity to a KernelBench problem")
        ax.set_ylabel("tasks")
        ax.set_xlim(0, 1)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    ax.set_title("KernelBench similarity of accepted tasks")
    fig.savefig(path)
    return fig


def _column(rows: list[Mapping[str, Any]], name: str) -> np.ndarray:
    return np.asarray([r[name] for r in rows if r.get(name) is not None], dtype=float)


def write_report(
    output_dir: str | os.PathLike,
    stats: RunStats,
    rows: list[Mapping[str, Any]] | None = None,
    rejections: Iterable[Mapping[str, Any]] | None = None,
    signature_of: Callable[[Mapping[str, Any]], str] | None = None,
) -> dict[str, Any]:
    """Write `<output_dir>/report.json` and `<output_dir>/plots/*.png`; return the report.

    rows: the accepted rows to describe (default: every row in the folder's shards).
    rejections: optional records of rejected candidates, each a mapping with at least "reason"
        (e.g. also "seed", "stage", "detail"); a few per reason are kept as examples. The counts
        come from `stats.rejected` when it has any, else from these records.
    signature_of: a row's graph signature, for the diversity section (the pipeline passes
        `OpGraph.signature` of the row's `graph`; shards do not import the graph package).
    """
    output_dir = Path(output_dir)
    rows = read_rows(output_dir) if rows is None else list(rows)
    th = stats.thresholds
    plots_dir = output_dir / PLOTS_DIR
    plots_dir.mkdir(parents=True, exist_ok=True)

    eager, compiled = _column(rows, "eager_ms"), _column(rows, "compile_ms")
    pairs = [(r["eager_ms"], r["compile_ms"]) for r in rows if r.get("eager_ms") and r.get("compile_ms")]
    speedup = np.asarray([e / c for e, c in pairs if c > 0], dtype=float)
    sim = _column(rows, "kb_max_similarity")
    mix = mixture(rows, stats.target_mixture)
    for src, q in ((stats.mixture_quota or {}).get("quotas") or {}).items():  # the quotas it was filled to
        if src in mix:
            mix[src]["quota"] = q
    kind_mix = kind_mixture(rows, stats.mixture_quota or {})
    cover, unknown_ops = category_coverage(rows, stats.categories)
    rej = rejection_summary(stats, rejections)

    plots = {
        "mixture": "mixture.png",
        "categories": "categories.png",
        "runtimes": "runtimes.png",
        "speedup": "speedup.png",
        "kb_similarity": "kb_similarity.png",
        "rejections": "rejections.png",
    }
    _plot_mixture(mix, plots_dir / plots["mixture"])
    _plot_barh(cover, "Category coverage (rows using each category)", "rows", "categories", plots_dir / plots["categories"])
    _plot_runtimes(eager, compiled, th, plots_dir / plots["runtimes"])
    _plot_speedup(speedup, plots_dir / plots["speedup"], th)
    _plot_similarity(sim, th, plots_dir / plots["kb_similarity"])
    _plot_barh(rej["counts"], "Rejections by reason", "candidates", "rejections", plots_dir / plots["rejections"])

    report = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run": stats.to_dict(),
        "rows": {
            "num_rows": len(rows),
            "mixture": mix,
            "num_ops": {str(k): v for k, v in sorted(Counter(r["num_ops"] for r in rows).items())},
            "category_coverage": cover,
            "uncategorised_ops": unknown_ops,
            "ops": dict(Counter(op for r in rows for op in r["ops"]).most_common()),
            "devices": dict(Counter(r["device"] for r in rows).most_common()),
            "eager_ms": summarize(eager),
            "compile_ms": summarize(compiled),
            "compile_speedup": summarize(speedup),
            "kb_max_similarity": summarize(sim),
            "diversity": diversity(rows, signature_of),
            "by_kind": by_kind(rows),
            **({"kind_mixture": kind_mix} if kind_mix else {}),
        },
        "rejections": rej,
        "plots": {k: f"{PLOTS_DIR}/{v}" for k, v in plots.items()},
    }
    tmp = output_dir / f".{REPORT_NAME}.tmp"
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, output_dir / REPORT_NAME)
    return report
