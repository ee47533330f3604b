class ModelNew(nn.Module):
    """Correct and fused: one parallel pass over memory instead of six."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        return ext.chain(x, self.scale, self.shift)
