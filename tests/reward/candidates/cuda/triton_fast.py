import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def chain_kernel(x_ptr, y_ptr, n, s, b, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask) * s + b
    v = tl.maximum(v, 0.0)
    tl.store(y_ptr + offs, tl.abs(v * 0.5 - 0.25), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        chain_kernel[(triton.cdiv(n, 4096),)](x, y, n, self.scale, self.shift, BLOCK=4096)
        return y
