class ModelNew(nn.Module):
    """Correct naive triple-loop matmul: far slower than BLAS."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # holds the copied weights only

    def forward(self, x):
        return ext.linear_relu(x, self.linear.weight, self.linear.bias)
