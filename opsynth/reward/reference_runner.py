"""Reference child: Model's weights, fresh inputs, reference outputs, the timed rounds' fingerprints.

`python -m opsynth.reward.reference_runner job.json`. Seeds come from the parent; the candidate only
ever sees the inputs file, after this child has exited.
"""

from __future__ import annotations

import time
import traceback

from opsynth.reward.compare import as_output_list
from opsynth.reward.task_call import warm_torch as prewarm  # noqa: F401  (a parked child's start: ready_children)
from opsynth.runtime.child import child_main, device_checks, device_lock


def _to_cpu(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return [_to_cpu(v) for v in x]
    return x


def _read_plan() -> dict | None:
    """The timed rounds' plan (seeds, rounds kept in full): on stdin, never on disk."""
    import json
    import sys

    raw = sys.stdin.buffer.read()
    return json.loads(raw) if raw.strip() else None


def _hand_data_over(facts: dict) -> None:
    """Tell the parent that the candidates' data (weights, inputs; `init_path`, `data_path`) is written,
    with what their jobs need of this child's results, before the timed rounds: the task's measuring
    children start on it while this child times, checks and hands its outputs over (the parent holds
    their timing until this child is done). A refusal leaves the files for the parent to read at the end."""
    from opsynth.reward.rounds import Channel
    from opsynth.runtime import child

    Channel(child.BUILD_FD).request({"kind": "reference_data", **facts})


def _timed_rounds(job: dict, call, trials: list, plan: dict, device: str, outputs0: list, host) -> tuple[dict, dict]:
    """The reference side of the timed rounds (opsynth.reward.rounds): for every round's fresh
    inputs, Model's fingerprints and their tolerance; in full for the kept rounds. The rounds every
    candidate's main pass may run go through the rounds protocol with the device to itself, the same
    code as the candidate's rounds, so the parent's clock sees the same overhead (the tolerances, a
    pass over each output candidates' rounds do not make, are reported as the reference's own work
    and taken out of it). The rounds only a longer pass or a re-measure can reach come after, with
    the device shared with other checks and nothing clocking them (`untimed_rounds`). `outputs0`: the
    first trial's outputs, the layout of every round's; `host`: the child's `host_copies.HostCopies`.
    Returns the rounds and the seconds of each part."""
    import torch

    from opsynth.runtime import child
    from opsynth.reward.guards import poison_fill
    from opsynth.reward.rounds import Channel, run_rounds, untimed_rounds
    from opsynth.reward.timed_inputs import stack_trials, tolerance
    from opsynth.runtime.timing import Timer

    contents = [[x.to(device) if isinstance(x, torch.Tensor) else x for x in t] for t in trials]
    buffers = [x.clone() if isinstance(x, torch.Tensor) else x for x in contents[0]]
    stacked = stack_trials(contents)
    atol, rtol = float(plan["atol"]), float(plan["rtol"])
    scale: dict = {}

    def poison(outs):
        for o in outs:
            poison_fill(o)  # as the candidate's rounds do

    timer = Timer(device, job.get("flush_l2", True))
    chan = Channel(child.BUILD_FD)
    seeds = plan["seeds"]
    t_lock = time.perf_counter()
    def tol(j, outs):
        scale[j] = tolerance(outs, atol, rtol)

    # The kept rounds' host copies go to memory allocated here, before the lock (`host_copies`)
    host.reserve([[list(o.shape), str(o.dtype).replace("torch.", "")] for o in outputs0], len(plan.get("keep") or ()))
    with device_lock(job), torch.no_grad():
        t0 = time.perf_counter()
        kept, fps = run_rounds(call, buffers, stacked, timer, chan, 0, after_report=poison, own_work=tol, keep_into=host.keep)
        chan.request({"kind": "timing_done"})
        t1 = time.perf_counter()
    kept = {j: host.land(o) for j, o in kept.items()}  # held on the device until the lock was let go
    land_s = time.perf_counter() - t1
    keys: dict = {}
    if len(fps) < len(seeds):
        with device_checks(job), torch.no_grad():
            more, keys = untimed_rounds(call, buffers, stacked, {j: seeds[j] for j in range(len(fps), len(seeds))}, after=tol)
            fps.update(more)
    t2 = time.perf_counter()
    rounds = [{"fp": fps[j], "scale": scale[j], **({"key": keys[j]} if j in keys else {})} for j in range(len(seeds))]
    times = {"rounds_s": round(t1 - t0, 3), "timing_wait_s": round(t0 - t_lock, 3), "land_s": round(land_s, 3),
             "untimed_rounds_s": round(t2 - t1 - land_s, 3)}
    return {"rounds": rounds, "round_outputs": kept}, times


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
    """The device is held as each part needs it: shared with other checks for the outputs and the
    flop count, to itself (`device_lock`) for the timed rounds only, not at all for saving. The
    baselines are not timed here: eager and torch.compile each have a child of their own
    (`baseline_runner`)."""
    import torch  # noqa: F401  (import outside the device lock)

    return _run(job)


def _run(job: dict) -> dict:
    """Reference outputs, the timed rounds' fingerprints, the weights and inputs for the candidates.
    The call is the task's step (`task_call.step_of`): Model's forward, or for a backward task its
    forward and gradients."""
    import torch

    from opsynth.render.task_file import load_task_module
    from opsynth.reward.task_call import build_model, job_kind, step_of

    if job.get("cpu_threads"):
        torch.set_num_threads(int(job["cpu_threads"]))
    device = job["device"]
    source = open(job["task_path"]).read()
    t0 = time.perf_counter()
    with device_checks(job):
        try:
            mod = load_task_module(source)
            model, init_inputs = build_model(mod, job, device)
            kind = job_kind(job)
            call, n_inputs, names = step_of(mod, model, kind)
        except Exception:
            traceback.print_exc()
            return {"reason": "task_error"}
        # On CUDA the outputs stay on the device (clones) until after the timed rounds: their copy to
        # the host is then off the path to the candidates' data (`host_copies`)
        from opsynth.reward import host_copies

        host = host_copies.for_job(torch, job, device == "cuda")
        out = _outputs(job, mod, model, kind, call, device, source, host.keep if host.hold_left else _to_cpu)
    if "reason" in out:
        return out
    trials, outputs, second_inputs, second_outputs = out["trials"], out["outputs"], out["second_inputs"], out["second_outputs"]

    meta = lambda outs: [[list(o.shape), str(o.dtype).replace("torch.", "")] for o in outs]  # noqa: E731
    facts = {"output_meta": {"trials": meta(outputs[0]), "second": meta(second_outputs) if second_outputs else None},
             "has_second": second_inputs is not None, "n_inputs": n_inputs, "param_names": names}
    t_save = time.perf_counter()
    torch.save(init_inputs, job["init_path"])
    torch.save(
        {
            "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "trials": trials,
            "second": second_inputs,
        },
        job["data_path"],
    )
    save_s = time.perf_counter() - t_save
    if job.get("early_data"):
        _hand_data_over(facts)
    plan = _read_plan()
    t1 = time.perf_counter()
    rounds, round_times = _timed_rounds(job, call, trials, plan, device, outputs[0], host) if plan else (None, {})
    t2 = time.perf_counter()
    with device_checks(job):
        flops = _flops(model, trials[0][:n_inputs] if kind.backward else trials[0], device)
    t3 = time.perf_counter()
    from opsynth.reward.outputs_file import channel_writer

    t_land = time.perf_counter()
    outputs, second_outputs = [host.land(o) for o in outputs], host.land(second_outputs)
    t4 = time.perf_counter()
    channel_writer(torch.save)({"trials": outputs, "second": second_outputs, **(rounds or {})})  # the parent's channel, no file
    # Where the child's time goes (diagnostics): the task and its outputs, the rounds (timed and untimed), the
    # flop count, the candidates' data saved, the outputs into the parent's channel
    parts = {"outputs_s": t_save - t0, "save_s": save_s, "data_at_s": t1 - t0, "all_rounds_s": t2 - t1, "flops_s": t3 - t2,
             "channel_s": time.perf_counter() - t4, "land_s": round_times.pop("land_s", 0.0),  # land_s: part of all_rounds_s
             "outputs_land_s": t4 - t_land}
    return {
        "reason": "ok",
        "parts": {k: round(v, 3) for k, v in parts.items()},
        **facts,
        **round_times,
        **flops,
    }


def _outputs(job: dict, mod, model, kind, call, device: str, source: str, keep=_to_cpu) -> dict:
    """The reference's outputs for each trial's inputs and for the second shape (checked work), each
    through `keep` (to the host; or `HostCopies.keep`, held on the device)."""
    import torch

    from opsynth.render.task_file import load_task_module, with_second_shape
    from opsynth.reward.task_call import call_args

    trials, outputs = [], []
    with torch.no_grad():
        for seed in job["trial_seeds"]:
            inputs = call_args(mod, model, kind, int(seed), device)
            out = as_output_list(call(*inputs))
            if not all(isinstance(o, torch.Tensor) for o in out):
                return {"reason": "task_error", "error": "a gradient of Model does not exist" if kind.backward
                        else "Model output is not tensors"}
            trials.append(_to_cpu(inputs))
            outputs.append(keep(out))
        second_inputs = second_outputs = None
        if job.get("second_shape"):
            src2 = with_second_shape(source)
            if src2 is not None:
                mod2 = load_task_module(src2, "task_module_second")
                inputs = call_args(mod2, model, kind, int(job["second_seed"]), device)
                second_inputs = _to_cpu(inputs)
                second_outputs = keep(as_output_list(call(*inputs)))
    return {"trials": trials, "outputs": outputs, "second_inputs": second_inputs, "second_outputs": second_outputs}


if __name__ == "__main__":
    child_main(run)
