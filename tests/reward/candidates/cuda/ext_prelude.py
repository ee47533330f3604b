# Shared CUDA extension for the GPU test candidates (one nvcc build for all of them). It uses only
# the current stream, so the static pre-check passes it; the side-stream candidate brings its own kernel.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

__device__ __forceinline__ float chain1(float v, float s, float b) {
    v = v * s + b;
    v = v > 0.f ? v : 0.f;
    return fabsf(v * 0.5f - 0.25f);
}

__global__ void chain_kernel(const float* __restrict__ x, float* __restrict__ y, long n, float s, float b, int relu, int reps) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
        float r = 0.f;
        for (int k = 0; k < reps; ++k) {  // reps > 1: slow on purpose
            float v = x[i] * s + b;
            if (relu) v = v > 0.f ? v : 0.f;
            r = fabsf(v * 0.5f - 0.25f) + r * 1e-30f;
        }
        y[i] = r;
    }
}

static torch::Tensor launch(torch::Tensor x, double s, double b, int relu, int reps, cudaStream_t stream) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, "float cuda tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    int threads = 256;
    long blocks = std::min<long>((n + threads - 1) / threads, 65535L * 16);
    chain_kernel<<<blocks, threads, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n, (float)s, (float)b, relu, reps);
    return y;
}

torch::Tensor chain(torch::Tensor x, double s, double b) {
    return launch(x, s, b, 1, 1, at::cuda::getCurrentCUDAStream());
}

torch::Tensor chain_wrong(torch::Tensor x, double s, double b) {  // forgets the relu
    return launch(x, s, b, 0, 1, at::cuda::getCurrentCUDAStream());
}

torch::Tensor chain_slow(torch::Tensor x, double s, double b) {  // correct, 40x slower than it needs to be
    return launch(x, s, b, 1, 40, at::cuda::getCurrentCUDAStream());
}

__global__ void linear_relu_kernel(const float* X, const float* W, const float* B, float* Y, int n, int k, int m) {
    int i = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;  // naive: one thread per output
    if (i >= n || j >= m) return;
    float acc = B[j];
    for (int t = 0; t < k; ++t) acc += X[(long)i * k + t] * W[(long)j * k + t];
    Y[(long)i * m + j] = acc > 0.f ? acc : 0.f;
}

torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {
    auto xc = x.contiguous(); auto wc = w.contiguous();
    int n = xc.size(0), k = xc.size(1), m = wc.size(0);
    auto y = torch::empty({n, m}, xc.options());
    dim3 grid((m + 127) / 128, n);
    linear_relu_kernel<<<grid, 128, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(), n, k, m);
    return y;
}

torch::Tensor linear_cublas(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {  // cuBLAS via at::
    return at::relu(at::addmm(bias, x, w.t()));
}
"""

_CPP = """
torch::Tensor chain(torch::Tensor x, double s, double b);
torch::Tensor chain_wrong(torch::Tensor x, double s, double b);
torch::Tensor chain_slow(torch::Tensor x, double s, double b);
torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor bias);
torch::Tensor linear_cublas(torch::Tensor x, torch::Tensor w, torch::Tensor bias);
"""

ext = load_inline(
    name="opsynth_test_cuda_ext",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["chain", "chain_wrong", "chain_slow", "linear_relu", "linear_cublas"],
    extra_cuda_cflags=["-O3"],
)
