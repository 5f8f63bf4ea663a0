// Tensor-core GEMM with fused epilogues (Megatron's linear layers):
//   D[b] = epilogue(alpha * op(A[b]) op(B[b]) + beta * C[b]),  row-major,
// fp16/bf16 inputs, fp32 accumulation, fp16/bf16/fp32 output.
//
// Algorithm. Each block computes a BM x BN tile of D (128x128 with 8 warps
// as 2x4 warp tiles of 64x32, or 64x64 with 4 warps of 32x32), stepping
// through K in slices of BK = 32:
//   * a 3-stage cp.async pipeline copies the A and B slices for step kt+2
//     into shared memory while step kt is computed (16-byte copies; partial
//     copies zero-fill, so edges in M, N and K are predicated without
//     branches in the inner loop). Operands whose address, leading dimension
//     or batch stride is not 16-byte aligned take a correct slower path:
//     element loads with bounds checks into the same shared layout.
//   * shared tiles are stored in the operand's own major order (K-contiguous
//     [rows][BK] or row-contiguous [BK][rows]) with rows padded by 8 halves
//     (16 bytes): the 8 row addresses of every ldmatrix phase then fall in 8
//     distinct 4-bank groups (row strides of 80 / 272 / 144 bytes), so
//     ldmatrix (.trans for the row-contiguous layouts) is conflict-free.
//   * each warp feeds mma.sync m16n8k16 from ldmatrix.x4 fragments
//     (cuda/mma.cuh); the fp32 accumulators stay in registers.
//   * the epilogue works on the accumulator fragments in registers: alpha,
//     beta*C, + bias, GeLU (tanh or erf, cuda/gelu.cuh) optionally saving the
//     pre-activation, or * GeLU'(saved pre-activation); then one store.
// Floors (per GEMM): 2*M*N*K FLOP at the tensor-core rate (H100 SXM bf16 dense
// ~989 TFLOP/s); HBM bytes >= (M*K + K*N)*2 + M*N*sizeof(out)
// [+ M*N*sizeof(out) for C or the saved pre-activation]. Megatron MLP shapes
// are compute-bound by ~2 orders of magnitude.
// The bias gradient is a deterministic two-stage column sum
// (ftn_gemm_column_partials_* here, then ftn_column_sum_partials_*).
#include "ftn_dtype.cuh"
#include "gemm_epilogue.cuh"
#include "gelu.cuh"
#include "mma.cuh"

constexpr int kGemmBK = 32;
constexpr int kGemmStages = 3;
constexpr int kGemmPad = 8;

constexpr int gemm_max(int a, int b) { return a > b ? a : b; }

template <int BM_, int BN_, int WM_, int WN_>
struct GemmTile {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_;
  static constexpr int THREADS = WM * WN * 32;
  static constexpr int WTM = BM / WM, WTN = BN / WN;  // warp tile
  static constexpr int MI = WTM / 16, NI = WTN / 8;   // mma tiles per warp
  // Halves of one stage for one operand: the larger of its two layouts.
  static constexpr int A_ELEMS = gemm_max(BM * (kGemmBK + kGemmPad), kGemmBK * (BM + kGemmPad));
  static constexpr int B_ELEMS = gemm_max(BN * (kGemmBK + kGemmPad), kGemmBK * (BN + kGemmPad));
  static constexpr int STAGE_ELEMS = A_ELEMS + B_ELEMS;
  // Must equal the plan's dynamic shared memory (src/core/plan/gemm.rs).
  static constexpr int SMEM_BYTES = kGemmStages * STAGE_ELEMS * 2;
  static_assert(NI % 2 == 0 && WTM % 16 == 0, "warp tile");
};
using GemmTile128 = GemmTile<128, 128, 2, 4>;
using GemmTile64 = GemmTile<64, 64, 2, 2>;

// Copies one BK slice of an operand into shared memory.
// K_MAJOR: stored [rows_total, k_total] (k contiguous) -> s[R][BK + pad];
// else:    stored [k_total, rows_total] (rows contiguous) -> s[BK][R + pad].
// Out-of-range elements become zeros.
template <typename T, int R, int THREADS, bool K_MAJOR>
FTN_DEVICE void gemm_load_slice(T *s, const T *g, int64_t ld, int64_t rows_total,
                                int64_t k_total, int64_t r0, int64_t k0, bool aligned, int tid) {
  constexpr int CHUNKS = R * kGemmBK / 8;
  constexpr int PER_LINE = K_MAJOR ? kGemmBK / 8 : R / 8;
  constexpr int SLD = K_MAJOR ? kGemmBK + kGemmPad : R + kGemmPad;
#pragma unroll
  for (int c = tid; c < CHUNKS; c += THREADS) {
    const int line = c / PER_LINE, off = (c % PER_LINE) * 8;
    // (gline, goff): stored row and column of the chunk's first element.
    const int64_t gline = (K_MAJOR ? r0 : k0) + line;
    const int64_t goff = (K_MAJOR ? k0 : r0) + off;
    const int64_t lines = K_MAJOR ? rows_total : k_total;
    const int64_t width = K_MAJOR ? k_total : rows_total;
    T *dst = s + line * SLD + off;
    const int64_t avail = gline < lines ? width - goff : 0;
    const int n = avail <= 0 ? 0 : (avail >= 8 ? 8 : int(avail));
    if (aligned) {
      const T *src = n > 0 ? g + gline * ld + goff : g;
      ftn_cp_async_16(dst, src, n * 2);
    } else {
      const T *src = g + gline * ld + goff;
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = e < n ? src[e] : ftn_from_float<T>(0.0f);
    }
  }
}

template <typename T, typename O, typename Tile, bool A_K_MAJOR, bool B_K_MAJOR>
FTN_DEVICE void gemm_main(const FtnGemmParams &p, T *smem) {
  constexpr int BM = Tile::BM, BN = Tile::BN, BK = kGemmBK, MI = Tile::MI, NI = Tile::NI;
  constexpr int SLDA = A_K_MAJOR ? BK + kGemmPad : BM + kGemmPad;
  constexpr int SLDB = B_K_MAJOR ? BK + kGemmPad : BN + kGemmPad;
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / Tile::WN) * Tile::WTM, wn0 = (warp % Tile::WN) * Tile::WTN;
  const int64_t tiles_n = (p.n + BN - 1) / BN;
  const int64_t m0 = int64_t(blockIdx.x) / tiles_n * BM, n0 = int64_t(blockIdx.x) % tiles_n * BN;
  const int64_t ktiles = (p.k + BK - 1) / BK;
  const bool aligned = p.aligned != 0;
  const int g = lane >> 2, t = lane & 3;

  for (int64_t bz = blockIdx.z; bz < p.batch; bz += gridDim.z) {
    const T *A = static_cast<const T *>(p.a) + bz * p.stride_a;
    const T *B = static_cast<const T *>(p.b) + bz * p.stride_b;
    auto load_stage = [&](int64_t kt) {
      T *sa = smem + int(kt % kGemmStages) * Tile::STAGE_ELEMS;
      T *sb = sa + Tile::A_ELEMS;
      gemm_load_slice<T, BM, Tile::THREADS, A_K_MAJOR>(sa, A, p.lda, p.m, p.k, m0, kt * BK,
                                                       aligned, tid);
      gemm_load_slice<T, BN, Tile::THREADS, B_K_MAJOR>(sb, B, p.ldb, p.n, p.k, n0, kt * BK,
                                                       aligned, tid);
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < kGemmStages - 1; ++s) {
      if (s < ktiles) load_stage(s);
      ftn_cp_async_commit();
    }

    // Emulator only (no-ops on a GPU): the tensor-core ops of the loop run
    // warp by warp at each __syncthreads instead of one rendezvous per op.
    // The fragments live for the whole loop: a batch writes them at its
    // flush points, which may come after a kk iteration's scope has ended.
    uint32_t af[MI][4], bf[NI][2];
    ftn_mma_batch_begin();
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      ftn_cp_async_wait<kGemmStages - 2>();
      __syncthreads();  // slice kt is visible; slice kt-1's stage is free
      if (kt + kGemmStages - 1 < ktiles) load_stage(kt + kGemmStages - 1);
      ftn_cp_async_commit();
      const T *sa = smem + int(kt % kGemmStages) * Tile::STAGE_ELEMS;
      const T *sb = sa + Tile::A_ELEMS;
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        // A: MI x4 loads, 16 rows (or columns) apart; B: NI/2 x4 loads, each
        // giving the fragments of n-tiles 2j (b0, b1) and 2j+1 (b0, b1).
        if constexpr (A_K_MAJOR) {
          ftn_ldmatrix_x4_seq<MI, false>(&af[0][0],
                                         sa + (wm0 + (lane & 15)) * SLDA + kk + (lane >> 4) * 8,
                                         16 * SLDA);
        } else {
          ftn_ldmatrix_x4_seq<MI, true>(
              &af[0][0], sa + (kk + (lane >> 4) * 8 + (lane & 7)) * SLDA + wm0 + ((lane >> 3) & 1) * 8,
              16);
        }
        if constexpr (B_K_MAJOR) {
          ftn_ldmatrix_x4_seq<NI / 2, false>(
              &bf[0][0], sb + (wn0 + (lane >> 4) * 8 + (lane & 7)) * SLDB + kk + ((lane >> 3) & 1) * 8,
              16 * SLDB);
        } else {
          ftn_ldmatrix_x4_seq<NI / 2, true>(
              &bf[0][0], sb + (kk + ((lane >> 3) & 1) * 8 + (lane & 7)) * SLDB + wn0 + (lane >> 4) * 8,
              16);
        }
        ftn_mma_tile_m16n8k16<T>(acc, af, bf);  // acc[i][j] += af[i] * bf[j]
      }
    }
    ftn_mma_batch_end();  // acc holds the results from here on
    ftn_cp_async_wait<0>();

    // Epilogue straight from the accumulator fragments: element e of tile
    // (i, j) is row g + 8*(e/2), column 2t + e%2 (PTX C/D fragment layout).
    O *D = static_cast<O *>(p.d) + bz * p.stride_d;
    const O *C = p.beta != 0.0f ? static_cast<const O *>(p.c) + bz * p.stride_c : nullptr;
    O *aux = p.aux != nullptr ? static_cast<O *>(p.aux) + bz * p.stride_aux : nullptr;
    const T *bias = static_cast<const T *>(p.bias);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t row = m0 + wm0 + i * 16 + g + 8 * (e >> 1);
          const int64_t col = n0 + wn0 + j * 8 + 2 * t + (e & 1);
          if (row >= p.m || col >= p.n) continue;
          gemm_store<T, O>(p, acc[i][j][e], D, C, aux, bias, row, col);
        }
    __syncthreads();  // the next batch entry reuses the stages
  }
}

template <typename T, typename O, typename Tile>
FTN_DEVICE void gemm_dispatch(const FtnGemmParams &p) {
  FTN_ASSERT(blockDim.x == Tile::THREADS && blockDim.y == 1 && blockDim.z == 1);
  FTN_DYNAMIC_SHARED(T, smem);
  if (!p.trans_a && !p.trans_b) gemm_main<T, O, Tile, true, false>(p, smem);
  if (!p.trans_a && p.trans_b) gemm_main<T, O, Tile, true, true>(p, smem);
  if (p.trans_a && !p.trans_b) gemm_main<T, O, Tile, false, false>(p, smem);
  if (p.trans_a && p.trans_b) gemm_main<T, O, Tile, false, true>(p, smem);
}

// Stage one of a deterministic column sum: one thread per column walks its
// chunk's rows in order. Floor: reads rows*cols*sizeof(T), writes
// chunks*cols*4 bytes.
template <typename T>
FTN_DEVICE void column_partials(const FtnColumnPartialsParams &p) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.cols) return;
  const T *x = static_cast<const T *>(p.x);
  const int64_t r0 = int64_t(blockIdx.y) * p.rows_per_chunk;
  const int64_t r1 = r0 + p.rows_per_chunk < p.rows ? r0 + p.rows_per_chunk : p.rows;
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += ftn_to_float(x[r * p.ld + c]);
  p.partial[int64_t(blockIdx.y) * p.cols + c] = s;
}

#define FTN_STAMP_GEMM(tile, Tile, threads, in, T)                                          \
  FTN_KERNEL_BOUNDED(ftn_gemm_##tile##_##in##_##in, FtnGemmParams, p, threads) {           \
    gemm_dispatch<T, T, Tile>(p);                                                          \
  }                                                                                        \
  FTN_KERNEL_BOUNDED(ftn_gemm_##tile##_##in##_f32, FtnGemmParams, p, threads) {            \
    gemm_dispatch<T, float, Tile>(p);                                                      \
  }

FTN_STAMP_GEMM(128x128, GemmTile128, 256, f16, __half)
FTN_STAMP_GEMM(128x128, GemmTile128, 256, bf16, __nv_bfloat16)
FTN_STAMP_GEMM(64x64, GemmTile64, 128, f16, __half)
FTN_STAMP_GEMM(64x64, GemmTile64, 128, bf16, __nv_bfloat16)

#define FTN_STAMP_COLUMN_PARTIALS(suffix, T)                                                \
  FTN_KERNEL_BOUNDED(ftn_gemm_column_partials_##suffix, FtnColumnPartialsParams, p, 256) { \
    column_partials<T>(p);                                                                 \
  }
FTN_STAMP_COLUMN_PARTIALS(f32, float)
FTN_STAMP_COLUMN_PARTIALS(f16, __half)
FTN_STAMP_COLUMN_PARTIALS(bf16, __nv_bfloat16)
