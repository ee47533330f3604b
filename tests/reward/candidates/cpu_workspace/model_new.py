# CUDA-Agent workspace layout (CPU flavour): kernels/ are built into `cuda_extension` by the harness.
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        cuda_extension.chain_raw(x.data_ptr(), y.data_ptr(), x.numel(), self.scale, self.shift)
        return y
