# The autograd.Function of the backward candidates (appended after the CPU prelude).


class ScaleRelu(torch.autograd.Function):
    """relu(x * w) with a backward of the extension's own kernel (`wrong`: a wrong weight gradient)."""

    @staticmethod
    def forward(ctx, x, w, wrong=False):
        ctx.save_for_backward(x, w)
        ctx.wrong = wrong
        return ext.scale_relu(x, w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx, gw = ext.scale_relu_backward(g, x, w, ctx.wrong)
        return gx, gw, None
