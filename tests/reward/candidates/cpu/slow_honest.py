class ModelNew(nn.Module):
    """The class-method attacks' kernel without the attack: correct and too slow to beat eager."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return atk.slow_chain(x, self.scale, self.shift, 8)
