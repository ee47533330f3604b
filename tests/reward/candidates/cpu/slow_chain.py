class ModelNew(nn.Module):
    """Correct and slow: the fused kernel run eight times over, the last result returned (about twice eager)."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        y = ext.chain(x, self.scale, self.shift)
        for _ in range(7):
            y = ext.chain(x, self.scale, self.shift)
        return y
