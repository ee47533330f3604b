"""What the device lock's scheduling costs: timings as a phase (`exclusive_first`) against the plain
writer-preferring lock, on the real locks (`opsynth.runtime.device_lock.device_share` and the timing
lock), with the work replaced by sleeps of measured lengths.

Why sleeps: the question is the order the lock lets holders in, not what they run. The lengths come
from the H200 records (issue 28's GRPO-shaped batch of 2026-12-06, issue 29's window of 2026-12-05),
so the rates here are what the lock alone allows with that work, not what the GPU gives; the gain
must be confirmed there (`benchmarks/reward_throughput.py`, `benchmarks/generate_throughput.py`).

Two workloads, each with both policies, the same seed, fresh lock files:

- `reward`: measuring children, `--in-flight` at a time, one candidate each: start-up (no lock),
  checks (shared: checked trials, profiled call, harness warm-up), timing (the device to itself).
  Two task kinds alternate (a large-output task and a small one), as in the GRPO-shaped batch.
- `generate`: verifier workers, each looping over requests: eager checks (shared), compile code
  generation (share let go), compiled run (shared), timing (share let go for a timing section),
  the rest (shared).

    python benchmarks/lock_phases.py                     # about 2 minutes on 2 cores
    python benchmarks/lock_phases.py --scale 0.5         # every length halved (faster, coarser)

Prints a table; writes JSON (`--out`, default benchmarks/results/lock_phases_cpu.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from opsynth.runtime.device_lock import create_lock_files, device_share, file_lock

# Lengths in seconds (medians from the H200 logs named above; jitter +-30 % uniform).
REWARD_KINDS = [  # (start-up, checks, timing): the 480 MB-output task, the 30 MB one
    (1.7, 1.25, 0.85),
    (1.35, 0.52, 0.30),
]
GENERATE_REQUEST = {  # one verifier request (a candidate that reaches timing)
    "eager_checks": 0.45, "codegen": 1.35, "compiled_run": 0.35, "timing": 0.12, "rest": 0.30,
}


class Clock:
    """Holds, waits and the timing spans of one run."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.lock = threading.Lock()
        self.timing_spans: list[tuple[float, float]] = []
        self.waits: list[float] = []

    def now(self) -> float:
        return time.perf_counter() - self.t0


@contextmanager
def _held(clock: Clock, path: str, exclusive: bool, first: bool):
    t = clock.now()
    cm = device_share(path, exclusive, exclusive_first=first)
    cm.__enter__()
    try:
        if exclusive:
            with file_lock(path):
                got = clock.now()
                yield
                end = clock.now()
            with clock.lock:
                clock.timing_spans.append((got, end))
        else:
            got = clock.now()
            yield
    finally:
        cm.__exit__(None, None, None)
        with clock.lock:
            clock.waits.append(got - t)


def _sleep(rng: random.Random, s: float, scale: float) -> None:
    time.sleep(s * scale * rng.uniform(0.7, 1.3))


def run_reward(path: str, first: bool, n: int, in_flight: int, scale: float, seed: int) -> dict:
    clock = Clock()
    sem = threading.Semaphore(in_flight)
    done: list[float] = []

    def child(i: int):
        rng = random.Random(seed * 1000 + i)
        setup, checks, timing = REWARD_KINDS[(i // 8) % len(REWARD_KINDS)]  # 8 per task, as GRPO groups
        try:
            _sleep(rng, setup, scale)
            with _held(clock, path, False, first):
                _sleep(rng, checks, scale)
            with _held(clock, path, True, first):
                _sleep(rng, timing, scale)
            done.append(clock.now())
        finally:
            sem.release()

    threads = []
    for i in range(n):
        sem.acquire()
        t = threading.Thread(target=child, args=(i,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return _summary(clock, len(done), max(done))


def run_generate(path: str, first: bool, workers: int, seconds: float, scale: float, seed: int) -> dict:
    clock = Clock()
    stop_at = seconds
    done: list[float] = []
    r = GENERATE_REQUEST

    def worker(w: int):
        rng = random.Random(seed * 1000 + w)
        while clock.now() < stop_at:
            with _held(clock, path, False, first):
                _sleep(rng, r["eager_checks"], scale)
            _sleep(rng, r["codegen"], scale)  # the share let go (compile_aside)
            with _held(clock, path, False, first):
                _sleep(rng, r["compiled_run"], scale)
            with _held(clock, path, True, first):  # HeldShare.timing: share let go, timing section
                _sleep(rng, r["timing"], scale)
            with _held(clock, path, False, first):
                _sleep(rng, r["rest"], scale)
            done.append(clock.now())

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _summary(clock, len(done), max(done))


def _summary(clock: Clock, n: int, wall: float) -> dict:
    busy = sum(b - a for a, b in clock.timing_spans)
    return {"done": n, "wall_s": round(wall, 3), "per_min": round(n / wall * 60, 2),
            "timing_busy_share": round(busy / wall, 3),
            "lock_wait_s_mean": round(statistics.fmean(clock.waits), 3) if clock.waits else 0.0,
            "lock_wait_s_sum_per_done": round(sum(clock.waits) / max(1, n), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every length (default 1.0)")
    ap.add_argument("--candidates", type=int, default=48, help="reward: candidates (8 per task; default 48)")
    ap.add_argument("--in-flight", type=int, default=12, help="reward: measuring children at a time (default 12)")
    ap.add_argument("--workers", type=int, default=14, help="generate: verifier workers (default 14)")
    ap.add_argument("--seconds", type=float, default=40.0, help="generate: seconds per run (default 40)")
    ap.add_argument("--repeats", type=int, default=2, help="runs per workload and policy (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/lock_phases_cpu.json")
    args = ap.parse_args()
    out: dict = {"host": platform.node(), "python": platform.python_version(), "args": vars(args),
                 "reward_kinds": REWARD_KINDS, "generate_request": GENERATE_REQUEST, "runs": []}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload in ("reward", "generate"):
            for rep in range(args.repeats):
                for first in (False, True):
                    path = str(Path(tmp) / f"{workload}-{rep}-{first}.lock")
                    create_lock_files(path)
                    if workload == "reward":
                        res = run_reward(path, first, args.candidates, args.in_flight, args.scale, args.seed + rep)
                    else:
                        res = run_generate(path, first, args.workers, args.seconds * args.scale, args.scale, args.seed + rep)
                    policy = "timings as a phase" if first else "writer-preferring only"
                    res.update(workload=workload, repeat=rep, exclusive_first=first, policy=policy)
                    out["runs"].append(res)
                    rows.append(res)
                    print(f"{workload:9s} {policy:24s} rep {rep}: {res['done']:4d} in {res['wall_s']:7.2f} s = "
                          f"{res['per_min']:7.2f}/min, timing busy {res['timing_busy_share']:.2f}, "
                          f"lock wait {res['lock_wait_s_sum_per_done']:.2f} s per item", flush=True)
                    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"\n{'workload':9s} {'policy':24s} {'per_min':>8s} {'timing busy':>11s} {'lock wait/item':>14s}")
    for workload in ("reward", "generate"):
        for first in (False, True):
            sel = [r for r in rows if r["workload"] == workload and r["exclusive_first"] == first]
            pm = statistics.fmean(r["per_min"] for r in sel)
            busy = statistics.fmean(r["timing_busy_share"] for r in sel)
            wait = statistics.fmean(r["lock_wait_s_sum_per_done"] for r in sel)
            out.setdefault("summary", {}).setdefault(workload, {})["phase" if first else "plain"] = {
                "per_min": round(pm, 2), "timing_busy_share": round(busy, 3), "lock_wait_s_per_item": round(wait, 3)}
            print(f"{workload:9s} {sel[0]['policy']:24s} {pm:8.2f} {busy:11.2f} {wait:14.2f}")
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
