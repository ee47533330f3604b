class ModelNew(nn.Module):
    """A correct forward, a wrong weight gradient."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        return ScaleRelu.apply(x, self.weight, True)
