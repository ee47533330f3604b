class ModelNew(nn.Module):
    """The C++ side calls at:: compute ops: they go through the dispatcher and are caught."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return ext.chain_aten(x, self.scale, self.shift)
