# Slows the task's baseline instead of speeding itself up (issue 28, the quiet device). Between a
# candidate's rounds the parent stops it (SIGSTOP) and times the baseline in another process; a stopped
# process launches nothing, but a kernel it queued before runs on, and the device time-slices between
# the two processes' kernels, so the baseline reads slow and this candidate's ratio to it fast. Its
# forward is honest and slow (the fused kernel's work REPEATS times, about 1.4x eager: reward 1). From
# C++, a native thread (no Python thread: nothing the child's thread checks see) keeps a heartbeat in
# pinned host memory and, DELAY_MS after each forward's kernels finish (the timer's sync has returned),
# queues a one-thread kernel on a stream of its own. The kernel leaves as soon as the harness writes the
# next round's inputs into the buffer forward read (before anything of the next round waits on the
# device), or once the process resumes after a stop (a baseline block came), or after WINDOW_MS if the
# process was never stopped; while it is stopped, it holds the device.
_hog = load_inline(
    name="opsynth_test_baseline_hog",
    cpp_sources="void hog_arm(double delay_ms, double window_ms); void hog_tick(long long stream, long long inputs);",
    cuda_sources=r"""
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <thread>

__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void hold(const volatile unsigned int* x, const volatile unsigned int* beat, unsigned long long window_ns) {
    unsigned int first[8];
    for (int i = 0; i < 8; ++i) first[i] = x[i];
    unsigned long long t0 = gtime(), beat_at = t0;
    unsigned int last = *beat;
    bool stopped = false;
    for (;;) {
        for (int i = 0; i < 8; ++i)
            if (x[i] != first[i]) return;  // the next round's inputs: gone before its clock waits on the device
        unsigned long long now = gtime();
        unsigned int v = *beat;
        if (v != last) {
            if (stopped) return;  // resumed after a stop: the baseline block is over
            last = v;
            beat_at = now;
        }
        if (now - beat_at > 300000ULL) { stopped = true; continue; }  // 0.3 ms without a beat: stopped
        if (now - t0 > window_ns) return;  // never stopped
    }
}

static std::atomic<long> ticks{0};
static std::atomic<bool> armed{false};
static std::atomic<long long> inputs_{0};
static cudaEvent_t done_ev;
static volatile unsigned int* beat_host = nullptr;
static unsigned int* beat_dev = nullptr;
static double delay_ms_ = 0.3, window_ms_ = 3.0;
static int device_ = 0;

static void beat_for(double ms) {
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds((long)(ms * 1000));
    do {
        *beat_host = *beat_host + 1;
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    } while (std::chrono::steady_clock::now() < until);
}

static void hogger() {
    cudaSetDevice(device_);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    long seen = ticks.load();
    for (;;) {
        beat_for(0.0);
        long now = ticks.load();
        if (now != seen) {
            seen = now;
            cudaEventSynchronize(done_ev);  // the forward's kernels are done: the timer's sync returns now too
            beat_for(delay_ms_);
            hold<<<1, 1, 0, s>>>((const unsigned int*)inputs_.load(), beat_dev, (unsigned long long)(window_ms_ * 1e6));
        }
    }
}

void hog_arm(double delay_ms, double window_ms) {
    bool no = false;
    if (!armed.compare_exchange_strong(no, true)) return;
    delay_ms_ = delay_ms;
    window_ms_ = window_ms;
    cudaGetDevice(&device_);
    cudaHostAlloc((void**)&beat_host, sizeof(unsigned int), cudaHostAllocMapped);
    *beat_host = 0;
    cudaHostGetDevicePointer((void**)&beat_dev, (void*)beat_host, 0);
    cudaEventCreateWithFlags(&done_ev, cudaEventDisableTiming);
    std::thread(hogger).detach();
}

void hog_tick(long long stream, long long inputs) {  // after the forward's kernels, on its stream
    inputs_.store(inputs);
    cudaEventRecord(done_ev, (cudaStream_t)stream);
    ticks++;
}
""",
    functions=["hog_arm", "hog_tick"],
)

HOG = True  # False: its honest twin (the same forward, no thread)
REPEATS = 3  # the fused kernel's work three times: about 1.4x eager on the H200 (fast read 0.42 of 0.87 ms)
DELAY_MS, WINDOW_MS = 0.3, 3.0  # the report comes ~1.7-2.3 ms after the call on the H200, the stop right after
FIRST = 10  # calls before it starts: the checked trials and the profiled call (whose profiler would see the kernel) come first


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = scale, shift
        self.calls = 0
        if HOG:
            _hog.hog_arm(DELAY_MS, WINDOW_MS)

    def forward(self, x):
        y = None
        for _ in range(REPEATS):
            y = ext.chain(x, self.scale, self.shift)
        self.calls += 1
        if HOG and self.calls > FIRST:
            _hog.hog_tick(torch.cuda.current_stream().cuda_stream, x.data_ptr())
        return y
