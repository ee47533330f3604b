# Shared CUDA extension of the GPU precision and pass candidates (tests/reward/test_reward_kinds_gpu.py):
# one nvcc build for all of them. Every kernel runs on the current stream and every launch is checked.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float chain1(float v, float s, float b) {
    v = v * s + b;
    v = v > 0.f ? v : 0.f;
    return fabsf(v * 0.5f - 0.25f);
}

__global__ void chain_bf16_kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, long n, float s, float b) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = __float2bfloat16(chain1(__bfloat162float(x[i]), s, b));  // bf16 in memory, float in registers
}

__global__ void chain_kernel(const float* __restrict__ x, float* __restrict__ y, long n, float s, float b) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) y[i] = chain1(x[i], s, b);
}

static long blocks_for(long n) { return std::min<long>((n + 255) / 256, 65535L * 16); }

torch::Tensor chain_bf16(torch::Tensor x, double s, double b) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kBFloat16, "bfloat16 cuda tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    chain_bf16_kernel<<<blocks_for(n), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const __nv_bfloat16*>(xc.data_ptr<at::BFloat16>()),
        reinterpret_cast<__nv_bfloat16*>(y.data_ptr<at::BFloat16>()), n, (float)s, (float)b);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}

torch::Tensor chain(torch::Tensor x, double s, double b) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, "float cuda tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    chain_kernel<<<blocks_for(n), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), n, (float)s, (float)b);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}

__global__ void scale_relu_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, long n, long d) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < n; k += stride) {
        float v = x[k] * w[k % d];
        y[k] = v > 0.f ? v : 0.f;
    }
}

__global__ void scale_relu_grad_x(const float* __restrict__ g, const float* __restrict__ x, const float* __restrict__ w,
                                  float* __restrict__ gx, long n, long d) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < n; k += stride) {
        float wj = w[k % d];
        gx[k] = x[k] * wj > 0.f ? g[k] * wj : 0.f;
    }
}

__global__ void scale_relu_grad_w(const float* __restrict__ g, const float* __restrict__ x, const float* __restrict__ w,
                                  float* __restrict__ gw, long rows, long d, int wrong) {
    long j = blockIdx.x * (long)blockDim.x + threadIdx.x;  // one thread per feature, rows summed in order
    if (j >= d) return;
    float wj = w[j], acc = 0.f;
    for (long i = 0; i < rows; ++i) {
        float xv = x[i * d + j];
        if (wrong || xv * wj > 0.f) acc += g[i * d + j] * xv;  // wrong: forgets the relu's mask
    }
    gw[j] = acc;
}

torch::Tensor scale_relu(torch::Tensor x, torch::Tensor w) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, "float cuda tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel(), d = w.numel();
    scale_relu_kernel<<<blocks_for(n), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), n, d);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}

std::vector<torch::Tensor> scale_relu_backward(torch::Tensor g, torch::Tensor x, torch::Tensor w, bool wrong) {
    auto gc = g.contiguous(); auto xc = x.contiguous();
    auto gx = torch::empty_like(xc);
    auto gw = torch::empty_like(w);
    long n = xc.numel(), d = w.numel();
    auto stream = at::cuda::getCurrentCUDAStream();
    scale_relu_grad_x<<<blocks_for(n), 256, 0, stream>>>(gc.data_ptr<float>(), xc.data_ptr<float>(), w.data_ptr<float>(),
                                                         gx.data_ptr<float>(), n, d);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    scale_relu_grad_w<<<(d + 255) / 256, 256, 0, stream>>>(gc.data_ptr<float>(), xc.data_ptr<float>(), w.data_ptr<float>(),
                                                            gw.data_ptr<float>(), n / d, d, wrong ? 1 : 0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {gx, gw};
}
"""

_CPP = """
torch::Tensor chain_bf16(torch::Tensor x, double s, double b);
torch::Tensor chain(torch::Tensor x, double s, double b);
torch::Tensor scale_relu(torch::Tensor x, torch::Tensor w);
std::vector<torch::Tensor> scale_relu_backward(torch::Tensor g, torch::Tensor x, torch::Tensor w, bool wrong);
"""

ext = load_inline(
    name="opsynth_test_kinds_cuda_ext",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["chain_bf16", "chain", "scale_relu", "scale_relu_backward"],
    extra_cuda_cflags=["-O3"],
)
