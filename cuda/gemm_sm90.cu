// Hopper (sm_90a) tensor-core GEMM: the same computation as cuda/gemm.cu
//   D[b] = epilogue(alpha * op(A[b]) op(B[b]) + beta * C[b]),  row-major,
// fp16/bf16 inputs, fp32 accumulation, fp16/bf16/fp32 output, epilogues
// NONE / BIAS / BIAS_GELU (saving the pre-activation) / DGELU
// (cuda/gemm_epilogue.cuh, shared with gemm.cu), any M/N/K >= 1, batched.
//
// Algorithm. Output tiles of 128 x 128, k-slices of 64:
//   * TMA (cp.async.bulk.tensor.3d, 128-byte swizzle) copies the A and B
//     slices of a k-step into one stage of a 4-stage ring in shared memory
//     (32 KiB a stage); the tensor maps are rank 3 {stored cols, stored
//     rows, batch} and zero-fill everything outside the matrices, so edges
//     in M, N and K need no predication in the main loop. A K-contiguous
//     operand is one box {64 k, 128 rows}; an M/N-contiguous one is two
//     boxes {64 rows, 64 k} (the 128-byte swizzle span is 64 elements),
//     the second skipped when it lies wholly past the edge (its rows only
//     reach outputs that are never stored).
//   * Each stage has a `full` mbarrier (the producer's arrive.expect_tx +
//     the TMA bytes) and an `empty` one (one arrival from each consumer
//     thread once the wgmma reading the stage has retired).
//   * Warp specialisation: warpgroup 0 is the producer (setmaxnreg.dec to
//     40 registers; one thread issues the TMA copies), warpgroups 1 and 2
//     are consumers (setmaxnreg.inc to 232), each owning 64 rows x 128
//     columns of the tile: per k-step four wgmma.mma_async m64n128k16 from
//     shared-memory descriptors of the stage (K-major or MN-major per the
//     operand's storage, SW128), one commit group, wait_group 1 (so one
//     group stays in flight) and the previous stage is released.
//   * Persistent scheduler: grid = min(SMs, tiles); block i walks tiles
//     i, i + grid, ... of tiles_m * tiles_n * batch in a grouped order
//     (group_m m-tiles walked down a column of n-tiles at a time, so
//     concurrently running blocks share A and B slices in L2). The stage
//     ring runs on across tiles: the producer loads the next tile's slices
//     while the consumers run this tile's epilogue.
//   * The epilogue works on the accumulator registers (fragment of
//     m64nNk16: warp w of the group holds rows 16w..16w+15; register r of
//     lane l is row l/4 + 8*((r%4)/2), column 8*(r/4) + 2*(l%4) + r%2),
//     stores predicated on M and N.
// Why 128 x 128 and not 128 x 256: the 64 x 128 accumulator of a consumer
// is 64 fp32 registers per thread, which leaves the fused epilogue (bias,
// GeLU with its pre-activation store, dGeLU's aux load, 64-bit address
// arithmetic) room under the 168-register launch budget of 384 threads
// without spills; 128 x 256 needs 128 accumulator registers and the full
// 232 of setmaxnreg, with one stage (48 KiB) less in 227 KiB of shared memory.
// Floors (per GEMM): 2*M*N*K FLOP at the tensor-core rate (H100/H200 SXM
// bf16 dense ~989 TFLOP/s); HBM bytes >= (M*K + K*N)*2 + M*N*sizeof(out)
// [+ M*N*sizeof(out) for C or the pre-activation]. The tile's arithmetic
// intensity is 128*128*64*2 FLOP / 32 KiB = 64 FLOP/B of shared-memory fill.
#include "ftn_dtype.cuh"
#include "gemm_epilogue.cuh"
#include "sm90.cuh"

constexpr int kSm90BM = FTN_GEMM_SM90_BM, kSm90BN = FTN_GEMM_SM90_BN;
constexpr int kSm90BK = FTN_GEMM_SM90_BK, kSm90Stages = FTN_GEMM_SM90_STAGES;
constexpr int kSm90Consumers = 2;  // consumer warpgroups, 64 rows each
constexpr uint32_t kSm90TileBytes = kSm90BM * kSm90BK * 2;  // one operand, one stage
constexpr uint32_t kSm90HalfBytes = kSm90TileBytes / 2;     // one 64-row box
constexpr uint32_t kSm90StageBytes = 2 * kSm90TileBytes;
constexpr uint32_t kSm90ConsumerThreads = 128 * kSm90Consumers;
static_assert(kSm90BM == 128 && kSm90BN == 128 && kSm90BK == 64, "tile");
static_assert(FTN_GEMM_SM90_THREADS == 128 * (1 + kSm90Consumers), "threads");
static_assert(FTN_GEMM_SM90_SMEM_BYTES == kSm90Stages * kSm90StageBytes + 1024 + 256,
              "dynamic shared memory (src/core/plan/gemm.rs)");

struct Sm90Tile {
  int64_t m0, n0, b;
};

// Tile t of the grouped walk: batch-major; within a batch entry, groups of
// group_m m-tiles, each walked n-tile by n-tile, m fastest. 32-bit
// arithmetic: the plan keeps the tile count below 2^31 (a 64-bit division
// is a subroutine call with a stack frame).
FTN_DEVICE Sm90Tile sm90_tile(const FtnGemmSm90Params &p, uint32_t t) {
  const uint32_t tm = uint32_t(p.tiles_m), per = tm * uint32_t(p.tiles_n);
  const uint32_t gm = uint32_t(p.group_m);
  const uint32_t b = t / per;
  t -= b * per;
  const uint32_t width = gm * uint32_t(p.tiles_n);
  const uint32_t group = t / width, first_m = group * gm;
  const uint32_t gsize = tm - first_m < gm ? tm - first_m : gm;
  const uint32_t r = t - group * width;
  return {int64_t(first_m + r % gsize) * kSm90BM, int64_t(r / gsize) * kSm90BN, int64_t(b)};
}

// The dynamic shared memory, aligned up to 1024 bytes (the 128-byte swizzle
// repeats every 1024 bytes of the shared window; TMA and wgmma agree on it).
FTN_DEVICE uint8_t *sm90_align1024(uint8_t *raw) {
#if defined(__CUDACC__)
  const uint32_t a = ftn_sm90_smem(raw);
  return raw + ((1024u - (a & 1023u)) & 1023u);
#else
  return raw;  // the emulator's arena is 1024-byte aligned
#endif
}

// One operand's slice (rows r0.., k-slice k0..) of batch entry b into dst:
// K-contiguous: one {64 k, 128 rows} box; else {64 rows, 64 k} boxes at
// rows r0 and r0 + 64 (the second only if it starts inside). Returns bytes.
template <bool K_MAJOR>
FTN_DEVICE uint32_t sm90_load_operand(uint8_t *dst, const FtnTensorMap *map, int64_t rows,
                                      int64_t r0, int64_t k0, int64_t b, uint64_t *bar,
                                      bool issue) {
  if constexpr (K_MAJOR) {
    if (issue) ftn_tma_load_3d(dst, map, int32_t(k0), int32_t(r0), int32_t(b), bar);
    return kSm90TileBytes;
  } else {
    const bool second = r0 + 64 < rows;
    if (issue) {
      ftn_tma_load_3d(dst, map, int32_t(r0), int32_t(k0), int32_t(b), bar);
      if (second) ftn_tma_load_3d(dst + kSm90HalfBytes, map, int32_t(r0 + 64), int32_t(k0),
                                  int32_t(b), bar);
    }
    return second ? kSm90TileBytes : kSm90HalfBytes;
  }
}

template <typename T, typename O, bool A_K_MAJOR, bool B_K_MAJOR>
FTN_DEVICE void gemm_sm90_main(const FtnGemmSm90Params &p, uint8_t *smem) {
  const FtnGemmParams &g = p.g;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + kSm90Stages * kSm90StageBytes);
  uint64_t *empty = full + kSm90Stages;
  auto a_tile = [&](int s) { return smem + s * kSm90StageBytes; };
  auto b_tile = [&](int s) { return smem + s * kSm90StageBytes + kSm90TileBytes; };
  const int tid = int(threadIdx.x);
  const uint32_t tiles = uint32_t(p.tiles_m * p.tiles_n * g.batch);
  const int64_t ktiles = (g.k + kSm90BK - 1) / kSm90BK;

  if (tid == 0) {
    for (int s = 0; s < kSm90Stages; ++s) {
      ftn_mbar_init(&full[s], 1);
      ftn_mbar_init(&empty[s], kSm90ConsumerThreads);
    }
    ftn_fence_proxy_async();
  }
  __syncthreads();  // the barriers are initialised; no block-wide barrier after this

  const int wg = tid / 128;
  if (wg == 0) {  // producer
    ftn_setmaxnreg_dec<40>();
    if (tid != 0) return;
    uint64_t it = 0;  // k-steps loaded so far by this block
    for (uint32_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      const Sm90Tile tile = sm90_tile(p, t);
      for (int64_t kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = int(it % kSm90Stages);
        const uint64_t round = it / kSm90Stages;
        if (round > 0) ftn_mbar_wait(&empty[s], uint32_t(round - 1) & 1u);
        const int64_t k0 = kt * kSm90BK;
        // Bytes first (arrive.expect_tx), then the copies that complete them.
        const uint32_t bytes =
            sm90_load_operand<A_K_MAJOR>(nullptr, &p.tmap_a, g.m, tile.m0, k0, tile.b, nullptr,
                                         false) +
            sm90_load_operand<B_K_MAJOR>(nullptr, &p.tmap_b, g.n, tile.n0, k0, tile.b, nullptr,
                                         false);
        ftn_mbar_arrive_expect_tx(&full[s], bytes);
        sm90_load_operand<A_K_MAJOR>(a_tile(s), &p.tmap_a, g.m, tile.m0, k0, tile.b, &full[s],
                                     true);
        sm90_load_operand<B_K_MAJOR>(b_tile(s), &p.tmap_b, g.n, tile.n0, k0, tile.b, &full[s],
                                     true);
      }
    }
    return;
  }

  // Consumers: warpgroup c = wg - 1 owns rows 64c..64c+63 of each tile.
  ftn_setmaxnreg_inc<232>();
  const int c = wg - 1, ctid = tid - 128 * wg, warp = ctid / 32, lane = ctid % 32;
  // Descriptor geometry (cuda/emu/README.md, CuTe's make_gmma_desc):
  // K-major SW128: rows of 128 bytes (64 k), SBO = 1024 per 8 rows, a k16
  //   step is +32 bytes; the consumer's 64 rows start 64 * 128 bytes in.
  // MN-major SW128: k-rows of 128 bytes (64 rows/cols), SBO = 1024 per 8
  //   k-rows (a k16 step is +2048), LBO = 8192 between the two 64-wide boxes.
  constexpr uint32_t a_lbo = A_K_MAJOR ? 16 : kSm90HalfBytes, b_lbo = B_K_MAJOR ? 16 : kSm90HalfBytes;
  constexpr uint32_t a_step = A_K_MAJOR ? 32 : 2048, b_step = B_K_MAJOR ? 32 : 2048;
  const uint32_t a_off = uint32_t(c) * kSm90HalfBytes;  // both layouts: 64 rows = 8 KiB
  FtnWgmmaAcc<kSm90BN> acc;
  uint64_t it = 0;  // k-steps consumed so far by this block
  for (uint32_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const Sm90Tile tile = sm90_tile(p, t);
    int prev = -1;
    for (int64_t kt = 0; kt < ktiles; ++kt, ++it) {
      const int s = int(it % kSm90Stages);
      ftn_mbar_wait(&full[s], uint32_t(it / kSm90Stages) & 1u);
      ftn_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kSm90BK / 16; ++kk) {
        const uint64_t da = ftn_wgmma_desc(a_tile(s) + a_off + kk * a_step, a_lbo, 1024,
                                           FTN_WGMMA_SWIZZLE_128B);
        const uint64_t db =
            ftn_wgmma_desc(b_tile(s) + kk * b_step, b_lbo, 1024, FTN_WGMMA_SWIZZLE_128B);
        ftn_wgmma<kSm90BN, T, A_K_MAJOR ? 0 : 1, B_K_MAJOR ? 0 : 1>(acc, da, db,
                                                                    kt > 0 || kk > 0);
      }
      ftn_wgmma_commit();
      if (prev >= 0) {
        ftn_wgmma_wait<1>();  // the previous k-step's group has retired
        ftn_mbar_arrive(&empty[prev]);
      }
      prev = s;
    }
    ftn_wgmma_wait<0>();  // acc holds the tile from here on
    ftn_mbar_arrive(&empty[prev]);

    O *D = static_cast<O *>(g.d) + tile.b * g.stride_d;
    const O *C = g.beta != 0.0f ? static_cast<const O *>(g.c) + tile.b * g.stride_c : nullptr;
    O *aux = g.aux != nullptr ? static_cast<O *>(g.aux) + tile.b * g.stride_aux : nullptr;
    const T *bias = static_cast<const T *>(g.bias);
    const int64_t row0 = tile.m0 + 64 * c + 16 * warp + lane / 4;
    const int64_t col0 = tile.n0 + 2 * (lane % 4);
#pragma unroll
    for (int r = 0; r < kSm90BN / 2; ++r) {
      const int64_t row = row0 + 8 * ((r % 4) / 2), col = col0 + 8 * (r / 4) + r % 2;
      if (row < g.m && col < g.n) gemm_store<T, O>(g, acc[r], D, C, aux, bias, row, col);
    }
  }
}

template <typename T, typename O>
FTN_DEVICE void gemm_sm90_dispatch(const FtnGemmSm90Params &p) {
#if !defined(__CUDACC__) || defined(FTN_SM90_PTX)
  FTN_ASSERT(blockDim.x == FTN_GEMM_SM90_THREADS && blockDim.y == 1 && blockDim.z == 1);
  FTN_DYNAMIC_SHARED(uint8_t, raw);
  uint8_t *smem = sm90_align1024(raw);
  if (!p.g.trans_a && !p.g.trans_b) gemm_sm90_main<T, O, true, false>(p, smem);
  if (!p.g.trans_a && p.g.trans_b) gemm_sm90_main<T, O, true, true>(p, smem);
  if (p.g.trans_a && !p.g.trans_b) gemm_sm90_main<T, O, false, false>(p, smem);
  if (p.g.trans_a && p.g.trans_b) gemm_sm90_main<T, O, false, true>(p, smem);
#else
  __trap();  // built for sm_90a only; other targets keep cuda/gemm.cu
#endif
}

#define FTN_STAMP_GEMM_SM90(in, T)                                                       \
  FTN_KERNEL_GRID_CONSTANT(ftn_gemm_wgmma_##in##_##in, FtnGemmSm90Params, p,              \
                           FTN_GEMM_SM90_THREADS) {                                      \
    gemm_sm90_dispatch<T, T>(p);                                                         \
  }                                                                                      \
  FTN_KERNEL_GRID_CONSTANT(ftn_gemm_wgmma_##in##_f32, FtnGemmSm90Params, p,               \
                           FTN_GEMM_SM90_THREADS) {                                      \
    gemm_sm90_dispatch<T, float>(p);                                                     \
  }

FTN_STAMP_GEMM_SM90(f16, __half)
FTN_STAMP_GEMM_SM90(bf16, __nv_bfloat16)
