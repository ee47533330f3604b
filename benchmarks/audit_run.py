"""Generate a dataset and audit it (issue 25): what share of a run passes the audit's checks, and
whether every slot of the operator-count mixture is within a point of Ops-6K's.

    python benchmarks/audit_run.py --n-tasks 500                      # H200: generate on the GPU, audit there
    python benchmarks/audit_run.py --folder data/run --device cuda    # audit a folder already generated
    python benchmarks/audit_run.py --n-tasks 4 --device cpu \\
        --override verify.compile_backend=eager --audit-override compile_backend=eager   # CPU check

Generation is `opsynth.generate.driver.run` (cluster=local_cuda with --device cuda, local on CPU), with the
settings of conf/generate.yaml plus `--override key=value` (dotted GenerateConfig keys); the audit is
`opsynth.audit.audit` over the folder (the generator's checks through its code; `--audit-override`
sets AuditConfig keys). Prints a table (rows, kept, rejected per reason, mixture against Ops-6K's)
and writes JSON to --out (default benchmarks/results/audit_run.json): the run's summary, the
audit's summary and the mixture check (`mixture_ok`: every slot within --tolerance points).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _set(obj, dotted: str, raw: str) -> None:
    """`verify.compile_backend=eager` on a GenerateConfig (values read as JSON, else as text)."""
    *path, last = dotted.split(".")
    for p in path:
        obj = getattr(obj, p)
    if not hasattr(obj, last):
        raise SystemExit(f"error: unknown setting {dotted}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    setattr(obj, last, value)


def generate(folder: Path, n_tasks: int, device: str, overrides: list[str]) -> dict:
    from opsynth.generate import candidate, driver
    from opsynth.generate.config import GenerateConfig

    cfg = GenerateConfig(n_tasks=n_tasks, output_dir=str(folder), progress=True)
    cfg.verify.device = device
    cfg.cluster.kind = "local_cuda" if device == "cuda" else "local"
    for o in overrides:
        key, _, value = o.partition("=")
        _set(cfg, key, value)
    t0 = time.monotonic()
    summary = driver.run(cfg)
    candidate._close_context()
    return {"rows": summary["rows"], "rejected": summary.get("rejected"), "wall_s": round(time.monotonic() - t0, 1),
            "device": summary.get("device")}


def mixture_check(audit_summary: dict, tolerance_points: float) -> dict:
    """Each data_source's share of the kept rows against Ops-6K's (opsynth.graph.sampler.OPS6K_MIXTURE)."""
    from opsynth.graph.sampler import OPS6K_MIXTURE

    kept = audit_summary["kept"] or 1
    got = {s: v["rows"] for s, v in audit_summary["mixture"].items()}
    out = {}
    for k, share in OPS6K_MIXTURE.items():
        name = "transformers#1" if k == "transformers" else f"torch#{k}"
        achieved = got.get(name, 0) / kept
        out[name] = {"ops6k": share, "achieved": round(achieved, 4), "rows": got.get(name, 0),
                     "within": abs(achieved - share) * 100 <= tolerance_points}
    return out


def table(result: dict) -> str:
    from opsynth.audit import format_table

    lines = [format_table(result["audit"]), "", f"{'data_source':<16}{'rows':>7}{'achieved':>10}{'Ops-6K':>9}  within"]
    for name, m in result["mixture"].items():
        lines.append(f"{name:<16}{m['rows']:>7}{m['achieved']:>10.2%}{m['ops6k']:>9.2%}  {'yes' if m['within'] else 'NO'}")
    lines.append(f"\nkept {result['audit']['kept_share']:.1%} (target >= 99 %); mixture within "
                 f"{result['tolerance_points']} point(s): {'yes' if result['mixture_ok'] else 'no'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-tasks", type=int, default=500)
    ap.add_argument("--folder", help="audit this folder (generate into it first unless it holds n_tasks rows)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--override", action="append", default=[], help="GenerateConfig key=value (dotted)")
    ap.add_argument("--audit-override", action="append", default=[], help="AuditConfig key=value")
    ap.add_argument("--tolerance", type=float, default=1.0, help="mixture tolerance, percentage points")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "audit_run.json"))
    args = ap.parse_args(argv)

    from opsynth.audit import AuditConfig, audit
    from opsynth.config import build
    from opsynth.shards import count_rows

    folder = Path(args.folder or REPO / "data" / f"audit-run-{args.device}-{args.n_tasks}")
    have = count_rows(folder) if (folder / "data").is_dir() else 0
    run = generate(folder, args.n_tasks, args.device, args.override) if have < args.n_tasks else {"rows": have}
    values = {"source": str(folder), "device": args.device, "out": str(folder / "audit")}
    for o in args.audit_override:
        key, _, raw = o.partition("=")
        try:
            values[key] = json.loads(raw)
        except ValueError:
            values[key] = raw
    summary = audit(build(AuditConfig, values, "audit"))
    mixture = mixture_check(summary, args.tolerance)
    result = {"folder": str(folder), "generate": run, "audit": summary, "mixture": mixture,
              "tolerance_points": args.tolerance, "mixture_ok": all(m["within"] for m in mixture.values()),
              "kept_ok": (summary["kept_share"] or 0) >= 0.99}
    print(table(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
