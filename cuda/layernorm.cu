// LayerNorm and RMSNorm, forward and backward, any hidden size (cols >= 1).
//
// Statistics are fp32 whatever the storage dtype and always two-pass: the
// mean first, then the sum of squared deviations from it (never
// E[x^2] - E[x]^2, which loses everything to cancellation when |mean| >> std).
// Variance is biased (divide by cols); rstd = rsqrt(var + eps). The mean is
// taken of x - pivot (pivot = the row's first element; exact subtraction for
// nearby values), so x - mean = (x - pivot) - shift stays accurate to fp32
// relative to the row's spread even under a large common offset; the saved
// mean is pivot + shift rounded to fp32.
//
// Three row paths, chosen by the plan (src/core/plan/layernorm.rs) from cols:
//   warp   (cols <= 1024): one warp per row, 4 rows per 128-thread block, a
//          grid-stride loop over rows; the row lives in registers (32 fp32
//          per lane), reductions are shuffles.
//   block  (cols <= 12288): one block per row, the fewest whole warps that
//          hold it at <= 24 fp32 per thread in registers (32..512 threads;
//          more resident blocks per SM); warp shuffles then a shared-memory
//          step.
//   global (any cols): one 1024-thread block per row, nothing cached: each
//          pass re-reads the row from global memory (L2 usually holds it).
// Block and global launches use a 2-D grid, one row per block (no row loop:
// the compiler would hoist every gamma/beta load out of it and spill).
// With 16-byte-aligned pointers and cols % (16 / sizeof(T)) == 0 every access
// is one 128-bit load/store (`vec` > 1); otherwise scalar accesses.
// ptxas (sm_80, sm_90a): zero spills in every kernel.
//
// Forward floor: reads rows*cols*sizeof(T), writes rows*cols*sizeof(T) and
//   8*rows bytes of statistics (gamma/beta: 2*cols*sizeof(T), cached).
//   The global path reads x three times (twice more from L2 when it fits).
//   ~10 FLOP per element: HBM-bound.
// Backward, input gradient: reads dy and x (2*rows*cols*sizeof(T)) and
//   8*rows bytes of statistics, writes dx (rows*cols*sizeof(T)). The global
//   path reads dy and x twice.
// Backward, parameter gradients (deterministic, no float atomics): stage one
//   (ftn_layernorm_param_grad_*) re-reads dy and x column-wise, each thread
//   owning `vec` adjacent columns of a chunk of rows, and writes fp32 partial
//   sums per chunk: 2*rows*cols*sizeof(T) + 2*chunks*cols*4 bytes. Stage two
//   (ftn_layernorm_column_sum_*) sums the chunks in a fixed order:
//   reads 2*chunks*cols*4, writes 2*cols*sizeof(T) bytes.
//   So the whole backward moves ~5*rows*cols*sizeof(T) against a fused floor
//   of 3*rows*cols*sizeof(T): accumulating dgamma/dbeta in registers inside
//   the row kernels would need two more register copies of the row and
//   spills on the block path; a fused variant is future work.
#include "reduce.cuh"
#include "vec.cuh"

namespace {

constexpr int kWarpItems = 32;   // fp32 values per lane in the warp path
constexpr int kWarpRows = 4;     // rows (warps) per block in the warp path
constexpr int kBlockItems = 24;  // fp32 values per thread in the block path
constexpr int kBlockThreads = 512;  // most threads of a block-path block

// The row of a block-per-row launch: grid (x, y) covers x*y >= rows rows,
// one per block. (No grid-stride loop: the compiler would hoist every
// gamma/beta load out of it and spill.) A block past the end exits whole.
FTN_DEVICE int64_t block_row() { return (int64_t)blockIdx.y * gridDim.x + blockIdx.x; }

// Sums over the row group: a warp (WARP) or the whole block (reduce.cuh; a
// fixed order, so deterministic). red: 64 floats of shared memory (block).
template <bool WARP>
FTN_DEVICE void group_sum2(float &a, float &b, float *red) {
  if constexpr (WARP) {
    (void)red;
    a = ftn_warp_allreduce<FtnSumOp>(a);
    b = ftn_warp_allreduce<FtnSumOp>(b);
  } else {
    float v[2] = {a, b};
    ftn_block_allreduce_n<FtnSumOp, 2>(v, red);
    a = v[0];
    b = v[1];
  }
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

// One row held in registers by a group of G threads (t = rank in the group):
// chunk c of thread t covers columns [(c*G + t)*V, +V).
template <typename T, int V, int ITEMS, bool WARP>
FTN_DEVICE void fwd_row_cached(const FtnLayerNormFwdParams &p, int64_t row, int t, int G,
                               float *red) {
  constexpr int C = ITEMS / V;
  const int n = (int)p.cols;  // <= 32 * kWarpItems or blockDim.x * kBlockItems
  const T *x = static_cast<const T *>(p.x) + row * p.cols;
  T *y = static_cast<T *>(p.y) + row * p.cols;
  const bool rms = p.kind == FTN_NORM_RMS;
  const float pivot = rms ? 0.0f : ftn_to_float(x[0]);
  float v[ITEMS];
  float s = 0.0f;
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if (col < n) {
      ftn_load<T, V>(x + col, v + c * V);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[c * V + k] -= pivot;
        s += v[c * V + k];
      }
    }
  }
  const float inv_n = 1.0f / (float)n;
  const float shift = rms ? 0.0f : group_sum<WARP>(s, red) * inv_n;
  float q = 0.0f;
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if (col < n) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[c * V + k] -= shift;  // x - mean
        q += v[c * V + k] * v[c * V + k];
      }
    }
  }
  q = group_sum<WARP>(q, red);
  const float rstd = rsqrtf(q * inv_n + p.eps);
  if (t == 0) {
    if (p.mean != nullptr) p.mean[row] = pivot + shift;
    if (p.rstd != nullptr) p.rstd[row] = rstd;
  }
  const T *gamma = static_cast<const T *>(p.gamma);
  const T *beta = rms ? nullptr : static_cast<const T *>(p.beta);
#pragma unroll
  for (int c = 0, col = t * V; c < C; ++c, col += G * V) {
    if (col < n) {
      float g[V], b[V];
      load_gamma<T, V>(gamma, col, p.zero_centered_gamma, g);
      if (beta != nullptr) {
        ftn_load<T, V>(beta + col, b);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) b[k] = 0.0f;
      }
      float o[V];
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = v[c * V + k] * rstd * g[k] + b[k];
      ftn_store<T, V>(y + col, o);
    }
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

template <typename T, int V>
FTN_DEVICE void fwd_block(const FtnLayerNormFwdParams &p, float *red) {
  FTN_ASSERT(blockDim.x % 32 == 0 && p.cols <= (int64_t)blockDim.x * kBlockItems);
  const int64_t row = block_row();
  if (row < p.rows) fwd_row_cached<T, V, kBlockItems, false>(p, row, threadIdx.x, blockDim.x, red);
}

// Nothing cached: three passes over the row (mean, squared deviations, y).
template <typename T, int V>
FTN_DEVICE void fwd_global(const FtnLayerNormFwdParams &p, float *red) {
  FTN_ASSERT(blockDim.x % 32 == 0);
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
    // mean = pivot + shift; x - mean is computed as (x - pivot) - shift.
    const float pivot = rms ? 0.0f : ftn_to_float(x[0]);
    float shift = 0.0f;
    if (!rms) {
      float s = 0.0f;
      for (int64_t col = (int64_t)threadIdx.x * V; col < n; col += step) {
        float v[V];
        ftn_load<T, V>(x + col, v);
#pragma unroll
        for (int k = 0; k < V; ++k) s += v[k] - pivot;
      }
      shift = group_sum<false>(s, red) * inv_n;
    }
    float q = 0.0f;
    for (int64_t col = (int64_t)threadIdx.x * V; col < n; col += step) {
      float v[V];
      ftn_load<T, V>(x + col, v);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float d = (v[k] - pivot) - shift;
        q += d * d;
      }
    }
    q = group_sum<false>(q, red);
    const float rstd = rsqrtf(q * inv_n + p.eps);
    if (threadIdx.x == 0) {
      if (p.mean != nullptr) p.mean[row] = pivot + shift;
      if (p.rstd != nullptr) p.rstd[row] = rstd;
    }
    for (int64_t col = (int64_t)threadIdx.x * V; col < n; col += step) {
      float v[V], g[V], o[V];
      ftn_load<T, V>(x + col, v);
      load_gamma<T, V>(gamma, col, p.zero_centered_gamma, g);
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = ((v[k] - pivot) - shift) * rstd * g[k];
      if (beta != nullptr) {
        float b[V];
        ftn_load<T, V>(beta + col, b);
#pragma unroll
        for (int k = 0; k < V; ++k) o[k] += b[k];
      }
      ftn_store<T, V>(y + col, o);
    }
  }
}

// --------------------------------------------------------------- backward

template <typename T, int V, int ITEMS, bool WARP>
FTN_DEVICE void bwd_row_cached(const FtnLayerNormBwdParams &p, int64_t row, int t, int G,
                               float *red) {
  constexpr int C = ITEMS / V;
  const int n = (int)p.cols;  // <= 32 * kWarpItems or blockDim.x * kBlockItems
  const T *x = static_cast<const T *>(p.x) + row * p.cols;
  const T *dy = static_cast<const T *>(p.dy) + row * p.cols;
  T *dx = static_cast<T *>(p.dx) + row * p.cols;
  const T *gamma = static_cast<const T *>(p.gamma);
  const bool rms = p.kind == FTN_NORM_RMS;
  const float mean = rms ? 0.0f : p.mean[row];
  const float rstd = p.rstd[row];
  float xh[ITEMS];  // xhat
  float gh[ITEMS];  // dxhat = dy * g
  float s1 = 0.0f, s2 = 0.0f;
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

template <typename T, int V>
FTN_DEVICE void bwd_warp(const FtnLayerNormBwdParams &p) {
  FTN_ASSERT(blockDim.x == 32 * kWarpRows && p.cols <= 32 * kWarpItems);
  const int lane = threadIdx.x & 31u;
  for (int64_t row = (int64_t)blockIdx.x * kWarpRows + (threadIdx.x >> 5); row < p.rows;
       row += (int64_t)gridDim.x * kWarpRows) {
    bwd_row_cached<T, V, kWarpItems, true>(p, row, lane, 32, nullptr);
  }
}

template <typename T, int V>
FTN_DEVICE void bwd_block(const FtnLayerNormBwdParams &p, float *red) {
  FTN_ASSERT(blockDim.x % 32 == 0 && p.cols <= (int64_t)blockDim.x * kBlockItems);
  const int64_t row = block_row();
  if (row < p.rows) bwd_row_cached<T, V, kBlockItems, false>(p, row, threadIdx.x, blockDim.x, red);
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
    for (int64_t k = threadIdx.y; k < p.chunks; k += blockDim.y) s += partial[k * p.cols + c];
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
#define FTN_LN_VEC_DISPATCH(fn, T, ...)       \
  do {                                        \
    if (p.vec == 1) {                         \
      fn<T, 1>(__VA_ARGS__);                  \
    } else {                                  \
      FTN_ASSERT(p.vec == FtnVec<T>::N);      \
      fn<T, FtnVec<T>::N>(__VA_ARGS__);       \
    }                                         \
  } while (0)

#define FTN_STAMP_LAYERNORM(suffix, T)                                                        \
  FTN_KERNEL_BOUNDED(ftn_layernorm_fwd_warp_##suffix, FtnLayerNormFwdParams, p, 128) {        \
    FTN_LN_VEC_DISPATCH(fwd_warp, T, p);                                                      \
  }                                                                                           \
  FTN_KERNEL_BOUNDED(ftn_layernorm_fwd_block_##suffix, FtnLayerNormFwdParams, p, kBlockThreads) {      \
    FTN_SHARED(float, red, [64]);                                                             \
    FTN_LN_VEC_DISPATCH(fwd_block, T, p, red);                                                \
  }                                                                                           \
  FTN_KERNEL_BOUNDED(ftn_layernorm_fwd_global_##suffix, FtnLayerNormFwdParams, p, 1024) {     \
    FTN_SHARED(float, red, [64]);                                                             \
    FTN_LN_VEC_DISPATCH(fwd_global, T, p, red);                                               \
  }                                                                                           \
  FTN_KERNEL_BOUNDED(ftn_layernorm_bwd_warp_##suffix, FtnLayerNormBwdParams, p, 128) {        \
    FTN_LN_VEC_DISPATCH(bwd_warp, T, p);                                                      \
  }                                                                                           \
  FTN_KERNEL_BOUNDED(ftn_layernorm_bwd_block_##suffix, FtnLayerNormBwdParams, p, kBlockThreads) {      \
    FTN_SHARED(float, red, [64]);                                                             \
    FTN_LN_VEC_DISPATCH(bwd_block, T, p, red);                                                \
  }                                                                                           \
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

FTN_STAMP_LAYERNORM(f32, float)
FTN_STAMP_LAYERNORM(f16, __half)
FTN_STAMP_LAYERNORM(bf16, __nv_bfloat16)
