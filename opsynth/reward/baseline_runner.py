"""Baseline child: the task's Model, eager or under torch.compile, timed in blocks the parent asks for.

`python -m opsynth.reward.baseline_runner job.json`, one child per task and kind for a batch
(`opsynth.reward.baselines.BaselineServer`). Eager and compiled never share a process: once
torch.compile has run, its worker pool and OpenMP threads slowed the same process's eager calls
about 100x (15 ms against 0.15 ms) on a 2-core machine.

It builds Model and the call the task's kind times as the reference child does (`task_call`: same
init seed, same trial arguments; a backward task's forward and gradients), compiles it when asked
(the one torch.compile of this task in the batch), says it is ready, then times each block the
parent orders: every call gets fresh inputs (`timed_inputs.fresh_inputs`, the candidate's own
input maker, outside the timed region) and is timed by `timing.Timer`, as a candidate's timed round
is. It takes no lock: the parent holds the device lock and pauses everything else around a block;
on CUDA it first waits for the device to read idle (`timing.QuietDevice`: kernels a stopped
candidate queued before it was stopped still run) and says how long it waited.
"""

from __future__ import annotations

import random
import time
import traceback

from opsynth.reward.task_call import warm_torch as prewarm  # noqa: F401  (a parked child's start: ready_children)
from opsynth.runtime.child import child_main


def _model_and_inputs(job: dict):
    """Model and the call the task's kind times, as the reference child builds them (`task_call`),
    the first trial's arguments as the buffers and every trial's stacked for fresh inputs."""
    import torch

    from opsynth.render.task_file import load_task_module
    from opsynth.reward.task_call import build_model, call_args, job_kind, step_of
    from opsynth.reward.timed_inputs import stack_trials

    device = job["device"]
    mod = load_task_module(open(job["task_path"]).read())
    model, _ = build_model(mod, job, device)
    kind = job_kind(job)
    call, n_inputs, names = step_of(mod, model, kind)
    trials = [call_args(mod, model, kind, int(seed), device) for seed in job["trial_seeds"]]
    buffers = [x.clone() if isinstance(x, torch.Tensor) else x for x in trials[0]]
    return model, call, (kind, n_inputs, names), buffers, stack_trials(trials)


def _compiled(model, step: tuple):
    """torch.compile of Model, called as the task's kind calls it: for a backward task the
    forward and gradients of the compiled model (`task_file.task_step` over it)."""
    import torch

    from opsynth.render.task_file import task_step

    kind, n_inputs, names = step
    compiled = torch.compile(model)
    return task_step(compiled, kind, n_inputs, names, owner=model) if kind.backward else compiled


def _cache_hits() -> int:
    """Inductor's FX graph cache hits in this process so far (what a seeded cache saved)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("fxgraph_cache_hit", 0))


def run(job: dict) -> dict:
    import torch

    from opsynth.reward.rounds import Channel
    from opsynth.reward.timed_inputs import fresh_inputs
    from opsynth.runtime import child
    from opsynth.runtime.timing import QUIET_CAP_MS, QuietDevice, Timer

    if job.get("cpu_threads"):
        torch.set_num_threads(int(job["cpu_threads"]))
    chan = Channel(child.BUILD_FD)
    try:
        model, fn, step, buffers, stacked = _model_and_inputs(job)
        compile_s = hits = None
        seeded = 0
        with torch.no_grad():
            if job["kind"] == "compile":
                t0 = time.perf_counter()
                if job.get("compile_cache"):  # the task's caches of earlier batches (opsynth.reward.compile_cache)
                    from opsynth.reward.compile_cache import seed

                    seeded = seed(job["compile_cache"])
                fn = _compiled(model, step)
                fn(*buffers)  # compiles here, before the first block (the parent pauses this child meanwhile)
                compile_s = round(time.perf_counter() - t0, 3)
                hits = _cache_hits()
                print(f"[baseline] torch.compile took {compile_s:.1f} s ({seeded} cached files, FX graph cache hits {hits})", flush=True)
    except Exception:
        traceback.print_exc()
        chan.request({"kind": "baseline_failed", "error": traceback.format_exc()[-2000:]})
        return {"reason": "task_error"}
    timer = Timer(job["device"], job.get("flush_l2", True))
    # Before each block, the device idle (`timing.QuietDevice`): what a stopped candidate left running
    # on it would be timed into the baseline. A few probes now give the idle floor its first reading.
    quiet = QuietDevice(job["device"]) if job.get("quiet_device", True) else None
    if quiet is not None:
        quiet.warm()
    rng = random.Random(int(job["seed"]))
    order = chan.request({"kind": "baseline_ready", "compile_s": compile_s, "cache_hits": hits})
    blocks = 0
    with torch.no_grad():
        while order.get("ok") and not order.get("stop"):
            waited = quiet.wait(float(order.get("quiet_cap_ms", QUIET_CAP_MS))) if quiet is not None else None
            times = []
            for _ in range(int(order["calls"])):
                fresh_inputs(buffers, stacked, rng.randrange(1, 2**62))
                ms, out = timer.time_call(fn, buffers)
                del out  # freed before the next call's inputs are made (as in timing.time_rounds)
                times.append(ms)
            blocks += 1
            order = chan.request({"kind": "block_done", "ms": times, "quiet": waited})
    return {"reason": "ok", "blocks": blocks, "compile_s": compile_s}


if __name__ == "__main__":
    child_main(run)
