class ModelNew(nn.Module):
    """Its own forward kernel, called directly: the output has no gradient."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        return ext.scale_relu(x, self.weight)
