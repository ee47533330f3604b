_SIDE = load_inline(
    name="opsynth_test_side_stream",
    cpp_sources="torch::Tensor chain_side_stream(torch::Tensor x, double s, double b);",
    cuda_sources=r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void side_kernel(const float* __restrict__ x, float* __restrict__ y, long n, float s, float b) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
        float r = 0.f;
        for (int k = 0; k < 200; ++k) {  // slow on purpose: the timed region must miss it
            float v = x[i] * s + b;
            v = v > 0.f ? v : 0.f;
            r = fabsf(v * 0.5f - 0.25f) + r * 1e-30f;
        }
        y[i] = r;
    }
}

torch::Tensor chain_side_stream(torch::Tensor x, double s, double b) {  // never joins the current stream
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    auto side = at::cuda::getStreamFromPool();
    side_kernel<<<std::min<long>((n + 255) / 256, 65535L * 16), 256, 0, side.stream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n, (float)s, (float)b);
    return y;
}
""",
    functions=["chain_side_stream"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """Runs its kernel on a pool stream and returns at once: events on the current stream miss it."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return _SIDE.chain_side_stream(x, self.scale, self.shift)
