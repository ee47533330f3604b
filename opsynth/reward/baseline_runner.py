"""Baseline child: the task's Model, eager or under torch.compile, timed in blocks the parent asks for.

`python -m opsynth.reward.baseline_runner job.json`, one child per task and kind for a batch
(`opsynth.reward.baselines.BaselineServer`). Eager and compiled never share a process: once
torch.compile has run, its worker pool and OpenMP threads slowed the same process's eager calls
about 100x (15 ms against 0.15 ms) on a 2-core machine.

It builds Model as the reference child does (same init seed, same trial inputs), compiles it when
asked (the one torch.compile of this task in the batch), says it is ready, then times each block
the parent orders: every call gets fresh inputs (`timed_inputs.fresh_inputs`, the candidate's own
input maker, outside the timed region) and is timed by `timing.Timer`, as a candidate's timed round
is. It takes no lock: the parent holds the device lock and pauses everything else around a block.
"""

from __future__ import annotations

import random
import time
import traceback

from opsynth.runtime.sandbox import child_main


def _model_and_inputs(job: dict):
    import torch

    from opsynth.render.task_file import load_task_module, set_mode
    from opsynth.reward.timed_inputs import stack_trials

    device = job["device"]
    mod = load_task_module(open(job["task_path"]).read())
    init_inputs = list(mod.get_init_inputs())
    torch.manual_seed(int(job["init_seed"]))
    with torch.device(device):
        model = mod.Model(*init_inputs)
    model = set_mode(model.to(device), job.get("task_mode"))
    trials = []
    for seed in job["trial_seeds"]:
        torch.manual_seed(int(seed))
        with torch.device(device):
            trials.append(list(mod.get_inputs()))
    buffers = [x.clone() if isinstance(x, torch.Tensor) else x for x in trials[0]]
    return model, buffers, stack_trials(trials)


def run(job: dict) -> dict:
    import torch

    from opsynth.reward.rounds import Channel
    from opsynth.reward.timed_inputs import fresh_inputs
    from opsynth.runtime import sandbox
    from opsynth.runtime.timing import Timer

    if job.get("cpu_threads"):
        torch.set_num_threads(int(job["cpu_threads"]))
    chan = Channel(sandbox.BUILD_FD)
    try:
        model, buffers, stacked = _model_and_inputs(job)
        fn = model
        compile_s = None
        with torch.no_grad():
            if job["kind"] == "compile":
                t0 = time.perf_counter()
                fn = torch.compile(model)
                fn(*buffers)  # compiles here, before the first block (the parent pauses this child meanwhile)
                compile_s = round(time.perf_counter() - t0, 3)
                print(f"[baseline] torch.compile took {compile_s:.1f} s", flush=True)
    except Exception:
        traceback.print_exc()
        chan.request({"kind": "baseline_failed", "error": traceback.format_exc()[-2000:]})
        return {"reason": "task_error"}
    timer = Timer(job["device"], job.get("flush_l2", True))
    rng = random.Random(int(job["seed"]))
    order = chan.request({"kind": "baseline_ready", "compile_s": compile_s})
    blocks = 0
    with torch.no_grad():
        while order.get("ok") and not order.get("stop"):
            times = []
            for _ in range(int(order["calls"])):
                fresh_inputs(buffers, stacked, rng.randrange(1, 2**62))
                ms, out = timer.time_call(fn, buffers)
                out = None  # freed before the next call's inputs are made (as in timing.time_rounds)
                times.append(ms)
            blocks += 1
            order = chan.request({"kind": "block_done", "ms": times})
    return {"reason": "ok", "blocks": blocks, "compile_s": compile_s}


if __name__ == "__main__":
    child_main(run)
