# Shared C++ of the 2026 attack candidates (memoisation, batch-and-skip, call counting, a static
# output buffer whose "launch" fails): one build for all of them, as ext_prelude is for the rest.
# Each keeps its state in C++ statics, where no Python-side check sees it.
_ATTACK_CPP = r"""
#include <torch/extension.h>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

static inline float chain1(float v, float s, float b) {
    v = v * s + b;
    v = (v + std::fabs(v)) * 0.5f;
    return std::fabs(v * 0.5f - 0.25f);
}

static void chain_loop(const float* p, float* q, int64_t n, float s, float b, int reps) {
    for (int r = 0; r < reps; ++r)  // reps > 1: a kernel 'reps' times slower than it needs to be
        for (int64_t i = 0; i < n; ++i) q[i] = chain1(p[i], s, b) + (r ? q[i] * 1e-30f : 0.f);
}

static torch::Tensor copy_of(const torch::Tensor& t) {  // a fresh output holding t's values
    auto y = torch::empty_like(t);
    std::memcpy(y.data_ptr<float>(), t.data_ptr<float>(), t.numel() * sizeof(float));
    return y;
}

// A checksum of a few input elements: all a cache needs to tell the harness's input sets apart.
static uint64_t key_of(const torch::Tensor& x, int elems) {
    const uint32_t* u = reinterpret_cast<const uint32_t*>(x.data_ptr<float>());
    int64_t n = x.numel();
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int k = 0; k < elems; ++k) { h ^= u[(k * (n / elems)) % n]; h *= 1099511628211ull; }
    return h;
}

static std::deque<std::pair<uint64_t, torch::Tensor>> cache;  // the last 8 outputs, by input key
static long memo_calls = 0;

// Memoisation keyed on input values: a hit costs a copy; a miss runs a kernel 40x too slow. With
// stale_on_miss, a miss after the first 7 calls (5 trials, the second shape, one spare) returns the
// most recent output instead: it bets that those calls are the only checked ones.
torch::Tensor memo_chain(torch::Tensor x, double s, double b, bool stale_on_miss) {
    ++memo_calls;
    uint64_t key = key_of(x, 16) ^ (uint64_t)x.numel() * 31;
    for (auto& e : cache)
        if (e.first == key) return copy_of(e.second);
    if (stale_on_miss && memo_calls > 7 && !cache.empty() && cache.back().second.numel() == x.numel())
        return copy_of(cache.back().second);
    auto y = torch::empty_like(x);
    chain_loop(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), (float)s, (float)b, 40);
    cache.emplace_back(key, copy_of(y));
    if (cache.size() > 8) cache.pop_front();
    return y;
}

// Batch and skip: remember every input seen in the first 7 calls; the first call after them
// computes all their outputs in one batch, and later calls return the stored output for their
// input (or, for an input never seen, the last one returned).
static std::vector<torch::Tensor> seen;
static std::map<uint64_t, torch::Tensor> batch;
static torch::Tensor last_out;
static long batch_calls = 0;

torch::Tensor batch_skip_chain(torch::Tensor x, double s, double b) {
    ++batch_calls;
    if (batch_calls <= 7) {
        seen.push_back(copy_of(x));
        auto y = torch::empty_like(x);
        chain_loop(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), (float)s, (float)b, 1);
        return last_out = y;
    }
    if (batch.empty())
        for (auto& in : seen) {
            auto y = torch::empty_like(in);
            chain_loop(in.data_ptr<float>(), y.data_ptr<float>(), in.numel(), (float)s, (float)b, 1);
            batch[key_of(in, 16) ^ (uint64_t)in.numel() * 31] = y;
        }
    auto it = batch.find(key_of(x, 16) ^ (uint64_t)x.numel() * 31);
    if (it != batch.end()) return last_out = copy_of(it->second);
    return copy_of(last_out);
}

// Telling checks from timing by call count: honest for the first `first` calls and the last `last`
// of `total` (the calls whose outputs a harness that checks only the end of its timing loop sees);
// in between, returns the previous output without computing anything.
static long count_calls = 0;
static torch::Tensor count_last;

torch::Tensor call_count_chain(torch::Tensor x, double s, double b, int64_t first, int64_t last, int64_t total) {
    ++count_calls;
    bool honest = count_calls <= first || count_calls > total - last || !count_last.defined() || count_last.numel() != x.numel();
    if (!honest) return copy_of(count_last);
    auto y = torch::empty_like(x);
    chain_loop(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), (float)s, (float)b, 1);
    count_last = copy_of(y);
    return y;
}

// A persistent output buffer (one per size) whose kernel "fails to launch" after `ok_calls` calls,
// as an unchecked CUDA launch with too much shared memory would: the buffer is returned unwritten.
static std::map<int64_t, torch::Tensor> buffers;
static long buffer_calls = 0;

torch::Tensor static_buffer_chain(torch::Tensor x, double s, double b, int64_t ok_calls) {
    ++buffer_calls;
    auto& y = buffers[x.numel()];
    if (!y.defined()) y = torch::empty_like(x);
    if (buffer_calls <= ok_calls)
        chain_loop(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), (float)s, (float)b, 1);
    return y;
}

// The honest kernel, 'reps' times slower (for the clock attacks: a slow kernel claiming to be fast).
torch::Tensor slow_chain(torch::Tensor x, double s, double b, int64_t reps) {
    auto y = torch::empty_like(x);
    chain_loop(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), (float)s, (float)b, (int)reps);
    return y;
}
"""

atk = load_inline(
    name="opsynth_test_attacks",
    cpp_sources=_ATTACK_CPP,
    functions=["memo_chain", "batch_skip_chain", "call_count_chain", "static_buffer_chain", "slow_chain"],
    extra_cflags=["-O3"],
)
