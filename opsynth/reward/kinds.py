"""What the reward does for a task's precision and pass, in words for the policy's prompt.

The task's code states its kind (`opsynth.render.task_file.task_kind`); the rules `precision` and
`backward` of `reasons.RULES` say what is enforced. This says it for one task, so the prompt
names the precision, the tolerance and the pass the candidate is judged in.
"""

from __future__ import annotations

from opsynth.render.task_file import BACKWARD_LOSS, task_kind, tolerance


def kind_brief(task_code: str) -> str:
    """One paragraph for a task that is not float32 forward (empty for one that is, or whose code
    states an unknown kind: the reward then reports the task's own error)."""
    try:
        kind = task_kind(task_code)
    except ValueError:
        return ""
    if kind.is_default:
        return ""
    parts = []
    if kind.dtype != "float32":
        tol = tolerance(kind.dtype)
        parts.append(f"This task is in {kind.dtype} (`dtype = torch.{kind.dtype}`): its inputs and `Model`'s parameters "
                     f"are {kind.dtype}, and ModelNew's parameters, buffers and outputs must be too; outputs are compared "
                     f"within atol = {tol.atol:g}, rtol = {tol.rtol:g}. Compute in {kind.dtype} kernels (float32 registers "
                     "and accumulators inside them are fine); a float32 computation cast back scores -1.")
    else:
        parts.append("This task is in float32.")
    if kind.backward:
        parts.append(f"It is a backward task (`task_pass = \"backward\"`): the harness asks ModelNew for the output and "
                     f"{BACKWARD_LOSS}, and times forward and backward together against eager and torch.compile doing "
                     "the same. Write the backward as your own kernels in a `torch.autograd.Function`.")
    return " ".join(parts)
