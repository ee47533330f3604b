class ModelNew(nn.Module):
    """BLAS (the CPU side of cuBLAS-backed ops) through at::addmm from C++."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return ext.linear_aten(x, self.linear.weight, self.linear.bias)
