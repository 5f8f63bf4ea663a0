// Compile-only probe of cuda/sm90.cuh for sm_90a (.ci/check_sm90.sh): one
// warpgroup loads a 64x64 A tile and a 128x64 B tile with TMA (128-byte
// swizzle) into shared memory on an mbarrier, runs four wgmma m64n128k16
// from descriptors of those tiles and stores the fp32 accumulators. The
// SASS must contain HGMMA, UTMALDG and mbarrier (SYNCS) instructions and no
// local memory. Never launched: the same pipeline runs on the emulator in
// cuda/emu/tests/test_hopper_gemm.cu.
#include "sm90.cuh"

struct alignas(64) ProbeTensorMap {
  unsigned char bytes[128];
};

extern "C" __global__ void __launch_bounds__(128)
    ftn_sm90_probe(const __grid_constant__ ProbeTensorMap a, const __grid_constant__ ProbeTensorMap b,
                   float *c, int n) {
  constexpr int kBM = 64, kBN = 128, kBK = 64;
  constexpr unsigned kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2;
  extern __shared__ __align__(1024) unsigned char smem[];
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + kABytes + kBBytes);
  if (threadIdx.x == 0) {
    ftn_mbar_init(full, 1);
    ftn_fence_proxy_async();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ftn_mbar_arrive_expect_tx(full, kABytes + kBBytes);
    ftn_tma_load_2d(smem, &a, 0, int(blockIdx.y) * kBM, full);
    ftn_tma_load_2d(smem + kABytes, &b, 0, int(blockIdx.x) * kBN, full);
  }
  FtnWgmmaAcc<kBN> acc;
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;
  ftn_mbar_wait(full, 0);
  ftn_wgmma_fence();
  for (int kk = 0; kk < kBK / 16; ++kk) {
    const uint64_t da = ftn_wgmma_desc(smem + 32 * kk, 16, 1024, FTN_WGMMA_SWIZZLE_128B);
    const uint64_t db = ftn_wgmma_desc(smem + kABytes + 32 * kk, 16, 1024, FTN_WGMMA_SWIZZLE_128B);
    ftn_wgmma<kBN, __nv_bfloat16>(acc, da, db, kk > 0);
  }
  ftn_wgmma_commit();
  ftn_wgmma_wait<0>();
  const int w = int(threadIdx.x) / 32, l = int(threadIdx.x) % 32;
  for (int r = 0; r < kBN / 2; ++r) {
    const int row = int(blockIdx.y) * kBM + 16 * w + l / 4 + 8 * ((r % 4) / 2);
    const int col = int(blockIdx.x) * kBN + 8 * (r / 4) + 2 * (l % 4) + r % 2;
    c[size_t(row) * n + col] = acc[r];
  }
}
