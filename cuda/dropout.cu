// Fused bias + dropout + residual add (Megatron's bias_dropout_add), forward
// and backward, with the keep-mask regenerated from a counter-based RNG.
//
// Mask. Element i (row-major index into [rows, cols]) uses random value
// j = offset + i of the Philox 4x32-10 stream `seed` (philox.cuh): word j % 4
// of the block j / 4. It is kept iff that word >= drop_threshold
// (= round(p * 2^32), computed on the host), and a kept value is multiplied
// by scale = 1/(1-p). The mask is a pure function of (seed, offset, i): the
// backward regenerates it bit for bit instead of reading a stored mask, so no
// mask memory is allocated or moved (a byte mask would cost n bytes written
// in forward and read in backward). Eval mode and p = 0 pass
// drop_threshold = 0, scale = 1 and skip the Philox calls.
//
// Forward  out = residual + keep * scale * (x + bias): a grid-stride loop over
//   the flattened matrix; with 16-byte-aligned pointers each thread moves one
//   128-bit vector (4 fp32 or 8 fp16/bf16, i.e. 1 or 2 Philox blocks) per
//   step, a scalar loop handles the tail. Arithmetic in fp32.
//   Floor: reads 2n*sizeof(T) (x, residual; bias: cols, cached), writes
//   n*sizeof(T) bytes; ~1/4 Philox call (~40 integer ops incl. 20 mul.hi/lo)
//   per element -> HBM-bound on A100/H100.
// Backward dx = keep * scale * dy, d_residual = dy (optional copy), plus the
//   optional fp32 partial bias sums of dx: the grid tiles (column groups of
//   blockDim.x*vec) x (row chunks), each thread owns vec adjacent columns
//   and walks its chunk's rows in order; ftn_column_sum_partials_*
//   (bias_gelu.cu) sums the chunks in order: dbias is deterministic.
//   Floor: reads n*sizeof(T), writes n*sizeof(T) (+ n*sizeof(T) with
//   d_residual) + chunks*cols*4 bytes.
#include "ftn_kernel.cuh"
#include "philox.cuh"
#include "vec.cuh"

// ftn_dropout_factors / ftn_dropout_apply: philox.cuh.

template <typename T>
FTN_DEVICE void bda_fwd_scalar(const FtnBiasDropoutAddFwdParams &p, int64_t begin, int64_t n,
                               int64_t tid, int64_t stride) {
  const T *x = static_cast<const T *>(p.x);
  const T *bias = static_cast<const T *>(p.bias);
  const T *res = static_cast<const T *>(p.residual);
  T *out = static_cast<T *>(p.out);
  ftn_grid_stride_cols(
      begin + tid, n, stride, 1, p.cols, bias != nullptr, [&](int64_t i, int64_t c) {
        float f[1];
        ftn_dropout_factors<1>(p.seed, p.offset + (uint64_t)i, p.drop_threshold, p.scale, f);
        float v = ftn_to_float(x[i]);
        if (bias != nullptr) v += ftn_to_float(bias[c]);
        out[i] = ftn_from_float<T>(ftn_to_float(res[i]) + ftn_dropout_apply(f[0], v));
      });
}

template <typename T>
FTN_DEVICE void bda_fwd(const FtnBiasDropoutAddFwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  const int64_t n = p.rows * p.cols;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  if (p.vec == 1) {
    bda_fwd_scalar<T>(p, 0, n, tid, stride);
    return;
  }
  FTN_ASSERT(p.vec == (uint32_t)V);
  const T *x = static_cast<const T *>(p.x);
  const T *bias = static_cast<const T *>(p.bias);
  const T *res = static_cast<const T *>(p.residual);
  T *out = static_cast<T *>(p.out);
  const int64_t nvec = n / V;
  const bool bias_vectorised = bias != nullptr && p.cols % V == 0;
  // c: the first column of vector i.
  ftn_grid_stride_cols(tid, nvec, stride, V, p.cols, bias != nullptr, [&](int64_t i, int64_t c) {
    float v[V];
    float r[V];
    float f[V];
    ftn_load_vec<T>(x + i * V, v);
    ftn_load_vec<T>(res + i * V, r);
    ftn_dropout_factors<V>(p.seed, p.offset + (uint64_t)(i * V), p.drop_threshold, p.scale, f);
    if (bias_vectorised) {
      float b[V];
      ftn_load_vec<T>(bias + c, b);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] += b[k];
    } else if (bias != nullptr) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[k] += ftn_to_float(bias[c]);
        c = (c + 1 == p.cols) ? 0 : c + 1;
      }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = r[k] + ftn_dropout_apply(f[k], v[k]);
    ftn_store_vec<T>(out + i * V, v);
  });
  bda_fwd_scalar<T>(p, nvec * V, n, tid, stride);
}

// One thread: VEC adjacent columns [c0, c0+VEC) of rows [r0, r1).
template <typename T, int VEC>
FTN_DEVICE void bda_bwd_columns(const FtnBiasDropoutAddBwdParams &p, int64_t c0, int64_t r0,
                                int64_t r1) {
  const T *dy = static_cast<const T *>(p.dy);
  T *dx = static_cast<T *>(p.dx);
  T *dres = static_cast<T *>(p.d_residual);
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t off = r * p.cols + c0;
    float g[VEC];
    float f[VEC];
    ftn_load<T, VEC>(dy + off, g);
    if (dres != nullptr) ftn_store<T, VEC>(dres + off, g);
    ftn_dropout_factors<VEC>(p.seed, p.offset + (uint64_t)off, p.drop_threshold, p.scale, f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      g[k] = ftn_dropout_apply(f[k], g[k]);
      acc[k] += g[k];
    }
    ftn_store<T, VEC>(dx + off, g);
  }
  if (p.dbias_partial != nullptr) {
    float *partial = p.dbias_partial + (int64_t)blockIdx.y * p.cols + c0;
#pragma unroll
    for (int k = 0; k < VEC; ++k) partial[k] = acc[k];
  }
}

template <typename T>
FTN_DEVICE void bda_bwd(const FtnBiasDropoutAddBwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  const int64_t unit = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * p.rows_per_chunk;
  const int64_t r1 = r0 + p.rows_per_chunk < p.rows ? r0 + p.rows_per_chunk : p.rows;
  if (p.vec == 1) {
    if (unit < p.cols) bda_bwd_columns<T, 1>(p, unit, r0, r1);
    return;
  }
  FTN_ASSERT(p.vec == (uint32_t)V && p.cols % V == 0);
  if (unit * V < p.cols) bda_bwd_columns<T, V>(p, unit * V, r0, r1);
}

#define FTN_STAMP_BIAS_DROPOUT_ADD(suffix, T)                                                   \
  FTN_KERNEL_BOUNDED(ftn_bias_dropout_add_fwd_##suffix, FtnBiasDropoutAddFwdParams, p, 256) {   \
    bda_fwd<T>(p);                                                                              \
  }                                                                                             \
  FTN_KERNEL_BOUNDED(ftn_bias_dropout_add_bwd_##suffix, FtnBiasDropoutAddBwdParams, p, 256) {   \
    bda_bwd<T>(p);                                                                              \
  }

FTN_STAMP_BIAS_DROPOUT_ADD(f32, float)
FTN_STAMP_BIAS_DROPOUT_ADD(f16, __half)
FTN_STAMP_BIAS_DROPOUT_ADD(bf16, __nv_bfloat16)

// Raw Philox output for tests: out[i] = random value offset + i of `seed`.
FTN_KERNEL_BOUNDED(ftn_philox_fill_i32, FtnPhiloxFillParams, p, 256) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    p.out[i] = (int32_t)ftn_philox_value(p.seed, p.offset + (uint64_t)i);
  }
}
