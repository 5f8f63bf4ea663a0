// Self-tests: __syncthreads (a shared-memory tree reduction that is only
// right if the barrier holds, a 3-D block, the _count/_and/_or forms) and
// static/dynamic shared memory (per block, poisoned before first use).
#include <vector>

#include "selftest.h"

namespace {
struct ReduceParams {
  const float *in;
  float *out;
};
struct MultiDimParams {
  unsigned *out;  // 4 values per thread
};
struct CountParams {
  int *out;  // 3 per thread
  int modulo;
};
struct PoisonParams {
  unsigned *out;  // per block: 8 words
};
struct DynParams {
  const double *in;
  double *out;
  unsigned *misaligned;
};
}  // namespace

FTN_KERNEL(st_tree_reduce, ReduceParams, p) {
  FTN_SHARED(float, s, [256]);
  const unsigned t = threadIdx.x;
  s[t] = p.in[blockIdx.x * 256 + t];
  __syncthreads();
  for (unsigned stride = 128; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) p.out[blockIdx.x] = s[0];
}

void test_barrier_tree_reduction() {
  const int blocks = 37;
  std::vector<float> in(blocks * 256), out(blocks, -1.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(int(i % 97) - 40);
  ReduceParams p{in.data(), out.data()};
  LAUNCH_OK(st_tree_reduce, p, dim3(blocks), dim3(256), 0, 2);
  for (int b = 0; b < blocks; ++b) {
    float want = 0;
    for (int i = 0; i < 256; ++i) want += in[b * 256 + i];
    CHECK(out[b] == want, "block %d: got %g want %g", b, out[b], want);
  }
}

FTN_KERNEL(st_multidim, MultiDimParams, p) {
  FTN_SHARED(unsigned, s, [2][4][8]);
  const unsigned x = threadIdx.x, y = threadIdx.y, z = threadIdx.z;
  const unsigned lin = x + y * blockDim.x + z * blockDim.x * blockDim.y;
  s[z][y][x] = lin + 1000 * blockIdx.y;
  __syncthreads();
  unsigned *o = p.out + 4 * (blockIdx.y * 64 + lin);
  o[0] = s[1 - z][3 - y][7 - x];
  o[1] = x | (y << 8) | (z << 16);
  o[2] = blockDim.x | (blockDim.y << 8) | (blockDim.z << 16);
  o[3] = gridDim.x | (gridDim.y << 8) | (blockIdx.y << 16);
}

void test_barrier_multidim_block() {
  std::vector<unsigned> out(4 * 64 * 3, 0xDEADu);
  MultiDimParams p{out.data()};
  LAUNCH_OK(st_multidim, p, dim3(1, 3, 1), dim3(8, 4, 2), 0, 2);
  for (unsigned by = 0; by < 3; ++by)
    for (unsigned z = 0; z < 2; ++z)
      for (unsigned y = 0; y < 4; ++y)
        for (unsigned x = 0; x < 8; ++x) {
          unsigned lin = x + 8 * y + 32 * z;
          const unsigned *o = &out[4 * (by * 64 + lin)];
          unsigned other = (7 - x) + 8 * (3 - y) + 32 * (1 - z) + 1000 * by;
          CHECK(o[0] == other, "thread (%u,%u,%u): read %u want %u", x, y, z, o[0], other);
          CHECK(o[1] == (x | (y << 8) | (z << 16)), "threadIdx wrong at %u", lin);
          CHECK(o[2] == (8u | (4u << 8) | (2u << 16)), "blockDim wrong");
          CHECK(o[3] == (1u | (3u << 8) | (by << 16)), "gridDim/blockIdx wrong");
        }
}

FTN_KERNEL(st_sync_count, CountParams, p) {
  const unsigned t = threadIdx.x;
  const int pred = int(t % unsigned(p.modulo)) == 0;
  p.out[3 * t] = __syncthreads_count(pred);
  p.out[3 * t + 1] = __syncthreads_and(pred);
  p.out[3 * t + 2] = __syncthreads_or(pred);
}

void test_barrier_count_and_or() {
  for (int modulo : {1, 3, 1000}) {
    std::vector<int> out(3 * 96, -7);
    CountParams p{out.data(), modulo};
    LAUNCH_OK(st_sync_count, p, dim3(1), dim3(96), 0, 1);
    int count = (96 + modulo - 1) / modulo;
    for (int t = 0; t < 96; ++t) {
      CHECK(out[3 * t] == count, "modulo %d: count %d want %d", modulo, out[3 * t], count);
      CHECK(out[3 * t + 1] == (modulo == 1), "modulo %d: and %d", modulo, out[3 * t + 1]);
      CHECK(out[3 * t + 2] == 1, "modulo %d: or %d", modulo, out[3 * t + 2]);
    }
  }
}

FTN_KERNEL(st_smem_poison, PoisonParams, p) {
  FTN_SHARED(float, a, [64]);
  FTN_SHARED(int, b, [4][8]);
  FTN_DYNAMIC_SHARED(unsigned char, d);
  unsigned *o = p.out + 8 * blockIdx.x;
  if (threadIdx.x == 0) {
    o[0] = __float_as_uint(a[5]);
    o[1] = unsigned(b[3][7]);
    o[2] = unsigned(d[0]) | (unsigned(d[99]) << 8);
    o[3] = unsigned(reinterpret_cast<uintptr_t>(d) % 16);
    o[4] = std::isnan(a[63]) ? 1u : 0u;
    o[5] = (reinterpret_cast<char *>(&b[0][0]) != reinterpret_cast<char *>(&a[0])) ? 1u : 0u;
  }
  __syncthreads();
  a[threadIdx.x] = 1.0f;  // dirty everything for the next block
  if (threadIdx.x < 32) b[threadIdx.x / 8][threadIdx.x % 8] = 0;
  d[threadIdx.x] = 0;
  __syncthreads();
  if (threadIdx.x == 0) o[6] = unsigned(d[1]) + unsigned(b[0][0]) + unsigned(a[1]);
}

void test_static_shared_poison() {
  std::vector<unsigned> out(8 * 3, 0);
  PoisonParams p{out.data()};
  LAUNCH_OK(st_smem_poison, p, dim3(3), dim3(64), 100, 1);  // one worker: arena reused
  for (int blk = 0; blk < 3; ++blk) {
    const unsigned *o = &out[8 * blk];
    CHECK(o[0] == 0xFFFFFFFFu, "block %d: static float not poisoned: 0x%08x", blk, o[0]);
    CHECK(o[1] == 0xFFFFFFFFu, "block %d: static int not poisoned: 0x%08x", blk, o[1]);
    CHECK(o[2] == 0xFFFFu, "block %d: dynamic bytes not poisoned: 0x%x", blk, o[2]);
    CHECK(o[3] == 0, "dynamic shared not 16-byte aligned");
    CHECK(o[4] == 1, "poisoned float is not NaN");
    CHECK(o[5] == 1, "two FTN_SHARED arrays alias");
    CHECK(o[6] == 1, "block %d: writes after barrier not visible (%u)", blk, o[6]);
  }
}

FTN_KERNEL(st_dyn_reduce, DynParams, p) {
  FTN_DYNAMIC_SHARED(double, s);
  const unsigned t = threadIdx.x, n = blockDim.x;
  if (reinterpret_cast<uintptr_t>(s) % 16) *p.misaligned = 1;
  s[t] = p.in[blockIdx.x * n + t];
  __syncthreads();
  if (t == 0) {
    double acc = 0;
    for (unsigned i = 0; i < n; ++i) acc += s[i];
    p.out[blockIdx.x] = acc;
  }
}

void test_dynamic_shared() {
  const unsigned n = 200, blocks = 5;
  std::vector<double> in(n * blocks), out(blocks, -1);
  for (size_t i = 0; i < in.size(); ++i) in[i] = double(i) * 0.5;
  unsigned mis = 0;
  DynParams p{in.data(), out.data(), &mis};
  LAUNCH_OK(st_dyn_reduce, p, dim3(blocks), dim3(n), n * sizeof(double), 2);
  CHECK(mis == 0, "dynamic shared memory misaligned");
  for (unsigned b = 0; b < blocks; ++b) {
    double want = 0;
    for (unsigned i = 0; i < n; ++i) want += in[b * n + i];
    CHECK(out[b] == want, "block %u: %g want %g", b, out[b], want);
  }
}
