class ModelNew(nn.Module):
    """Reads bfloat16 but returns float32."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return ext.chain_bf16_to_f32(x, self.scale, self.shift)
