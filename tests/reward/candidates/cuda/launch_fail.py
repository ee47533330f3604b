# A launch that fails and leaves stale output: a persistent output buffer (one per size); after the
# 7 calls checked first, the kernel asks for 1 MiB of dynamic shared memory, so its launch fails,
# and nothing checks. With SWALLOW the extension also clears the error (cudaGetLastError).
SWALLOW = False

_FAIL = load_inline(
    name="opsynth_test_launch_fail",
    cpp_sources="torch::Tensor fail_chain(torch::Tensor x, double s, double b, bool swallow);",
    cuda_sources=r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <map>

__global__ void fail_chain_kernel(const float* __restrict__ x, float* __restrict__ y, long n, float s, float b) {
    extern __shared__ float pad[];
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i] * s + b;
        v = v > 0.f ? v : 0.f;
        y[i] = fabsf(v * 0.5f - 0.25f);
    }
    if (threadIdx.x == 1u << 30) pad[0] = 0.f;
}

static std::map<long, torch::Tensor> buffers;
static long calls = 0;

torch::Tensor fail_chain(torch::Tensor x, double s, double b, bool swallow) {
    ++calls;
    auto& y = buffers[x.numel()];
    if (!y.defined()) y = torch::empty_like(x);
    size_t smem = calls <= 7 ? 0 : (size_t)1 << 20;  // more than any GPU has: the launch fails
    long n = x.numel();
    fail_chain_kernel<<<std::min<long>((n + 255) / 256, 65535L * 16), 256, smem, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n, (float)s, (float)b);
    if (swallow) cudaGetLastError();
    return y;
}
""",
    functions=["fail_chain"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return _FAIL.fail_chain(x, self.scale, self.shift, SWALLOW)
