import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A learned per-feature scale, then relu: forward and backward."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        x = x * self.weight
        x = torch.relu(x)
        return x


batch_size = 64
dim = 1024
task_pass = "backward"


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
