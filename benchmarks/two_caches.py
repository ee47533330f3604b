"""The same candidate in two fresh caches, one of them while another candidate builds (issue 28).

Cached baselines measured while builds ran once read 100x high, and the same candidate scored 2 in
one cache and 3 in another. This evaluates one correct candidate

- in cache A, alone (nothing else running);
- in cache B, a fresh one, while a second evaluation in the same process builds another candidate
  with compiler flags nothing has built yet (so its PCH and its extension compile beside the first
  candidate's timed rounds, which pause them: `opsynth.reward.quiet`);

and reports both rewards, the ratios to eager with their intervals, and each cache's stored eager
and torch.compile baselines with the B/A ratio (the issue asks for agreement within 10 % on the
H200). Prints a table, writes JSON.

    python benchmarks/two_caches.py --device cuda --out benchmarks/results/two_caches_h200.json
    python benchmarks/two_caches.py --device cpu --out benchmarks/results/two_caches_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CANDS = REPO / "tests" / "reward" / "candidates"


def _sources(device: str) -> tuple[str, str, str]:
    """(task, the candidate, another candidate whose build has flags nothing has built yet)."""
    if device == "cuda":
        task = (CANDS / "tasks" / "chain_gpu.py").read_text()
        prelude = (CANDS / "cuda" / "ext_prelude.py").read_text()
        fast = prelude + "\n" + (CANDS / "cuda" / "fast.py").read_text()
        other = prelude.replace('extra_cuda_cflags=["-O3"]', 'extra_cuda_cflags=["-O2"], extra_cflags=["-O2"]')
        return task, fast, other + "\n" + (CANDS / "cuda" / "fast.py").read_text()
    task = (CANDS / "tasks" / "chain.py").read_text()
    prelude = (CANDS / "cpu" / "ext_prelude.py").read_text()
    fast = prelude + "\n" + (CANDS / "cpu" / "fast.py").read_text()
    other = prelude.replace('extra_cflags=["-O3"]', 'extra_cflags=["-O2"]')
    return task, fast, other + "\n" + (CANDS / "cpu" / "fast.py").read_text()


def _row(label: str, r, cfg, task: str, device: str) -> dict:
    from opsynth.reward import baseline_cache

    t = r.times or {}
    entry = baseline_cache.lookup(cfg, task, device) or {}
    return {"run": label, "reward": r.reward, "reason": r.reason, "candidate_ms": t.get("candidate_ms"),
            "eager_ratio": t.get("eager_ratio"), "eager_ratio_lo": t.get("eager_ratio_lo"), "eager_ratio_hi": t.get("eager_ratio_hi"),
            "compile_ratio": t.get("compile_ratio"), "cached_eager_ms": entry.get("eager_ms"),
            "cached_compile_ms": entry.get("compile_ms"), "baseline": (r.details or {}).get("baseline")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    from opsynth.reward import RewardConfig, evaluate, quiet

    task, cand, other = _sources(args.device)
    work = Path(tempfile.mkdtemp(prefix="two_caches_"))
    extra = {} if args.device == "cuda" else {"cpu_threads": 1}

    def cfg(name: str) -> RewardConfig:
        return RewardConfig(device=args.device, cache_dir=str(work / name), **extra)

    out = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "cpu_count": os.cpu_count(),
           "torch": torch.__version__, "rows": []}
    path = Path(args.out or REPO / "benchmarks" / "results" / f"two_caches_{args.device}.json")

    def save():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2, default=str))

    t0 = time.perf_counter()
    a = evaluate(task, cand, cfg("a"))
    out["rows"].append({**_row("A alone", a, cfg("a"), task, args.device), "wall_s": round(time.perf_counter() - t0, 1)})
    save()
    print(json.dumps(out["rows"][-1], default=str), flush=True)

    # Cache B: the other candidate's build starts first; the candidate is evaluated while it runs.
    got: dict = {}
    builder = threading.Thread(target=lambda: got.setdefault("r", evaluate(task, other, cfg("b"))))
    builder.start()
    deadline = time.time() + 300
    while "build" not in quiet.registered().values() and "pch" not in quiet.registered().values() \
            and builder.is_alive() and time.time() < deadline:
        time.sleep(0.1)
    building = sorted(set(quiet.registered().values()))
    t0 = time.perf_counter()
    b = evaluate(task, cand, cfg("b"))
    out["rows"].append({**_row("B beside a build", b, cfg("b"), task, args.device), "wall_s": round(time.perf_counter() - t0, 1),
                        "building_when_started": building})
    builder.join(timeout=900)
    r = got.get("r")
    out["other_candidate"] = {"reward": getattr(r, "reward", None), "reason": getattr(r, "reason", None)}
    ra, rb = out["rows"]
    out["same_reward"] = ra["reward"] == rb["reward"]
    for k in ("eager", "compile"):
        x, y = ra[f"cached_{k}_ms"], rb[f"cached_{k}_ms"]
        out[f"cached_{k}_b_over_a"] = round(y / x, 4) if x and y else None
    out["complete"] = True
    save()
    print()
    print(f"{'run':<20}{'reward':>7}  {'ratio to eager [interval]':<28}{'cached eager ms':>16}{'cached compile ms':>18}")
    for row in out["rows"]:
        iv = f"{row['eager_ratio'] or 0:.3f} [{row['eager_ratio_lo'] or 0:.3f}, {row['eager_ratio_hi'] or 0:.3f}]"
        ce, cc = (f"{row[k]:.4f}" if row[k] else "-" for k in ("cached_eager_ms", "cached_compile_ms"))
        print(f"{row['run']:<20}{row['reward']:>7}  {iv:<28}{ce:>16}{cc:>18}")
    print(f"same reward: {out['same_reward']}; cached eager B/A {out['cached_eager_b_over_a']}, "
          f"compile B/A {out['cached_compile_b_over_a']}; building when B started: {building}; "
          f"other candidate: {out['other_candidate']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
