"""A task's forward cost, as the reward's reference child asks for it (the physical floor's report)."""

import torch

from opsynth.render.cost import forward_cost


def test_a_linear_forward_costs_its_multiply_adds_and_moves_its_tensors():
    m = torch.nn.Linear(8, 4)
    c = forward_cost(m, [torch.randn(2, 8)])
    assert [k.name for k in c.kernels] == ["addmm"]
    assert c.flops == 2 * 2 * 8 * 4  # one multiply and one add per (row, out, in)
    assert c.bytes == 4 * (2 * 8 + 8 * 4 + 4 + 2 * 4)  # x, weight, bias read; out written (fp32)
