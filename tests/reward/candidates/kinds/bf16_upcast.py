class ModelNew(nn.Module):
    """Widens the input to float32, runs a float32 kernel, casts back: a float32 computation."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return ext.chain(x.float(), self.scale, self.shift).to(torch.bfloat16)
