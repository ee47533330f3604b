"""Generate throughput: the real pipeline for a fixed wall time, where its time went, and the
fresh-process-per-candidate baseline in the same call.

    python benchmarks/generate_throughput.py                      # H200: cluster=local_cuda verify=cuda, 7 min + 60 s baseline
    python benchmarks/generate_throughput.py --gpus 1,2 --minutes 3.5 --baseline-seconds 0   # one window per GPU count
    python benchmarks/generate_throughput.py --linear 300 --minutes 0 --baseline-seconds 0   # n_tasks 300 then 600: time ratio
    python benchmarks/generate_throughput.py --device cpu --minutes 1.5 --baseline-seconds 40 \\
        --override verify.compile_backend=aot_eager               # CPU check (cluster=local, sampler=small)

Each window is `opsynth.generate.driver.run` in a child process of its own (so CUDA_VISIBLE_DEVICES can
differ per window, and a stuck window is killed without losing what it saved), with
`n_tasks` out of reach and a timer that stops it after `--minutes` of wall time counted from the
window process's start (imports, cluster and verifier start-up included, as a user's run pays
them). It reports:

- accepted tasks per minute (rows committed after dedup), candidates per minute, acceptance rate;
- the GPU busy fraction: the union of the device sections the verifier workers record (their
  checks and timed runs, opsynth/verify/stages.py) over the window, per GPU; sampled pynvml
  utilisation ("a kernel ran in the last sample period") is reported next to it when pynvml is there;
- CPU utilisation (psutil, whole machine, sampled every 0.5 s);
- seconds per stage summed over candidates (sampling, KernelBench check, eager checks,
  calibration, compile, timing, lock wait, writing, ...) and per accepted task;
- start-up (process start to the first result back) apart from the sustained window after it, with
  accepted/min over the sustained window;
- the floors table: per stage, seconds per accepted row and, for the stages that run on the device
  (checks, compile, timing), its busy share over the sustained window (the union of that kind's
  sections, per device; on CPU the verifier workers' share); then the physical minimum: the device
  seconds per accepted row the timed runs need (they hold the device alone: a hard floor) and the
  checks and timing together need (each run alone), the accepted/min each floor allows, and how far
  the sustained wall seconds per accepted row are above them;
- the timing tally (`timing`, and in the floors): timing seconds per timed candidate, the timed candidates
  rejected afterwards (by the verifier, by reason; by the committer: duplicates), and per timing its
  timed and warm-up runs and why its repeats stopped (`opsynth.runtime.timing.STOPS`).

The baseline verifies one candidate at a time, each in a fresh `python -m opsynth.verify` process
(torch import, CUDA start, compile from the shared inductor cache), over the same sampler and
KernelBench check, for `--baseline-seconds`; a candidate still running at the end is stopped and
not counted. Its seeds are far from the window's, so neither warms the other's compile cache.

Results are written to --out after every window and every 10 s within one (partial: true until done).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROCESS_T0 = time.time()  # a window counts from its process's start: imports are start-up too
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BASELINE_SEED_OFFSET = 1_000_000  # baseline candidates: far from the window's, no shared compile cache
HUGE_N_TASKS = 10_000_000
TEARDOWN_GRACE_S = 15.0  # a window's teardown may take this long after its numbers are saved


# ---- configuration -------------------------------------------------------------------------------

def device_overrides(device: str) -> list[str]:
    if device == "cuda":
        return ["cluster=local_cuda", "verify=cuda"]
    return ["cluster=local", "verify=cpu", "sampler=small"]


def compose(overrides: list[str]):
    """The GenerateConfig `python -m pipelines.generate <overrides>` would run."""
    from opsynth import cli
    from opsynth.generate.config import GenerateConfig, generate_config

    return generate_config(cli.compose("generate", overrides, {"": GenerateConfig}))


# ---- samplers of the machine's state -----------------------------------------------------------------

class MachineSampler:
    """CPU utilisation (psutil) and, on CUDA, per-GPU utilisation (pynvml) every `period` s."""

    def __init__(self, device: str, period: float = 0.5):
        import psutil

        self.psutil, self.period = psutil, period
        self.cpu: list[float] = []
        self.gpu: dict[int, list[float]] = {}
        self.nvml = None
        if device == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                idx = [int(x) for x in visible.split(",") if x.strip()] if visible else \
                    list(range(pynvml.nvmlDeviceGetCount()))
                self.handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in idx}
                self.nvml = pynvml
            except Exception as e:  # noqa: BLE001 - utilisation sampling is a cross-check only
                print(f"pynvml unavailable ({type(e).__name__}: {e}); GPU busy share from worker records only",
                      file=sys.stderr)
        # Per process: CPU seconds at the first and the latest reading (every 4th tick), to name the
        # busiest processes. The Dask worker's share near 1.0 says its one GIL binds (the candidates'
        # stages before verification and the verify pool's threads run there).
        self._procs: dict[int, tuple[str, float, float, float]] = {}  # pid -> (name, t0, cpu0, cpu now)
        self._ticks = 0
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read_processes(self) -> None:
        now = time.monotonic()
        for p in self.psutil.process_iter(["cmdline", "cpu_times"]):
            try:
                t = p.info["cpu_times"]
                cpu = t.user + t.system
                cmd = " ".join(p.info["cmdline"] or [])[:160]
            except Exception:  # noqa: BLE001 - gone meanwhile
                continue
            if p.pid in self._procs:
                name, t0, cpu0, _ = self._procs[p.pid]
                self._procs[p.pid] = (name, t0, cpu0, cpu)
            else:
                self._procs[p.pid] = (cmd, now, cpu, cpu)

    def busiest(self, n: int = 6) -> list[dict]:
        """The processes that used the most CPU over the window, as a share of one core."""
        now = time.monotonic()
        rows = [{"pid": pid, "cmdline": name, "core_share": round((cpu - cpu0) / max(1e-9, now - t0), 3)}
                for pid, (name, t0, cpu0, cpu) in self._procs.items() if now - t0 > 5]
        return sorted(rows, key=lambda r: -r["core_share"])[:n]

    def start(self) -> "MachineSampler":
        self.psutil.cpu_percent(interval=None)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.cpu.append(self.psutil.cpu_percent(interval=None))
            self._ticks += 1
            if self._ticks % 4 == 1:
                self._read_processes()
            if self.nvml is not None:
                for i, h in self.handles.items():
                    try:
                        self.gpu.setdefault(i, []).append(float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu))
                    except Exception:  # noqa: BLE001
                        pass

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(2)
        return self.snapshot()

    def snapshot(self) -> dict:
        out = {"cpu_utilisation": round(sum(self.cpu) / len(self.cpu) / 100, 4) if self.cpu else None,
               "cpu_count": os.cpu_count(), "busiest_processes": self.busiest()}
        if self.gpu:
            per = {str(i): round(sum(v) / len(v) / 100, 4) for i, v in self.gpu.items() if v}
            out["gpu_util_sampled"] = per
            out["gpu_util_sampled_mean"] = round(sum(per.values()) / len(per), 4) if per else None
        return out


# ---- one window (runs in a child process) ------------------------------------------------------------

def window_child(spec: dict) -> int:
    """Run the pipeline for spec["seconds"] (or to spec["n_tasks"]) and write spec["out"]."""
    import logging

    import distributed  # noqa: F401  (sets its loggers on import; quiet them after)

    from opsynth.generate.driver import run
    from opsynth.generate.state import STATE_FILE
    from opsynth.verify.stages import union_seconds

    for noisy in ("distributed", "tornado", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    out_path = Path(spec["out"])
    n_tasks = spec.get("n_tasks") or HUGE_N_TASKS
    cfg = compose([*spec["overrides"], f"n_tasks={n_tasks}", f"output_dir={spec['output_dir']}", "progress=false",
                   "write_card=false"])
    seconds = spec.get("seconds")
    stop = threading.Event()
    lock = threading.Lock()
    recs = {"n": 0, "verified": 0, "first_t": None, "sections": {}, "kinds": {}, "reasons": {}}
    tally, compiles = TimingTally(), CompileTally()
    machine = MachineSampler(spec["device"]).start()
    t0 = PROCESS_T0
    t_stop = [None]

    def snapshot(final: bool, summary: dict | None = None) -> dict:
        now = t_stop[0] or time.time()
        wall = now - t0
        with lock:
            d = {"partial": not final, "gpus_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                 "window_s": seconds, "wall_s": round(wall, 2), "records": recs["n"],
                 "verifier_accepted": recs["verified"], "reasons_seen": dict(recs["reasons"]),
                 "first_result_s": round(recs["first_t"] - t0, 2) if recs["first_t"] else None,
                 "timing": tally.summary(summary["accepted"] if summary is not None else None),
                 "compile": compiles.summary(summary["accepted"] if summary is not None else None)}
            busy = {str(g): union_seconds(iv, t0, now) / wall for g, iv in recs["sections"].items()} if wall > 0 else {}
            first = recs["first_t"]
            sustained = now - first if first else 0.0
            if sustained > 0:  # each kind's busy share after start-up, averaged over the devices
                by_kind: dict[str, list[float]] = {}
                for g, kinds in recs["kinds"].items():
                    for kind, iv in kinds.items():
                        by_kind.setdefault(kind, []).append(union_seconds(iv, first, now) / sustained)
                every = [union_seconds(iv, first, now) / sustained for iv in recs["sections"].values()]
                d["device_busy_sustained"] = {k: round(sum(v) / len(v), 4) for k, v in sorted(by_kind.items())}
                if every:
                    d["device_busy_sustained"]["checks+timing"] = round(sum(every) / len(every), 4)
                d["devices"] = max(1, len(recs["sections"]))
        d["gpu_busy_fraction_records"] = {k: round(v, 4) for k, v in busy.items()}
        d["gpu_busy_fraction"] = round(sum(busy.values()) / len(busy), 4) if busy else None
        if recs["first_t"] and now > recs["first_t"]:
            d["verified_per_min_steady"] = round(60 * recs["verified"] / (now - recs["first_t"]), 2)
        if summary is not None:
            acc, cands = summary["accepted"], summary["candidates"]
            d.update(accepted=acc, candidates=cands, acceptance_rate=summary.get("acceptance_rate"),
                     accepted_per_min=round(60 * acc / wall, 2), candidates_per_min=round(60 * cands / wall, 2),
                     rejected=summary.get("rejected"), calib_steps_mean=summary.get("calib_steps_mean"),
                     device=summary.get("device"), run_wall_time_s=summary.get("wall_time_s"),
                     compile_deferrals=summary.get("compile_deferrals") or {})
            ss = summary.get("stage_seconds") or {}
            d["stage_seconds"] = {k: round(v, 2) for k, v in sorted(ss.items(), key=lambda kv: -kv[1])}
            d["stage_seconds_per_accepted"] = {k: round(v / acc, 4) for k, v in d["stage_seconds"].items()} if acc else {}
            if recs["first_t"]:
                d["startup_s"] = round(recs["first_t"] - t0, 2)
                d["sustained_s"] = round(now - recs["first_t"], 2)
                if d["sustained_s"] > 0:
                    d["accepted_per_min_sustained"] = round(60 * acc / d["sustained_s"], 2)
            d["floors"] = floors(d)
        return d

    write_lock = threading.Lock()
    run_returned = [False]  # once the run's own summary is written, nothing overwrites it

    def save(final: bool, summary: dict | None = None, machine_stats: dict | None = None,
             from_run: bool = False) -> None:
        d = snapshot(final, summary)
        if machine_stats:
            d.update(machine_stats)
        with write_lock:
            if run_returned[0]:
                return
            run_returned[0] = from_run
            tmp = out_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(d, indent=1, default=str))
            os.replace(tmp, out_path)

    last_save = [time.time()]

    def on_result(rec: dict) -> None:
        now = time.time()
        with lock:
            recs["n"] += 1
            recs["first_t"] = recs["first_t"] or now
            recs["verified"] += bool(rec.get("accepted"))
            tally.add(rec)
            compiles.add(rec)
            r = rec.get("reason") or "accepted"
            recs["reasons"][r] = recs["reasons"].get(r, 0) + 1
            gpu = rec.get("gpu") if rec.get("gpu") is not None else 0
            recs["sections"].setdefault(gpu, []).extend(rec.get("gpu_sections") or [])
            for kind, iv in (rec.get("device_sections") or {}).items():
                recs["kinds"].setdefault(gpu, {}).setdefault(kind, []).extend(iv)
        if now - last_save[0] > 10:
            last_save[0] = now
            save(False)
            print(f"  {now - t0:5.0f} s: {recs['n']} candidates back, {recs['verified']} passed the verifier",
                  file=sys.stderr, flush=True)

    def stop_now() -> None:
        t_stop[0] = time.time()
        try:
            before = (Path(spec["output_dir"]) / STATE_FILE).stat().st_mtime
        except OSError:
            before = None
        stop.set()
        threading.Thread(target=save_from_state, args=(before,), daemon=True).start()

    def save_from_state(before: float | None) -> None:
        """The pipeline saves its state (counts, stage seconds) as soon as its loop ends, before the
        cluster's teardown, which can take tens of seconds: write the final numbers from it then,
        so a window cut off during teardown still has them. A teardown slower than
        TEARDOWN_GRACE_S after that (verifier workers finishing a compile before they read their
        exit message) would only cost the device call's time: the window process then ends, and
        the parent kills its Dask children with its process group."""
        path = Path(spec["output_dir"]) / STATE_FILE
        deadline = time.time() + 60
        while True:
            if time.time() > deadline:
                return
            try:
                if path.stat().st_mtime != before:
                    stats = json.loads(path.read_text())["stats"]
                    save(True, stats, {**machine.snapshot(), "final_from": "state file, before teardown"})
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        t_saved = time.time()
        while time.time() - t_saved < TEARDOWN_GRACE_S:
            if run_returned[0]:
                return
            time.sleep(0.2)
        print(f"teardown still running {TEARDOWN_GRACE_S:.0f} s after the window: ending it", file=sys.stderr,
              flush=True)
        os._exit(0)

    timer = threading.Timer(max(0.0, seconds - (time.time() - t0)), stop_now) if seconds else None
    if timer:
        timer.daemon = True
        timer.start()
    summary = run(cfg, on_result=on_result, stop=stop)
    if t_stop[0] is None:
        t_stop[0] = time.time()
    done_t = time.time()
    ms = machine.stop()
    save(True, summary, {**ms, "teardown_s": round(done_t - t_stop[0], 2), "final_from": "run summary"},
         from_run=True)
    return 0


# ---- what the timed runs cost ---------------------------------------------------------------------

class TimingTally:
    """The timing stage from the candidates' records as they come back: how many candidates were
    timed, the seconds their timing sections took (held with the device alone), which of them the
    verifier then rejected (by reason: too_fast, too_slow after the eager timing; compile_* after
    it too), and per timing (the record's `timed`, opsynth/verify/worker.py) its timed and warm-up
    runs, the milliseconds the timed runs summed to and why its repeats stopped. Rows the committer
    drops after the verifier accepted them (semantic, near or exact duplicates) were timed too:
    `timed_then_rejected` counts them as the timed candidates less the accepted rows (a record back
    but not yet committed when a window stops counts there as well)."""

    def __init__(self) -> None:
        self.records = 0
        self.timed = 0
        self.timing_s = 0.0
        self.verifier_accepted = 0
        self.rejected: dict[str, list] = {}  # verifier reason -> [candidates, timing seconds]
        self.ops: dict[str, dict] = {}  # "eager" / "compile" -> timings, runs, warm-up runs, ms timed
        self.stops: dict[str, int] = {}

    def add(self, rec: dict) -> None:
        self.records += 1
        t = float((rec.get("stage_s") or {}).get("timing") or 0.0)
        if t <= 0:
            return
        self.timed += 1
        self.timing_s += t
        if rec.get("accepted"):
            self.verifier_accepted += 1
        else:
            r = self.rejected.setdefault(rec.get("reason") or "?", [0, 0.0])
            r[0] += 1
            r[1] += t
        for one in rec.get("timed") or ():
            o = self.ops.setdefault(one.get("op") or "?", {"timings": 0, "runs": 0, "warmup": 0, "timed_ms": 0.0})
            o["timings"] += 1
            o["runs"] += int(one.get("runs") or 0)
            o["warmup"] += int(one.get("warmup") or 0)
            o["timed_ms"] += float(one.get("spent_ms") or 0.0)
            self.stops[one.get("stop") or "?"] = self.stops.get(one.get("stop") or "?", 0) + 1

    def summary(self, accepted: int | None = None) -> dict:
        rej_n = sum(n for n, _ in self.rejected.values())
        rej_s = sum(s for _, s in self.rejected.values())
        out = {"records": self.records, "timed_candidates": self.timed, "timing_s": round(self.timing_s, 2),
               "timing_s_per_timed_candidate": round(self.timing_s / self.timed, 4) if self.timed else None,
               "verifier_accepted_timed": self.verifier_accepted,
               "timed_then_rejected_by_verifier": rej_n,
               "timed_then_rejected_by_verifier_reasons": {k: v[0] for k, v in sorted(self.rejected.items())},
               "timing_s_on_verifier_rejected": round(rej_s, 2),
               "stops": dict(sorted(self.stops.items()))}
        if accepted is not None:
            out["timed_then_rejected"] = self.timed - accepted
            out["timed_then_rejected_after_verifier"] = self.verifier_accepted - accepted
            out["timing_s_per_accepted"] = round(self.timing_s / accepted, 4) if accepted else None
        timed_s = sum(o["timed_ms"] for o in self.ops.values()) / 1e3
        out["timed_runs_s"] = round(timed_s, 3)  # the timed calls alone; the rest is warm-up, syncs, Python
        out["timed_runs_share_of_timing"] = round(timed_s / self.timing_s, 3) if self.timing_s else None
        out["per_timing"] = {op: {"timings": o["timings"], "runs_mean": round(o["runs"] / o["timings"], 2),
                                  "warmup_mean": round(o["warmup"] / o["timings"], 2),
                                  "timed_ms_mean": round(o["timed_ms"] / o["timings"], 2)}
                             for op, o in sorted(self.ops.items()) if o["timings"]}
        return out


class CompileTally:
    """The compile stage from the candidates' records: compile requests made (`compiles`), graphs
    Dynamo compiled for them (`graphs`: graph breaks and recompiles add one each), the seconds of
    their compile sections and what of them was compiling (`compile_split`), and which compiled candidates were rejected anyway (by the verifier, by
    reason; after it: the committer's duplicates). Per accepted row, the compile work each row costs."""

    def __init__(self) -> None:
        self.compiles = self.graphs = self.verifier_accepted = 0
        self.compile_s = 0.0
        self.rejected: dict[str, int] = {}
        self.graphs_per_compile: dict[int, int] = {}
        self.split: dict[str, float] = {}  # dynamo_s, backend_s, share_wait_s (opsynth.verify.worker)

    def add(self, rec: dict) -> None:
        n = int(rec.get("compiles") or 0)
        self.compile_s += float((rec.get("stage_s") or {}).get("compile") or 0.0)
        if not n:
            return
        g = int(rec.get("graphs") or 0)
        for k, v in (rec.get("compile_split") or {}).items():
            self.split[k] = self.split.get(k, 0.0) + float(v)
        self.compiles += n
        self.graphs += g
        self.graphs_per_compile[g] = self.graphs_per_compile.get(g, 0) + 1
        if rec.get("accepted"):
            self.verifier_accepted += 1
        else:
            self.rejected[rec.get("reason") or "?"] = self.rejected.get(rec.get("reason") or "?", 0) + 1

    def summary(self, accepted: int | None = None) -> dict:
        out = {"compiles": self.compiles, "graphs": self.graphs, "compile_s": round(self.compile_s, 2),
               "compile_s_per_compile": round(self.compile_s / self.compiles, 4) if self.compiles else None,
               "graphs_per_compile": dict(sorted(self.graphs_per_compile.items())),
               "split_s_per_compile": {k: round(v / self.compiles, 4) for k, v in sorted(self.split.items())}
               if self.compiles else {},
               "compiled_then_rejected_by_verifier": dict(sorted(self.rejected.items()))}
        if accepted:
            out.update(compiles_per_accepted=round(self.compiles / accepted, 4),
                       graphs_per_accepted=round(self.graphs / accepted, 4),
                       compile_s_per_accepted=round(self.compile_s / accepted, 4),
                       compiled_then_rejected_after_verifier=self.verifier_accepted - accepted)
        return out


# ---- floors: how far the sustained rate is from what the device work needs ---------------------------

DEVICE_STAGES = {"eager_checks": "checks", "calibration": "checks", "compile": "compile", "timing": "timing"}


def floors(d: dict) -> dict:
    """The physical minimum per accepted row next to what the window took (see the module docstring).
    Stage seconds are summed over candidates (rejected ones too: their device work is part of each
    accepted row's cost); device seconds are per device, so the floors divide by the device count."""
    acc, ss = d.get("accepted") or 0, d.get("stage_seconds") or {}
    if not acc:
        return {}
    n_dev = d.get("devices") or 1
    busy = d.get("device_busy_sustained") or {}
    stages = {k: {"s_per_accepted": round(v / acc, 4),
                  "device_busy_share": busy.get(DEVICE_STAGES[k]) if k in DEVICE_STAGES and v > 0 else None}
              for k, v in ss.items()}
    timing = ss.get("timing", 0.0) / acc / n_dev
    checks = (ss.get("eager_checks", 0.0) + ss.get("calibration", 0.0)) / acc / n_dev
    wall = (d.get("sustained_s") or d.get("wall_s") or 0.0) / acc
    tim = d.get("timing") or {}
    out = {"stages": stages, "devices": n_dev,
           "wall_s_per_accepted_sustained": round(wall, 4),
           "timing_floor_s_per_accepted": round(timing, 4),
           "device_floor_s_per_accepted": round(timing + checks, 4),
           "accepted_per_min_at_timing_floor": round(60 / timing, 1) if timing else None,
           "accepted_per_min_at_device_floor": round(60 / (timing + checks), 1) if timing + checks else None,
           "timing_s_per_timed_candidate": tim.get("timing_s_per_timed_candidate"),
           "timed_candidates": tim.get("timed_candidates"),
           "timed_then_rejected": tim.get("timed_then_rejected"),
           "timed_then_rejected_by_verifier_reasons": tim.get("timed_then_rejected_by_verifier_reasons"),
           "timed_then_rejected_after_verifier": tim.get("timed_then_rejected_after_verifier"),
           "timed_runs_per_timing": {op: v["runs_mean"] for op, v in (tim.get("per_timing") or {}).items()},
           "timing_stops": tim.get("stops"),
           "compiles_per_accepted": (d.get("compile") or {}).get("compiles_per_accepted"),
           "compile_s_per_accepted": (d.get("compile") or {}).get("compile_s_per_accepted"),
           "graphs_per_compile": (d.get("compile") or {}).get("graphs_per_compile"),
           "compile_split_s_per_compile": (d.get("compile") or {}).get("split_s_per_compile"),
           "gap_to_timing_floor": round(wall / timing, 2) if timing else None,
           "gap_to_device_floor": round(wall / (timing + checks), 2) if timing + checks else None,
           "note": "timing floor: the timed runs, which hold the device alone (a hard minimum); device floor: "
                   "the checks and timing sections each run alone (checks may share the device, so the true "
                   "minimum lies between the two); sections include their Python overhead (upper bounds on "
                   "kernel time); per device"}
    return out


def print_floors(f: dict) -> None:
    if not f:
        return
    print(f"   {'floors':<14} {'s/accepted':>11} {'device busy':>12}   (busy: share of the sustained window, per device)")
    for k, v in sorted(f["stages"].items(), key=lambda kv: -kv[1]["s_per_accepted"]):
        share = v["device_busy_share"]
        print(f"   {k:<14} {v['s_per_accepted']:>11.3f} {'' if share is None else f'{share:.3f}':>12}")
    print(f"   sustained wall s per accepted row {f['wall_s_per_accepted_sustained']:.3f} on {f['devices']} device(s); "
          f"timing floor {f['timing_floor_s_per_accepted']:.3f} ({f['accepted_per_min_at_timing_floor']}/min, "
          f"gap {f['gap_to_timing_floor']}x); checks + timing floor {f['device_floor_s_per_accepted']:.3f} "
          f"({f['accepted_per_min_at_device_floor']}/min, gap {f['gap_to_device_floor']}x)")
    if f.get("timed_candidates"):
        print(f"   timing: {f['timing_s_per_timed_candidate']} s per timed candidate over {f['timed_candidates']}; "
              f"timed then rejected {f.get('timed_then_rejected')} (verifier "
              f"{f.get('timed_then_rejected_by_verifier_reasons')}, after it {f.get('timed_then_rejected_after_verifier')}); "
              f"timed runs per timing {f.get('timed_runs_per_timing')}; stops {f.get('timing_stops')}")
    if f.get("compiles_per_accepted") is not None:
        print(f"   compile: {f['compiles_per_accepted']} compiles and {f['compile_s_per_accepted']} s per accepted row; "
              f"graphs per compile {f.get('graphs_per_compile')}; per compile, of its section: "
              f"{f.get('compile_split_s_per_compile')} (Dynamo's frame compiles, their backend's part, "
              f"the wait for the memory share after code generation)")


# ---- the fresh-process baseline --------------------------------------------------------------------

def baseline_child(spec: dict) -> int:
    """One candidate at a time, each verified by a fresh `python -m opsynth.verify` process."""
    from opsynth.catalog import load_catalog
    from opsynth.graph import Sampler, SamplingError
    from opsynth.graph.cost import with_batch
    from opsynth.generate.config import CPU_SCALE, candidate_seed
    from opsynth.render import render_task
    from opsynth.verify.sizing import choose_batch

    cfg = compose(spec["overrides"])
    if cfg.sampler.scale is None:
        cfg.sampler.scale = 1.0 if spec["device"] == "cuda" else CPU_SCALE
    sampler = Sampler(cfg.sampler, load_catalog())
    kb = None
    if cfg.kb_check:
        from dataclasses import asdict

        from opsynth.dedup import KernelBenchIndex

        kb = KernelBenchIndex.from_config(asdict(cfg.dedup))
    vset = []
    for k, v in cfg.verify.to_dict().items():
        if k in ("n_workers", "device"):
            continue
        vset += ["--set", f"{k}={json.dumps(v)}"]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    work = Path(tempfile.mkdtemp(prefix="opsynth-baseline-"))
    out_path = Path(spec["out"])
    res = {"partial": True, "window_s": spec["seconds"], "candidates": 0, "accepted": 0, "kb_rejected": 0,
           "reasons": {}, "per_candidate_s": []}
    t0 = time.time()
    deadline = t0 + spec["seconds"]
    i = 0
    while time.time() < deadline:
        idx = BASELINE_SEED_OFFSET + i
        i += 1
        try:
            st = sampler.sample(candidate_seed(cfg.seed, idx))
        except SamplingError:
            res["reasons"]["sampling_failed"] = res["reasons"].get("sampling_failed", 0) + 1
            continue
        # Sized as the pipeline sizes it (the cost model, before verification).
        size = choose_batch(st.graph, sampler.catalog, st.seed, cfg.verify, spec["device"])
        if size.reason:
            res["reasons"][size.reason] = res["reasons"].get(size.reason, 0) + 1
            continue
        src = render_task(with_batch(st.graph, size.batch), sampler.catalog)
        if kb is not None and kb.check(src).rejected:
            res["kb_rejected"] += 1
            continue
        f = work / f"task_{idx}.py"
        f.write_text(src)
        c0 = time.time()
        cmd = [sys.executable, "-m", "opsynth.verify", str(f), "--device", spec["device"], "--workers", "1",
               "--backend", cfg.verify.compile_backend, *vset]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True,
                                start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            res["unfinished_at_end"] = 1
            break
        line = next((ln for ln in stdout.splitlines() if ln.startswith("{")), None)
        verdict = json.loads(line) if line else {"reason": f"verify_exit_{proc.returncode}", "accepted": False}
        res["candidates"] += 1
        res["accepted"] += bool(verdict.get("accepted"))
        r = verdict.get("reason", "?")
        res["reasons"][r] = res["reasons"].get(r, 0) + 1
        res["per_candidate_s"].append(round(time.time() - c0, 2))
        out_path.write_text(json.dumps(res, indent=1))
    wall = time.time() - t0
    res.update(partial=False, wall_s=round(wall, 2), accepted_per_min=round(60 * res["accepted"] / wall, 3),
               candidates_per_min=round(60 * res["candidates"] / wall, 3))
    out_path.write_text(json.dumps(res, indent=1))
    return 0


# ---- the parent: windows in children, one JSON --------------------------------------------------------

def _child(kind: str, spec: dict, env: dict, hard_s: float) -> dict | None:
    """Run a child with `spec`; kill it (its process group) after hard_s; return what it wrote."""
    spec_path = Path(spec["out"]).with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.Popen([sys.executable, __file__, f"--{kind}-child", str(spec_path)], env=env,
                            start_new_session=True)
    try:
        proc.wait(timeout=hard_s)
    except subprocess.TimeoutExpired:
        print(f"{kind} child ran past {hard_s:.0f} s: stopped; its last saved state is kept", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers (dask workers, verifier workers) of a finished child
    except ProcessLookupError:
        pass
    try:
        d = json.loads(Path(spec["out"]).read_text())
    except (OSError, ValueError):
        return None
    d["child_exit"] = proc.returncode
    return d


def _env(device: str, gpus: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONUNBUFFERED": "1"}
    if device == "cuda" and gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    return env


def _host_gpus() -> tuple[int, str]:
    """GPU count and the first one's name, without creating a CUDA context in this process (the
    windows need the memory): pynvml, else `nvidia-smi -L`."""
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if n else ""
        return n, name.decode() if isinstance(name, bytes) else name
    except Exception:  # noqa: BLE001
        pass
    try:
        lines = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.splitlines()
        lines = [ln for ln in lines if ln.startswith("GPU ")]
        name = lines[0].split(":", 1)[1].split("(")[0].strip() if lines else ""
        return len(lines), name
    except (OSError, subprocess.SubprocessError):
        return 0, ""


def _device_name(device: str) -> str:
    if device != "cuda":
        return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return _host_gpus()[1] or "cuda"


def _print_window(label: str, w: dict) -> None:
    print(f"\n== {label}: {w.get('accepted')} accepted of {w.get('candidates')} candidates in {w.get('wall_s')} s "
          f"(first result at {w.get('first_result_s')} s; teardown {w.get('teardown_s')} s)")
    print(f"   accepted/min {w.get('accepted_per_min')}   candidates/min {w.get('candidates_per_min')}   "
          f"acceptance {w.get('acceptance_rate')}   verified/min after the first result {w.get('verified_per_min_steady')}")
    if w.get("compile_deferrals"):  # compiles deferred to an earlier in-flight candidate's forward, and re-runs
        print(f"   compile deferrals (opsynth.generate.inflight): {w['compile_deferrals']}")
    print(f"   device busy (worker records) {w.get('gpu_busy_fraction')}   GPU util sampled {w.get('gpu_util_sampled_mean')}   "
          f"CPU {w.get('cpu_utilisation')} of {w.get('cpu_count')} cores   calibration steps/task {w.get('calib_steps_mean')}")
    for p in (w.get("busiest_processes") or [])[:4]:
        print(f"   process {p['pid']}: {p['core_share']} of a core  {p['cmdline'][:100]}")
    ss = w.get("stage_seconds") or {}
    total = sum(ss.values()) or 1.0
    if ss:
        print(f"   {'stage':<14} {'seconds':>9} {'share':>7} {'s/accepted':>11}")
        for k, v in ss.items():
            print(f"   {k:<14} {v:>9.1f} {100 * v / total:>6.1f}% {w['stage_seconds_per_accepted'].get(k, 0):>11.3f}")
    print(f"   start-up {w.get('startup_s')} s, then {w.get('sustained_s')} s sustained: "
          f"{w.get('accepted_per_min_sustained')} accepted/min   device busy by kind {w.get('device_busy_sustained')}")
    print_floors(w.get("floors") or {})
    if w.get("rejected"):
        print(f"   rejected: {w['rejected']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--minutes", type=float, default=7.0, help="wall time of each pipeline window (0: none)")
    ap.add_argument("--baseline-seconds", type=float, default=60.0, help="fresh-process baseline window (0: none)")
    ap.add_argument("--gpus", default="", help="GPU counts, one window each, e.g. 1,2 (on cpu: Dask workers)")
    ap.add_argument("--linear", type=int, default=0, help="also run n_tasks=N and 2N to completion; report the time ratio")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hydra override for every window, e.g. cluster.threads_per_worker=14")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/generate_throughput.json"))
    ap.add_argument("--keep", action="store_true", help="keep the windows' output folders (under /tmp)")
    ap.add_argument("--window-child", help=argparse.SUPPRESS)
    ap.add_argument("--baseline-child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.window_child:
        return window_child(json.loads(Path(a.window_child).read_text()))
    if a.baseline_child:
        return baseline_child(json.loads(Path(a.baseline_child).read_text()))

    overrides = [*device_overrides(a.device), *a.override]
    compose(overrides).validate()  # a bad override fails here, before any window
    gpus = [int(x) for x in a.gpus.split(",") if x.strip()] or [None]
    if a.device == "cuda" and any(gpus):
        have = _host_gpus()[0]
        if max(g for g in gpus if g) > have:
            ap.error(f"--gpus {a.gpus}: this host has {have} GPU(s)")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="opsynth-throughput-"))
    result: dict = {"device": _device_name(a.device), "device_kind": a.device, "overrides": overrides,
                    "window_minutes": a.minutes, "baseline_seconds": a.baseline_seconds,
                    "gpus": [g for g in gpus if g], "windows": {}, "partial": True,
                    "gpu_busy_source": "union of the verifier workers' recorded checks and timing sections, per GPU "
                                       "(gpu_util_sampled: pynvml utilisation, when available)"}

    def save() -> None:
        out.write_text(json.dumps(result, indent=1, default=str) + "\n")

    save()
    if a.minutes > 0:
        for g in gpus:
            label = f"{g}gpu" if g and a.device == "cuda" else (f"{g}workers" if g else "window")
            ov = list(overrides) + ([f"cluster.n_workers={g}"] if g and a.device == "cpu" else [])
            spec = {"mode": "window", "device": a.device, "overrides": ov, "seconds": 60 * a.minutes,
                    "output_dir": str(work / label), "out": str(work / f"{label}.json")}
            print(f"window {label}: {a.minutes} min of `pipelines.generate {' '.join(ov)}`", file=sys.stderr, flush=True)
            w = _child("window", spec, _env(a.device, g), hard_s=60 * a.minutes + 90)
            result["windows"][label] = w
            if w:
                _print_window(label, w)
            save()
        first = next((w for w in result["windows"].values() if w), None)
        if first and first.get("device"):
            result["device"] = first["device"]  # as the verifier workers name it
        if first:
            for k in ("accepted_per_min", "candidates_per_min", "acceptance_rate", "gpu_busy_fraction",
                      "gpu_util_sampled_mean", "cpu_utilisation", "stage_seconds", "stage_seconds_per_accepted",
                      "verified_per_min_steady", "calib_steps_mean", "startup_s", "sustained_s",
                      "accepted_per_min_sustained", "device_busy_sustained", "floors", "timing", "compile_deferrals"):
                result[k] = first.get(k)
        if a.device == "cuda":
            for g in gpus:
                w = result["windows"].get(f"{g}gpu")
                if g and w:
                    result[f"accepted_per_min_{g}gpu"] = w.get("accepted_per_min")
        else:
            for g in gpus:
                w = result["windows"].get(f"{g}workers")
                if g and w:
                    result[f"accepted_per_min_{g}workers"] = w.get("accepted_per_min")
        rates = [result["windows"][k].get("accepted_per_min") for k in result["windows"] if result["windows"][k]]
        if len(rates) >= 2 and rates[0]:
            result["scaling"] = round(rates[-1] / rates[0], 3)
        save()
    if a.baseline_seconds > 0:
        spec = {"device": a.device, "overrides": overrides, "seconds": a.baseline_seconds,
                "out": str(work / "baseline.json")}
        print(f"baseline: {a.baseline_seconds:.0f} s, one fresh `python -m opsynth.verify` per candidate",
              file=sys.stderr, flush=True)
        b = _child("baseline", spec, _env(a.device, gpus[0]), hard_s=a.baseline_seconds + 120)
        result["baseline"] = b
        result["baseline_accepted_per_min"] = (b or {}).get("accepted_per_min")
        if b:
            print(f"\n== baseline: {b.get('accepted')} accepted of {b.get('candidates')} verified in {b.get('wall_s')} s "
                  f"({b.get('accepted_per_min')}/min; per candidate {b.get('per_candidate_s')} s)")
        save()
    if a.linear:
        lin = {}
        for n in (a.linear, 2 * a.linear):
            spec = {"mode": "n_tasks", "device": a.device, "overrides": overrides, "n_tasks": n, "seconds": None,
                    "output_dir": str(work / f"linear{n}"), "out": str(work / f"linear{n}.json")}
            print(f"linear: n_tasks={n} to completion", file=sys.stderr, flush=True)
            w = _child("window", spec, _env(a.device, gpus[0]), hard_s=580)
            lin[str(n)] = w
            result["linear"] = lin
            save()
        w1, w2 = lin.get(str(a.linear)), lin.get(str(2 * a.linear))
        if w1 and w2 and not w1.get("partial") and not w2.get("partial"):
            result["linear_time_ratio"] = round(w2["wall_s"] / w1["wall_s"], 3)
            s1, s2 = w1["wall_s"] - (w1["first_result_s"] or 0), w2["wall_s"] - (w2["first_result_s"] or 0)
            result["linear_time_ratio_after_first_result"] = round(s2 / s1, 3) if s1 > 0 else None
            print(f"\n== linear: n_tasks {a.linear} in {w1['wall_s']} s, {2 * a.linear} in {w2['wall_s']} s: "
                  f"ratio {result['linear_time_ratio']} (after the first result: "
                  f"{result['linear_time_ratio_after_first_result']}; target <= 2.1)")
        save()
    result["partial"] = False
    save()
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    keys = ("device", "accepted_per_min", "candidates_per_min", "acceptance_rate", "baseline_accepted_per_min",
            "gpu_busy_fraction", "gpu_util_sampled_mean", "cpu_utilisation", "scaling", "linear_time_ratio",
            "startup_s", "accepted_per_min_sustained")
    print("\n" + json.dumps({k: result.get(k) for k in keys if k in result}, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
