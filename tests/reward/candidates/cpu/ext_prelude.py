# Shared C++ extension for the CPU test candidates: every candidate starts with this exact text, so
# the reward environment's content-addressed build cache compiles it once for the whole suite.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstring>

static inline float chain1(float v, float s, float b) {
    v = v * s + b;
    v = (v + std::fabs(v)) * 0.5f;  // relu without a branch, so that gcc vectorises the loops
    return std::fabs(v * 0.5f - 0.25f);
}

torch::Tensor chain(torch::Tensor x, double s, double b) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* p = xc.data_ptr<float>();
    float* q = y.data_ptr<float>();
    const float fs = (float)s, fb = (float)b;
    at::parallel_for(0, xc.numel(), 1 << 14, [=](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) q[i] = chain1(p[i], fs, fb);
    });
    return y;
}

void chain_into(torch::Tensor x, torch::Tensor y, double s, double b) {
    const float* p = x.data_ptr<float>();
    float* q = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) q[i] = chain1(p[i], (float)s, (float)b);
}

torch::Tensor chain_wrong(torch::Tensor x, double s, double b) {  // forgets the relu
    auto y = torch::empty_like(x);
    const float* p = x.data_ptr<float>();
    float* q = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) q[i] = std::fabs((p[i] * (float)s + (float)b) * 0.5f - 0.25f);
    return y;
}

torch::Tensor chain_lowp(torch::Tensor x, double s, double b) {  // keeps 3 mantissa bits (fp8-like)
    auto y = torch::empty_like(x);
    const float* p = x.data_ptr<float>();
    float* q = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
        float v = chain1(p[i], (float)s, (float)b);
        uint32_t u; std::memcpy(&u, &v, 4); u &= 0xFFF00000u; std::memcpy(&v, &u, 4);
        q[i] = v;
    }
    return y;
}

torch::Tensor chain_inplace(torch::Tensor x, double s, double b) {  // overwrites its input
    float* p = x.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = chain1(p[i], (float)s, (float)b);
    return x;
}

torch::Tensor chain_aten(torch::Tensor x, double s, double b) {  // torch compute hidden in C++
    return at::abs(at::relu(x * s + b) * 0.5 - 0.25);
}

void noop(torch::Tensor x) {}

torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {  // naive: slow
    auto xc = x.contiguous(); auto wc = w.contiguous();
    int64_t n = xc.size(0), k = xc.size(1), m = wc.size(0);
    auto y = torch::empty({n, m}, xc.options());
    const float* X = xc.data_ptr<float>(); const float* W = wc.data_ptr<float>();
    const float* B = bias.data_ptr<float>(); float* Y = y.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
            float acc = B[j];
            for (int64_t t = 0; t < k; ++t) acc += X[i * k + t] * W[j * k + t];
            Y[i * m + j] = acc > 0.f ? acc : 0.f;
        }
    return y;
}

torch::Tensor linear_aten(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {  // BLAS via at::
    return at::relu(at::addmm(bias, x, w.t()));
}

// Precision and pass candidates (tests/reward/test_reward_kinds_cpu.py).
torch::Tensor chain_bf16(torch::Tensor x, double s, double b) {  // reads and writes bf16, computes in float
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const at::BFloat16* p = xc.data_ptr<at::BFloat16>();
    at::BFloat16* q = y.data_ptr<at::BFloat16>();
    for (int64_t i = 0; i < xc.numel(); ++i) q[i] = at::BFloat16(chain1(float(p[i]), (float)s, (float)b));
    return y;
}

torch::Tensor chain_bf16_to_f32(torch::Tensor x, double s, double b) {  // reads bf16, writes float32
    auto xc = x.contiguous();
    auto y = torch::empty(xc.sizes(), xc.options().dtype(torch::kFloat));
    const at::BFloat16* p = xc.data_ptr<at::BFloat16>();
    float* q = y.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) q[i] = chain1(float(p[i]), (float)s, (float)b);
    return y;
}

torch::Tensor scale_relu(torch::Tensor x, torch::Tensor w) {  // y = relu(x * w), w per feature
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* X = xc.data_ptr<float>(); const float* W = w.data_ptr<float>(); float* Y = y.data_ptr<float>();
    int64_t d = w.numel(), n = xc.numel() / d;
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < d; ++j) { float v = X[i * d + j] * W[j]; Y[i * d + j] = v > 0.f ? v : 0.f; }
    return y;
}

std::vector<torch::Tensor> scale_relu_backward(torch::Tensor g, torch::Tensor x, torch::Tensor w, bool wrong) {
    auto gc = g.contiguous(); auto xc = x.contiguous();
    auto gx = torch::empty_like(xc);
    auto gw = torch::empty_like(w);
    const float* G = gc.data_ptr<float>(); const float* X = xc.data_ptr<float>(); const float* W = w.data_ptr<float>();
    float* GX = gx.data_ptr<float>(); float* GW = gw.data_ptr<float>();
    int64_t d = w.numel(), n = xc.numel() / d;
    for (int64_t j = 0; j < d; ++j) GW[j] = 0.f;
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < d; ++j) {
            int64_t k = i * d + j;
            float on = X[k] * W[j] > 0.f ? 1.f : 0.f;
            GX[k] = G[k] * on * W[j];
            GW[j] += G[k] * (wrong ? 1.f : on) * X[k];  // wrong: forgets the relu's mask
        }
    return {gx, gw};
}
"""

ext = load_inline(
    name="opsynth_test_ext",
    cpp_sources=_CPP,
    functions=["chain", "chain_into", "chain_wrong", "chain_lowp", "chain_inplace", "chain_aten", "noop", "linear_relu", "linear_aten",
               "chain_bf16", "chain_bf16_to_f32", "scale_relu", "scale_relu_backward"],
    extra_cflags=["-O3"],
)
