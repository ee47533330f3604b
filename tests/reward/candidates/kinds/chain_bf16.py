import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Six elementwise ops in a row, in bfloat16."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        x = x * self.scale
        x = x + self.shift
        x = torch.relu(x)
        x = x * 0.5
        x = x - 0.25
        x = torch.abs(x)
        return x


batch_size = 64
dim = 4096
dtype = torch.bfloat16


def get_inputs():
    return [torch.randn(batch_size, dim, dtype=dtype)]


def get_init_inputs():
    return [2.0, 1.0]
