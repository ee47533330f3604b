class ModelNew(nn.Module):
    """half_claim's kernel without the attack: correct and too slow to beat eager (on the chain task
    at batch 768, ~1.5x eager and ~12 ms on the CPU: slow enough that the parent's absolute slacks
    around the call hide none of what half_claim forges)."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return atk.slow_chain(x, self.scale, self.shift, 7)
