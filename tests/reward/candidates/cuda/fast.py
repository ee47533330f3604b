class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return ext.chain(x, self.scale, self.shift)
