import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """nn.Linear -> torch.relu"""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        x = torch.relu(x)
        return x


batch_size = 1024
in_features = 1024
out_features = 1024


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
