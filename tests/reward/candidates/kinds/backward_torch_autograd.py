class TorchBackward(torch.autograd.Function):
    """Its own forward kernel, but the backward is torch operators (autograd's own formulas)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return ext.scale_relu(x, w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        on = (x * w > 0).to(g.dtype)
        return g * on * w, (g * on * x).sum(0)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        return TorchBackward.apply(x, self.weight)
