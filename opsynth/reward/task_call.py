"""The task's Model and the call its kind times, built the same way in every child that runs it.

The reference child (`reference_runner`) and the baseline children (`baseline_runner`) must time
and check the same thing: Model from the same init seed and mode, each call's arguments from its
seed (the inputs, and for a backward task the grad_outputs after them), and the step of the task's
kind (`opsynth.render.task_file.task_step`: the forward, or the forward and its gradients). One
copy here, so a baseline can never time a different call from the one the candidate is judged on.
"""

from __future__ import annotations


def job_kind(job: dict):
    """The task's kind as the parent put it in the job (`task_file.task_kind` of the task's code)."""
    from opsynth.render.task_file import TaskKind

    return TaskKind(**(job.get("task_kind") or {}))


def build_model(mod, job: dict, device: str):
    """(Model built from the job's init seed on `device`, in the task's mode; its init inputs)."""
    import torch

    from opsynth.render.task_file import set_mode

    init_inputs = list(mod.get_init_inputs())
    torch.manual_seed(int(job["init_seed"]))
    with torch.device(device):
        model = mod.Model(*init_inputs)
    return set_mode(model.to(device), job.get("task_mode")), init_inputs


def step_of(mod, model, kind):
    """(the call the task times, how many task inputs it takes, the parameters it differentiates):
    Model itself for a forward task; for a backward task `task_file.task_step` over it."""
    import torch

    from opsynth.render.task_file import parameter_names, task_step

    if not kind.backward:
        return model, None, None
    with torch.device("meta"):  # how many inputs a call has (the grad_outputs follow them)
        n_inputs = len(mod.get_inputs())
    names = parameter_names(model)
    return task_step(model, kind, n_inputs, names), n_inputs, names


def make_inputs(mod, seed: int, device: str) -> list:
    import torch

    torch.manual_seed(seed)
    with torch.device(device):
        return list(mod.get_inputs())


def call_args(mod, model, kind, seed: int, device: str) -> list:
    """One call's arguments: the task's inputs from `seed`, and for a backward task the
    grad_outputs drawn for them (`task_file.grad_outputs`), after them."""
    import torch

    from opsynth.render.task_file import grad_outputs
    from opsynth.reward.compare import as_output_list

    inputs = make_inputs(mod, seed, device)
    if not kind.backward:
        return inputs
    with torch.no_grad():
        shapes = as_output_list(model(*inputs))
    return [*inputs, *grad_outputs(shapes, seed)]


def warm_torch(args: dict) -> None:
    """A parked child's job-independent start (`opsynth.reward.ready_children`): torch's CPU pools and,
    on CUDA, the context, the first thing every runner's job would otherwise pay (seconds on a loaded
    H200). Nothing of the job is known yet and nothing untrusted has run."""
    import torch

    if args.get("cpu_threads"):
        torch.set_num_threads(int(args["cpu_threads"]))
    torch.ones(1 << 20).add_(1)
    if args.get("device") == "cuda":
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
