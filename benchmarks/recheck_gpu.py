"""Re-measure a random sample of a dataset folder's rows, independently of the verifier.

    python benchmarks/recheck_gpu.py data/h200                       # GPU: 60 rows, JSON to results/recheck_h200.json
    python benchmarks/recheck_gpu.py /tmp/ds --device cpu --sample 20 --out /tmp/recheck_cpu.json

Each sampled row's task is loaded (the task contract's loader, ``opsynth.render``) in a *fresh*
child process that does not use the verifier's code (no worker pool, no timing helpers): the model
and its inputs are made on the device (``with torch.device(...)``), the model is put in the row's
train/eval mode (the ``mode`` column, through ``set_mode``), the eager forward is timed after warm-ups, with CUDA events on a GPU (thread CPU time, one thread, on a CPU), and the median of at
least ``--repeats`` runs is compared with the band the dataset promises. A row passes when it is

* in band: the re-measured median eager time is inside [min_ms, max_ms] (1 to 100 ms on a GPU;
  the CPU band on a CPU; both read from the folder's state file when it has them);
* finite: no NaN or Inf in the outputs of two random inputs;
* deterministic within tolerance: two forwards on the same inputs agree within the verifier's
  determinism tolerance (``det_atol``/``det_rtol``; whether they are also bitwise equal is reported
  per row, since cuDNN and atomics need not be);
* input-sensitive: outputs for two different random inputs are not allclose at ``atol``/``rtol``.

The child handles one row at a time; a row that hangs past ``--timeout-s`` or kills the child is a
failed row and the next one gets a new child. Results are written after every row (a cut-off run
keeps what it measured). Prints a table; the JSON has ``device``, ``rows_checked``, ``pass_share``
and per-row details.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STATE_FILE = ".opsynth-state.json"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "recheck_h200.json"


# ------------------------------------------------------------------------------------------------
# Child: one row per request line on stdin, one JSON result line on stdout.
# ------------------------------------------------------------------------------------------------

def _flat(out) -> list:
    import torch

    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return [t.detach() for t in leaves if isinstance(t, torch.Tensor)]


def _allclose(a: list, b: list, atol: float, rtol: float) -> bool:
    import torch

    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return False
        if x.dtype != y.dtype or not x.is_floating_point():
            x, y = x.double(), y.double()
        if not torch.allclose(x, y, atol=atol, rtol=rtol, equal_nan=True):
            return False
    return True


def _max_diff(a: list, b: list) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return float("inf")
        worst = max(worst, float((x.double() - y.double()).abs().max().item()) if x.numel() else 0.0)
    return worst


def check_row(code: str, device: str, warmup: int, repeats: int, tol: dict, mode: str | None = None) -> dict:
    """Measure one task as the dataset's user would, in the row's train/eval mode (``mode`` column:
    BatchNorm in train mode computes batch statistics and can take 10x its eval time); see the module
    docstring for what passes."""
    import torch

    from opsynth.render.task_file import load_task_module, missing_names, set_mode

    mod = load_task_module(code, "recheck_task")
    if missing_names(mod):
        raise ValueError(f"the task lacks {', '.join(missing_names(mod))}")
    torch.manual_seed(0)
    with torch.device(device):
        model = mod.Model(*mod.get_init_inputs())
    model = set_mode(model.to(device), mode)

    def inputs(seed: int) -> list:
        torch.manual_seed(seed)
        with torch.device(device):
            xs = list(mod.get_inputs())
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]

    def run(xs: list):
        with torch.no_grad():
            out = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in xs])
        if device == "cuda":
            torch.cuda.synchronize()
        return _flat(out)

    x1, x2 = inputs(1), inputs(2)
    a, a_again, b = run(x1), run(x1), run(x2)
    finite = all(bool(torch.isfinite(t).all()) for t in a + b if t.is_floating_point() or t.is_complex())
    bitwise = len(a) == len(a_again) and all(torch.equal(x, y) for x, y in zip(a, a_again))
    deterministic = _allclose(a, a_again, tol["det_atol"], tol["det_rtol"])
    sensitive = not _allclose(a, b, tol["atol"], tol["rtol"])
    det_diff = _max_diff(a, a_again)
    del a, a_again, b, x2

    def fwd() -> None:
        with torch.no_grad():
            model(*x1)

    for _ in range(max(1, warmup)):
        fwd()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(repeats):
            start.record()
            fwd()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t = time.thread_time()
            fwd()
            times.append((time.thread_time() - t) * 1e3)
    return {"eager_ms": statistics.median(times), "eager_min_ms": min(times), "finite": finite,
            "bitwise": bitwise, "deterministic": deterministic, "det_max_abs_diff": det_diff,
            "input_sensitive": sensitive}


def child_main(device: str) -> int:
    import torch

    if device == "cpu":
        torch.set_num_threads(1)
    else:
        torch.zeros(1, device="cuda")
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(json.dumps({"ready": True, "device": name, "torch_version": torch.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            res = check_row(req["code"], device, req["warmup"], req["repeats"], req["tol"], req.get("mode"))
        except BaseException as e:  # noqa: BLE001 - a task that fails is a failed row, not a failed run
            res = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        if device == "cuda":
            torch.cuda.empty_cache()
        sys.modules.pop("recheck_task", None)
        print(json.dumps(res), flush=True)
    return 0


# ------------------------------------------------------------------------------------------------
# Parent: sample rows, feed the child, judge, write JSON.
# ------------------------------------------------------------------------------------------------

class Child:
    def __init__(self, device: str, startup_s: float):
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if device == "cpu":
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", "--device", device],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env, start_new_session=True)
        self.info = self._read(startup_s)
        if not self.info or not self.info.get("ready"):
            self.kill()
            raise RuntimeError("the measuring child did not start")

    def _read(self, timeout: float) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def ask(self, req: dict, timeout: float) -> dict:
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"error": "the measuring child died"}
        res = self._read(timeout)
        if res is None:
            gone = self.proc.poll() is not None
            return {"error": "the measuring child died" if gone else f"no result within {timeout:.0f} s"}
        return res

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait()


def read_rows(folder: Path) -> list[dict]:
    """The folder's rows (the shard reader picks each shard's current file, finalized or not)."""
    sys.path.insert(0, str(REPO))
    from opsynth.shards import read_rows as read

    rows = read(folder, columns=["task_id", "seed", "ops", "code", "eager_ms", "device", "mode"])
    if not rows:
        raise SystemExit(f"error: no rows under {folder / 'data'}")
    return rows


def promised(folder: Path, device: str, args) -> tuple[tuple[float, float], dict]:
    """The band and tolerances the folder's run promised (state file), else the defaults."""
    ver = {}
    try:
        ver = json.loads((folder / STATE_FILE).read_text()).get("stats", {}).get("config", {}).get("verify", {})
    except (OSError, ValueError):
        pass
    p, lo, hi = ("", 1.0, 100.0) if device == "cuda" else ("cpu_", 0.05, 100.0)
    band = (float(ver.get(p + "min_ms", lo)), float(ver.get(p + "max_ms", hi)))
    if args.band:
        band = tuple(float(v) for v in args.band.split(","))
    tol = {k: float(getattr(args, k) if getattr(args, k) is not None else ver.get(k, d))
           for k, d in (("atol", 1e-2), ("rtol", 1e-2), ("det_atol", 1e-6), ("det_rtol", 1e-5))}
    return band, tol


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", nargs="?", help="a generate output_dir")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when visible")
    ap.add_argument("--sample", type=int, default=60, help="rows to check (default 60)")
    ap.add_argument("--seed", type=int, default=0, help="which rows: random.Random(seed).sample")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per row (median; >= 10 by default)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per row")
    ap.add_argument("--band", default=None, help="LO,HI in ms (default: from the folder's state file)")
    for k in ("atol", "rtol", "det_atol", "det_rtol"):
        ap.add_argument(f"--{k.replace('_', '-')}", dest=k, type=float, default=None)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        return child_main(args.device)
    if not args.folder:
        ap.error("folder is required")
    folder = Path(args.folder)
    rows = read_rows(folder)
    picked = random.Random(args.seed).sample(range(len(rows)), min(args.sample, len(rows)))
    band, tol = promised(folder, args.device, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    child = Child(args.device, startup_s=300)
    report = {"device": child.info["device"], "device_kind": args.device, "torch_version": child.info["torch_version"],
              "dataset": str(folder), "rows_in_dataset": len(rows), "rows_sampled": len(picked), "rows_checked": 0,
              "pass_share": None, "band_ms": list(band), "tolerances": tol, "warmup": args.warmup,
              "repeats": args.repeats, "failures": {}, "rows": []}
    print(f"{report['device']}: checking {len(picked)} of {len(rows)} rows of {folder}, band {band[0]:g}-{band[1]:g} ms")
    print(f"{'#':>3}  {'row ms':>8}  {'now ms':>8}  {'ratio':>5}  band fin det bit sens  ops")
    try:
        for n, i in enumerate(picked, 1):
            row = rows[i]
            res = child.ask({"code": row["code"], "mode": row.get("mode"), "warmup": args.warmup,
                             "repeats": args.repeats, "tol": tol},
                            args.timeout_s)
            if "error" in res and ("child" in res["error"] or "no result" in res["error"]):
                child.kill()
                child = Child(args.device, startup_s=300)
            rec = {"task_id": row["task_id"], "seed": row["seed"], "ops": row["ops"], "mode": row.get("mode"),
                   "row_eager_ms": row["eager_ms"],
                   "row_device": row["device"], **res}
            if "error" not in res:
                rec["in_band"] = band[0] <= res["eager_ms"] <= band[1]
                rec["ratio"] = res["eager_ms"] / row["eager_ms"] if row["eager_ms"] else None
                rec["pass"] = bool(rec["in_band"] and res["finite"] and res["deterministic"] and res["input_sensitive"])
            else:
                rec["pass"] = False
            why = ("error" if "error" in res else
                   [k for k in ("in_band", "finite", "deterministic", "input_sensitive") if not rec[k]])
            for k in ([why] if isinstance(why, str) else why):
                report["failures"][k] = report["failures"].get(k, 0) + 1
            report["rows"].append(rec)
            report["rows_checked"] = len(report["rows"])
            report["pass_share"] = sum(r["pass"] for r in report["rows"]) / report["rows_checked"]
            report["wall_s"] = time.time() - t0
            out.write_text(json.dumps(report, indent=1))
            if "error" in res:
                print(f"{n:>3}  {row['eager_ms']:>8.3f}  {'-':>8}  {'-':>5}  {res['error'][:60]}  {'+'.join(row['ops'])}")
            else:
                flags = " ".join("ok " if rec[k] else "NO " for k in ("in_band", "finite", "deterministic"))
                print(f"{n:>3}  {row['eager_ms']:>8.3f}  {res['eager_ms']:>8.3f}  {rec['ratio']:>5.2f}  {flags} "
                      f"{'y  ' if res['bitwise'] else 'n  '} {'ok ' if rec['input_sensitive'] else 'NO '}  "
                      f"{'+'.join(row['ops'])}", flush=True)
    finally:
        child.kill()
    ratios = [r["ratio"] for r in report["rows"] if r.get("ratio")]
    report["ratio_median"] = statistics.median(ratios) if ratios else None
    # The spread of the quiet / row ratio: deciles over the rows re-measured (None below 2 rows).
    deciles = statistics.quantiles(ratios, n=10) if len(ratios) >= 2 else None
    report["ratio_p10"], report["ratio_p90"] = (deciles[0], deciles[-1]) if deciles else (None, None)
    report["bitwise_share"] = (sum(1 for r in report["rows"] if r.get("bitwise")) / report["rows_checked"]
                               if report["rows_checked"] else None)
    out.write_text(json.dumps(report, indent=1))
    r3 = {k: None if report[k] is None else round(report[k], 3) for k in ("ratio_median", "ratio_p10", "ratio_p90")}
    print(f"\n{report['rows_checked']} rows checked on {report['device']}: pass_share {report['pass_share']:.3f}, "
          f"failures {report['failures'] or 'none'}, re-measured/row eager median "
          f"{r3['ratio_median']} (p10 {r3['ratio_p10']}, p90 {r3['ratio_p90']}), "
          f"bitwise repeatable {report['bitwise_share']:.2f}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
