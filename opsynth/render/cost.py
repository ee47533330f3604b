"""The kernel cost of one forward of a task's model: a fact about the task, like its ops and sizes.

Counted on the task's own model and inputs by the cost model's recorder (`opsynth.graph.cost`). The
reward's reference child asks for it here (for the physical floor's report: FLOPs and bytes of the
eager forward); the reward does not import the graph room itself.
"""

from __future__ import annotations


def forward_cost(fn, args):
    """`opsynth.graph.cost.forward_cost(fn, args)`: a `GraphCost` (kernels, FLOPs, bytes, peak)."""
    from opsynth.graph.cost import forward_cost as count

    return count(fn, args)
