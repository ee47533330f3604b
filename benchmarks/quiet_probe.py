"""The quiet-device probe on a real GPU: its idle readings, its readings beside another process's
kernels, and how much such kernels slow a baseline (issue 28; `opsynth.runtime.timing.QuietDevice`).

Before each baseline block the reward's baseline child waits until a probe reads idle, because a
candidate stopped between its rounds can leave a kernel running that time-slices the device with
the baseline. Its thresholds (host reading within 4x its fastest, at least 0.3 ms and at most 1 ms;
the probe kernel's own stretch within 1.5x its fastest) were set without a GPU. This measures what
they must separate, in one process probing while a second process (its own CUDA context, as a
candidate child has) keeps the device busy:

- idle: probe readings with nothing else on the device;
- beside a hog of long kernels (`torch.cuda._sleep`, ~10 ms each) and of short ones (~50 us each,
  back to back): probe readings, and whether `wait_quiet` (cap 300 ms here) calls the device quiet;
- the effect the guard is for: an elementwise baseline-like op (256 MiB in and out) timed with
  events idle and beside each hog.

    python benchmarks/quiet_probe.py --out benchmarks/results/quiet_probe_h200.json

Prints a table and writes JSON after each stage. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HOG = r"""
import sys, time, torch
cycles, seconds = int(sys.argv[1]), float(sys.argv[2])
torch.cuda.init(); torch.cuda._sleep(1000); torch.cuda.synchronize()
print("ready", flush=True)
t_end = time.time() + seconds
while time.time() < t_end:
    for _ in range(8):
        torch.cuda._sleep(cycles)
    torch.cuda.synchronize()  # a bounded queue: the device busy, the host never far ahead
"""


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))], 4)


def _summary(readings: list[tuple[float, float]]) -> dict:
    host = [h for h, _ in readings]
    dev = [d for _, d in readings]
    return {"n": len(readings), **{f"host_p{int(q * 100)}": _pct(host, q) for q in (0.01, 0.1, 0.5, 0.9, 0.99)},
            **{f"device_p{int(q * 100)}": _pct(dev, q) for q in (0.01, 0.1, 0.5, 0.9, 0.99)}}


def _cycles_for(ms: float) -> int:
    """`torch.cuda._sleep` cycles for about `ms` on this device (calibrated with events)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 1_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    per_ms = cycles / max(start.elapsed_time(end), 1e-3)
    return max(1000, int(per_ms * ms))


def _baseline_ms(n: int) -> list[float]:
    """An elementwise op over 256 MiB (in and out), timed with events, n times."""
    import torch

    x = torch.randn(64 * 2**20, device="cuda")
    out = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y = x * 2.0 + 1.0
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
        del y
    return out


def _with_hog(cycles: int, seconds: float, work):
    """Run `work()` while a second process keeps the device busy with `_sleep(cycles)` kernels."""
    proc = subprocess.Popen([sys.executable, "-c", HOG, str(cycles), str(seconds)], stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the hog process did not start")
        time.sleep(0.2)
        return work()
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probes", type=int, default=400)
    ap.add_argument("--out", default="benchmarks/results/quiet_probe.json")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("quiet_probe: needs a CUDA device (the probe separates other contexts' kernels on a GPU)")
    from opsynth.runtime import timing
    from opsynth.runtime.timing import QuietDevice, wait_quiet

    q = QuietDevice("cuda")
    q.warm(10)
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "thresholds": {"host_floor_ms": timing.QUIET_FLOOR_MS, "host_factor": timing.QUIET_FACTOR,
                                "host_ceiling_ms": timing.QUIET_CEILING_MS, "device_factor": timing.QUIET_DEVICE_FACTOR,
                                "probe_elements": timing.PROBE_ELEMENTS, "spacer_cycles": timing.PROBE_SPACER_CYCLES,
                                "spacer": q.spin is not None}, "stages": {}}
    out = Path(args.out)

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1))

    def stage(name: str, fn) -> None:
        t0 = time.perf_counter()
        res["stages"][name] = {**fn(), "seconds": round(time.perf_counter() - t0, 2)}
        save()
        print(f"{name:24s} {json.dumps(res['stages'][name])[:300]}", flush=True)

    def probes(idle: bool = False):
        readings = [q.probe() for _ in range(args.probes)]
        if idle:  # the idle floor every later stage is read against, as a baseline child's would be
            q.fastest = [min(q.fastest[0], *(h for h, _ in readings)), min(q.fastest[1], *(d for _, d in readings))]
        waited = wait_quiet(q.probe, list(q.fastest), cap_ms=300.0)
        return {**_summary(readings), "wait_quiet": waited,
                "read_idle": sum(h <= timing.quiet_threshold(q.fastest[0]) and d <= timing.device_threshold(q.fastest[1])
                                 for h, d in readings) / len(readings),
                "baseline_ms": round(statistics.median(_baseline_ms(30)), 4)}

    stage("idle", lambda: probes(idle=True))
    for label, ms in (("hog_long_10ms", 10.0), ("hog_short_50us", 0.05)):
        cycles = _cycles_for(ms)
        stage(label, lambda c=cycles: {"hog_kernel_ms": ms, "cycles": c, **_with_hog(c, 60.0, probes)})
    idle = res["stages"]["idle"]
    print(f"\n{'stage':16s} {'host p50':>9s} {'host p1':>8s} {'dev p50':>8s} {'dev p1':>7s} {'read idle':>9s} "
          f"{'wait: quiet':>11s} {'baseline ms':>11s} {'x idle':>6s}")
    for name, st in res["stages"].items():
        w = st["wait_quiet"]
        print(f"{name:16s} {st['host_p50']:9.4f} {st['host_p1']:8.4f} {st['device_p50']:8.4f} {st['device_p1']:7.4f} "
              f"{st['read_idle']:9.3f} {str(w['quiet']):>11s} {st['baseline_ms']:11.4f} {st['baseline_ms'] / idle['baseline_ms']:6.2f}")
    res["separates"] = {name: (not st["wait_quiet"]["quiet"]) for name, st in res["stages"].items() if name != "idle"}
    res["idle_reads_quiet"] = bool(idle["wait_quiet"]["quiet"])
    save()
    print(f"\nidle reads quiet: {res['idle_reads_quiet']}; busy never reads quiet: {res['separates']}; -> {out}")
    if not math.isfinite(q.fastest[0]):
        sys.exit(1)


if __name__ == "__main__":
    main()
