// The row-reduce benchmark kernel and ftn_emu_bench_row_reduce, plus the
// self-test that a grid spread over several workers gives bit-identical
// results to one worker. One block per row, 256 threads: strided per-thread
// sums, a __shfl_xor_sync warp reduction, per-warp partials in shared
// memory, a barrier, and a final warp reduction by warp 0.
#include <cmath>
#include <mutex>
#include <vector>

#include "selftest.h"

namespace {
struct RowReduceParams {
  const float *x;
  float *out;
  uint64_t cols;
};
constexpr unsigned kThreads = 256;
}  // namespace

FTN_KERNEL_BOUNDED(ftn_emu_bench_row_sum, RowReduceParams, p, 256) {
  FTN_SHARED(float, partial, [kThreads / 32]);
  const unsigned t = threadIdx.x, lane = t % 32, warp = t / 32;
  const float *row = p.x + uint64_t(blockIdx.x) * p.cols;
  float acc = 0.0f;
  for (uint64_t c = t; c < p.cols; c += kThreads) acc += row[c];
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    float v = lane < kThreads / 32 ? partial[lane] : 0.0f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if (lane == 0) p.out[blockIdx.x] = v;
  }
}

static void fill(std::vector<float> &x) {
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = float((uint32_t(i) * 2654435761u) >> 22) / 1024.0f - 0.5f;
}

static int run_row_sum(const std::vector<float> &x, std::vector<float> &out, uint32_t rows,
                       uint32_t cols, uint32_t workers, std::string *err) {
  RowReduceParams p{x.data(), out.data(), cols};
  return ftn_emu_test::launch("ftn_emu_bench_row_sum", &ftn_emu_entry_ftn_emu_bench_row_sum, &p,
                              dim3(rows), dim3(kThreads), 0, workers, err);
}

extern "C" double ftn_emu_bench_row_reduce(uint32_t rows, uint32_t cols, uint32_t workers) {
  static std::mutex mu;         // callers may be concurrent test threads
  static std::vector<float> x;  // inputs are reused between calls of one shape
  static uint64_t filled = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (filled != uint64_t(rows) * cols) {
    x.assign(size_t(rows) * cols, 0.0f);
    fill(x);
    filled = uint64_t(rows) * cols;
  }
  std::vector<float> out(rows, NAN);
  std::string err;
  if (run_row_sum(x, out, rows, cols, workers, &err) != 0) return NAN;
  double sum = 0;
  for (float v : out) sum += double(v);
  return sum;
}

void test_workers_identical() {
  const uint32_t rows = 300, cols = 1000;
  std::vector<float> x(size_t(rows) * cols);
  fill(x);
  std::vector<float> one(rows, NAN), many(rows, NAN);
  std::string err;
  CHECK(run_row_sum(x, one, rows, cols, 1, &err) == 0, "%s", err.c_str());
  CHECK(run_row_sum(x, many, rows, cols, 3, &err) == 0, "%s", err.c_str());
  for (uint32_t r = 0; r < rows; ++r) {
    CHECK(std::memcmp(&one[r], &many[r], 4) == 0, "row %u: %a vs %a", r, double(one[r]),
          double(many[r]));
    double ref = 0;
    for (uint32_t c = 0; c < cols; ++c) ref += x[size_t(r) * cols + c];
    CHECK(std::fabs(one[r] - ref) <= 1e-3 * (1 + std::fabs(ref)), "row %u: %g vs ref %g", r,
          double(one[r]), ref);
  }
}
