// LayerNorm and RMSNorm, forward and backward, any hidden size (cols >= 1).
//
// Statistics are fp32 whatever the storage dtype and never E[x^2] - E[x]^2
// (which loses everything to cancellation when |mean| >> std): two-pass (the
// mean first, then the sum of squared deviations from it) on the row held in
// registers; the global forward folds each iteration's mean and squared
// deviations into running ones with Chan's pairwise update (one pass).
// Variance is biased (divide by cols); rstd = rsqrt(var + eps). The mean is
// taken of x - pivot (pivot = the row's first element; exact subtraction for
// nearby values), so x - mean = (x - pivot) - shift stays accurate to fp32
// relative to the row's spread even under a large common offset; the saved
// mean is pivot + shift rounded to fp32. The row forwards sum 16-bit chunks
// pairwise and subtract V * pivot once per chunk, and square x - mean with
// mean = pivot + shift rounded once (a second-order effect on the sum).
//
// Three row paths, chosen by the plan (src/core/plan/layernorm.rs) from cols:
//   warp   (cols <= 1024): one warp per row, 4 rows per 128-thread block, a
//          grid-stride loop over rows; the row lives in registers (32 fp32
//          per lane), reductions are shuffles.
//   block  (cols <= 12288; the forward's 16-bit 128-bit builds up to
//          16384): a block per row, the fewest whole warps that
//          hold it at <= 24 values per thread in registers (32..512 threads;
//          more resident blocks per SM); warp shuffles then a shared-memory
//          step. Both directions keep the row (x; x and dy) in its storage
//          type (two bf16/f16 per register), load all of it before using
//          any, and widen it again in each pass. The forward gives each
//          block a run of up to 8 consecutive rows (the plan's grid); its
//          16-bit 128-bit builds copy gamma and beta once per block into
//          shared memory (cp.async) instead of re-reading them from L2 for
//          every row, which frees the registers for 32 values per thread
//          (63 registers on sm_90a: 4 blocks of 256 threads per SM at 8192).
//          The fused backward of 16-bit 128-bit rows is pipelined instead
//          (bwd_fused_pipe: rows copied into shared memory two ahead).
//   global (any cols): one 1024-thread block per row, nothing cached: each
//          pass re-reads the row from global memory (L2 usually holds it);
//          the forward's statistics in one pass (Chan-merged per-iteration
//          mean and squared deviations, 4 vectors in flight per thread).
// Block and global launches use a 2-D grid, one row per block (no row loop:
// the compiler would hoist every gamma/beta load out of it and spill; the
// fused backward's chunk loop hides its pointers from the optimiser).
// With 16-byte-aligned pointers and cols % (16 / sizeof(T)) == 0 every access
// is one 128-bit load/store (`vec` > 1); otherwise scalar accesses.
// ptxas (sm_80, sm_90a): zero spills in every kernel of the debug build CI
// checks. Release builds (-DNDEBUG) spill 8 B in one,
// ftn_layernorm_fwd_block_scalar_bf16 on sm_90a (set-up only).
//
// Forward floor: reads rows*cols*sizeof(T), writes rows*cols*sizeof(T) and
//   8*rows bytes of statistics (gamma/beta: 2*cols*sizeof(T), cached; the
//   block path reads them once per run of rows). ~11 SASS instructions per
//   element in the block forward's three passes (widen; pairwise add;
//   subtract, square; subtract, two FMAs out): issue, not DRAM, is what a
//   round adds to the latency.
//   The global path reads x twice (once more from L2 when it fits).
//   ~10 FLOP per element: HBM-bound.
// Backward, input gradient: reads dy and x (2*rows*cols*sizeof(T)) and
//   8*rows bytes of statistics, writes dx (rows*cols*sizeof(T)). The global
//   path reads dy and x twice.
// Backward with parameter gradients (deterministic, no float atomics):
//   warp path, block path (16-bit 128-bit rows up to 12288, others up to
//   9216), and 16-bit 128-bit global-path rows up to 16384 (the wide
//   pipelined build) and, on sm_90, up to 131072 (the cluster builds: the
//   row's columns split over the 2, 4 or 8 blocks of a thread block
//   cluster, which push their two row sums to each other by st.async into
//   distributed shared memory, waited on with an mbarrier): fused. One block per chunk of rows_per_chunk rows (>= 32, ~1024
//   chunks) computes dx and adds dy*xhat and dy of every column to fp32
//   accumulators (each column owned by one thread; in shared memory, or in
//   registers in the pipelined kernel), then writes the chunk's partials
//   [chunks, cols] (ftn_layernorm_bwd_fused_*): reads 2*rows*cols*sizeof(T),
//   writes rows*cols*sizeof(T) + 2*chunks*cols*4 bytes, i.e. the 3n floor
//   plus ~8 bytes per column per 32+ rows.
//   other rows > 9216 (fp32, scalar access, 16-bit past 131072 or past
//   16384 before sm_90): stage one
//   (ftn_layernorm_param_grad_*) re-reads dy and x column-wise, each thread
//   owning `vec` adjacent columns of a chunk of rows, and writes fp32 partial
//   sums per chunk: 2*rows*cols*sizeof(T) + 2*chunks*cols*4 bytes; the row
//   kernel then writes dx: ~5*rows*cols*sizeof(T) in all.
//   Stage two (ftn_layernorm_column_sum_*) sums the chunks in a fixed order:
//   reads 2*chunks*cols*4, writes 2*cols*sizeof(T) bytes.
#include <type_traits>

#include "cluster.cuh"
#include "mma.cuh"
#include "reduce.cuh"
#include "sm90.cuh"
#include "vec.cuh"

namespace {

constexpr int kWarpItems = 32;   // fp32 values per lane in the warp path
constexpr int kWarpRows = 4;     // rows (warps) per block in the warp path
constexpr int kBlockItems = 24;  // fp32 values per thread in the block path
// Values per thread of the block forward's 16-bit vector builds (gamma and
// beta staged in shared memory: the row alone is in registers).
constexpr int kFwdHeldItems = 32;
constexpr int kBlockThreads = 512;  // most threads of a block-path block
constexpr int kFusedBlockThreads = 384;  // most threads of a fused block-path block

// The row of a block-per-row launch: grid (x, y) covers x*y >= rows rows,
// one per block. (No grid-stride loop: the compiler would hoist every
// gamma/beta load out of it and spill.) A block past the end exits whole.
FTN_DEVICE int64_t block_row() { return (int64_t)blockIdx.y * gridDim.x + blockIdx.x; }

// Hides a pointer's value from the optimiser, so that loads through it in a
// row loop are not hoisted out of the loop (every gamma value of the tile
// held across rows: registers the tile cannot spare). A no-op emulated.
template <typename P>
FTN_DEVICE void ftn_ln_opaque(P *&ptr) {
#if defined(__CUDACC__)
  asm volatile("" : "+l"(ptr));
#else
  (void)ptr;
#endif
}

FTN_DEVICE void ftn_ln_opaque_int(int &v) {
#if defined(__CUDACC__)
  asm volatile("" : "+r"(v));
#else
  (void)v;
#endif
}

// f16 storage (the block forward's fence is skipped there on sm_90a).
template <typename T> constexpr bool kLnIsHalf = false;
template <> constexpr bool kLnIsHalf<__half> = true;

// A compiler-only memory fence: no memory access moves across it (nothing
// is emitted). A no-op emulated.
FTN_DEVICE void ftn_ln_fence() {
#if defined(__CUDACC__)
  asm volatile("" ::: "memory");
#endif
}

// Sums over the row group: a warp (WARP) or the whole block (reduce.cuh; a
// fixed order, so deterministic). red: 64 floats of shared memory (block).
template <bool WARP>
FTN_DEVICE void group_sum2(float &a, float &b, float *red) {
  float v[2] = {a, b};
  if constexpr (WARP) {
    (void)red;
    ftn_group_allreduce_n<FtnSumOp, 32, 2>(v);
  } else {
    ftn_block_allreduce_n<FtnSumOp, 2>(v, red);
  }
  a = v[0];
  b = v[1];
}

template <bool WARP>
FTN_DEVICE float group_sum(float a, float *red) {
  if constexpr (WARP) {
    (void)red;
    return ftn_warp_allreduce<FtnSumOp>(a);
  } else {
    return ftn_block_allreduce<FtnSumOp>(a, red);
  }
}

// Effective gamma (g) for V columns at col: 1 without gamma, gamma + 1 with
// zero-centred gamma.
template <typename T, int V>
FTN_DEVICE void load_gamma(const T *gamma, int64_t col, uint32_t zc, float *g) {
  if (gamma == nullptr) {
#pragma unroll
    for (int k = 0; k < V; ++k) g[k] = 1.0f;
    return;
  }
  ftn_load<T, V>(gamma + col, g);
  if (zc != 0) {
#pragma unroll
    for (int k = 0; k < V; ++k) g[k] += 1.0f;
  }
}

// ---------------------------------------------------------------- forward

// Gamma and beta of one block's columns, copied once per block into shared
// memory (gamma at gs[0, cols), beta at bs[0, cols)) and read back by the
// thread that copied them for every row of the block: a run of rows pays
// one load of them, and they take no registers across the row's passes.
// cp.async copies them (no registers, in flight with the first row's x);
// gamma 1 where absent, beta 0 where absent (or RMSNorm), so the output
// needs no branch. Each thread touches only its own columns: no barrier.
template <typename T, int V, int ITEMS>
FTN_DEVICE void ln_stage_params(const FtnLayerNormFwdParams &p, int t, int G, T *gs, T *bs) {
  constexpr int C = ITEMS / V;
  static_assert(V * sizeof(T) == 16, "16-byte vectors");
  const T *gamma = static_cast<const T *>(p.gamma);
  const T *beta = p.kind == FTN_NORM_RMS ? nullptr : static_cast<const T *>(p.beta);
  typename FtnPacked<T, V>::U one;
#pragma unroll
  for (int k = 0; k < V; ++k) one.v[k] = ftn_from_float<T>(1.0f);
  const int n = (int)p.cols;
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if (col < n) {
      if (gamma != nullptr) {
        ftn_cp_async_16(gs + col, gamma + col, 16);
      } else {
        *reinterpret_cast<uint4 *>(gs + col) = make_uint4(one.w[0], one.w[1], one.w[2], one.w[3]);
      }
      // src_bytes 0: 16 zero bytes (x is a valid global address).
      ftn_cp_async_16(bs + col, beta != nullptr ? beta + col : static_cast<const T *>(p.x),
                      beta != nullptr ? 16 : 0);
    }
  }
  ftn_cp_async_commit();
}

// One row held in registers by a group of G threads (t = rank in the group):
// chunk c of thread t covers columns [(c*G + t)*V, +V). The row stays in its
// storage type (two bf16/f16 per register: half the registers of fp32) and
// each pass widens it again. Pass 1 sums x - pivot (pivot: the row's first
// value, against cancellation), pass 2 the squares of x - (pivot + shift).
// The output is
// fma(fma(x - pivot, rstd, -shift * rstd), g, b) (with zero-centred gamma
// u * g + (u + b), i.e. u * (g + 1) + b): 3 operations per element.
// HELD: gamma/beta staged in shared memory (gs, bs: ln_stage_params), else
// loaded per row from global memory.
template <typename T, int V, int ITEMS, bool WARP, bool HELD = false>
FTN_DEVICE void fwd_row_cached(const FtnLayerNormFwdParams &p, int64_t row, int t, int G,
                               float *red, const T *gs = nullptr, const T *bs = nullptr) {
  constexpr int C = ITEMS / V;
  constexpr int W = FtnPacked<T, V>::W;
  constexpr bool kHeld = HELD;
  const int n = (int)p.cols;  // <= 32 * kWarpItems or blockDim.x * kBlockItems
  const T *x = static_cast<const T *>(p.x) + row * p.cols;
  T *y = static_cast<T *>(p.y) + row * p.cols;
  const bool rms = p.kind == FTN_NORM_RMS;
  const float pivot = rms ? 0.0f : ftn_to_float(x[0]);
  uint32_t xw[C * W];
  // 16-bit types: every load of the row before any use of one, so all of
  // the thread's vectors are in flight at once (a use between two guarded
  // loads makes the second wait for the first). fp32 loads each chunk just
  // before its use: all first, the block kernel spilled 4 bytes on sm_80.
  constexpr bool kLoadsFirst = sizeof(T) == 2;
  if constexpr (kLoadsFirst) {
#pragma unroll
    for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
      if (col < n) ftn_load_packed<T, V>(x + col, xw + c * W);
    }
  }
  float s = 0.0f;
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if (col < n) {
      if constexpr (!kLoadsFirst) ftn_load_packed<T, V>(x + col, xw + c * W);
      float v[V];
      ftn_unpack<T, V>(xw + c * W, v);
      if constexpr (sizeof(T) == 2) {
        // A pairwise sum of the chunk, then one subtraction of V * pivot
        // (exact: V is a power of two): V + 1 operations instead of 2V.
        // Exact like the per-value x - pivot unless the chunk's values
        // span more binades than fp32 has bits beyond a 16-bit mantissa.
#pragma unroll
        for (int w = V / 2; w > 0; w /= 2) {
#pragma unroll
          for (int k = 0; k < w; ++k) v[k] += v[k + w];
        }
        s += v[0] - (float)V * pivot;
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) s += v[k] - pivot;
      }
    }
  }
  const float inv_n = 1.0f / (float)n;
  const float shift = rms ? 0.0f : group_sum<WARP>(s, red) * inv_n;
  ftn_opaque_words(xw);
  // x - mean as x - (pivot + shift): one rounding of the mean, which moves
  // the sum of squares only in second order (the deviations sum to ~0).
  const float mean = pivot + shift;
  float q = 0.0f;
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if (col < n) {
      float v[V];
      ftn_unpack<T, V>(xw + c * W, v);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float d = v[k] - mean;
        q = fmaf(d, d, q);
      }
    }
  }
  q = group_sum<WARP>(q, red);
  ftn_opaque_words(xw);
  const float rstd = rsqrtf(q * inv_n + p.eps);
  const float neg_shift_rstd = -shift * rstd;
  if (t == 0) {
    if (p.mean != nullptr) p.mean[row] = mean;
    if (p.rstd != nullptr) p.rstd[row] = rstd;
  }
  const T *gamma = static_cast<const T *>(p.gamma);
  const T *beta = rms ? nullptr : static_cast<const T *>(p.beta);
  // Zero-centred gamma applies only where gamma is given (absent: 1).
  const bool zc = p.zero_centered_gamma != 0 && gamma != nullptr;
  if constexpr (kHeld) ftn_cp_async_wait<0>();  // the staged gamma/beta (first row)
  // Two copies of the output pass (zero-centred or not): no per-element
  // select.
  auto out = [&](auto zc_tag) {
    constexpr bool ZC = decltype(zc_tag)::value;
#pragma unroll
    for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
      // Block path, gamma/beta loaded per row: one chunk at a time (no
      // memory access moves across the fence), not all hoisted next to the
      // row's registers. Not in f16 on sm_90a: ptxas spilled 4 bytes there
      // with it (and 16 on sm_80 without it).
      if constexpr (!WARP) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if constexpr (!kLnIsHalf<T>) ftn_ln_fence();
#else
        ftn_ln_fence();
#endif
      }
      if (col < n) {
        float v[V], g[V], b[V];
        ftn_unpack<T, V>(xw + c * W, v);
        if constexpr (kHeld) {
          ftn_load<T, V>(gs + col, g);
          ftn_load<T, V>(bs + col, b);
        } else {
          load_gamma<T, V>(gamma, col, 0u, g);
          if (beta != nullptr) {
            ftn_load<T, V>(beta + col, b);
          } else {
#pragma unroll
            for (int k = 0; k < V; ++k) b[k] = 0.0f;
          }
        }
        float o[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float u = fmaf(v[k] - pivot, rstd, neg_shift_rstd);  // (x - mean) * rstd
          o[k] = ZC ? fmaf(u, g[k], u + b[k]) : fmaf(u, g[k], b[k]);
        }
        ftn_store<T, V>(y + col, o);
      }
    }
  };
  if (zc) {
    out(std::true_type{});
  } else {
    out(std::false_type{});
  }
}

template <typename T, int V>
FTN_DEVICE void fwd_warp(const FtnLayerNormFwdParams &p) {
  FTN_ASSERT(blockDim.x == 32 * kWarpRows && p.cols <= 32 * kWarpItems);
  const int lane = threadIdx.x & 31u;
  for (int64_t row = (int64_t)blockIdx.x * kWarpRows + (threadIdx.x >> 5); row < p.rows;
       row += (int64_t)gridDim.x * kWarpRows) {
    fwd_row_cached<T, V, kWarpItems, true>(p, row, lane, 32, nullptr);
  }
}

// A run of consecutive rows per block: ceil(rows / blocks) each (the plan
// sizes the grid so, src/core/plan/layernorm.rs). 16-bit vector builds stage
// gamma and beta once per block in shared memory (ln_stage_params; pws: the
// plan's 2 * cols * sizeof(T) bytes of dynamic shared memory), reuse them
// for every row and hold kFwdHeldItems values of the row per thread; the
// others load them per row and hold kBlockItems.
template <typename T, int V>
FTN_DEVICE void fwd_block(const FtnLayerNormFwdParams &p, float *red, T *pws) {
  constexpr bool kHeld = V > 1 && sizeof(T) == 2;
  constexpr int kItems = kHeld ? kFwdHeldItems : kBlockItems;
  FTN_ASSERT(blockDim.x % 32 == 0 && p.cols <= (int64_t)blockDim.x * kItems);
  const int64_t blocks = (int64_t)gridDim.x * gridDim.y;
  const int64_t per = (p.rows + blocks - 1) / blocks;
  const int64_t first = block_row() * per;
  const int64_t end = first + per < p.rows ? first + per : p.rows;
  if (first >= end) return;  // the whole block: no barrier is skipped by part of it
  const int t = threadIdx.x;
  const int G = blockDim.x;
  if constexpr (kHeld) {
    T *gs = pws;
    T *bs = pws + p.cols;
    ln_stage_params<T, V, kItems>(p, t, G, gs, bs);
    for (int64_t row = first; row < end; ++row) {
      fwd_row_cached<T, V, kItems, false, true>(p, row, t, G, red, gs, bs);
    }
  } else {
    (void)pws;
    for (int64_t row = first; row < end; ++row) {
      // Per row: no column offsets (one per scalar chunk) held across rows.
      int tr = t, gr = G;
      ftn_ln_opaque_int(tr);
      ftn_ln_opaque_int(gr);
      fwd_row_cached<T, V, kItems, false>(p, row, tr, gr, red);
    }
  }
}

// Chan et al.'s pairwise update: folds the statistics (nb, mb, qb) of a set
// of values (count, mean, sum of squared deviations from the mean) into
// (na, ma, qa). Exact in its algebra (no E[x^2] - E[x]^2 cancellation): the
// squared difference of the two means enters weighted by na * nb / n.
FTN_DEVICE void ln_merge_stats(float &na, float &ma, float &qa, float nb, float mb, float qb) {
  if (nb == 0.0f) return;
  const float nn = na + nb;
  const float d = mb - ma;
  // nb / nn without the IEEE division's slow-path call (whose register
  // saves made the release build spill inside the global forward's loop on
  // sm_80): the hardware quotient (counts are far below 2^126, where it is
  // within ~2 ulp) plus one Newton step on its residual, within ~1 ulp.
  const float inv = __fdividef(1.0f, nn);
  const float f0 = nb * inv;
  const float f = fmaf(fmaf(-f0, nn, nb), inv, f0);
  ma += d * f;
  qa += qb + d * d * (na * f);
  na = nn;
}

// Folds the statistics of the warp's 32 lanes into lane 0 by a shfl_down
// tree (fixed order: bitwise the same on every run). Other lanes end with
// partial merges.
FTN_DEVICE void ln_warp_merge_stats(float &n, float &m, float &q, int lane) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float nb = __shfl_down_sync(0xffffffffu, n, off);
    const float mb = __shfl_down_sync(0xffffffffu, m, off);
    const float qb = __shfl_down_sync(0xffffffffu, q, off);
    if (lane < off) ln_merge_stats(n, m, q, nb, mb, qb);
  }
}

// Every thread gets the block's statistics, merged in a fixed order (a
// shfl_down tree in each warp, then one over the warps in warp 0), so
// bitwise the same on every run. red: 99 floats of shared memory.
FTN_DEVICE void ln_block_stats(float &n, float &m, float &q, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  ln_warp_merge_stats(n, m, q, lane);
  if (lane == 0) {
    red[warp] = n;
    red[32 + warp] = m;
    red[64 + warp] = q;
  }
  __syncthreads();
  if (warp == 0) {
    n = lane < warps ? red[lane] : 0.0f;
    m = lane < warps ? red[32 + lane] : 0.0f;
    q = lane < warps ? red[64 + lane] : 0.0f;
    ln_warp_merge_stats(n, m, q, lane);
    if (lane == 0) {
      red[96] = n;
      red[97] = m;
      red[98] = q;
    }
  }
  __syncthreads();
  n = red[96];
  m = red[97];
  q = red[98];
}

// 128-bit accesses one thread of the global forward's statistics pass has in
// flight per iteration (bytes in flight: one per iteration left the SM
// latency-bound).
constexpr int kGlobalUnroll = 4;

// Two passes over the row. One reads x from DRAM for the statistics: each
// iteration takes the mean and squared deviations of its U*V values in
// registers and folds them into the thread's running statistics
// (ln_merge_stats), then the block merges the threads' in a fixed order.
// The other re-reads x (from L2: 1024 threads of a 2-block SM hold 2 rows)
// and writes y. DRAM: the floor (x read once, y written once).
template <typename T, int V>
FTN_DEVICE void fwd_global(const FtnLayerNormFwdParams &p, float *red) {
  FTN_ASSERT(blockDim.x % 32 == 0);
  constexpr int U = kGlobalUnroll;
  const int64_t n = p.cols;
  const int64_t step = (int64_t)blockDim.x * V;
  const bool rms = p.kind == FTN_NORM_RMS;
  const float inv_n = 1.0f / (float)n;
  const T *gamma = static_cast<const T *>(p.gamma);
  const T *beta = rms ? nullptr : static_cast<const T *>(p.beta);
  const int64_t row = block_row();
  if (row < p.rows) {
    const T *x = static_cast<const T *>(p.x) + row * n;
    T *y = static_cast<T *>(p.y) + row * n;
    // mean = pivot + shift; the output is fma(x - pivot, rstd, -shift * rstd)
    // * g + b.
    const float pivot = rms ? 0.0f : ftn_to_float(x[0]);
    float cnt = 0.0f, mean = 0.0f, m2 = 0.0f;  // of x - pivot, this thread's
    for (int64_t col = (int64_t)threadIdx.x * V; col < n; col += U * step) {
      // The U vectors' loads before any use of one (packed: all in flight
      // at once); each pass below widens them again (x - pivot: the same
      // bits both times), so the packed words are all the thread keeps.
      uint32_t xw[U][FtnPacked<T, V>::W] = {};  // read only where in[u]
      bool in[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        in[u] = u == 0 || col + u * step < n;
        if (in[u]) ftn_load_packed<T, V>(x + col + u * step, xw[u]);
      }
      float s = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (in[u]) {
          float v[V];
          ftn_unpack<T, V>(xw[u], v);
#pragma unroll
          for (int k = 0; k < V; ++k) s += v[k] - pivot;
        }
      }
      int c = 0;  // values this iteration: U * V but at the row's end
#pragma unroll
      for (int u = 0; u < U; ++u) c += in[u] ? V : 0;
      // U * V a power of 2: the full iterations' mean is exact
      const float mb = c == U * V ? s * (1.0f / (U * V)) : s / (float)c;
      float qb = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (in[u]) {
          float v[V];
          ftn_unpack<T, V>(xw[u], v);
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float d = (v[k] - pivot) - mb;
            qb += d * d;
          }
        }
      }
      ln_merge_stats(cnt, mean, m2, (float)c, mb, qb);
    }
    ln_block_stats(cnt, mean, m2, red);
    // RMSNorm: no centring; the mean square is m2 / n + mean^2 (pivot 0).
    const float shift = rms ? 0.0f : mean;
    const float ms = rms ? (m2 * inv_n + mean * mean) : m2 * inv_n;
    const float rstd = rsqrtf(ms + p.eps);
    if (threadIdx.x == 0) {
      if (p.mean != nullptr) p.mean[row] = pivot + shift;
      if (p.rstd != nullptr) p.rstd[row] = rstd;
    }
    const float neg_shift_rstd = -shift * rstd;
    for (int64_t col = (int64_t)threadIdx.x * V; col < n; col += step) {
      // Every load before any use (a use between them makes the later ones
      // wait for the earlier: one more L2 latency per iteration).
      constexpr int W = FtnPacked<T, V>::W;
      uint32_t xw[W], gw[W] = {}, bw[W] = {};  // gw, bw: read only when loaded
      ftn_load_packed<T, V>(x + col, xw);
      if (gamma != nullptr) ftn_load_packed<T, V>(gamma + col, gw);
      if (beta != nullptr) ftn_load_packed<T, V>(beta + col, bw);
      float v[V], g[V], b[V], o[V];
      ftn_unpack<T, V>(xw, v);
      if (gamma != nullptr) {
        ftn_unpack<T, V>(gw, g);
        if (p.zero_centered_gamma != 0) {
#pragma unroll
          for (int k = 0; k < V; ++k) g[k] += 1.0f;
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) g[k] = 1.0f;
      }
      if (beta != nullptr) {
        ftn_unpack<T, V>(bw, b);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) b[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = fmaf(fmaf(v[k] - pivot, rstd, neg_shift_rstd), g[k], b[k]);
      ftn_store<T, V>(y + col, o);
    }
  }
}

// --------------------------------------------------------------- backward

// Adds V values to V fp32 accumulators in shared memory (16-byte aligned
// when V > 1): 128-bit accesses, explicitly to the shared window (the fused
// block kernel hides its accumulator pointers from the optimiser, which
// otherwise leaves generic 64-bit LD/ST).
template <int V>
FTN_DEVICE void acc_add(float *acc, const float *v) {
  if constexpr (V == 1) {
    acc[0] += v[0];
  } else {
    static_assert(V % 4 == 0, "accumulator width");
#pragma unroll
    for (int h = 0; h < V; h += 4) {
#if defined(__CUDACC__)
      const uint32_t s = ftn_smem_addr(acc + h);
      float a0, a1, a2, a3;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(a0), "=f"(a1), "=f"(a2), "=f"(a3)
                   : "r"(s));
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(s), "f"(a0 + v[h]),
                   "f"(a1 + v[h + 1]), "f"(a2 + v[h + 2]), "f"(a3 + v[h + 3])
                   : "memory");
#else
      float a[4];
      ftn_load<float, 4>(acc + h, a);
#pragma unroll
      for (int k = 0; k < 4; ++k) a[k] += v[h + k];
      ftn_store<float, 4>(acc + h, a);
#endif
    }
  }
}

// bwd_row_cached for fp32 storage: the row as fp32 xhat and dy * g (packing
// saves nothing at 4 bytes; holding x and dy and recomputing spilled 8-16
// bytes in the fused kernels). x and dy convert as they load.
template <typename T, int V, int ITEMS, bool WARP, bool ACC>
FTN_DEVICE void bwd_row_cached_f32(const FtnLayerNormBwdParams &p, const T *gamma, int64_t row, int t,
                               int G, float *red, float *acc_g = nullptr,
                               float *acc_b = nullptr) {
  constexpr int C = ITEMS / V;
  const int n = (int)p.cols;  // <= 32 * kWarpItems or blockDim.x * kBlockItems
  const T *x = static_cast<const T *>(p.x) + row * p.cols;
  const T *dy = static_cast<const T *>(p.dy) + row * p.cols;
  T *dx = static_cast<T *>(p.dx) + row * p.cols;
  const bool rms = p.kind == FTN_NORM_RMS;
  const float mean = rms ? 0.0f : p.mean[row];
  const float rstd = p.rstd[row];
  float xh[ITEMS];  // xhat
  float gh[ITEMS];  // dxhat = dy * g
  float s1 = 0.0f, s2 = 0.0f;
  if constexpr (!ACC) {
#pragma unroll
    for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
      if (col < n) {
        float g[V];
        ftn_load<T, V>(x + col, xh + c * V);
        ftn_load<T, V>(dy + col, gh + c * V);
        load_gamma<T, V>(gamma, col, p.zero_centered_gamma, g);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          xh[c * V + k] = (xh[c * V + k] - mean) * rstd;
          gh[c * V + k] *= g[k];
          s1 += gh[c * V + k];
          s2 += gh[c * V + k] * xh[c * V + k];
        }
      }
    }
  } else {
    // x and dy first; then the accumulators one chunk at a time and only
    // then gamma (memory fences keep the compiler from hoisting every
    // accumulator and gamma load next to the row's: the tile would spill).
#pragma unroll
    for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
      if (col < n) {
        ftn_load<T, V>(x + col, xh + c * V);
        ftn_load<T, V>(dy + col, gh + c * V);
#pragma unroll
        for (int k = 0; k < V; ++k) xh[c * V + k] = (xh[c * V + k] - mean) * rstd;
      }
    }
#pragma unroll
    for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
      ftn_ln_fence();
      if (col < n) {
        float pg[V];
#pragma unroll
        for (int k = 0; k < V; ++k) pg[k] = gh[c * V + k] * xh[c * V + k];
        acc_add<V>(acc_g + col, pg);
        acc_add<V>(acc_b + col, gh + c * V);
      }
    }
    ftn_ln_fence();
#pragma unroll
    for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
      if (col < n) {
        float g[V];
        load_gamma<T, V>(gamma, col, p.zero_centered_gamma, g);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          gh[c * V + k] *= g[k];
          s1 += gh[c * V + k];
          s2 += gh[c * V + k] * xh[c * V + k];
        }
      }
    }
  }
  group_sum2<WARP>(s1, s2, red);
  const float inv_n = 1.0f / (float)n;
  const float m1 = rms ? 0.0f : s1 * inv_n;
  const float m2 = s2 * inv_n;
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if (col < n) {
      float o[V];
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = rstd * (gh[c * V + k] - m1 - xh[c * V + k] * m2);
      ftn_store<T, V>(dx + col, o);
    }
  }
}

// One row held in registers by a group of G threads, as fwd_row_cached
// (fp32 storage: bwd_row_cached_f32). x and dy stay packed in their
// storage type (half the registers of fp32) and are all loaded before any is used (every load in
// flight at once); each pass widens them again and recomputes xhat and
// dy * g (the same bits in both passes; gamma is re-read, an L1/L2 hit).
// ACC: also adds dy * xhat and dy of each of the thread's columns to
// acc_g[col] and acc_b[col] (fp32, shared memory, owned by this thread).
template <typename T, int V, int ITEMS, bool WARP, bool ACC = false>
FTN_DEVICE void bwd_row_cached(const FtnLayerNormBwdParams &p, const T *gamma, int64_t row, int t,
                               int G, float *red, float *acc_g = nullptr,
                               float *acc_b = nullptr) {
  if constexpr (sizeof(T) == 4) {
    bwd_row_cached_f32<T, V, ITEMS, WARP, ACC>(p, gamma, row, t, G, red, acc_g, acc_b);
    return;
  }
  constexpr int C = ITEMS / V;
  constexpr int W = FtnPacked<T, V>::W;
  const int n = (int)p.cols;  // <= 32 * kWarpItems or blockDim.x * kBlockItems
  const T *x = static_cast<const T *>(p.x) + row * p.cols;
  const T *dy = static_cast<const T *>(p.dy) + row * p.cols;
  T *dx = static_cast<T *>(p.dx) + row * p.cols;
  const bool rms = p.kind == FTN_NORM_RMS;
  const float mean = rms ? 0.0f : p.mean[row];
  const float rstd = p.rstd[row];
  uint32_t xw[C * W], dw[C * W];
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if (col < n) {
      ftn_load_packed<T, V>(x + col, xw + c * W);
      ftn_load_packed<T, V>(dy + col, dw + c * W);
    }
  }
  // Pass 1: the two row sums and (ACC) the accumulators, one chunk at a
  // time (with ACC, memory fences keep the compiler from hoisting every
  // accumulator load next to the row's). The warp kernel (128 threads,
  // 32 KiB of accumulators) keeps more blocks per SM with the accumulators
  // in a pass of their own (80 registers, against 95 merged); the block
  // kernel saves the widening and x-hat of a pass by merging them.
  constexpr bool kAccPass = ACC && WARP;    // the accumulators in a pass of their own
  constexpr bool kAccMerged = ACC && !WARP;  // the accumulators in the sums pass
  if constexpr (kAccPass) {
#pragma unroll
    for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
      ftn_ln_fence();
      if (col < n) {
        float xv[V], dv[V], pg[V];
        ftn_unpack<T, V>(xw + c * W, xv);
        ftn_unpack<T, V>(dw + c * W, dv);
#pragma unroll
        for (int k = 0; k < V; ++k) pg[k] = dv[k] * ((xv[k] - mean) * rstd);
        acc_add<V>(acc_g + col, pg);
        acc_add<V>(acc_b + col, dv);
      }
    }
    ftn_ln_fence();
    ftn_opaque_words(xw);
    ftn_opaque_words(dw);
  }
  float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if constexpr (kAccMerged) ftn_ln_fence();
    if (col < n) {
      float xv[V], dv[V], g[V], pg[V];
      ftn_unpack<T, V>(xw + c * W, xv);
      ftn_unpack<T, V>(dw + c * W, dv);
#pragma unroll
      for (int k = 0; k < V; ++k) pg[k] = dv[k] * ((xv[k] - mean) * rstd);  // dy * xhat
      if constexpr (kAccMerged) {
        acc_add<V>(acc_g + col, pg);
        acc_add<V>(acc_b + col, dv);
      }
      load_gamma<T, V>(gamma, col, p.zero_centered_gamma, g);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        s1 = fmaf(dv[k], g[k], s1);
        s2 = fmaf(g[k], pg[k], s2);
      }
    }
  }
  if constexpr (kAccMerged) ftn_ln_fence();
  group_sum2<WARP>(s1, s2, red);
  ftn_opaque_words(xw);
  ftn_opaque_words(dw);
  // Pass 2: dx = rstd * (dy*g - m1 - xhat*m2), with xhat = (x - mean) * rstd:
  // dx = (dy*g) * rstd + ((x - mean) * c2 + c0), c2 = -rstd^2 m2,
  // c0 = -rstd m1 (x - mean stays a difference: exact near the mean).
  const float inv_n = 1.0f / (float)n;
  const float m1 = rms ? 0.0f : s1 * inv_n;
  const float m2 = s2 * inv_n;
  const float c0 = -rstd * m1;
  const float c2 = -(rstd * rstd) * m2;
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if constexpr (!WARP) ftn_ln_fence();
    if (col < n) {
      float xv[V], dv[V], g[V], o[V];
      ftn_unpack<T, V>(xw + c * W, xv);
      ftn_unpack<T, V>(dw + c * W, dv);
      load_gamma<T, V>(gamma, col, p.zero_centered_gamma, g);
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = fmaf(dv[k] * g[k], rstd, fmaf(xv[k] - mean, c2, c0));
      ftn_store<T, V>(dx + col, o);
    }
  }
}

template <typename T, int V>
FTN_DEVICE void bwd_warp(const FtnLayerNormBwdParams &p) {
  FTN_ASSERT(blockDim.x == 32 * kWarpRows && p.cols <= 32 * kWarpItems);
  const int lane = threadIdx.x & 31u;
  for (int64_t row = (int64_t)blockIdx.x * kWarpRows + (threadIdx.x >> 5); row < p.rows;
       row += (int64_t)gridDim.x * kWarpRows) {
    bwd_row_cached<T, V, kWarpItems, true>(p, static_cast<const T *>(p.gamma), row, lane, 32,
                                           nullptr);
  }
}

template <typename T, int V>
FTN_DEVICE void bwd_block(const FtnLayerNormBwdParams &p, float *red) {
  FTN_ASSERT(blockDim.x % 32 == 0 && p.cols <= (int64_t)blockDim.x * kBlockItems);
  const int64_t row = block_row();
  if (row < p.rows) {
    bwd_row_cached<T, V, kBlockItems, false>(p, static_cast<const T *>(p.gamma), row, threadIdx.x,
                                             blockDim.x, red);
  }
}

// ------------------------------------------ fused backward: dx + partials
// Block b (block_row()) handles the chunk of rows [b*R, min((b+1)*R, rows)),
// R = rows_per_chunk, and writes the chunk's parameter-gradient partials
//   partial_gamma[b, c] = sum over its rows of dy * xhat,
//   partial_beta[b, c]  = sum over its rows of dy   (if not NULL),
// each in row order (the warp path: every warp sums rows w, w + 4, ... in
// order, then the warps' sums are added in warp order), so the partials
// depend on the shape only. The accumulators are fp32 in shared memory,
// every column owned by one thread of its row group (no barrier until the
// flush); ftn_layernorm_column_sum_* then sums the chunks in a fixed order.

// Zeroes the accumulators of thread t's columns (the *_row_cached layout).
template <int V, int ITEMS>
FTN_DEVICE void acc_zero(float *acc_g, float *acc_b, int n, int t, int G) {
  constexpr int C = ITEMS / V;
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if (col < n) {
#pragma unroll
      for (int k = 0; k < V; ++k) acc_g[col + k] = acc_b[col + k] = 0.0f;
    }
  }
}

// Writes the chunk's partials: the sum over `slabs` accumulator slabs (each
// [2][stride]: gamma then beta) in slab order.
FTN_DEVICE void flush_partials(const FtnLayerNormBwdParams &p, int64_t chunk, const float *acc,
                               int slabs, int64_t stride) {
  __syncthreads();
  const int64_t n = p.cols;
  float *pg = p.partial_gamma + chunk * n;
  float *pb = p.partial_beta == nullptr ? nullptr : p.partial_beta + chunk * n;
  for (int64_t col = threadIdx.x; col < n; col += blockDim.x) {
    float g = acc[col], b = acc[stride + col];
    for (int w = 1; w < slabs; ++w) {
      g += acc[2 * w * stride + col];
      b += acc[(2 * w + 1) * stride + col];
    }
    pg[col] = g;
    if (pb != nullptr) pb[col] = b;
  }
}

// The chunk's rows [r0, r1); false when the block has no chunk (whole block).
FTN_DEVICE bool chunk_rows(const FtnLayerNormBwdParams &p, int64_t chunk, int64_t &r0,
                           int64_t &r1) {
  r0 = chunk * p.rows_per_chunk;
  r1 = r0 + p.rows_per_chunk < p.rows ? r0 + p.rows_per_chunk : p.rows;
  return r0 < p.rows;
}

// acc: [kWarpRows][2][32 * kWarpItems] (static shared memory, 32 KiB).
template <typename T, int V>
FTN_DEVICE void bwd_fused_warp(const FtnLayerNormBwdParams &p, float *acc) {
  constexpr int S = 32 * kWarpItems;
  FTN_ASSERT(blockDim.x == 32 * kWarpRows && p.cols <= S && p.partial_gamma != nullptr &&
             p.rows_per_chunk >= 1);
  const int64_t chunk = block_row();
  int64_t r0, r1;
  if (!chunk_rows(p, chunk, r0, r1)) return;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  float *ag = acc + 2 * w * S, *ab = ag + S;
  acc_zero<V, kWarpItems>(ag, ab, (int)p.cols, lane, 32);
#pragma unroll 1
  for (int64_t row = r0 + w; row < r1; row += kWarpRows) {
    const T *gamma = static_cast<const T *>(p.gamma);
    ftn_ln_opaque(gamma);
    bwd_row_cached<T, V, kWarpItems, true, true>(p, gamma, row, lane, 32, nullptr, ag, ab);
  }
  flush_partials(p, chunk, acc, kWarpRows, S);
}

// acc: [2][cols] fp32 (dynamic shared memory, 8 * cols bytes). fp32
// storage and scalar access only: 16-bit rows with 128-bit access take
// bwd_fused_pipe (that build of this kernel is never launched).
template <typename T, int V>
FTN_DEVICE void bwd_fused_block(const FtnLayerNormBwdParams &p, float *red, float *acc) {
  if constexpr (V > 1 && sizeof(T) == 2) {
    FTN_ASSERT(!"16-bit 128-bit rows take ftn_layernorm_bwd_fused_pipe");
    (void)p;
    (void)red;
    (void)acc;
  } else {
    FTN_ASSERT(blockDim.x % 32 == 0 && p.cols <= (int64_t)blockDim.x * kBlockItems &&
               p.partial_gamma != nullptr && p.rows_per_chunk >= 1);
    const int64_t chunk = block_row();
    int64_t r0, r1;
    if (!chunk_rows(p, chunk, r0, r1)) return;
    float *ag = acc, *ab = acc + p.cols;
    acc_zero<V, kBlockItems>(ag, ab, (int)p.cols, threadIdx.x, blockDim.x);
#pragma unroll 1
    for (int64_t row = r0; row < r1; ++row) {
      // Opaque per row: nothing derived from them is kept across rows (156
      // -> 127 registers on sm_90a; sm_80 spilled without).
      const T *gamma = static_cast<const T *>(p.gamma);
      float *g_acc = ag, *b_acc = ab;
      int t = threadIdx.x, G = blockDim.x;
      ftn_ln_opaque(gamma);
      ftn_ln_opaque(g_acc);
      ftn_ln_opaque(b_acc);
      ftn_ln_opaque_int(t);
      ftn_ln_opaque_int(G);
      bwd_row_cached<T, V, kBlockItems, false, true>(p, gamma, row, t, G, red, g_acc, b_acc);
    }
    flush_partials(p, chunk, acc, 1, p.cols);
  }
}

// ------------------------- fused backward, pipelined (16-bit, 128-bit)
// ftn_layernorm_bwd_fused_pipe_{f16,bf16}: the fused backward of the block
// path's 16-bit rows with 128-bit access (cols % 8 == 0, cols <= blockDim.x
// * kBlockItems), chunks of rows as bwd_fused_block; the wide build
// (ftn_layernorm_bwd_fused_pipe_wide_*) takes global-path rows up to 512 *
// kLnPipeWideItems = 16384 with gamma read from global memory. Algorithm:
//   * thread t owns the vectors c*G + t (c < kBlockItems / 8, G =
//     blockDim.x) of every row: its fp32 accumulators of dy * xhat and dy for
//     those columns stay in registers for the whole chunk and are written as
//     the chunk's partials at its end (no shared-memory read-modify-write
//     per element, no flush barrier);
//   * x and dy reach shared memory by cp.async, kLnPipeStages rows deep: row
//     r + 2 is copied while row r is computed, so a block keeps two rows in
//     flight through its compute (the DRAM latency is paid once per chunk,
//     not per row). A thread copies and reads back only its own columns:
//     the wait, no barrier;
//   * gamma is staged once per block as fp32 (+1 folded in under
//     zero-centring; 1 when absent): no widening per pass.
// Per row: pass 1 the two row sums and the accumulators, one block
// reduction, pass 2 dx (the formulas of bwd_row_cached, the same bits).
// Dynamic shared memory: gamma fp32 [cols] (not in the wide build), then
// kLnPipeStages stages of (x, dy) [2][cols] T: (4 + 4 * kLnPipeStages) *
// cols bytes (192 KiB at cols = 12288; wide: 4 * kLnPipeStages * cols, 192
// KiB at 16384).
// Floor: reads x, dy (2*rows*cols*2 bytes) and 8 bytes of statistics per
// row, writes dx (rows*cols*2) and 8*cols bytes of partials per chunk:
// the 3n bytes of the fused backward. ~28 SASS instructions per element
// on sm_90a (33 wide): two passes of widening and ~8 FP operations per
// element, plus the row's copies and one reduction per row.
constexpr int kLnPipeStages = 3;
// Values per thread of the wide build (rows past the block path, up to
// 512 * 32 = 16384 columns): gamma is read from global memory (L1/L2) in
// each pass instead of staged, so the three stages fit in shared memory.
constexpr int kLnPipeWideItems = 32;

// 8 16-bit values at shared address p, packed: one 128-bit shared load.
template <typename T>
FTN_DEVICE void ln_lds_packed(const T *p, uint32_t *w) {
#if defined(__CUDACC__)
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "r"(ftn_smem_addr(p)));
#else
  ftn_load_packed<T, 8>(p, w);
#endif
}

// 8 fp32 values at shared address p: two 128-bit shared loads.
FTN_DEVICE void ln_lds_f32x8(const float *p, float *v) {
#if defined(__CUDACC__)
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%8];\n\t"
               "ld.shared.v4.f32 {%4, %5, %6, %7}, [%8 + 16];"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]), "=f"(v[4]), "=f"(v[5]),
                 "=f"(v[6]), "=f"(v[7])
               : "r"(ftn_smem_addr(p)));
#else
  ftn_load<float, 4>(p, v);
  ftn_load<float, 4>(p + 4, v + 4);
#endif
}

// The block-wide sums of a and b with one barrier: warp sums (shuffles),
// lane 0 of each warp stores its pair in red[parity], then every thread
// adds the warps' pairs in warp order (deterministic; two pairs per 128-bit
// shared load, unrolled to the 16 warps of a 512-thread block). Alternating
// parity between calls lets the next call store while slow threads still
// read this one's pairs (the barrier of the call in between separates a
// store from the reads two calls before). red: [2][16] float2, 16-aligned.
FTN_DEVICE void block_sum2_single_barrier(float &a, float &b, float4 *red, int parity) {
  constexpr int kMaxWarps = kBlockThreads / 32;
  float ab[2] = {a, b};  // both warp sums in one butterfly (one rendezvous)
  ftn_group_allreduce_n<FtnSumOp, 32, 2>(ab);
  a = ab[0];
  b = ab[1];
  float4 *r = red + parity * (kMaxWarps / 2);
  const int warp = (int)(threadIdx.x >> 5), warps = (int)(blockDim.x >> 5);
  if ((threadIdx.x & 31u) == 0) {
    float *slot = reinterpret_cast<float *>(r) + 2 * warp;
    slot[0] = a;
    slot[1] = b;
  }
  __syncthreads();
  // Warps w and w + 1's pairs (one shared address computed once).
#if defined(__CUDACC__)
  const uint32_t base = ftn_smem_addr(r);
#endif
  auto pairs = [&](int w, float *q) {
#if defined(__CUDACC__)
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(q[0]), "=f"(q[1]), "=f"(q[2]), "=f"(q[3])
                 : "r"(base + 8 * w));
#else
    ftn_load<float, 4>(reinterpret_cast<const float *>(r + w / 2), q);
#endif
  };
  float q[4];
  pairs(0, q);
  a = q[0];
  b = q[1];
  if (warps > 1) {
    a += q[2];
    b += q[3];
  }
#pragma unroll
  for (int w = 2; w < kMaxWarps; w += 2) {
    if (w < warps) {
      pairs(w, q);
      a += q[0];
      b += q[1];
      if (w + 1 < warps) {
        a += q[2];
        b += q[3];
      }
    }
  }
}

// The row-sum exchange of a cluster (CL > 1): slots [2][CL] float2 and two
// mbarriers (arrival count 1), both by row parity, in each block's shared
// memory. Row k: thread r < CL pushes the block's pair into slot [k & 1][me]
// of block r by st.async, which completes its 8 bytes on block r's mbarrier
// [k & 1]; thread 0 arrives on the block's own one expecting CL * 8 bytes;
// every thread waits for that phase, then adds the CL slots in rank order
// (every block gets the same bits). No barrier across the cluster and no
// memory fence per row: a block waits only for the pairs it needs. A slot
// is written again two rows later, by a peer that has by then received
// this block's next pair, which this block sent after every thread read the
// slot (the block reduction's __syncthreads lies between).
struct LnClusterXch {
  float2 *slot;
  uint64_t *bar;
};

// Before the first row: the mbarriers initialised and visible to the peers
// before any of them sends (one barrier.cluster per chunk).
FTN_DEVICE void cluster_xch_init(const LnClusterXch &x) {
  if (threadIdx.x == 0) {
    ftn_mbar_init(&x.bar[0], 1);
    ftn_mbar_init(&x.bar[1], 1);
    ftn_cluster_fence_mbar_init();
  }
  ftn_cluster_sync();
}

template <int CL>
FTN_DEVICE void cluster_sum2(float &a, float &b, const LnClusterXch &x, int64_t k) {
  const int par = (int)(k & 1);
  float2 *slots = x.slot + par * CL;
  uint64_t *bar = &x.bar[par];
  if (threadIdx.x == 0) ftn_mbar_arrive_expect_tx(bar, CL * (uint32_t)sizeof(float2));
  if (threadIdx.x < CL)
    ftn_cluster_st_async_f32x2(slots + ftn_cluster_rank(), threadIdx.x, make_float2(a, b), bar);
  ftn_mbar_wait(bar, (uint32_t)((k >> 1) & 1));
  a = 0.0f;
  b = 0.0f;
#pragma unroll
  for (int r = 0; r < CL; ++r) {
    const float2 v = slots[r];
    a += v.x;
    b += v.y;
  }
}

// ITEMS values per thread; GS: gamma staged in shared memory as fp32 (else
// read from global memory in each pass: the wide build). CL > 1: launched
// in clusters of CL blocks along x, one cluster per chunk of rows, block
// rank k owning the columns [k * slice, (k + 1) * slice) of every row
// (slice = the row's 8-column vectors split evenly; the last block's may be
// short or empty); the two row sums are then added over the cluster
// (cluster_sum2), and each block writes the partials of its own columns.
template <typename T, int ITEMS, bool GS, int CL = 1>
FTN_DEVICE void bwd_fused_pipe(const FtnLayerNormBwdParams &p, float4 *red, float *smem,
                               LnClusterXch xch = {}) {
  static_assert(sizeof(T) == 2, "16-bit storage");
  static_assert(CL == 1 || !GS, "clusters take the wide build");
  constexpr int V = 8, C = ITEMS / V, S = kLnPipeStages;
  FTN_ASSERT(blockDim.x % 32 == 0 && blockDim.x <= 512 && p.cols % V == 0 &&
             p.partial_gamma != nullptr && p.rows_per_chunk >= 1);
  int64_t chunk;
  int col0 = 0, n = (int)p.cols;  // this block's columns: [col0, col0 + n)
  if constexpr (CL > 1) {
    chunk = blockIdx.x / CL;
    // The plan's cluster_slice (src/core/plan/layernorm.rs): keep in step.
    const int slice = (int)((p.cols / V + CL - 1) / CL) * V;
    col0 = (int)ftn_cluster_rank() * slice;
    n = col0 >= n ? 0 : (n - col0 < slice ? n - col0 : slice);
    FTN_ASSERT(slice <= (int)blockDim.x * ITEMS && xch.slot != nullptr && blockDim.x >= CL);
  } else {
    chunk = block_row();
    FTN_ASSERT(p.cols <= (int64_t)blockDim.x * ITEMS);
  }
  int64_t r0, r1;
  if (!chunk_rows(p, chunk, r0, r1)) return;  // the whole cluster: same chunk
  if constexpr (CL > 1) cluster_xch_init(xch);
  const int t = threadIdx.x, G = blockDim.x;
  float *gs = smem;
  T *stages = reinterpret_cast<T *>(smem + (GS ? n : 0));  // [S][2][n]
  if constexpr (GS) {
#pragma unroll
    for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
      if (col < n) {
        float g[V];
        load_gamma<T, V>(static_cast<const T *>(p.gamma), col0 + col, p.zero_centered_gamma, g);
        ftn_store<float, 4>(gs + col, g);
        ftn_store<float, 4>(gs + col + 4, g + 4);
      }
    }
  }
  // The effective gamma of 8 columns: staged, or loaded (the pointer made
  // opaque per row, so the loads are not hoisted out of the row loop and
  // held in registers).
  const T *gamma_src = static_cast<const T *>(p.gamma);
  auto gamma_at = [&](const T *gamma, int col, float *g) {
    if constexpr (GS) {
      (void)gamma;
      ln_lds_f32x8(gs + col, g);
    } else {
      load_gamma<T, V>(gamma, col0 + col, p.zero_centered_gamma, g);
    }
  };
  // x and dy of the 8 columns at col from a stage (sx, sd), widened, and
  // their gamma: what both passes of a row start from.
  auto row_vec = [&](const T *sx, const T *sd, const T *gamma, int col, float *xv, float *dv,
                     float *g) {
    uint32_t xw[4], dw[4];
    ln_lds_packed<T>(sx + col, xw);
    ln_lds_packed<T>(sd + col, dw);
    gamma_at(gamma, col, g);
    ftn_unpack<T, V>(xw, xv);
    ftn_unpack<T, V>(dw, dv);
  };
  // Copies row `row`'s x and dy (this thread's columns) into stage s and
  // commits them as one group; past the chunk, an empty group (the wait
  // below counts groups).
  // (The row's addresses once per row, opaque: per vector only the
  // column is added, not row * cols recomputed.)
  auto fetch = [&](int64_t row, int s) {
    if (row < r1) {
      const T *x = static_cast<const T *>(p.x) + row * p.cols + col0;
      const T *dy = static_cast<const T *>(p.dy) + row * p.cols + col0;
      T *sx = stages + s * 2 * n;
      ftn_ln_opaque(x);
      ftn_ln_opaque(dy);
      ftn_ln_opaque(sx);
      T *sd = sx + n;
#pragma unroll
      for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
        if (col < n) {
          ftn_cp_async_16(sx + col, x + col, 16);
          ftn_cp_async_16(sd + col, dy + col, 16);
        }
      }
    }
    ftn_cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) fetch(r0 + s, s);
  float ag[C * V], ab[C * V];
#pragma unroll
  for (int k = 0; k < C * V; ++k) ag[k] = ab[k] = 0.0f;
  const bool rms = p.kind == FTN_NORM_RMS;
  const float inv_n = 1.0f / (float)p.cols;
  // The statistics of rows row .. row + S - 2, loaded as far ahead as the
  // rows themselves (a DRAM round trip per row otherwise); moved down at
  // the end of a row, a round after their load was issued.
  float mean_q[S - 1], rstd_q[S - 1];
  auto stats = [&](int64_t row, float &mean, float &rstd) {
    mean = 0.0f;
    rstd = 0.0f;
    if (row < r1) {
      if (!rms) mean = p.mean[row];
      rstd = p.rstd[row];
    }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) stats(r0 + s, mean_q[s], rstd_q[s]);
  int s = 0;
#pragma unroll 1
  for (int64_t row = r0; row < r1; ++row) {
    // Row + S - 1 into the stage row - 1 used (this thread is done with
    // its own columns of it), then wait for this row's group.
    fetch(row + S - 1, s == 0 ? S - 1 : s - 1);
    float mean_next, rstd_next;
    stats(row + S - 1, mean_next, rstd_next);
    ftn_cp_async_wait<S - 1>();
    const T *sx = stages + (int64_t)s * 2 * n, *sd = sx + n;
    const float mean = mean_q[0];
    const float rstd = rstd_q[0];
    const T *gamma = gamma_src;
    if constexpr (!GS) ftn_ln_opaque(gamma);
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
      if (col < n) {
        float xv[V], dv[V], g[V];
        row_vec(sx, sd, gamma, col, xv, dv, g);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float pg = dv[k] * ((xv[k] - mean) * rstd);  // dy * xhat
          ag[c * V + k] += pg;
          ab[c * V + k] += dv[k];
          s1 = fmaf(dv[k], g[k], s1);
          s2 = fmaf(g[k], pg, s2);
        }
      }
    }
    block_sum2_single_barrier(s1, s2, red, (int)((row - r0) & 1));
    if constexpr (CL > 1) cluster_sum2<CL>(s1, s2, xch, row - r0);
    const float m1 = rms ? 0.0f : s1 * inv_n;
    const float m2 = s2 * inv_n;
    const float c0 = -rstd * m1;
    const float c2 = -(rstd * rstd) * m2;
    T *dx = static_cast<T *>(p.dx) + row * p.cols + col0;
#pragma unroll
    for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
      if (col < n) {
        float xv[V], dv[V], g[V], o[V];
        row_vec(sx, sd, gamma, col, xv, dv, g);
#pragma unroll
        for (int k = 0; k < V; ++k) o[k] = fmaf(dv[k] * g[k], rstd, fmaf(xv[k] - mean, c2, c0));
        ftn_store<T, V>(dx + col, o);
      }
    }
#pragma unroll
    for (int q = 0; q + 1 < S - 1; ++q) {
      mean_q[q] = mean_q[q + 1];
      rstd_q[q] = rstd_q[q + 1];
    }
    mean_q[S - 2] = mean_next;
    rstd_q[S - 2] = rstd_next;
    s = s + 1 == S ? 0 : s + 1;
  }
  ftn_cp_async_wait<0>();
  float *pg = p.partial_gamma + chunk * p.cols + col0;
  float *pb = p.partial_beta == nullptr ? nullptr : p.partial_beta + chunk * p.cols + col0;
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if (col < n) {
      ftn_store<float, 4>(pg + col, ag + c * V);
      ftn_store<float, 4>(pg + col + 4, ag + c * V + 4);
      if (pb != nullptr) {
        ftn_store<float, 4>(pb + col, ab + c * V);
        ftn_store<float, 4>(pb + col + 4, ab + c * V + 4);
      }
    }
  }
  // No block leaves while a peer's st.async may still be on its way to it
  // or from it (one barrier.cluster per chunk).
  if constexpr (CL > 1) ftn_cluster_sync();
}

// Two passes over dy and x: the two row sums, then dx.
template <typename T, int V>
FTN_DEVICE void bwd_global(const FtnLayerNormBwdParams &p, float *red) {
  FTN_ASSERT(blockDim.x % 32 == 0);
  const int64_t n = p.cols;
  const int64_t step = (int64_t)blockDim.x * V;
  const bool rms = p.kind == FTN_NORM_RMS;
  const float inv_n = 1.0f / (float)n;
  const T *gamma = static_cast<const T *>(p.gamma);
  const int64_t row = block_row();
  if (row < p.rows) {
    const T *x = static_cast<const T *>(p.x) + row * n;
    const T *dy = static_cast<const T *>(p.dy) + row * n;
    T *dx = static_cast<T *>(p.dx) + row * n;
    const float mean = rms ? 0.0f : p.mean[row];
    const float rstd = p.rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t col = (int64_t)threadIdx.x * V; col < n; col += step) {
      float v[V], d[V], g[V];
      ftn_load<T, V>(x + col, v);
      ftn_load<T, V>(dy + col, d);
      load_gamma<T, V>(gamma, col, p.zero_centered_gamma, g);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float gh = d[k] * g[k];
        s1 += gh;
        s2 += gh * ((v[k] - mean) * rstd);
      }
    }
    group_sum2<false>(s1, s2, red);
    const float m1 = rms ? 0.0f : s1 * inv_n;
    const float m2 = s2 * inv_n;
    // Every thread has read its dy before the barrier in group_sum2, so dx
    // may alias dy: each thread rewrites only the columns it read.
    for (int64_t col = (int64_t)threadIdx.x * V; col < n; col += step) {
      float v[V], d[V], g[V], o[V];
      ftn_load<T, V>(x + col, v);
      ftn_load<T, V>(dy + col, d);
      load_gamma<T, V>(gamma, col, p.zero_centered_gamma, g);
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = rstd * (d[k] * g[k] - m1 - (v[k] - mean) * rstd * m2);
      ftn_store<T, V>(dx + col, o);
    }
  }
}

// One thread: V adjacent columns [c0, c0+V) over the rows of one chunk.
template <typename T, int V>
FTN_DEVICE void param_grad_columns(const FtnLayerNormParamGradParams &p, int64_t c0) {
  const int64_t r0 = (int64_t)blockIdx.y * p.rows_per_chunk;
  const int64_t r1 = r0 + p.rows_per_chunk < p.rows ? r0 + p.rows_per_chunk : p.rows;
  const T *x = static_cast<const T *>(p.x);
  const T *dy = static_cast<const T *>(p.dy);
  const bool rms = p.kind == FTN_NORM_RMS;
  float ag[V], ab[V];
#pragma unroll
  for (int k = 0; k < V; ++k) ag[k] = ab[k] = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float mean = rms ? 0.0f : p.mean[r];
    const float rstd = p.rstd[r];
    float v[V], d[V];
    ftn_load<T, V>(x + r * p.cols + c0, v);
    ftn_load<T, V>(dy + r * p.cols + c0, d);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      ag[k] += d[k] * ((v[k] - mean) * rstd);
      ab[k] += d[k];
    }
  }
  const int64_t off = (int64_t)blockIdx.y * p.cols + c0;
#pragma unroll
  for (int k = 0; k < V; ++k) p.partial_gamma[off + k] = ag[k];
  if (p.partial_beta != nullptr) {
#pragma unroll
    for (int k = 0; k < V; ++k) p.partial_beta[off + k] = ab[k];
  }
}

template <typename T>
FTN_DEVICE void param_grad(const FtnLayerNormParamGradParams &p) {
  constexpr int V = FtnVec<T>::N;
  const int64_t unit = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (p.vec == 1) {
    if (unit < p.cols) param_grad_columns<T, 1>(p, unit);
    return;
  }
  FTN_ASSERT(p.vec == (uint32_t)V && p.cols % V == 0);
  if (unit * V < p.cols) param_grad_columns<T, V>(p, unit * V);
}

// Block (32, R), R <= 32: column blockIdx.x*32 + threadIdx.x; thread row ty
// sums chunks ty, ty+R, ... in order, then ty == 0 adds the R sums in order.
// The plan picks R from the chunk count, so the order is fixed per shape.
template <typename T>
FTN_DEVICE void column_sum(const FtnLayerNormColumnSumParams &p, float (*red)[33]) {
  FTN_ASSERT(blockDim.x == 32 && blockDim.y <= 32);
  const int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
  const bool beta = blockIdx.y == 1;
  const float *partial = beta ? p.partial_beta : p.partial_gamma;
  T *out = static_cast<T *>(beta ? p.dbeta : p.dgamma);
  if (out == nullptr) return;  // the whole block: this gradient is not wanted
  float s = 0.0f;
  if (c < p.cols) {
    s = ftn_column_chunk_sum(partial, p.cols, c, threadIdx.y, blockDim.y, p.chunks);
  }
  red[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < p.cols) {
    float t = 0.0f;
    for (unsigned k = 0; k < blockDim.y; ++k) t += red[k][threadIdx.x];
    out[c] = ftn_from_float<T>(t);
  }
}

}  // namespace

// Dispatch on the access width chosen by the plan.
// The row kernels come in two builds each: 128-bit vectors (`..._<dtype>`)
// and scalar accesses (`..._scalar_<dtype>`, for unaligned pointers or cols
// not a multiple of the vector). One kernel holding both spent the scalar
// instance's registers on the vector path (24 or 32 separately addressed
// chunks: e.g. 125 instead of 64 registers in the block backward, sm_90a).
#define FTN_LN_VECTOR(fn, T, ...)        \
  do {                                    \
    FTN_ASSERT(p.vec == FtnVec<T>::N);    \
    fn<T, FtnVec<T>::N>(__VA_ARGS__);     \
  } while (0)
#define FTN_LN_SCALAR(fn, T, ...) \
  do {                            \
    FTN_ASSERT(p.vec == 1);       \
    fn<T, 1>(__VA_ARGS__);        \
  } while (0)
#define FTN_LN_VEC_DISPATCH(fn, T, ...)       \
  do {                                        \
    if (p.vec == 1) {                         \
      fn<T, 1>(__VA_ARGS__);                  \
    } else {                                  \
      FTN_ASSERT(p.vec == FtnVec<T>::N);      \
      fn<T, FtnVec<T>::N>(__VA_ARGS__);       \
    }                                         \
  } while (0)

// A row kernel in both builds: NAME_<suffix> (vector) and
// NAME_scalar_<suffix>, with the same parameters, bound and body.
#define FTN_LN_ROW_KERNEL(name, suffix, T, Params, bound, body)               \
  FTN_KERNEL_BOUNDED(name##_##suffix, Params, p, bound) {                      \
    body(FTN_LN_VECTOR, T)                                                     \
  }                                                                           \
  FTN_KERNEL_BOUNDED(name##_scalar_##suffix, Params, p, bound) {               \
    body(FTN_LN_SCALAR, T)                                                     \
  }

#define FTN_LN_BODY_FWD_WARP(PICK, T) PICK(fwd_warp, T, p);
#define FTN_LN_BODY_FWD_BLOCK(PICK, T) \
  FTN_SHARED(float, red, [64]);       \
  FTN_DYNAMIC_SHARED(T, pws);         \
  PICK(fwd_block, T, p, red, pws);
#define FTN_LN_BODY_BWD_WARP(PICK, T) PICK(bwd_warp, T, p);
#define FTN_LN_BODY_BWD_BLOCK(PICK, T) \
  FTN_SHARED(float, red, [64]);       \
  PICK(bwd_block, T, p, red);
#define FTN_LN_BODY_BWD_FUSED_WARP(PICK, T)                      \
  FTN_SHARED(float, acc, [kWarpRows * 2 * 32 * kWarpItems]);    \
  PICK(bwd_fused_warp, T, p, acc);
#define FTN_LN_BODY_BWD_FUSED_BLOCK(PICK, T) \
  FTN_SHARED(float, red, [64]);             \
  FTN_DYNAMIC_SHARED(float, acc);           \
  PICK(bwd_fused_block, T, p, red, acc);

#define FTN_STAMP_LAYERNORM(suffix, T)                                                        \
  FTN_LN_ROW_KERNEL(ftn_layernorm_fwd_warp, suffix, T, FtnLayerNormFwdParams, 128,             \
                    FTN_LN_BODY_FWD_WARP)                                                      \
  FTN_LN_ROW_KERNEL(ftn_layernorm_fwd_block, suffix, T, FtnLayerNormFwdParams, kBlockThreads,  \
                    FTN_LN_BODY_FWD_BLOCK)                                                     \
  FTN_KERNEL_BOUNDED(ftn_layernorm_fwd_global_##suffix, FtnLayerNormFwdParams, p, 1024) {     \
    FTN_SHARED(float, red, [99]);                                                             \
    FTN_LN_VEC_DISPATCH(fwd_global, T, p, red);                                               \
  }                                                                                           \
  FTN_LN_ROW_KERNEL(ftn_layernorm_bwd_warp, suffix, T, FtnLayerNormBwdParams, 128,             \
                    FTN_LN_BODY_BWD_WARP)                                                      \
  FTN_LN_ROW_KERNEL(ftn_layernorm_bwd_block, suffix, T, FtnLayerNormBwdParams, kBlockThreads,  \
                    FTN_LN_BODY_BWD_BLOCK)                                                     \
  FTN_LN_ROW_KERNEL(ftn_layernorm_bwd_fused_warp, suffix, T, FtnLayerNormBwdParams, 128,       \
                    FTN_LN_BODY_BWD_FUSED_WARP)                                                \
  FTN_LN_ROW_KERNEL(ftn_layernorm_bwd_fused_block, suffix, T, FtnLayerNormBwdParams,           \
                    kFusedBlockThreads, FTN_LN_BODY_BWD_FUSED_BLOCK)                           \
  FTN_KERNEL_BOUNDED(ftn_layernorm_bwd_global_##suffix, FtnLayerNormBwdParams, p, 1024) {     \
    FTN_SHARED(float, red, [64]);                                                             \
    FTN_LN_VEC_DISPATCH(bwd_global, T, p, red);                                               \
  }                                                                                           \
  FTN_KERNEL_BOUNDED(ftn_layernorm_param_grad_##suffix, FtnLayerNormParamGradParams, p, 256) { \
    param_grad<T>(p);                                                                         \
  }                                                                                           \
  FTN_KERNEL_BOUNDED(ftn_layernorm_column_sum_##suffix, FtnLayerNormColumnSumParams, p,       \
                     1024) {                                                                  \
    FTN_SHARED(float, red, [32][33]);                                                         \
    column_sum<T>(p, red);                                                                    \
  }

// The pipelined fused backward: 16-bit storage, 128-bit access only; the
// block-path build (gamma staged) and the wide one (gamma from global).
#define FTN_LN_PIPE_KERNEL(name, T, items, staged)                                     \
  FTN_KERNEL_BOUNDED(name, FtnLayerNormBwdParams, p, kBlockThreads) {                   \
    FTN_SHARED(float4, red, [kBlockThreads / 32]);                                     \
    FTN_DYNAMIC_SHARED(float, smem);                                                   \
    FTN_ASSERT(p.vec == 8);                                                            \
    bwd_fused_pipe<T, items, staged>(p, red, smem);                                    \
  }
// Rows past the wide build: split over the blocks of a cluster of CL.
#define FTN_LN_CLUSTER_KERNEL(suffix, T, CL)                                                  \
  FTN_KERNEL_CLUSTER(ftn_layernorm_bwd_fused_cluster##CL##_##suffix, FtnLayerNormBwdParams, p, \
                     kBlockThreads, CL) {                                                     \
    FTN_SHARED(float4, red, [kBlockThreads / 32]);                                            \
    FTN_SHARED(float2, xslot, [2 * CL]);                                                      \
    FTN_SHARED(uint64_t, xbar, [2]);                                                          \
    FTN_DYNAMIC_SHARED(float, smem);                                                          \
    FTN_ASSERT(p.vec == 8);                                                                   \
    bwd_fused_pipe<T, kLnPipeWideItems, false, CL>(p, red, smem, LnClusterXch{xslot, xbar});  \
  }
#define FTN_STAMP_LAYERNORM_PIPE(suffix, T)                                            \
  FTN_LN_PIPE_KERNEL(ftn_layernorm_bwd_fused_pipe_##suffix, T, kBlockItems, true)       \
  FTN_LN_PIPE_KERNEL(ftn_layernorm_bwd_fused_pipe_wide_##suffix, T, kLnPipeWideItems, false) \
  FTN_LN_CLUSTER_KERNEL(suffix, T, 2)                                                   \
  FTN_LN_CLUSTER_KERNEL(suffix, T, 4)                                                   \
  FTN_LN_CLUSTER_KERNEL(suffix, T, 8)

FTN_STAMP_LAYERNORM(f32, float)
FTN_STAMP_LAYERNORM(f16, __half)
FTN_STAMP_LAYERNORM(bf16, __nv_bfloat16)
FTN_STAMP_LAYERNORM_PIPE(f16, __half)
FTN_STAMP_LAYERNORM_PIPE(bf16, __nv_bfloat16)
