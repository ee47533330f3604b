// The fused chain on raw pointers: no torch headers, so this workspace builds in seconds.
#include <cmath>
#include <cstdint>

void chain_raw(std::int64_t src, std::int64_t dst, std::int64_t n, double s, double b) {
    const float* __restrict__ p = reinterpret_cast<const float*>(src);
    float* __restrict__ q = reinterpret_cast<float*>(dst);
    const float fs = (float)s, fb = (float)b;
    for (std::int64_t i = 0; i < n; ++i) {
        float v = p[i] * fs + fb;
        v = (v + std::fabs(v)) * 0.5f;  // relu without a branch, so that gcc vectorises the loop
        q[i] = std::fabs(v * 0.5f - 0.25f);
    }
}
