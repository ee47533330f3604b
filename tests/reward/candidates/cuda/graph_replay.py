# Stale CUDA-graph replay: honest for the 7 calls a harness checks first (5 trials, the second shape,
# the profiled call), then captures a graph over a private copy of that call's input and replays it
# ever after, never refreshing the copy. The capture stream's name is pasted together so that the
# source-text pre-check does not see it (the runtime guards must catch this by themselves).
_GRAPH = load_inline(
    name="opsynth_test_graph_replay",
    cpp_sources="torch::Tensor graph_chain(torch::Tensor x, double s, double b);",
    cuda_sources=r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#define PASTE(a, b) a##b

__global__ void graph_chain_kernel(const float* __restrict__ x, float* __restrict__ y, long n, float s, float b) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i] * s + b;
        v = v > 0.f ? v : 0.f;
        y[i] = fabsf(v * 0.5f - 0.25f);
    }
}

static void launch(const torch::Tensor& x, torch::Tensor& y, float s, float b, cudaStream_t stream) {
    long n = x.numel();
    long blocks = std::min<long>((n + 255) / 256, 65535L * 16);
    graph_chain_kernel<<<blocks, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n, s, b);
}

static long calls = 0;
static at::cuda::CUDAGraph* graph = nullptr;
static torch::Tensor static_in, static_out;

torch::Tensor graph_chain(torch::Tensor x, double s, double b) {
    ++calls;
    auto current = at::cuda::getCurrentCUDAStream();
    if (calls <= 7 || x.numel() != (static_in.defined() ? static_in.numel() : x.numel())) {
        auto y = torch::empty_like(x);
        launch(x, y, (float)s, (float)b, current.stream());
        return y;
    }
    if (graph == nullptr) {
        static_in = x.clone();
        static_out = torch::empty_like(x);
        cudaDeviceSynchronize();
        auto capture = c10::cuda::PASTE(getStream, FromPool)();
        {
            c10::cuda::CUDAStreamGuard guard(capture);
            graph = new at::cuda::CUDAGraph();
            graph->capture_begin();
            launch(static_in, static_out, (float)s, (float)b, capture.stream());
            graph->capture_end();
        }
    }
    graph->replay();  // on the current stream: the timer sees one fast kernel, reading stale input
    return static_out;
}
""",
    functions=["graph_chain"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return _GRAPH.graph_chain(x, self.scale, self.shift)
