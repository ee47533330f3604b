"""Where a candidate's device-exclusive time goes: its timed rounds, by pass, and the reference's.

On the H200 the reward's throughput is capped by the timed sections, which hold the device to
themselves one at a time (issue 28: `locked_s` about 0.9 s a candidate, about 100 rounds at about
4 ms of protocol each for a 0.2 ms kernel). This benchmark evaluates a few correct CPU candidates
(the test suite's shared extension, tests/reward/candidates/cpu/) and reports, per candidate, the
rounds of each pass (warm-up, main, added near a threshold, re-measure), `locked_s` (the device to
itself), `rounds_s`, the baseline blocks in it, and per round the parent's ms beyond the claimed
time (`round_overhead_ms`) and from one seed request to the next (`round_period_ms`: what a round
costs the device, gaps included); and the same for the task's reference child.

The candidates: `fast` (a fused loop, clearly below eager), `slow_chain` (the fused loop eight times:
clearly above), `near_eager` (four times: about eager, where the pacer extends the main pass) on the
chain task, and `slow_linear` (a naive matmul) on the matmul task. The plan's counts default to the
cuda ones (10 warm-up, 30 repeats, blocks of 10), so the round counts read as on the H200.

    python benchmarks/reward_rounds.py --out benchmarks/results/reward_rounds_cpu.json
    python benchmarks/reward_rounds.py --batches 1 --out /tmp/rounds.json      # a quick look

Imports only torch and opsynth.reward (no dask / hydra / datasets).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opsynth.reward import RewardConfig, evaluate_many  # noqa: E402

CANDS = REPO / "tests" / "reward" / "candidates"
PRELUDE = (CANDS / "cpu" / "ext_prelude.py").read_text()
TASKS = {"chain": (CANDS / "tasks" / "chain.py").read_text(), "matmul_bias": (CANDS / "tasks" / "matmul_bias.py").read_text()}

NEAR_EAGER = '''
class ModelNew(nn.Module):
    """The fused loop run four times over (slow_chain runs it eight, about twice eager): about eager."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        y = ext.chain(x, self.scale, self.shift)
        for _ in range(3):
            y = ext.chain(x, self.scale, self.shift)
        return y
'''

CANDIDATES = {  # name -> (task, ModelNew source after the shared prelude)
    "fast": ("chain", (CANDS / "cpu" / "fast.py").read_text()),
    "near_eager": ("chain", NEAR_EAGER),
    "slow_chain": ("chain", (CANDS / "cpu" / "slow_chain.py").read_text()),
    "slow_linear": ("matmul_bias", (CANDS / "cpu" / "slow_linear.py").read_text()),
}

COLUMNS = ("reward", "ratio", "warmup", "main", "extended", "remeasure", "rounds", "locked_s", "rounds_s", "baseline_blocks_s",
           "quiet_window_s", "round_overhead_ms", "call_overhead_ms", "round_period_ms")
REF_COLUMNS = ("rounds", "rounds_s", "untimed_rounds_s", "round_overhead_ms", "round_period_ms")


def row(res) -> dict:
    """One evaluation's figures for the table."""
    t, r = res.times, res.details.get("rounds") or {}
    return {"reward": res.reward, "reason": res.reason, "ratio": t.get("eager_ratio"),
            "warmup": r.get("warmup"), "main": r.get("main"), "extended": r.get("extended"), "remeasure": r.get("remeasure"),
            "rounds": r.get("total"), "locked_s": t.get("locked_s"), "rounds_s": t.get("rounds_s"),
            "baseline_blocks_s": t.get("baseline_blocks_s"), "quiet_window_s": t.get("quiet_window_s"), "round_overhead_ms": t.get("round_overhead_ms"),
            "call_overhead_ms": t.get("call_overhead_ms"), "round_period_ms": t.get("round_period_ms"),
            "timed_calls": (res.details.get("decision") or {}).get("timed_calls"),
            "undecided": (res.details.get("decision") or {}).get("undecided"),
            "reference": {"rounds": r.get("reference"), "rounds_s": t.get("reference_rounds_s"),
                          "untimed_rounds_s": t.get("reference_untimed_rounds_s"),
                          "round_overhead_ms": t.get("reference_round_overhead_ms"),
                          "round_period_ms": t.get("reference_round_period_ms")}}


def median_of(rows: list[dict], key: str):
    vals = [x[key] for x in rows if isinstance(x.get(key), (int, float)) and not isinstance(x.get(key), bool)]
    return round(statistics.median(vals), 4) if vals else None


def summarize(rows_by_name: dict[str, list[dict]]) -> dict:
    out = {}
    for name, rows in rows_by_name.items():
        s = {k: median_of(rows, k) for k in COLUMNS}
        s["rewards"] = [x["reward"] for x in rows]
        s["reference"] = {k: median_of([x["reference"] for x in rows], k) for k in REF_COLUMNS}
        out[name] = s
    return out


def table(summary: dict) -> str:
    head = ["candidate", *COLUMNS, *(f"ref_{k}" for k in REF_COLUMNS)]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for name, s in summary.items():
        cells = [name, *(s[k] for k in COLUMNS), *(s["reference"][k] for k in REF_COLUMNS)]
        lines.append(" | ".join("-" if c is None else str(c) for c in cells))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=3, help="batches, each evaluating every candidate once with fresh references")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--block", type=int, default=10, help="reward.timing_block")
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--cache", default=None, help="a reward cache to reuse (the extension built once); default a temporary one")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "reward_rounds_cpu.json"))
    ap.add_argument("--label", default="", help="recorded in the JSON (e.g. before / after)")
    args = ap.parse_args()

    cache = args.cache or tempfile.mkdtemp(prefix="opsynth_rounds_cache_")
    cfg = RewardConfig(device="cpu", cache_dir=cache, compile_baseline=False, static_check=False, cpu_threads=1,
                       warmup=args.warmup, repeats=args.repeats, timing_block=args.block)
    names = args.candidates.split(",")
    pairs = [(TASKS[CANDIDATES[n][0]], PRELUDE + "\n" + CANDIDATES[n][1]) for n in names]
    t0 = time.perf_counter()
    warm = evaluate_many(pairs[:1], cfg)[0]  # builds the shared extension (not timed here)
    print(f"[rounds] warm-up evaluation: reward {warm.reward} ({warm.reason}) in {time.perf_counter() - t0:.1f} s", flush=True)
    rows: dict[str, list[dict]] = {n: [] for n in names}
    for b in range(args.batches):
        t1 = time.perf_counter()
        for n, res in zip(names, evaluate_many(pairs, cfg)):
            rows[n].append(row(res))
            if res.reason != "ok":
                print(f"[rounds] batch {b}: {n} rejected: {res.reason}: {res.log[-400:]}", flush=True)
        print(f"[rounds] batch {b + 1}/{args.batches}: {time.perf_counter() - t1:.1f} s", flush=True)
    summary = summarize(rows)
    print(table(summary))
    out = {"label": args.label, "device": "cpu", "cpu_count": os.cpu_count(), "python": platform.python_version(),
           "plan": {"warmup": args.warmup, "repeats": args.repeats, "timing_block": args.block,
                    "max_timed_calls": cfg.timing_cap("cpu")},
           "batches": args.batches, "summary": summary, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"[rounds] wrote {args.out}")


if __name__ == "__main__":
    main()
