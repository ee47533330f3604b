"""Precisions and passes on the GPU: one generate run of mixed kinds, reported by dtype and pass.

    python benchmarks/generate_dtypes.py                           # H200: >= 200 rows, {fp32, bf16, fp16} x {forward, backward}
    python benchmarks/generate_dtypes.py --device cpu --n-tasks 6 --minutes 3   # CPU check of the script

One `opsynth.generate.driver.run` (cluster=local_cuda verify=cuda on a GPU; cluster=local verify=cpu
sampler=small on the CPU) with `sampler.dtypes` {fp32: 0.4, bf16: 0.4, fp16: 0.2} and
`sampler.passes` {forward: 0.75, backward: 0.25}, until `--n-tasks` rows or `--minutes` of wall time
(it stops at the next result then). Before the run, the catalog's precision tables are probed on the
device once (`opsynth.catalog.precision`; cached on disk), so the workers start from them. Reported
per kind (dtype/pass): candidates (each candidate's kind is drawn from its seed), verifier
verdicts by reason, acceptance, rows written (after dedup), eager and compile runtimes of the
accepted tasks (median, p10, p90) and measured over predicted eager time (the cost model's check);
plus the operators the catalog excludes per kind on this device. JSON goes to --out after every
result batch (partial: true until the run ends), then the final table is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

T0 = time.time()
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DTYPES = {"fp32": 0.4, "bf16": 0.4, "fp16": 0.2}
PASSES = {"forward": 0.75, "backward": 0.25}


def compose(overrides: list[str]):
    """The GenerateConfig `python -m pipelines.generate <overrides>` would run (its own config loading)."""
    from opsynth import cli
    from opsynth.generate.config import GenerateConfig, generate_config

    return generate_config(cli.compose("generate", overrides, {"": GenerateConfig}))


def _q(values: list[float]) -> dict:
    v = sorted(x for x in values if x is not None and x == x)
    if not v:
        return {"n": 0}
    pick = lambda f: v[min(len(v) - 1, int(f * (len(v) - 1) + 0.5))]  # noqa: E731
    return {"n": len(v), "median": round(statistics.median(v), 4), "p10": round(pick(0.1), 4), "p90": round(pick(0.9), 4)}


class Tally:
    """What the verifier said per kind, as results arrive (thread-safe: on_result runs in the driver)."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.lock = threading.Lock()
        self.by_kind: dict = defaultdict(lambda: {"candidates": 0, "reasons": Counter(), "eager_ms": [], "compile_ms": [],
                                                  "eager_over_predicted": []})

    def add(self, rec: dict) -> None:
        kind = "/".join(self.sampler.draw_kind(int(rec["seed"])))
        with self.lock:
            k = self.by_kind[kind]
            k["candidates"] += 1
            k["reasons"]["accepted" if rec.get("accepted") else str(rec.get("reason"))] += 1
            row = rec.get("row")
            if rec.get("accepted") and row:
                k["eager_ms"].append(row["eager_ms"])
                k["compile_ms"].append(row["compile_ms"])
                if rec.get("predicted_ms"):
                    k["eager_over_predicted"].append(row["eager_ms"] / rec["predicted_ms"])

    def table(self, rows_by_kind: dict | None = None) -> dict:
        with self.lock:
            out = {}
            for kind, k in sorted(self.by_kind.items()):
                acc = k["reasons"].get("accepted", 0)
                out[kind] = {"candidates": k["candidates"], "verifier_accepted": acc,
                             "acceptance": round(acc / k["candidates"], 4) if k["candidates"] else None,
                             "rows": (rows_by_kind or {}).get(kind), "reasons": dict(k["reasons"].most_common()),
                             "eager_ms": _q(k["eager_ms"]), "compile_ms": _q(k["compile_ms"]),
                             "eager_over_predicted": _q(k["eager_over_predicted"])}
            return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--n-tasks", type=int, default=240)
    ap.add_argument("--minutes", type=float, default=7.5, help="wall-time budget from process start (stops at the next result)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/generate_dtypes_<device>.json)")
    ap.add_argument("--output-dir", default=None, help="dataset folder (default: a fresh temporary one)")
    ap.add_argument("--override", action="append", default=[], help="extra Hydra override, e.g. verify.compile_backend=aot_eager")
    a = ap.parse_args(argv)
    out_path = Path(a.out or REPO / "benchmarks" / "results" / f"generate_dtypes_{a.device}.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    folder = a.output_dir or tempfile.mkdtemp(prefix="opsynth-dtypes-")
    base = ["cluster=local_cuda", "verify=cuda"] if a.device == "cuda" else ["cluster=local", "verify=cpu", "sampler=small"]
    kinds = [f"++sampler.dtypes={json.dumps(DTYPES)}".replace('"', ""), f"++sampler.passes={json.dumps(PASSES)}".replace('"', "")]
    overrides = [*base, f"n_tasks={a.n_tasks}", f"output_dir={folder}", "progress=false", f"max_candidates={20 * a.n_tasks}",
                 *kinds, *a.override]
    cfg = compose(overrides)

    from opsynth.catalog import load_catalog
    from opsynth.catalog.precision import exclusions
    from opsynth.generate.driver import run
    from opsynth.graph import Sampler

    t = time.time()
    catalog = load_catalog()
    excluded = {f"{d}/{p}": exclusions(catalog, d, p, a.device) for d in DTYPES for p in PASSES}
    probe_s = round(time.time() - t, 1)
    sampler_cfg = cfg.sampler
    if sampler_cfg.scale is None:
        sampler_cfg.scale = 1.0 if a.device == "cuda" else 0.1
    tally = Tally(Sampler(sampler_cfg, catalog, device=a.device))
    stop = threading.Event()
    state = {"t_save": 0.0}

    def save(final: bool, summary: dict | None = None, rows_by_kind: dict | None = None) -> None:
        d = {"benchmark": "generate_dtypes", "partial": not final, "device": a.device, "overrides": overrides,
             "elapsed_s": round(time.time() - T0, 1), "catalog_probe_s": probe_s,
             "excluded_ops": {k: len(v) for k, v in excluded.items()}, "excluded": excluded,
             "by_kind": tally.table(rows_by_kind), "summary": summary}
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(d, indent=1, default=str))
        tmp.replace(out_path)

    def on_result(rec: dict) -> None:
        tally.add(rec)
        if time.time() - state["t_save"] > 15:
            state["t_save"] = time.time()
            save(False)
        if time.time() - T0 > a.minutes * 60:
            stop.set()

    timer = threading.Timer(max(1.0, a.minutes * 60 - (time.time() - T0)), stop.set)
    timer.daemon = True
    timer.start()
    summary = run(cfg, on_result=on_result, stop=stop)
    timer.cancel()
    from opsynth.shards import read_rows

    rows = read_rows(folder, columns=["dtype", "task_pass"]) if (Path(folder) / "data").is_dir() else []
    rows_by_kind = dict(Counter(f"{r['dtype']}/{r['task_pass']}" for r in rows))
    save(True, {k: summary.get(k) for k in ("accepted", "candidates", "rows", "rejected", "device", "wall_time_s")},
         rows_by_kind)
    table = tally.table(rows_by_kind)
    print(f"{'kind':22} {'cand':>5} {'acc':>5} {'rows':>5} {'accept':>7} {'eager ms':>9} {'compile ms':>10} {'eager/pred':>10}")
    for kind, k in table.items():
        print(f"{kind:22} {k['candidates']:5d} {k['verifier_accepted']:5d} {k['rows'] or 0:5d} "
              f"{(k['acceptance'] or 0):7.2%} {k['eager_ms'].get('median', float('nan')):9.3f} "
              f"{k['compile_ms'].get('median', float('nan')):10.3f} {k['eager_over_predicted'].get('median', float('nan')):10.2f}")
    print(f"rows {len(rows)} in {time.time() - T0:.0f} s; JSON: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
