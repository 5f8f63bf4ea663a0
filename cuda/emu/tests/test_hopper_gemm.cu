// An end-to-end use of the Hopper models: a small bf16 GEMM C = A * B^T
// (A: M x K, B: N x K, both K-contiguous) with TMA loads (128-byte swizzle)
// into a two-stage mbarrier pipeline and wgmma m64n128k16 from descriptors
// of those same tiles, checked against an f64 oracle. It checks that the
// TMA and wgmma models agree on the SW128 layout (as CuTe's K-major SW128
// atom: 8 rows of 128 bytes per 1024-byte atom, SBO = 1024) and that the
// pipeline's rules (expect_tx, parity per round, wait_group before a stage
// is refilled) hold under strict mode. One warpgroup per 64x128 tile.
#include <cmath>
#include <random>
#include <vector>

#include "../../sm90.cuh"
#include "selftest.h"

namespace {
constexpr int kBM = 64, kBN = 128, kBK = 64, kStages = 2;
constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2;
struct GemmParams {
  const ftn_emu_tensor_map *a, *b;
  float *c;
  int m, n, k;
};
}  // namespace

FTN_KERNEL(st_hopper_gemm, GemmParams, p) {
  FTN_DYNAMIC_SHARED(uint8_t, smem);  // 1024-aligned: stages of A then B tiles, then barriers
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + kStages * (kABytes + kBBytes));
  const int m0 = int(blockIdx.y) * kBM, n0 = int(blockIdx.x) * kBN, kt_n = p.k / kBK;
  auto a_tile = [&](int s) { return smem + s * (kABytes + kBBytes); };
  auto b_tile = [&](int s) { return smem + s * (kABytes + kBBytes) + kABytes; };
  auto load = [&](int kt) {
    const int s = kt % kStages;
    ftn_mbar_arrive_expect_tx(&full[s], kABytes + kBBytes);
    ftn_tma_load_2d(a_tile(s), p.a, kt * kBK, m0, &full[s]);
    ftn_tma_load_2d(b_tile(s), p.b, kt * kBK, n0, &full[s]);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) ftn_mbar_init(&full[s], 1);
    ftn_fence_proxy_async();
  }
  __syncthreads();
  if (threadIdx.x == 0) load(0);
  FtnWgmmaAcc<kBN> acc;
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;
  ftn_wgmma_fence();
  for (int kt = 0; kt < kt_n; ++kt) {
    const int s = kt % kStages;
    if (threadIdx.x == 0 && kt + 1 < kt_n) load(kt + 1);
    ftn_mbar_wait(&full[s], uint32_t(kt / kStages) & 1u);
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint64_t da = ftn_wgmma_desc(a_tile(s) + 32 * kk, 16, 1024, FTN_WGMMA_SWIZZLE_128B);
      const uint64_t db = ftn_wgmma_desc(b_tile(s) + 32 * kk, 16, 1024, FTN_WGMMA_SWIZZLE_128B);
      ftn_wgmma<kBN, __nv_bfloat16>(acc, da, db, kt > 0 || kk > 0);
    }
    ftn_wgmma_commit();
    ftn_wgmma_wait<0>();
    __syncthreads();  // every thread is done with stage s before it is refilled
  }
  const int w = int(threadIdx.x) / 32, l = int(threadIdx.x) % 32;
  for (int r = 0; r < kBN / 2; ++r) {
    const int row = m0 + 16 * w + l / 4 + 8 * ((r % 4) / 2);
    const int col = n0 + 8 * (r / 4) + 2 * (l % 4) + r % 2;
    if (row < p.m && col < p.n) p.c[size_t(row) * p.n + col] = acc[r];
  }
}

void test_hopper_gemm_pipeline() {
  ftn_emu_test::StrictOn strict;  // deferred TMA copies
  const int m = 100, n = 256, k = 192;  // M not a tile multiple: TMA fills rows >= 100 with 0
  std::mt19937 rng(90);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> a(size_t(m) * k), b(size_t(n) * k);
  std::vector<double> fa(a.size()), fb(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    fa[i] = ftn_emu_bf16_bits_to_f32(a[i] = ftn_emu_f32_to_bf16_bits(u(rng)));
  for (size_t i = 0; i < b.size(); ++i)
    fb[i] = ftn_emu_bf16_bits_to_f32(b[i] = ftn_emu_f32_to_bf16_bits(u(rng)));
  ftn_emu_tensor_map ma, mb;
  const uint64_t da[2] = {uint64_t(k), uint64_t(m)}, db[2] = {uint64_t(k), uint64_t(n)};
  const uint64_t stride[1] = {uint64_t(k) * 2};
  const uint32_t boxa[2] = {kBK, kBM}, boxb[2] = {kBK, kBN}, es[2] = {1, 1};
  char err[256];
  CHECK(ftn_emu_tensor_map_encode_tiled(&ma, FTN_TMAP_BFLOAT16, 2, a.data(), da, stride, boxa, es,
                                        0, FTN_TMAP_SWIZZLE_128B, 0, 0, err, sizeof err) == 0,
        "%s", err);
  CHECK(ftn_emu_tensor_map_encode_tiled(&mb, FTN_TMAP_BFLOAT16, 2, b.data(), db, stride, boxb, es,
                                        0, FTN_TMAP_SWIZZLE_128B, 0, 0, err, sizeof err) == 0,
        "%s", err);
  std::vector<float> c(size_t(m) * n, NAN);
  GemmParams p{&ma, &mb, c.data(), m, n, k};
  const size_t dyn = kStages * (kABytes + kBBytes) + 64;
  LAUNCH_OK(st_hopper_gemm, p, dim3(n / kBN, (m + kBM - 1) / kBM), dim3(128), dyn, 2);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double want = 0, mag = 0;
      for (int q = 0; q < k; ++q) {
        want += fa[size_t(i) * k + q] * fb[size_t(j) * k + q];
        mag += std::fabs(fa[size_t(i) * k + q] * fb[size_t(j) * k + q]);
      }
      const double got = c[size_t(i) * n + j];
      CHECK(std::fabs(got - want) <= mag * 0x1p-20, "C[%d][%d] = %.9g, f64 oracle %.9g", i, j,
            got, want);
    }
}
