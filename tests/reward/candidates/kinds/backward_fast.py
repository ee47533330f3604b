class ModelNew(nn.Module):
    """Forward and backward in the extension's own kernels, through an autograd.Function."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        return ScaleRelu.apply(x, self.weight)
