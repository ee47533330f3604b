"""Reference child: Model's weights, fresh inputs, reference outputs, and eager / compile timings.

`python -m opsynth.reward.reference_runner job.json`. Seeds come from the parent; the candidate only
ever sees the inputs file, after this child has exited.
"""

from __future__ import annotations

import time
import traceback

from opsynth.reward.compare import as_output_list
from opsynth.runtime.child import child_main, device_lock


def _to_cpu(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return [_to_cpu(v) for v in x]
    return x


def _make_inputs(mod, seed: int, device: str):
    import torch

    torch.manual_seed(seed)
    with torch.device(device):
        return list(mod.get_inputs())


def _read_plan() -> dict | None:
    """The timed rounds' plan (seeds, rounds kept in full): on stdin, never on disk."""
    import json
    import sys

    raw = sys.stdin.buffer.read()
    return json.loads(raw) if raw.strip() else None


def _timed_rounds(job: dict, call, trials: list, plan: dict, device: str) -> dict:
    """The reference side of the timed rounds (opsynth.reward.rounds): for every round's fresh
    inputs, Model's fingerprints and their tolerance; in full for the kept rounds.
    The same code as the candidate's rounds, so the parent's clock sees the same overhead."""
    import torch

    from opsynth.runtime import child
    from opsynth.reward.guards import poison_fill
    from opsynth.reward.rounds import Channel, run_rounds
    from opsynth.reward.timed_inputs import stack_trials, tolerance
    from opsynth.runtime.timing import Timer

    contents = [[x.to(device) if isinstance(x, torch.Tensor) else x for x in t] for t in trials]
    buffers = [x.clone() if isinstance(x, torch.Tensor) else x for x in contents[0]]
    stacked = stack_trials(contents)
    scale: dict = {}
    current: dict = {}

    def check(j, outs):
        current["j"] = j

    def after(outs):
        j = current["j"]
        scale[j] = tolerance(outs, float(plan["atol"]), float(plan["rtol"]))
        for o in outs:
            poison_fill(o)  # as the candidate's rounds do

    timer = Timer(device, job.get("flush_l2", True))
    chan = Channel(child.BUILD_FD)
    with torch.no_grad():
        kept, fps = run_rounds(call, buffers, stacked, timer, chan, range(len(plan["seeds"])), check_call=check, after_report=after)
    chan.request({"kind": "timing_done"})
    rounds = [{"fp": fps[j], "scale": scale[j]} for j in range(len(plan["seeds"]))]
    return {"rounds": rounds, "round_outputs": kept}


def _flops(model, inputs: list, device: str) -> dict:
    """FLOPs and bytes of one eager forward (opsynth.render.cost), for the physical floor's report."""
    import torch

    from opsynth.render.cost import forward_cost

    try:
        args = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
        c = forward_cost(model, args)
        return {"flops": c.flops, "eager_bytes": c.bytes}
    except Exception:  # noqa: BLE001 - a count is a report, never a reason to fail the task
        return {"flops": None, "eager_bytes": None}


def run(job: dict) -> dict:
    """Everything that touches the device runs under the device lock, except torch.compile's
    compilation (seconds to a minute of CPU work for each new task), which would otherwise hold up
    every candidate's measurement behind it."""
    import torch  # noqa: F401  (import outside the device lock)

    with device_lock(job):
        result, compile_job = _run(job)
    if compile_job is not None:
        _compile_baseline(job, result, *compile_job)
    return result


def _compile_baseline(job: dict, result: dict, model, buffers, contents, timer, warmup, repeats) -> None:
    import torch

    from opsynth.render.task_file import task_step
    from opsynth.runtime.timing import time_forward

    try:
        t0 = time.perf_counter()
        compiled = torch.compile(model)
        kind = _kind(job)
        if kind.backward:  # forward and backward of the compiled model, on the same gradients
            compiled = task_step(compiled, kind, result["n_inputs"], result["param_names"], owner=model)
        with torch.no_grad():
            compiled(*buffers)  # compiles (CPU work) outside the lock; one forward on the device
        print(f"[reference] torch.compile took {time.perf_counter() - t0:.1f} s", flush=True)
        with device_lock(job), torch.no_grad():
            result["compile_ms"], _ = time_forward(compiled, buffers, contents, timer, warmup, repeats)
        print(f"[reference] compile {result['compile_ms']:.4f} ms", flush=True)
    except Exception:
        traceback.print_exc()
        print("[reference] torch.compile baseline failed; reward 3 is out of reach", flush=True)


def _kind(job: dict):
    from opsynth.render.task_file import TaskKind

    return TaskKind(**(job.get("task_kind") or {}))


def _call_args(mod, model, kind, seed: int, device: str):
    """One call's arguments: the task's inputs from `seed`, and for a backward task the
    grad_outputs drawn for them (`task_file.grad_outputs`), after them."""
    import torch

    from opsynth.render.task_file import grad_outputs

    inputs = _make_inputs(mod, seed, device)
    if not kind.backward:
        return inputs
    with torch.no_grad():
        shapes = as_output_list(model(*inputs))
    return [*inputs, *grad_outputs(shapes, seed)]


def _run(job: dict):
    """Reference outputs and the eager timing (under the device lock); returns (result, what the
    compile baseline needs, or None). The call is the task's step (`task_file.task_step`): Model's
    forward, or for a backward task its forward and gradients."""
    import torch

    from opsynth.render.task_file import load_task_module, parameter_names, set_mode, task_step, with_second_shape
    from opsynth.reward.compare import as_output_list
    from opsynth.runtime.timing import Timer, time_forward

    if job.get("cpu_threads"):
        torch.set_num_threads(int(job["cpu_threads"]))
    device = job["device"]
    source = open(job["task_path"]).read()
    try:
        mod = load_task_module(source)
        init_inputs = list(mod.get_init_inputs())
        torch.manual_seed(int(job["init_seed"]))
        with torch.device(device):
            model = mod.Model(*init_inputs)
        model = set_mode(model.to(device), job.get("task_mode"))
        kind = _kind(job)
        n_inputs = None
        if kind.backward:
            with torch.device("meta"):  # how many inputs a call has (the grad_outputs follow them)
                n_inputs = len(mod.get_inputs())
        names = parameter_names(model) if kind.backward else None
        call = task_step(model, kind, n_inputs, names)
    except Exception:
        traceback.print_exc()
        return {"reason": "task_error"}, None

    trials, outputs = [], []
    with torch.no_grad():
        for seed in job["trial_seeds"]:
            inputs = _call_args(mod, model, kind, int(seed), device)
            out = as_output_list(call(*inputs))
            if not all(isinstance(o, torch.Tensor) for o in out):
                return {"reason": "task_error", "error": "a gradient of Model does not exist" if kind.backward
                        else "Model output is not tensors"}, None
            trials.append(_to_cpu(inputs))
            outputs.append(_to_cpu(out))
        second_inputs = second_outputs = None
        if job.get("second_shape"):
            src2 = with_second_shape(source)
            if src2 is not None:
                mod2 = load_task_module(src2, "task_module_second")
                inputs = _call_args(mod2, model, kind, int(job["second_seed"]), device)
                second_inputs = _to_cpu(inputs)
                second_outputs = _to_cpu(as_output_list(call(*inputs)))

    meta = lambda outs: [[list(o.shape), str(o.dtype).replace("torch.", "")] for o in outs]  # noqa: E731
    plan = _read_plan()
    rounds = _timed_rounds(job, call, trials, plan, device) if plan else None
    torch.save(init_inputs, job["init_path"])
    torch.save(
        {
            "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "trials": trials,
            "second": second_inputs,
        },
        job["data_path"],
    )
    torch.save({"trials": outputs, "second": second_outputs, **(rounds or {})}, job["ref_outputs_path"])
    result = {
        "reason": "ok",
        "output_meta": {"trials": meta(outputs[0]), "second": meta(second_outputs) if second_outputs else None},
        "has_second": second_inputs is not None,
        "eager_ms": None,
        "compile_ms": None,
        "n_inputs": n_inputs,
        "param_names": names,
        **_flops(model, trials[0][:n_inputs] if kind.backward else trials[0], device),
    }
    if not job.get("measure_baselines"):
        return result, None

    warmup, repeats = job["timing"]
    timer = Timer(device, job.get("flush_l2", True))
    contents = [[x.to(device) if isinstance(x, torch.Tensor) else x for x in t] for t in trials]
    buffers = [x.clone() if isinstance(x, torch.Tensor) else x for x in contents[0]]
    with torch.no_grad():
        result["eager_ms"], _ = time_forward(call, buffers, contents, timer, warmup, repeats)
        print(f"[reference] eager {result['eager_ms']:.4f} ms", flush=True)
    if job.get("compile_baseline"):
        return result, (model, buffers, contents, timer, warmup, repeats)
    return result, None


if __name__ == "__main__":
    child_main(run)
