class ModelNew(nn.Module):
    """bfloat16 in and out, float arithmetic in registers: what a reduced-precision kernel does."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return ext.chain_bf16(x, self.scale, self.shift)
