"""Programs for the smoke policy's warm start: C++ candidates written from a task's own code.

The smoke policy is a tiny random model; trained from scratch it never writes a program, so the
reward environment would judge nothing. Before GRPO it is taught (supervised) to answer some of its
training tasks with a real `ModelNew`: one written here from the task's own source for the tasks
made of operators this module knows how to lower (pointwise functions, scalar and broadcast
arithmetic, `nn.Linear` and `matmul` by a weight, `nn.Conv1d` / `nn.Conv2d`, softmax, reductions
and scans over one dim, `tril` / `triu`), all calling one shared extension (`LIBRARY` in C++ for the
cpu backend: an op-code loop for pointwise chains, plain loops for the rest; `CUDA_KERNELS` and
`CUDA_WRAPPERS` for cuda: the same functions, one thread per output, a torch-free `.cu`; no torch
compute in either), so every such program builds once and then only runs.

`lower_task(code)` returns the candidate source or None when the task has an operator, an input or
an argument it does not handle. The programs are correct, not fast; what they are for is to put the
environment's building, running and judging in the demo's loop from the first step.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

# The pointwise functions by op code, in C that both g++ and nvcc (device code) compile.
PW_BODY = r"""
    switch (op) {
        case 0: return v > 0.f ? v : 0.f;                                           // relu
        case 1: return 1.f / (1.f + expf(-v));                                  // sigmoid
        case 2: return tanhf(v);                                                // tanh
        case 3: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));       // gelu
        case 4: return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));  // gelu tanh
        case 5: return v / (1.f + expf(-v));                                    // silu
        case 6: return v / (1.f + fabsf(v));                                    // softsign
        case 7: return v < 0.f ? v - log1pf(expf(v)) : -log1pf(expf(-v));  // logsigmoid
        case 8: { float sp = v > 20.f ? v : log1pf(expf(v)); return v * tanhf(sp); }  // mish
        case 9: return v * a > b ? v : log1pf(expf(v * a)) / a;             // softplus(beta, threshold)
        case 10: return v > 0.f ? v : a * (expf(v) - 1.f);                      // elu(alpha)
        case 11: return 1.0507009873554805f * (v > 0.f ? v : 1.6732632423543772f * (expf(v) - 1.f));  // selu
        case 12: return v > 0.f ? v : a * (expf(v / a) - 1.f);                  // celu(alpha)
        case 13: return v > 0.f ? v : a * v;                                        // leaky_relu(slope)
        case 14: return fminf(fmaxf(v, a), b);                                // hardtanh(min, max)
        case 15: return fminf(fmaxf(v, 0.f), 6.f);                            // relu6
        case 16: return fminf(fmaxf(v / 6.f + 0.5f, 0.f), 1.f);               // hardsigmoid
        case 17: return v * fminf(fmaxf(v + 3.f, 0.f), 6.f) / 6.f;            // hardswish
        case 18: return v - tanhf(v);                                           // tanhshrink
        case 19: return v > a ? v - a : (v < -a ? v + a : 0.f);                     // softshrink(lambd)
        case 20: return (v > a || v < -a) ? v : 0.f;                                // hardshrink(lambd)
        case 21: return sinf(v);
        case 22: return cosf(v);
        case 23: return expf(v);
        case 24: return fabsf(v);
        case 25: return -v;
        case 26: return sqrtf(v);
        case 27: return rsqrtf_(v);
        case 28: return 1.f / v;
        case 29: return v * v;
        case 30: return expm1f(v);
        case 31: return erff(v);
        case 32: return log1pf(v);
        case 33: return v * a;                                                      // mul by a scalar
        case 34: return v + a;                                                      // add
        case 35: return v - a;                                                      // sub
        case 36: return v / a;                                                      // div
        case 37: return logf(v);
        case 38: return truncf(v);
        case 39: return (float)((v > 0.f) - (v < 0.f));                             // sign
        case 40: return sinhf(v);
        case 41: return coshf(v);
        case 42: return atanf(v);
        case 43: return asinhf(v);
        case 44: return v * 0.017453292519943295f;                                  // deg2rad
        case 45: { float r = fmodf(v, a); return (r != 0.f && ((r < 0.f) != (a < 0.f))) ? r + a : r; }  // remainder
        case 46: return fmaxf(v, a);                                             // maximum
        case 47: return fminf(v, a);                                             // minimum
        case 48: return log2f(v);
        case 49: return exp2f(v);
    }
    return v;
"""

# Shared by the CPU library and the CUDA wrappers, like PW_BODY.
AROUND = r"""
// (outer, size of dim, inner) of a contiguous tensor around one dim.
static void around(const torch::Tensor& x, int64_t& dim, int64_t& outer, int64_t& d, int64_t& inner) {
    if (dim < 0) dim += x.dim();
    outer = 1; inner = 1;
    for (int64_t i = 0; i < dim; ++i) outer *= x.size(i);
    for (int64_t i = dim + 1; i < x.dim(); ++i) inner *= x.size(i);
    d = x.size(dim);
}
"""

LIBRARY = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <math.h>
#include <vector>

// One pointwise function by op code; a and b are its arguments (shared with the CUDA library).
static inline float rsqrtf_(float v) { return 1.f / sqrtf(v); }
static inline float pw(int64_t op, float v, float a, float b) {@PW_BODY@}

torch::Tensor pointwise(torch::Tensor x, std::vector<int64_t> ops, std::vector<double> a, std::vector<double> b) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* p = xc.data_ptr<float>();
    float* q = y.data_ptr<float>();
    const int64_t k = (int64_t)ops.size();
    std::vector<float> fa(a.begin(), a.end()), fb(b.begin(), b.end());
    at::parallel_for(0, xc.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
            float v = p[i];
            for (int64_t j = 0; j < k; ++j) v = pw(ops[j], v, fa[j], fb[j]);
            q[i] = v;
        }
    });
    return y;
}

// x op other, elementwise; other has x's shape (the caller expands it).
torch::Tensor binary(torch::Tensor x, torch::Tensor other, int64_t op) {
    auto xc = x.contiguous();
    auto oc = other.contiguous();
    auto y = torch::empty_like(xc);
    const float* p = xc.data_ptr<float>();
    const float* o = oc.data_ptr<float>();
    float* q = y.data_ptr<float>();
    at::parallel_for(0, xc.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) q[i] = pw(op, p[i], o[i], 0.f);
    });
    return y;
}

// y[..., j] = sum_k x[..., k] * w[j, k] (+ bias[j]): nn.Linear.
torch::Tensor linear(torch::Tensor x, torch::Tensor w, torch::Tensor bias, bool has_bias) {
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    const int64_t k = xc.size(-1), m = wc.size(0), rows = xc.numel() / k;
    auto sizes = xc.sizes().vec();
    sizes.back() = m;
    auto y = torch::empty(sizes, xc.options());
    const float* X = xc.data_ptr<float>();
    const float* W = wc.data_ptr<float>();
    const float* B = has_bias ? bias.contiguous().data_ptr<float>() : nullptr;
    float* Y = y.data_ptr<float>();
    at::parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r)
            for (int64_t j = 0; j < m; ++j) {
                float acc = B ? B[j] : 0.f;
                for (int64_t t = 0; t < k; ++t) acc += X[r * k + t] * W[j * k + t];
                Y[r * m + j] = acc;
            }
    });
    return y;
}

// y[..., n] = sum_k x[..., k] * w[k, n]: torch.matmul by a 2-D weight.
torch::Tensor matmul(torch::Tensor x, torch::Tensor w) {
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    const int64_t k = xc.size(-1), n = wc.size(1), rows = xc.numel() / k;
    auto sizes = xc.sizes().vec();
    sizes.back() = n;
    auto y = torch::empty(sizes, xc.options());
    const float* X = xc.data_ptr<float>();
    const float* W = wc.data_ptr<float>();
    float* Y = y.data_ptr<float>();
    at::parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r)
            for (int64_t c = 0; c < n; ++c) {
                float acc = 0.f;
                for (int64_t t = 0; t < k; ++t) acc += X[r * k + t] * W[t * n + c];
                Y[r * n + c] = acc;
            }
    });
    return y;
}

@AROUND@
// Reduce over one dim: mode 0 sum, 1 mean, 2 amax, 3 amin, 4 prod.
torch::Tensor reduce(torch::Tensor x, int64_t dim, bool keepdim, int64_t mode) {
    auto xc = x.contiguous();
    int64_t outer, d, inner;
    around(xc, dim, outer, d, inner);
    auto sizes = xc.sizes().vec();
    if (keepdim) sizes[dim] = 1; else sizes.erase(sizes.begin() + dim);
    auto y = torch::empty(sizes, xc.options());
    const float* p = xc.data_ptr<float>();
    float* q = y.data_ptr<float>();
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
            const float* s = p + o * d * inner + i;
            float acc = mode == 2 ? -INFINITY : (mode == 3 ? INFINITY : (mode == 4 ? 1.f : 0.f));
            for (int64_t j = 0; j < d; ++j) {
                float v = s[j * inner];
                if (mode <= 1) acc += v;
                else if (mode == 2) acc = (v > acc || std::isnan(v)) ? v : acc;
                else if (mode == 3) acc = (v < acc || std::isnan(v)) ? v : acc;
                else acc *= v;
            }
            q[o * inner + i] = mode == 1 ? acc / (float)d : acc;
        }
    return y;
}

// Softmax over one dim: mode 0 softmax, 1 log_softmax, 2 softmin.
torch::Tensor softmax(torch::Tensor x, int64_t dim, int64_t mode) {
    auto xc = x.contiguous();
    int64_t outer, d, inner;
    around(xc, dim, outer, d, inner);
    auto y = torch::empty_like(xc);
    const float* p = xc.data_ptr<float>();
    float* q = y.data_ptr<float>();
    const float sign = mode == 2 ? -1.f : 1.f;
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
            const float* s = p + o * d * inner + i;
            float* t = q + o * d * inner + i;
            float mx = -INFINITY;
            for (int64_t j = 0; j < d; ++j) mx = std::max(mx, sign * s[j * inner]);
            float sum = 0.f;
            for (int64_t j = 0; j < d; ++j) sum += std::exp(sign * s[j * inner] - mx);
            for (int64_t j = 0; j < d; ++j) {
                float z = sign * s[j * inner] - mx;
                t[j * inner] = mode == 1 ? z - std::log(sum) : std::exp(z) / sum;
            }
        }
    return y;
}

// Scan over one dim: mode 0 cumsum, 1 cumprod, 2 logcumsumexp.
torch::Tensor scan(torch::Tensor x, int64_t dim, int64_t mode) {
    auto xc = x.contiguous();
    int64_t outer, d, inner;
    around(xc, dim, outer, d, inner);
    auto y = torch::empty_like(xc);
    const float* p = xc.data_ptr<float>();
    float* q = y.data_ptr<float>();
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
            const int64_t base = o * d * inner + i;
            double acc = mode == 1 ? 1.0 : (mode == 2 ? -INFINITY : 0.0);
            for (int64_t j = 0; j < d; ++j) {
                const double v = p[base + j * inner];
                if (mode == 0) acc += v;
                else if (mode == 1) acc *= v;
                else { const double m = std::max(acc, v); acc = m == -INFINITY ? m : m + std::log(std::exp(acc - m) + std::exp(v - m)); }
                q[base + j * inner] = (float)acc;
            }
        }
    return y;
}

// nn.Conv1d / nn.Conv2d (zero padding): x [N, C, (H,) W], w [O, C / groups, (KH,) KW]; 1-D as H = 1.
torch::Tensor conv2d(torch::Tensor x, torch::Tensor w, torch::Tensor bias, bool has_bias, int64_t sh, int64_t sw,
                     int64_t ph, int64_t pw_, int64_t dh, int64_t dw, int64_t groups) {
    const bool one_d = x.dim() == 3;
    auto xc = (one_d ? x.unsqueeze(2) : x).contiguous();
    auto wc = (one_d ? w.unsqueeze(2) : w).contiguous();
    const int64_t n = xc.size(0), c = xc.size(1), h = xc.size(2), wd = xc.size(3);
    const int64_t o = wc.size(0), cg = wc.size(1), kh = wc.size(2), kw = wc.size(3), og = o / groups;
    const int64_t oh = (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1, ow = (wd + 2 * pw_ - dw * (kw - 1) - 1) / sw + 1;
    auto y = torch::empty({n, o, oh, ow}, xc.options());
    const float* X = xc.data_ptr<float>();
    const float* W = wc.data_ptr<float>();
    const float* B = has_bias ? bias.contiguous().data_ptr<float>() : nullptr;
    float* Y = y.data_ptr<float>();
    at::parallel_for(0, n * o, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t no = lo; no < hi; ++no) {
            const int64_t b = no / o, oc = no % o, g = oc / og;
            for (int64_t yi = 0; yi < oh; ++yi)
                for (int64_t xi = 0; xi < ow; ++xi) {
                    float acc = B ? B[oc] : 0.f;
                    for (int64_t ci = 0; ci < cg; ++ci)
                        for (int64_t a = 0; a < kh; ++a) {
                            const int64_t iy = yi * sh - ph + a * dh;
                            if (iy < 0 || iy >= h) continue;
                            for (int64_t e = 0; e < kw; ++e) {
                                const int64_t ix = xi * sw - pw_ + e * dw;
                                if (ix < 0 || ix >= wd) continue;
                                acc += X[((b * c + g * cg + ci) * h + iy) * wd + ix] * W[((oc * cg + ci) * kh + a) * kw + e];
                            }
                        }
                    Y[((b * o + oc) * oh + yi) * ow + xi] = acc;
                }
        }
    });
    return one_d ? y.squeeze(2) : y;
}

// torch.tril / torch.triu over the last two dims (mode 0 tril, 1 triu), diagonal k.
torch::Tensor tri(torch::Tensor x, int64_t k, int64_t mode) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t r = xc.size(-2), c = xc.size(-1), mats = xc.numel() / (r * c);
    const float* p = xc.data_ptr<float>();
    float* q = y.data_ptr<float>();
    for (int64_t m = 0; m < mats; ++m)
        for (int64_t i = 0; i < r; ++i)
            for (int64_t j = 0; j < c; ++j) {
                const bool keep = mode == 0 ? (j - i <= k) : (j - i >= k);
                q[(m * r + i) * c + j] = keep ? p[(m * r + i) * c + j] : 0.f;
            }
    return y;
}
""".replace("@PW_BODY@", PW_BODY).replace("@AROUND@", AROUND)


# The same functions for CUDA tensors: torch-free kernels and launchers in `cuda_sources` (nvcc never
# parses ATen, so the build is short), the `torch::Tensor` wrappers in `cpp_sources`; every kernel
# goes on the stream the caller passes (the current one), one thread per output element.
CUDA_KERNELS = r"""
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

__device__ __forceinline__ float rsqrtf_(float v) { return rsqrtf(v); }
__device__ __forceinline__ float pw(int64_t op, float v, float a, float b) {@PW_BODY@}

#define MAXOPS 16
struct OpChain { int n; int64_t op[MAXOPS]; float a[MAXOPS]; float b[MAXOPS]; };

static unsigned blocks_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}
#define GRID_LOOP(i, n) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)blockDim.x * gridDim.x)

__global__ void k_pointwise(const float* x, float* y, int64_t n, OpChain c) {
    GRID_LOOP(i, n) {
        float v = x[i];
        for (int j = 0; j < c.n; ++j) v = pw(c.op[j], v, c.a[j], c.b[j]);
        y[i] = v;
    }
}
void launch_pointwise(const float* x, float* y, int64_t n, const int64_t* op, const double* a, const double* b, int k,
                      int64_t stream) {
    OpChain c;
    c.n = k;
    for (int j = 0; j < k; ++j) { c.op[j] = op[j]; c.a[j] = (float)a[j]; c.b[j] = (float)b[j]; }
    k_pointwise<<<blocks_for(n), 256, 0, (cudaStream_t)stream>>>(x, y, n, c);
}

__global__ void k_binary(const float* x, const float* o, float* y, int64_t n, int64_t op) {
    GRID_LOOP(i, n) y[i] = pw(op, x[i], o[i], 0.f);
}
void launch_binary(const float* x, const float* o, float* y, int64_t n, int64_t op, int64_t stream) {
    k_binary<<<blocks_for(n), 256, 0, (cudaStream_t)stream>>>(x, o, y, n, op);
}

__global__ void k_linear(const float* X, const float* W, const float* B, float* Y, int64_t rows, int64_t k, int64_t m) {
    GRID_LOOP(i, rows * m) {
        const int64_t r = i / m, j = i % m;
        float acc = B ? B[j] : 0.f;
        for (int64_t t = 0; t < k; ++t) acc += X[r * k + t] * W[j * k + t];
        Y[i] = acc;
    }
}
void launch_linear(const float* X, const float* W, const float* B, float* Y, int64_t rows, int64_t k, int64_t m,
                   int64_t stream) {
    k_linear<<<blocks_for(rows * m), 256, 0, (cudaStream_t)stream>>>(X, W, B, Y, rows, k, m);
}

__global__ void k_matmul(const float* X, const float* W, float* Y, int64_t rows, int64_t k, int64_t n) {
    GRID_LOOP(i, rows * n) {
        const int64_t r = i / n, c = i % n;
        float acc = 0.f;
        for (int64_t t = 0; t < k; ++t) acc += X[r * k + t] * W[t * n + c];
        Y[i] = acc;
    }
}
void launch_matmul(const float* X, const float* W, float* Y, int64_t rows, int64_t k, int64_t n, int64_t stream) {
    k_matmul<<<blocks_for(rows * n), 256, 0, (cudaStream_t)stream>>>(X, W, Y, rows, k, n);
}

__global__ void k_reduce(const float* p, float* q, int64_t outer, int64_t d, int64_t inner, int64_t mode) {
    GRID_LOOP(i, outer * inner) {
        const float* s = p + (i / inner) * d * inner + i % inner;
        float acc = mode == 2 ? -INFINITY : (mode == 3 ? INFINITY : (mode == 4 ? 1.f : 0.f));
        for (int64_t j = 0; j < d; ++j) {
            const float v = s[j * inner];
            if (mode <= 1) acc += v;
            else if (mode == 2) acc = (v > acc || isnan(v)) ? v : acc;
            else if (mode == 3) acc = (v < acc || isnan(v)) ? v : acc;
            else acc *= v;
        }
        q[i] = mode == 1 ? acc / (float)d : acc;
    }
}
void launch_reduce(const float* p, float* q, int64_t outer, int64_t d, int64_t inner, int64_t mode, int64_t stream) {
    k_reduce<<<blocks_for(outer * inner), 256, 0, (cudaStream_t)stream>>>(p, q, outer, d, inner, mode);
}

__global__ void k_softmax(const float* p, float* q, int64_t outer, int64_t d, int64_t inner, int64_t mode) {
    GRID_LOOP(i, outer * inner) {
        const int64_t base = (i / inner) * d * inner + i % inner;
        const float sign = mode == 2 ? -1.f : 1.f;
        float mx = -INFINITY;
        for (int64_t j = 0; j < d; ++j) mx = fmaxf(mx, sign * p[base + j * inner]);
        float sum = 0.f;
        for (int64_t j = 0; j < d; ++j) sum += expf(sign * p[base + j * inner] - mx);
        for (int64_t j = 0; j < d; ++j) {
            const float z = sign * p[base + j * inner] - mx;
            q[base + j * inner] = mode == 1 ? z - logf(sum) : expf(z) / sum;
        }
    }
}
void launch_softmax(const float* p, float* q, int64_t outer, int64_t d, int64_t inner, int64_t mode, int64_t stream) {
    k_softmax<<<blocks_for(outer * inner), 256, 0, (cudaStream_t)stream>>>(p, q, outer, d, inner, mode);
}

__global__ void k_scan(const float* p, float* q, int64_t outer, int64_t d, int64_t inner, int64_t mode) {
    GRID_LOOP(i, outer * inner) {
        const int64_t base = (i / inner) * d * inner + i % inner;
        double acc = mode == 1 ? 1.0 : (mode == 2 ? -INFINITY : 0.0);
        for (int64_t j = 0; j < d; ++j) {
            const double v = p[base + j * inner];
            if (mode == 0) acc += v;
            else if (mode == 1) acc *= v;
            else { const double m = fmax(acc, v); acc = m == -INFINITY ? m : m + log(exp(acc - m) + exp(v - m)); }
            q[base + j * inner] = (float)acc;
        }
    }
}
void launch_scan(const float* p, float* q, int64_t outer, int64_t d, int64_t inner, int64_t mode, int64_t stream) {
    k_scan<<<blocks_for(outer * inner), 256, 0, (cudaStream_t)stream>>>(p, q, outer, d, inner, mode);
}

__global__ void k_conv2d(const float* X, const float* W, const float* B, float* Y, int64_t n, int64_t c, int64_t h,
                         int64_t wd, int64_t o, int64_t cg, int64_t kh, int64_t kw, int64_t oh, int64_t ow, int64_t sh,
                         int64_t sw, int64_t ph, int64_t pw_, int64_t dh, int64_t dw, int64_t og) {
    GRID_LOOP(i, n * o * oh * ow) {
        const int64_t xi = i % ow, yi = (i / ow) % oh, oc = (i / (ow * oh)) % o, b = i / (ow * oh * o), g = oc / og;
        float acc = B ? B[oc] : 0.f;
        for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t a = 0; a < kh; ++a) {
                const int64_t iy = yi * sh - ph + a * dh;
                if (iy < 0 || iy >= h) continue;
                for (int64_t e = 0; e < kw; ++e) {
                    const int64_t ix = xi * sw - pw_ + e * dw;
                    if (ix < 0 || ix >= wd) continue;
                    acc += X[((b * c + g * cg + ci) * h + iy) * wd + ix] * W[((oc * cg + ci) * kh + a) * kw + e];
                }
            }
        Y[i] = acc;
    }
}
void launch_conv2d(const float* X, const float* W, const float* B, float* Y, int64_t n, int64_t c, int64_t h, int64_t wd,
                   int64_t o, int64_t cg, int64_t kh, int64_t kw, int64_t oh, int64_t ow, int64_t sh, int64_t sw,
                   int64_t ph, int64_t pw_, int64_t dh, int64_t dw, int64_t og, int64_t stream) {
    k_conv2d<<<blocks_for(n * o * oh * ow), 256, 0, (cudaStream_t)stream>>>(X, W, B, Y, n, c, h, wd, o, cg, kh, kw, oh, ow,
                                                                            sh, sw, ph, pw_, dh, dw, og);
}

__global__ void k_tri(const float* p, float* q, int64_t total, int64_t r, int64_t c, int64_t k, int64_t mode) {
    GRID_LOOP(i, total) {
        const int64_t j = i % c, row = (i / c) % r;
        const bool keep = mode == 0 ? (j - row <= k) : (j - row >= k);
        q[i] = keep ? p[i] : 0.f;
    }
}
void launch_tri(const float* p, float* q, int64_t total, int64_t r, int64_t c, int64_t k, int64_t mode, int64_t stream) {
    k_tri<<<blocks_for(total), 256, 0, (cudaStream_t)stream>>>(p, q, total, r, c, k, mode);
}
""".replace("@PW_BODY@", PW_BODY)

CUDA_WRAPPERS = r"""
#include <torch/extension.h>
#include <vector>

void launch_pointwise(const float*, float*, int64_t, const int64_t*, const double*, const double*, int, int64_t);
void launch_binary(const float*, const float*, float*, int64_t, int64_t, int64_t);
void launch_linear(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
void launch_matmul(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
void launch_reduce(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);
void launch_softmax(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);
void launch_scan(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);
void launch_conv2d(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                   int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                   int64_t, int64_t);
void launch_tri(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);

@AROUND@
torch::Tensor pointwise(torch::Tensor x, std::vector<int64_t> ops, std::vector<double> a, std::vector<double> b,
                        int64_t stream) {
    TORCH_CHECK(ops.size() <= 16, "at most 16 pointwise ops in one chain");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch_pointwise(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), ops.data(), a.data(), b.data(),
                     (int)ops.size(), stream);
    return y;
}

torch::Tensor binary(torch::Tensor x, torch::Tensor other, int64_t op, int64_t stream) {
    auto xc = x.contiguous();
    auto oc = other.contiguous();
    auto y = torch::empty_like(xc);
    launch_binary(xc.data_ptr<float>(), oc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), op, stream);
    return y;
}

torch::Tensor linear(torch::Tensor x, torch::Tensor w, torch::Tensor bias, bool has_bias, int64_t stream) {
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    const int64_t k = xc.size(-1), m = wc.size(0), rows = xc.numel() / k;
    auto sizes = xc.sizes().vec();
    sizes.back() = m;
    auto y = torch::empty(sizes, xc.options());
    auto bc = has_bias ? bias.contiguous() : bias;
    launch_linear(xc.data_ptr<float>(), wc.data_ptr<float>(), has_bias ? bc.data_ptr<float>() : nullptr,
                  y.data_ptr<float>(), rows, k, m, stream);
    return y;
}

torch::Tensor matmul(torch::Tensor x, torch::Tensor w, int64_t stream) {
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    const int64_t k = xc.size(-1), n = wc.size(1), rows = xc.numel() / k;
    auto sizes = xc.sizes().vec();
    sizes.back() = n;
    auto y = torch::empty(sizes, xc.options());
    launch_matmul(xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), rows, k, n, stream);
    return y;
}

torch::Tensor reduce(torch::Tensor x, int64_t dim, bool keepdim, int64_t mode, int64_t stream) {
    auto xc = x.contiguous();
    int64_t outer, d, inner;
    around(xc, dim, outer, d, inner);
    auto sizes = xc.sizes().vec();
    if (keepdim) sizes[dim] = 1; else sizes.erase(sizes.begin() + dim);
    auto y = torch::empty(sizes, xc.options());
    launch_reduce(xc.data_ptr<float>(), y.data_ptr<float>(), outer, d, inner, mode, stream);
    return y;
}

torch::Tensor softmax(torch::Tensor x, int64_t dim, int64_t mode, int64_t stream) {
    auto xc = x.contiguous();
    int64_t outer, d, inner;
    around(xc, dim, outer, d, inner);
    auto y = torch::empty_like(xc);
    launch_softmax(xc.data_ptr<float>(), y.data_ptr<float>(), outer, d, inner, mode, stream);
    return y;
}

torch::Tensor scan(torch::Tensor x, int64_t dim, int64_t mode, int64_t stream) {
    auto xc = x.contiguous();
    int64_t outer, d, inner;
    around(xc, dim, outer, d, inner);
    auto y = torch::empty_like(xc);
    launch_scan(xc.data_ptr<float>(), y.data_ptr<float>(), outer, d, inner, mode, stream);
    return y;
}

torch::Tensor conv2d(torch::Tensor x, torch::Tensor w, torch::Tensor bias, bool has_bias, int64_t sh, int64_t sw,
                     int64_t ph, int64_t pw_, int64_t dh, int64_t dw, int64_t groups, int64_t stream) {
    const bool one_d = x.dim() == 3;
    auto xc = (one_d ? x.unsqueeze(2) : x).contiguous();
    auto wc = (one_d ? w.unsqueeze(2) : w).contiguous();
    const int64_t n = xc.size(0), c = xc.size(1), h = xc.size(2), wd = xc.size(3);
    const int64_t o = wc.size(0), cg = wc.size(1), kh = wc.size(2), kw = wc.size(3);
    const int64_t oh = (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1, ow = (wd + 2 * pw_ - dw * (kw - 1) - 1) / sw + 1;
    auto y = torch::empty({n, o, oh, ow}, xc.options());
    auto bc = has_bias ? bias.contiguous() : bias;
    launch_conv2d(xc.data_ptr<float>(), wc.data_ptr<float>(), has_bias ? bc.data_ptr<float>() : nullptr,
                  y.data_ptr<float>(), n, c, h, wd, o, cg, kh, kw, oh, ow, sh, sw, ph, pw_, dh, dw, o / groups, stream);
    return one_d ? y.squeeze(2) : y;
}

torch::Tensor tri(torch::Tensor x, int64_t k, int64_t mode, int64_t stream) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch_tri(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), xc.size(-2), xc.size(-1), k, mode, stream);
    return y;
}
""".replace("@AROUND@", AROUND)

FUNCTIONS = ["pointwise", "binary", "linear", "matmul", "reduce", "softmax", "scan", "conv2d", "tri"]

HEADER = {
    "cpu": '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_SRC = r"""{library}"""

_ext = load_inline(name="opsynth_smoke_kernels", cpp_sources=[_SRC], functions={functions},
                   extra_cflags=["-O3"], verbose=False)

'''.format(library=LIBRARY, functions=FUNCTIONS),
    "cuda": '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CU = r"""{kernels}"""

_CPP = r"""{wrappers}"""

_ext = load_inline(name="opsynth_smoke_kernels_cuda", cpp_sources=[_CPP], cuda_sources=[_CU], functions={functions},
                   extra_cflags=["-O3"], extra_cuda_cflags=["-O3"], no_implicit_headers=True, verbose=False)

'''.format(kernels=CUDA_KERNELS, wrappers=CUDA_WRAPPERS, functions=FUNCTIONS),
}


@dataclass(frozen=True)
class Pointwise:
    code: int
    params: tuple[tuple[str, float], ...] = ()  # (argument name, default), as the function names them


# Pointwise functions: torch / F name -> op code and arguments; nn modules by class name.
POINTWISE: dict[str, Pointwise] = {
    "relu": Pointwise(0), "sigmoid": Pointwise(1), "tanh": Pointwise(2), "gelu": Pointwise(3), "silu": Pointwise(5),
    "softsign": Pointwise(6), "logsigmoid": Pointwise(7), "mish": Pointwise(8),
    "softplus": Pointwise(9, (("beta", 1.0), ("threshold", 20.0))), "elu": Pointwise(10, (("alpha", 1.0),)),
    "selu": Pointwise(11), "celu": Pointwise(12, (("alpha", 1.0),)),
    "leaky_relu": Pointwise(13, (("negative_slope", 0.01),)),
    "hardtanh": Pointwise(14, (("min_val", -1.0), ("max_val", 1.0))), "relu6": Pointwise(15),
    "hardsigmoid": Pointwise(16), "hardswish": Pointwise(17), "tanhshrink": Pointwise(18),
    "softshrink": Pointwise(19, (("lambd", 0.5),)), "hardshrink": Pointwise(20, (("lambd", 0.5),)),
    "sin": Pointwise(21), "cos": Pointwise(22), "exp": Pointwise(23), "abs": Pointwise(24), "neg": Pointwise(25),
    "negative": Pointwise(25), "sqrt": Pointwise(26), "rsqrt": Pointwise(27), "reciprocal": Pointwise(28),
    "square": Pointwise(29), "expm1": Pointwise(30), "erf": Pointwise(31), "log1p": Pointwise(32), "log": Pointwise(37),
    "trunc": Pointwise(38), "fix": Pointwise(38), "sign": Pointwise(39), "sinh": Pointwise(40), "cosh": Pointwise(41),
    "atan": Pointwise(42), "arctan": Pointwise(42), "asinh": Pointwise(43), "arcsinh": Pointwise(43),
    "deg2rad": Pointwise(44), "log2": Pointwise(48), "exp2": Pointwise(49),
}
MODULES = {
    "ReLU": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "GELU": "gelu", "SiLU": "silu", "Softsign": "softsign",
    "LogSigmoid": "logsigmoid", "Mish": "mish", "Softplus": "softplus", "ELU": "elu", "SELU": "selu", "CELU": "celu",
    "LeakyReLU": "leaky_relu", "Hardtanh": "hardtanh", "ReLU6": "relu6", "Hardsigmoid": "hardsigmoid",
    "Hardswish": "hardswish", "Tanhshrink": "tanhshrink", "Softshrink": "softshrink", "Hardshrink": "hardshrink",
}
BINARY = {"mul": 33, "multiply": 33, "add": 34, "sub": 35, "subtract": 35, "div": 36, "divide": 36, "true_divide": 36,
          "remainder": 45, "maximum": 46, "minimum": 47}
REDUCE = {"sum": 0, "mean": 1, "amax": 2, "amin": 3, "prod": 4}
SOFTMAX = {"softmax": 0, "log_softmax": 1, "softmin": 2, "Softmax": 0, "LogSoftmax": 1, "Softmin": 2}
SCAN = {"cumsum": 0, "cumprod": 1, "logcumsumexp": 2}
TRI = {"tril": 0, "triu": 1}


class Unsupported(Exception):
    pass


def _dotted(node: ast.AST) -> str:
    """`a.b.c` of an attribute chain (the static check's reading), or Unsupported."""
    from opsynth.reward.static_check import _dotted as dotted

    name = dotted(node)
    if name is None:
        raise Unsupported("not a name")
    return name


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError):
        raise Unsupported("not a literal") from None


class _Task:
    """What the lowering needs of a task: its Model's __init__ source and attributes, and forward."""

    def __init__(self, code: str):
        tree = ast.parse(code)
        model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
        if model is None:
            raise Unsupported("no Model")
        fns = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
        if "__init__" not in fns or "forward" not in fns:
            raise Unsupported("no __init__/forward")
        self.init_src = ast.get_source_segment(code, fns["__init__"], padded=True)
        self.forward = fns["forward"]
        self.modules: dict[str, ast.Call] = {}  # self.<attr> = nn.<Cls>(...)
        self.tensors: set[str] = set()  # self.<attr> = nn.Parameter(...) / register_buffer
        self.scalars: set[str] = set()  # self.<attr> = <an __init__ argument or a number>
        init_args = {a.arg for a in fns["__init__"].args.args[1:]}
        for st in ast.walk(fns["__init__"]):
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Attribute):
                t = st.targets[0]
                if not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                    continue
                v = st.value
                if isinstance(v, ast.Call):
                    fn = _dotted(v.func) if isinstance(v.func, (ast.Attribute, ast.Name)) else ""
                    if fn in ("nn.Parameter", "torch.nn.Parameter"):
                        self.tensors.add(t.attr)
                    elif fn.startswith(("nn.", "torch.nn.")):
                        self.modules[t.attr] = v
                elif (isinstance(v, ast.Name) and v.id in init_args) or (
                        isinstance(v, ast.Constant) and isinstance(v.value, (int, float))):
                    self.scalars.add(t.attr)
            if isinstance(st, ast.Call) and isinstance(st.func, ast.Attribute) and st.func.attr == "register_buffer":
                if st.args and isinstance(st.args[0], ast.Constant):
                    self.tensors.add(st.args[0].value)


def _argument(call: ast.Call, pos: int, name: str, default: Any, module_attr: str | None = None) -> str:
    """Python source for one argument of an op: a literal (or the default), or, for an nn module
    built with a non-literal argument, the module's attribute read at run time."""
    node = next((k.value for k in call.keywords if k.arg == name), None)
    if node is None and len(call.args) > pos:
        node = call.args[pos]
    if node is None:
        return repr(default)
    try:
        return repr(_literal(node))
    except Unsupported:
        if module_attr is not None:
            return f"self.{module_attr}.{name}"
        raise


def _lower_step(task: _Task, call: ast.Call) -> tuple[str, Any]:
    """One forward statement -> ("pw", (code, a, b)) or ("call", python expression of the new x)."""
    if not isinstance(call, ast.Call) or not call.args or not (isinstance(call.args[0], ast.Name) and call.args[0].id == "x"):
        raise Unsupported("not an op on x")
    fn = _dotted(call.func)
    if fn.startswith("self."):  # a module built in __init__
        attr = fn[len("self."):]
        ctor = task.modules.get(attr)
        if ctor is None or len(call.args) != 1 or call.keywords:
            raise Unsupported(fn)
        cls = _dotted(ctor.func).rsplit(".", 1)[-1]
        if cls in MODULES:
            spec = POINTWISE[MODULES[cls]]
            code = spec.code
            if cls == "GELU" and _argument(ctor, 0, "approximate", "none") == repr("tanh"):
                code = 4
            args = [_argument(ctor, i, n, d, module_attr=attr) for i, (n, d) in enumerate(spec.params)]
            return "pw", (code, *(args + ["0.0", "0.0"])[:2])
        if cls == "Linear":
            m = f"self.{attr}"
            return "call", f"_ext.linear(x, {m}.weight, {m}.bias if {m}.bias is not None else {m}.weight, {m}.bias is not None)"
        if cls in SOFTMAX:
            return "call", f"_ext.softmax(x, {_argument(ctor, 0, 'dim', None, module_attr=attr)}, {SOFTMAX[cls]})"
        if cls in ("Conv1d", "Conv2d"):
            pm = next((k.value for k in ctor.keywords if k.arg == "padding_mode"), None)
            pad = next((k.value for k in ctor.keywords if k.arg == "padding"), ctor.args[4] if len(ctor.args) > 4 else None)
            if (pm is not None and _literal(pm) != "zeros") or (isinstance(pad, ast.Constant) and isinstance(pad.value, str)):
                raise Unsupported("conv padding mode")
            m = f"self.{attr}"
            i, j = ("0", "0") if cls == "Conv1d" else ("0", "1")
            h = "1" if cls == "Conv1d" else f"{m}.stride[{i}]"
            geo = (f"{h}, {m}.stride[{j}], " + ("0" if cls == "Conv1d" else f"{m}.padding[{i}]") + f", {m}.padding[{j}], "
                   + ("1" if cls == "Conv1d" else f"{m}.dilation[{i}]") + f", {m}.dilation[{j}], {m}.groups")
            return "call", (f"_ext.conv2d(x, {m}.weight, {m}.bias if {m}.bias is not None else {m}.weight, "
                            f"{m}.bias is not None, {geo})")
        raise Unsupported(cls)
    head, _, name = fn.rpartition(".")
    if head not in ("torch", "F", "torch.nn.functional"):
        raise Unsupported(fn)
    if name in POINTWISE:
        spec = POINTWISE[name]
        code = spec.code
        if name == "gelu" and _argument(call, 1, "approximate", "none") == repr("tanh"):
            code = 4
        args = [_argument(call, i + 1, n, d) for i, (n, d) in enumerate(spec.params)]
        return "pw", (code, *(args + ["0.0", "0.0"])[:2])
    if name in BINARY:
        if len(call.args) != 2 or call.keywords:
            raise Unsupported(fn)
        other = call.args[1]
        if isinstance(other, ast.Constant) and isinstance(other.value, (int, float)):
            return "pw", (BINARY[name], repr(float(other.value)), "0.0")
        if isinstance(other, ast.Attribute) and isinstance(other.value, ast.Name) and other.value.id == "self":
            if other.attr in task.scalars:
                return "pw", (BINARY[name], f"float(self.{other.attr})", "0.0")
            if other.attr in task.tensors:
                return "call", f"_ext.binary(x, self.{other.attr}.expand_as(x), {BINARY[name]})"
        raise Unsupported(fn)
    if name == "matmul":
        other = call.args[1] if len(call.args) == 2 else None
        if isinstance(other, ast.Attribute) and isinstance(other.value, ast.Name) and other.attr in task.tensors:
            return "call", f"_ext.matmul(x, self.{other.attr})"
        raise Unsupported(fn)
    if name in REDUCE:
        dim = _argument(call, 1, "dim", None)
        keep = _argument(call, 2, "keepdim", False)
        if not dim.lstrip("-").isdigit():
            raise Unsupported(f"{fn} over {dim}")
        return "call", f"_ext.reduce(x, {dim}, {keep}, {REDUCE[name]})"
    if name in SOFTMAX or name in SCAN:
        dim = _argument(call, 1, "dim", None)
        if not dim.lstrip("-").isdigit():
            raise Unsupported(f"{fn} over {dim}")
        return "call", (f"_ext.softmax(x, {dim}, {SOFTMAX[name]})" if name in SOFTMAX else f"_ext.scan(x, {dim}, {SCAN[name]})")
    if name in TRI:
        k = _argument(call, 1, "diagonal", 0)
        if not k.lstrip("-").isdigit():
            raise Unsupported(fn)
        return "call", f"_ext.tri(x, {k}, {TRI[name]})"
    raise Unsupported(fn)


def lower_task(code: str, device: str = "cpu") -> str | None:
    """A correct `ModelNew` for the task (C++ on `cpu`, CUDA on `cuda`), or None if it uses
    something this module does not lower."""
    if device not in HEADER:
        raise ValueError(f"device must be one of {sorted(HEADER)}, got {device!r}")
    try:
        task = _Task(code)
        fwd = task.forward
        if [a.arg for a in fwd.args.args] != ["self", "x"] or fwd.args.vararg or fwd.args.kwonlyargs:
            raise Unsupported("forward must take one input x")
        *steps, ret = fwd.body
        if not (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Name) and ret.value.id == "x"):
            raise Unsupported("forward must end with return x")
        lines: list[str] = []
        run: list[tuple[int, str, str]] = []

        def flush():
            if run:
                codes = ", ".join(str(c) for c, _, _ in run)
                a = ", ".join(x for _, x, _ in run)
                b = ", ".join(x for _, _, x in run)
                lines.append(f"x = _ext.pointwise(x, [{codes}], [{a}], [{b}])")
                run.clear()

        for st in steps:
            if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                    and st.targets[0].id == "x"):
                raise Unsupported("forward must be a chain of x = op(x, ...)")
            kind, what = _lower_step(task, st.value)
            if kind == "pw":
                run.append(what)
            else:
                flush()
                lines.append(f"x = {what}")
        flush()
    except (Unsupported, SyntaxError, KeyError):
        return None
    if device == "cuda":  # every launch goes on the current stream, the one the harness times
        lines = ["s = torch.cuda.current_stream().cuda_stream"] + [ln[:-1] + ", s)" for ln in lines]
    body = "\n".join(f"        {ln}" for ln in lines)
    init = task.init_src or ""
    return (HEADER[device] + "\nclass ModelNew(nn.Module):\n" + init.rstrip() + "\n\n"
            "    def forward(self, x):\n" + body + "\n        return x\n")


def warm_start_pairs(rows: list[dict[str, Any]], limit: int | None = None,
                     device: str = "cpu") -> list[tuple[dict[str, Any], str]]:
    """(task row, candidate) for the rows `lower_task` handles, at most `limit`."""
    out = []
    for r in rows:
        cand = lower_task(r["code"], device)
        if cand is not None:
            out.append((r, cand))
            if limit and len(out) >= limit:
                break
    return out


def answer(candidate: str) -> str:
    """A candidate as the policy answers: one fenced python block."""
    return f"```python\n{candidate}```"


def program_prefix(device: str = "cpu") -> str:
    """What every warm-start answer starts with: the fence and the shared extension (`HEADER`)."""
    return answer(HEADER[device])[: -len("```")]


def smoke_examples(rows: list[dict[str, Any]], n: int | None, device: str = "cpu",
                   brief: str | None = None) -> list[tuple[str, str]]:
    """(prompt, answer) pairs to warm-start the smoke policy on: every task it can write for
    (`n` None) or up to `n` of them (0: none), in C++ for the cpu backend and CUDA for cuda;
    `brief` is the prompt's brief (default: the reward's default settings)."""
    from opsynth.train.prompts import KERNEL_BRIEF, build_prompt

    if n == 0:
        return []
    return [(build_prompt(r["code"], brief or KERNEL_BRIEF), answer(c)) for r, c in warm_start_pairs(rows, n, device)]


def variant_batch_sizes(batch_size: int, k: int) -> list[int]:
    """`k` batch sizes other than `batch_size` for a task's size variants (double, half, ...)."""
    out: list[int] = []
    for v in (2 * batch_size, batch_size // 2, 4 * batch_size, 3 * batch_size, batch_size + 1, 8 * batch_size):
        if len(out) < k and v >= 1 and v != batch_size and v not in out:
            out.append(v)
    return out


def size_variant_examples(rows: list[dict[str, Any]], n: int | None, k: int, device: str = "cpu",
                          brief: str | None = None) -> list[tuple[str, str]]:
    """For each task `smoke_examples(rows, n, ...)` uses, `k` prompts of the same task at other
    batch sizes (`opsynth.render.task_file.set_batch_size`), with the same answer: the program does
    not depend on the sizes (the reward runs it at a second batch size too), and training on the
    variants teaches the policy to answer a task it has not seen at the sizes it has."""
    from opsynth.render.task_file import read_batch_size, set_batch_size
    from opsynth.train.prompts import KERNEL_BRIEF, build_prompt

    if n == 0 or k <= 0:
        return []
    out = []
    for r, cand in warm_start_pairs(rows, n, device):
        bs = read_batch_size(r["code"])
        if bs is None:
            continue
        for v in variant_batch_sizes(bs, k):
            try:
                out.append((build_prompt(set_batch_size(r["code"], v), brief or KERNEL_BRIEF), answer(cand)))
            except ValueError:  # a batch_size literal the contract does not rewrite
                break
    return out


def revision_examples(examples: list[tuple[str, str]], seed: int = 0, timings: int = 6) -> list[tuple[str, str, str, str]]:
    """Second turns to warm-start on, for multi-turn training: for each (prompt, answer) pair, the
    answer written again after (a) the answer itself judged correct but slow and (b) the answer
    with one of its own lines dropped, rejected; as (prompt, first answer, feedback text, answer),
    the feedback worded by `opsynth.train.feedback.format_feedback` as the environment words it.
    Without them the smoke policy, taught first turns only, fills every second turn with text that
    holds no program, and GRPO trains on that text with the episode's advantage. `timings` slow
    verdicts a program, each with other numbers: with 2 the policy learned the numbers and wrote the
    program again after fresh ones 1-4 times in 16; with 6, 12 in 16, for the same warm-start time."""
    import random
    from types import SimpleNamespace

    from opsynth.train.feedback import format_feedback

    rng = random.Random(seed)
    out = []
    for prompt, ans in examples:
        for _ in range(timings):  # timings vary from run to run: the policy must answer whatever numbers it reads
            eager = float(f"{10 ** rng.uniform(-2, 1.7):.4g}")  # as the reward reports them: 4 significant digits
            slow = SimpleNamespace(reason="ok", reward=1, correct=True, log="", details={},
                                   times={"candidate_ms": float(f"{eager * 10 ** rng.uniform(0, 1.2):.4g}"), "eager_ms": eager})
            out.append((prompt, ans, format_feedback(slow, 1), ans))
        shared = next((len(program_prefix(d)) for d in HEADER if ans.startswith(program_prefix(d))), len("```python\n"))
        lines = ans.splitlines(keepends=True)
        start = ans[:shared].count("\n")
        own = [i for i in range(start, len(lines) - 1) if lines[i].strip()]  # the task's lines, not the fence
        if not own:
            continue
        k = rng.choice(own)
        broken = "".join(lines[:k] + lines[k + 1:])
        bad = SimpleNamespace(reason="syntax_error", reward=-1, correct=False, details={},
                              log=f"[candidate] rejected: syntax_error: line {k + 1}: invalid syntax")
        out.append((prompt, broken, format_feedback(bad, 1), ans))
    return out


def passages(device: str = "cpu", brief: str | None = None) -> list[str]:
    """The long texts every warm-start example repeats (the prompt's brief, the program's shared
    extension): the smoke tokenizer makes each one token, so a prompt and an answer are only the
    task's own lines."""
    from opsynth.train.prompts import KERNEL_BRIEF, prompt_prefix

    return [prompt_prefix(brief or KERNEL_BRIEF), program_prefix(device)]
