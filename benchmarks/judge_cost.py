"""What judging one candidate's outputs costs the trusted parent, old path against new (issue 28).

    python benchmarks/judge_cost.py --out benchmarks/results/judge_cost_cpu.json

Reference and candidate outputs at the sizes of the reward's H200 benchmark tasks
(`benchmarks/reward_throughput.py`, SIZES["cuda"]: chain 512 x 32768 float32, 64 MiB an output;
linear_relu 1024 x 1024) and a bfloat16 chain: `num_trials` trials as in the default RewardConfig,
the second shape, and the KEEP timed rounds kept in full, saved as the measuring child saves them.
Each candidate is a correct one (the reference plus noise well inside the tolerance: the common
case, and the one that is judged in full).

- old: `torch.load(path)` and `judge_outputs` / `judge_rounds` without a memo (`_cmp` on every tensor);
- new: the outputs through the channel the parent hands the child (`outputs_file.OutputsChannel`: a
  memfd, filled before the clock starts, as the child fills it), sealed and loaded in place, and the
  same calls with the reference's `FactsMemo`, its facts computed by the first judgement of a group
  and reused by the rest;
- new_warm: the same with the memo warmed before the group, as `evaluate` does once the reference
  is ready (while its candidates build); `warm_s` is that one-off cost.

Each path judges a GRPO group of 8 candidates against one reference, one at a time and with 8
threads at once in one process (as `evaluate_many`'s measure workers do); it reports seconds per
judgement (median and max; for the threads, each judgement's own wall time) and the group's wall.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from opsynth.render.task_file import second_batch_size, tolerance  # noqa: E402
from opsynth.reward.compare import FactsMemo, judge_outputs  # noqa: E402
from opsynth.reward.eval_types import RewardConfig  # noqa: E402
from opsynth.reward.outputs_file import OutputsChannel, size_cap  # noqa: E402
from opsynth.reward.rounds import KEEP, RoundSession, TimingPlan, judge_rounds  # noqa: E402

# task -> (batch, per-row shape, dtype): the H200 sizes of benchmarks/reward_throughput.py
TASKS = {
    "chain": (512, (32768,), torch.float32),
    "linear_relu": (1024, (1024,), torch.float32),
    "chain_bf16": (512, (32768,), torch.bfloat16),
}
GROUP = 8


def _outputs(batch, row, dtype, n_trials, seed):
    g = torch.Generator().manual_seed(seed)

    def t(bs):
        return torch.randn((bs, *row), generator=g).to(dtype)

    trials = [[t(batch)] for _ in range(n_trials)]
    second = [t(second_batch_size(batch))]
    kept = {10 + j: [t(batch)] for j in range(KEEP)}
    return trials, second, kept


def _near(x, g):
    """x plus noise far inside the tolerance, in x's dtype."""
    return (x.float() + 1e-3 * torch.rand(x.shape, generator=g)).to(x.dtype)


def make_case(task: str, tmp: Path, cfg: RewardConfig):
    batch, row, dtype = TASKS[task]
    trials, second, kept = _outputs(batch, row, dtype, cfg.num_trials, 0)
    rounds = [{"fp": [[0.0, 1.0, 0.0, 0.0]], "scale": [1.0]} for _ in range(12)]
    ref = {"trials": trials, "second": second, "rounds": rounds, "round_outputs": kept}
    paths = []
    for c in range(GROUP):
        g = torch.Generator().manual_seed(100 + c)
        cand = {"trials": [[_near(x, g) for x in tr] for tr in trials], "second": [_near(x, g) for x in second],
                "rounds_kept": {j: [_near(x, g) for x in outs] for j, outs in kept.items()},
                "trial_reused": [False] * len(trials)}
        p = tmp / f"{task}_cand{c}.pt"
        torch.save(cand, p)
        paths.append(p)
    plan = TimingPlan(warmup=0, repeats=12, seeds=list(range(12)), keep=sorted(kept), atol=cfg.atol, rtol=cfg.rtol)
    session = RoundSession(plan, fps={j: r["fp"] for j, r in enumerate(rounds)}, keys={j: "k" for j in range(12)},
                           done=True, next_round=12)
    return ref, paths, session


def judge_old(ref, path, session, cfg, memo=None):
    cand = torch.load(path, weights_only=True)
    v = judge_outputs(ref, cand, cfg)
    if v[0] == "ok":
        v = judge_rounds(ref, session, cand["rounds_kept"], cfg, session.keys)
    return v


def channel_of(path) -> OutputsChannel:
    """A channel holding the file's bytes, as a measuring child leaves it (not timed: the child's work)."""
    ch = OutputsChannel("judge-cost")
    with open(path, "rb") as f:
        size, got = os.fstat(f.fileno()).st_size, 0
        while got < size:
            got += os.sendfile(ch.fd, f.fileno(), got, size - got)
    return ch


def judge_new(ref, channel, session, cfg, memo):
    cand = channel.read(size_cap(ref))
    v = judge_outputs(ref, cand, cfg, memo)
    if v[0] == "ok":
        v = judge_rounds(ref, session, cand["rounds_kept"], cfg, session.keys, memo)
    return v


def _timed(fn, *args):
    t0 = time.perf_counter()
    v = fn(*args)
    return time.perf_counter() - t0, v


def run_group(fn, ref, paths, session, cfg, threads: bool, warm: bool = False) -> dict:
    memo = FactsMemo()  # a fresh reference: its facts are paid for inside this group, unless warmed first
    t_warm = time.perf_counter()
    if warm:  # as evaluate does when the reference is ready, before its candidates are measured
        memo.warm(ref, cfg)
    t_warm = time.perf_counter() - t_warm
    times: list = [None] * len(paths)
    verdicts: list = [None] * len(paths)
    sources = [channel_of(p) for p in paths] if fn is judge_new else paths

    def one(i):
        times[i], verdicts[i] = _timed(fn, ref, sources[i], session, cfg, memo)

    t0 = time.perf_counter()
    if threads:
        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(paths))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    else:
        for i in range(len(paths)):
            one(i)
    wall = time.perf_counter() - t0
    for src in sources:
        if isinstance(src, OutputsChannel):
            src.close()
    assert all(v == ("ok", "") for v in verdicts), verdicts
    return {"warm_s": round(t_warm, 3) if warm else None, "per_judgement_median_s": round(statistics.median(times), 4), "per_judgement_max_s": round(max(times), 4),
            "first_s": round(times[0], 4), "group_wall_s": round(wall, 3), "per_judgement_s": [round(t, 4) for t in times]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "judge_cost_cpu.json"))
    args = ap.parse_args()
    cfg = RewardConfig()
    tol = tolerance("bfloat16")  # the task contract's tolerance for the reduced precision (evaluate.task_cfg)
    bf16 = RewardConfig(atol=tol.atol, rtol=tol.rtol)
    rows = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="judge_cost_") as tmp:
        for task in args.tasks.split(","):
            tcfg = bf16 if TASKS[task][2] == torch.bfloat16 else cfg
            ref, paths, session = make_case(task, Path(tmp), tcfg)
            ref_mb = sum(t.numel() * t.element_size() for tr in ref["trials"] + [ref["second"]] for t in tr)
            ref_mb += sum(t.numel() * t.element_size() for outs in ref["round_outputs"].values() for t in outs)
            file_mb = os.path.getsize(paths[0]) / 2**20
            for threads in (False, True):
                for name, fn, warm in (("old", judge_old, False), ("new", judge_new, False), ("new_warm", judge_new, True)):
                    r = run_group(fn, ref, paths, session, tcfg, threads, warm)
                    rows.append({"task": task, "path": name, "mode": "8 threads" if threads else "one at a time",
                                 "ref_outputs_mib": round(ref_mb / 2**20, 1), "file_mib": round(file_mb, 1), **r})
                    print(f"{task:12s} {name:8s} {rows[-1]['mode']:14s} median {r['per_judgement_median_s']:7.3f} s  "
                          f"max {r['per_judgement_max_s']:7.3f} s  first {r['first_s']:7.3f} s  group {r['group_wall_s']:7.2f} s",
                          flush=True)
            for p in paths:
                p.unlink()
    print()
    print("seconds per judgement (median of 8; facts warmed: as evaluate does, when the reference is ready)")
    print(f"{'task':12s} {'mode':14s} {'old':>8s} {'new':>8s} {'new, facts warmed':>18s} {'speed-up':>9s} {'warm-up s':>10s}")
    for task in args.tasks.split(","):
        for mode in ("one at a time", "8 threads"):
            o, n, w = ([r for r in rows if r["task"] == task and r["mode"] == mode and r["path"] == p][0]
                       for p in ("old", "new", "new_warm"))
            print(f"{task:12s} {mode:14s} {o['per_judgement_median_s']:8.3f} {n['per_judgement_median_s']:8.3f} "
                  f"{w['per_judgement_median_s']:18.3f} {o['per_judgement_median_s'] / w['per_judgement_median_s']:8.1f}x "
                  f"{w['warm_s']:10.3f}")
    out = {"host": {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                    "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
           "group": GROUP, "num_trials": cfg.num_trials, "kept_rounds": KEEP, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
