// Which stream operations wait while *another* stream is held inside a
// blocking host function (cudaLaunchHostFunc)? A driver-level probe for the
// open memory-ordering question in docs/perf.md ("Host functions and other
// streams"). Each case runs on its own helper thread with a fresh
// non-blocking stream while stream A is held at a gate; it reports the time
// to finish, or WAITS if it had not finished after the limit (the gate then
// opens and the case completes). Build (no GPU needed):
// The first launch of a kernel is timed on its own (the "first launch" case
// only loads the kernel in the first round; CUDA_MODULE_LOADING=EAGER loads
// it at start-up).
//   nvcc -O2 -std=c++17 -arch=sm_90a -cudart static -L"$(dirname "$NVCC")/../lib" \
//     -o host_fn_blocking host_fn_blocking.cu
// Run with CUDA_DEVICE_MAX_CONNECTIONS unset, 1 and 32 to see whether
// hardware work queues shared between streams explain a wait.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,           \
                   cudaGetErrorString(e_));                                     \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

static std::atomic<bool> g_open{false};

static void CUDART_CB gate(void*) {
  auto t0 = std::chrono::steady_clock::now();
  while (!g_open.load()) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

static void CUDART_CB noop(void*) {}

__global__ void tiny(int* p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *p += 1;
}

struct Ctx {
  cudaStream_t b;
  void* dev4m;
  void* dev4k;
  void* pin4m;
  cudaMemPool_t pool;
  // Memory of a pool set up as ferrotron's (keep everything, no internal
  // cross-stream dependencies), and a stream made before any other.
  void* pool4m;
  cudaStream_t early;
  // The held stream, and a stream that frees pool memory after waiting for
  // it (as ferrotron's release stream does for a drop).
  cudaStream_t a;
  cudaStream_t release;
};

// A pool free queued behind the held stream (the release stream waits for
// an event recorded on it): ferrotron's drop.
static void free_behind_held(Ctx& c) {
  void* p;
  CK(cudaMallocFromPoolAsync(&p, 1 << 20, c.pool, c.early));
  CK(cudaStreamSynchronize(c.early));
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CK(cudaEventRecord(e, c.a));
  CK(cudaStreamWaitEvent(c.release, e, 0));
  CK(cudaFreeAsync(p, c.release));
  CK(cudaEventDestroy(e));
}

static const double kLimitS = 1.5;

// Runs `op` on stream B while stream A is held; `streams_between` extra
// streams are created between A and B (to land B on A's hardware queue when
// streams are assigned round-robin).
static void run_case(const char* name, int streams_between, bool kernel_behind_gate,
                     Ctx& c, const std::function<void(Ctx&)>& op) {
  cudaStream_t a;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  std::vector<cudaStream_t> pad(streams_between);
  for (auto& s : pad) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&c.b, cudaStreamNonBlocking));
  c.a = a;
  g_open = false;
  CK(cudaLaunchHostFunc(a, gate, nullptr));
  if (kernel_behind_gate) tiny<<<1, 32, 0, a>>>((int*)c.dev4k + 64);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::atomic<bool> done{false};
  auto t0 = std::chrono::steady_clock::now();
  std::thread helper([&] {
    op(c);
    CK(cudaStreamSynchronize(c.b));
    done = true;
  });
  while (!done && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < kLimitS)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  bool waited = !done;
  g_open = true;
  helper.join();
  CK(cudaStreamSynchronize(a));
  std::printf("  %-62s pad %2d%s: %s", name, streams_between,
              kernel_behind_gate ? " +k" : "   ", waited ? "WAITS" : "ok   ");
  if (!waited) std::printf(" %8.3f ms", ms);
  std::printf("\n");
  for (auto& s : pad) CK(cudaStreamDestroy(s));
  CK(cudaStreamDestroy(c.b));
  CK(cudaStreamDestroy(a));
}

int main() {
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("host_fn_blocking: CUDA_DEVICE_MAX_CONNECTIONS=%s, limit %.1f s\n",
              conn ? conn : "(unset)", kLimitS);
  Ctx c{};
  CK(cudaMalloc(&c.dev4m, 4 << 20));
  CK(cudaMalloc(&c.dev4k, 4 << 10));
  CK(cudaMallocHost(&c.pin4m, 4 << 20));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  CK(cudaMemPoolCreate(&c.pool, &props));
  {
    uint64_t keep = ~0ull;
    int off = 0;
    CK(cudaMemPoolSetAttribute(c.pool, cudaMemPoolAttrReleaseThreshold, &keep));
    CK(cudaMemPoolSetAttribute(c.pool, cudaMemPoolReuseAllowInternalDependencies, &off));
    CK(cudaStreamCreateWithFlags(&c.early, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&c.release, cudaStreamNonBlocking));
    CK(cudaMallocFromPoolAsync(&c.pool4m, 4 << 20, c.pool, c.early));
    CK(cudaStreamSynchronize(c.early));
  }
  static char pageable[4 << 20];

  struct Case {
    const char* name;
    std::function<void(Ctx&)> op;
  };
  std::vector<Case> cases = {
      {"nothing (synchronize an empty stream)", [](Ctx&) {}},
      {"event record + synchronize", [](Ctx& c) {
         cudaEvent_t e;
         CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
         CK(cudaEventRecord(e, c.b));
         CK(cudaEventSynchronize(e));
         CK(cudaEventDestroy(e));
       }},
      {"memset 4 KiB", [](Ctx& c) { CK(cudaMemsetAsync(c.dev4k, 0, 4 << 10, c.b)); }},
      {"memset 4 MiB", [](Ctx& c) { CK(cudaMemsetAsync(c.dev4m, 0, 4 << 20, c.b)); }},
      {"HtoD 4 KiB from pinned", [](Ctx& c) { CK(cudaMemcpyAsync(c.dev4k, c.pin4m, 4 << 10, cudaMemcpyHostToDevice, c.b)); }},
      {"HtoD 4 MiB from pinned", [](Ctx& c) { CK(cudaMemcpyAsync(c.dev4m, c.pin4m, 4 << 20, cudaMemcpyHostToDevice, c.b)); }},
      {"HtoD 4 KiB from pageable", [](Ctx& c) { CK(cudaMemcpyAsync(c.dev4k, pageable, 4 << 10, cudaMemcpyHostToDevice, c.b)); }},
      {"DtoH 16 B to pinned", [](Ctx& c) { CK(cudaMemcpyAsync(c.pin4m, c.dev4k, 16, cudaMemcpyDeviceToHost, c.b)); }},
      {"DtoH 4 MiB to pinned", [](Ctx& c) { CK(cudaMemcpyAsync(c.pin4m, c.dev4m, 4 << 20, cudaMemcpyDeviceToHost, c.b)); }},
      {"DtoD 4 MiB", [](Ctx& c) { CK(cudaMemcpyAsync(c.dev4m, (char*)c.dev4m + (2 << 20), 2 << 20, cudaMemcpyDeviceToDevice, c.b)); }},
      {"kernel, then memset 4 MiB", [](Ctx& c) {
         tiny<<<1, 32, 0, c.b>>>((int*)c.dev4k);
         CK(cudaMemsetAsync(c.dev4m, 0, 4 << 20, c.b));
       }},
      {"pool alloc 4 MiB + free (async)", [](Ctx& c) {
         void* p;
         CK(cudaMallocFromPoolAsync(&p, 4 << 20, c.pool, c.b));
         CK(cudaFreeAsync(p, c.b));
       }},
      {"pool alloc 64 MiB (pool grows) + free", [](Ctx& c) {
         static size_t grow = 64 << 20;
         void* p;
         CK(cudaMallocFromPoolAsync(&p, grow, c.pool, c.b));
         CK(cudaFreeAsync(p, c.b));
         grow += 64 << 20;
       }},
      {"memset 4 MiB of pool memory", [](Ctx& c) { CK(cudaMemsetAsync(c.pool4m, 0, 4 << 20, c.b)); }},
      {"DtoH 16 B from pool memory", [](Ctx& c) { CK(cudaMemcpyAsync(c.pin4m, c.pool4m, 16, cudaMemcpyDeviceToHost, c.b)); }},
      {"HtoD 4 MiB to pool memory", [](Ctx& c) { CK(cudaMemcpyAsync(c.pool4m, c.pin4m, 4 << 20, cudaMemcpyHostToDevice, c.b)); }},
      {"pool alloc 8 MiB + memset + free", [](Ctx& c) {
         void* p;
         CK(cudaMallocFromPoolAsync(&p, 8 << 20, c.pool, c.b));
         CK(cudaMemsetAsync(p, 0, 8 << 20, c.b));
         CK(cudaFreeAsync(p, c.b));
       }},
      {"memset 4 MiB on a stream made first", [](Ctx& c) {
         CK(cudaMemsetAsync(c.dev4m, 0, 4 << 20, c.early));
         CK(cudaStreamSynchronize(c.early));
       }},
      {"free behind A, then memset 4 MiB of pool memory", [](Ctx& c) {
         free_behind_held(c);
         CK(cudaMemsetAsync(c.pool4m, 0, 4 << 20, c.b));
       }},
      {"free behind A, then DtoH 16 B from pool memory", [](Ctx& c) {
         free_behind_held(c);
         CK(cudaMemcpyAsync(c.pin4m, c.pool4m, 16, cudaMemcpyDeviceToHost, c.b));
       }},
      {"free behind A, then pool alloc 4 MiB + memset on the first stream", [](Ctx& c) {
         free_behind_held(c);
         void* p;
         CK(cudaMallocFromPoolAsync(&p, 4 << 20, c.pool, c.early));
         CK(cudaMemsetAsync(p, 0, 4 << 20, c.early));
         CK(cudaStreamSynchronize(c.early));
         CK(cudaFreeAsync(p, c.early));
       }},
      {"another host function on B", [](Ctx& c) { CK(cudaLaunchHostFunc(c.b, noop, nullptr)); }},
      {"kernel <<<1,32>>> (first launch: lazy load)", [](Ctx& c) { tiny<<<1, 32, 0, c.b>>>((int*)c.dev4k); CK(cudaGetLastError()); }},
      {"kernel <<<1,32>>> (loaded)", [](Ctx& c) { tiny<<<1, 32, 0, c.b>>>((int*)c.dev4k); CK(cudaGetLastError()); }},
  };
  // pad: streams created between A and B; +k: a kernel queued on A
  // behind the gate.
  for (bool k : {false, true})
    for (int pad : {0, 7}) {
      std::printf("streams created between A and B: %d%s\n", pad,
                  k ? ", a kernel queued behind the gate" : "");
      for (auto& cs : cases) run_case(cs.name, pad, k, c, cs.op);
    }
  std::printf("host_fn_blocking: done\n");
  return 0;
}
