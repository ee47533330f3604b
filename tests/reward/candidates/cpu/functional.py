import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        y = ext.chain(x, self.scale, self.shift)
        return F.relu(y)
