// Bias + GeLU, forward and backward (Megatron's fused bias_gelu).
//
// Forward  out = gelu(x + bias): a grid-stride loop over the flattened
//   [rows, cols] matrix; with 16-byte-aligned pointers each thread moves one
//   128-bit vector (4 fp32 or 8 fp16/bf16) per step and a scalar loop handles
//   the n % vec tail. Columns are tracked incrementally, so any cols works.
//   Two vectors per thread and step (both loads, and their bias vectors',
//   in flight before any is used). Floor: reads n*sizeof(T) + writes n*sizeof(T) bytes (bias: cols,
//   cached); ~20 FLOP/element, far below the matrix rate -> HBM-bound.
// Backward dx = dy * gelu'(x + bias), plus optional fp32 partial bias sums:
//   the grid tiles (column groups of blockDim.x*vec) x (row chunks); each
//   thread owns vec adjacent columns, walks its chunk's rows in order (two
//   rows per step, loads first), writes
//   dx and one partial sum per column. ftn_column_sum_partials_* then sums the
//   chunks in order: dbias is deterministic, no float atomics.
//   Floor: reads 2n*sizeof(T), writes n*sizeof(T) + chunks*cols*4 bytes.
#include "reduce.cuh"
#include "vec.cuh"
#include "gelu.cuh"

template <typename T, unsigned KIND>
FTN_DEVICE void bias_gelu_fwd_scalar(const FtnBiasGeluFwdParams &p, int64_t begin, int64_t n,
                                     int64_t tid, int64_t stride) {
  const T *x = static_cast<const T *>(p.x);
  const T *bias = static_cast<const T *>(p.bias);
  T *out = static_cast<T *>(p.out);
  ftn_grid_stride_cols(begin + tid, n, stride, 1, p.cols, bias != nullptr,
                       [&](int64_t i, int64_t c) {
                         float v = ftn_to_float(x[i]);
                         if (bias != nullptr) v += ftn_to_float(bias[c]);
                         out[i] = ftn_from_float<T>(ftn_gelu_bw<KIND>(v));
                       });
}

// Adds the bias to the V values of vector i (first column c = i*V % cols).
template <typename T>
FTN_DEVICE void bias_gelu_add_bias(const FtnBiasGeluFwdParams &p, int64_t i, float (&v)[FtnVec<T>::N]) {
  constexpr int V = FtnVec<T>::N;
  const T *bias = static_cast<const T *>(p.bias);
  if (bias == nullptr) return;
  int64_t c = (i * V) % p.cols;
  if (p.cols % V == 0) {
    float b[V];
    ftn_load_vec<T>(bias + c, b);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] += b[k];
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      v[k] += ftn_to_float(bias[c]);
      c = (c + 1 == p.cols) ? 0 : c + 1;
    }
  }
}

template <typename T, unsigned KIND>
FTN_DEVICE void bias_gelu_fwd(const FtnBiasGeluFwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  const int64_t n = p.rows * p.cols;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  if (p.vec == 1) {
    bias_gelu_fwd_scalar<T, KIND>(p, 0, n, tid, stride);
    return;
  }
  FTN_ASSERT(p.vec == (uint32_t)V);
  const T *x = static_cast<const T *>(p.x);
  T *out = static_cast<T *>(p.out);
  const int64_t nvec = n / V;
  // Two vectors (i, i + stride) per step, both loaded before either is
  // used and stored after both are computed (in place stays safe: every
  // element is read before it is written, by the same thread).
  int64_t i = tid;
  // A vector bias is loaded with them (packed, before any use): a bias
  // load after the first use of x would wait for x's round trip first.
  const T *bias = static_cast<const T *>(p.bias);
  const bool vec_bias = bias != nullptr && p.cols % V == 0;
  constexpr int W = FtnPacked<T, V>::W;
  // The two vectors' bias columns, advanced by increments (ftn_wrap_add),
  // in 32 bits:
  // the plan takes the scalar path for rows of 2^31 columns or more.
  FTN_ASSERT(p.cols <= 0x7fffffff);
  const int cols = (int)p.cols;
  // The loop's 64-bit divisions only where the loop runs (a thread left
  // with a single vector would pay three for nothing).
  int c0 = 0, c1 = 0, dc = 0;
  if (vec_bias && i + stride < nvec) {
    c0 = (int)((i * V) % cols);
    c1 = (int)(((i + stride) * V) % cols);
    dc = (int)((2 * stride * V) % cols);
  }
  for (; i + stride < nvec; i += 2 * stride) {
    uint32_t xw0[W], xw1[W], bw0[W] = {}, bw1[W] = {};  // bw*: read only when vec_bias
    ftn_load_packed<T, V>(x + i * V, xw0);
    ftn_load_packed<T, V>(x + (i + stride) * V, xw1);
    if (vec_bias) {
      ftn_load_packed<T, V>(bias + c0, bw0);
      ftn_load_packed<T, V>(bias + c1, bw1);
      c0 = ftn_wrap_add(c0, dc, cols);
      c1 = ftn_wrap_add(c1, dc, cols);
    }
    float v0[V], v1[V];
    ftn_unpack<T, V>(xw0, v0);
    ftn_unpack<T, V>(xw1, v1);
    if (vec_bias) {
      float b0[V], b1[V];
      ftn_unpack<T, V>(bw0, b0);
      ftn_unpack<T, V>(bw1, b1);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v0[k] += b0[k];
        v1[k] += b1[k];
      }
    } else {
      bias_gelu_add_bias<T>(p, i, v0);
      bias_gelu_add_bias<T>(p, i + stride, v1);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      v0[k] = ftn_gelu_bw<KIND>(v0[k]);
      v1[k] = ftn_gelu_bw<KIND>(v1[k]);
    }
    ftn_store_vec<T>(out + i * V, v0);
    ftn_store_vec<T>(out + (i + stride) * V, v1);
  }
  if (i < nvec) {
    float v[V];
    ftn_load_vec<T>(x + i * V, v);
    bias_gelu_add_bias<T>(p, i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = ftn_gelu_bw<KIND>(v[k]);
    ftn_store_vec<T>(out + i * V, v);
  }
  bias_gelu_fwd_scalar<T, KIND>(p, nvec * V, n, tid, stride);
}

template <typename T>
FTN_DEVICE void bias_gelu_fwd_dispatch(const FtnBiasGeluFwdParams &p) {
  if (p.gelu == FTN_GELU_ERF) {
    bias_gelu_fwd<T, FTN_GELU_ERF>(p);
  } else {
    bias_gelu_fwd<T, FTN_GELU_TANH>(p);
  }
}

// Makes word a depend on word b (an identity byte permute ptxas keeps): no
// use of a is scheduled before b's load has issued. A no-op emulated.
FTN_DEVICE void ftn_after_load(uint32_t &a, uint32_t b) {
#if defined(__CUDACC__)
  asm volatile("prmt.b32 %0, %0, %1, 0x3210;" : "+r"(a) : "r"(b));
#else
  (void)a;
  (void)b;
#endif
}

// One thread: VEC adjacent columns [c0, c0+VEC) of rows [r0, r1).
template <typename T, unsigned KIND, int VEC>
FTN_DEVICE void bias_gelu_bwd_columns(const FtnBiasGeluBwdParams &p, int64_t c0, int64_t r0,
                                      int64_t r1) {
  const T *dy = static_cast<const T *>(p.dy);
  const T *x = static_cast<const T *>(p.x);
  const T *bias = static_cast<const T *>(p.bias);
  T *dx = static_cast<T *>(p.dx);
  float b[VEC];
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
  if (bias == nullptr) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) b[k] = 0.0f;
  } else {
    ftn_load<T, VEC>(bias + c0, b);
  }
  // Two rows per step, all four loads issued before any use; the partial
  // sums still add row r before row r + 1, so dbias is unchanged bitwise.
  int64_t r = r0;
  for (; r + 1 < r1; r += 2) {
    const int64_t off0 = r * p.cols + c0;
    const int64_t off1 = off0 + p.cols;
    // Packed: no conversion between the loads (one would make the next
    // load wait for the previous one).
    constexpr int W = FtnPacked<T, VEC>::W;
    uint32_t gw0[W], vw0[W], gw1[W], vw1[W];
    ftn_load_packed<T, VEC>(dy + off0, gw0);
    ftn_load_packed<T, VEC>(x + off0, vw0);
    ftn_load_packed<T, VEC>(dy + off1, gw1);
    ftn_load_packed<T, VEC>(x + off1, vw1);
    // No use of x before all four loads issue (else ptxas starts the GeLU
    // arithmetic on the first x to arrive and a later load waits behind
    // it): every word of x is tied to a token that depends on each load.
    uint32_t token = gw0[0];
    ftn_after_load(token, gw1[0]);
    ftn_after_load(token, vw0[0]);
    ftn_after_load(token, vw1[0]);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      ftn_after_load(vw0[k], token);
      ftn_after_load(vw1[k], token);
    }
    float g0[VEC], v0[VEC], g1[VEC], v1[VEC];
    ftn_unpack<T, VEC>(gw0, g0);
    ftn_unpack<T, VEC>(vw0, v0);
    ftn_unpack<T, VEC>(gw1, g1);
    ftn_unpack<T, VEC>(vw1, v1);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      g0[k] *= ftn_gelu_grad_bw<KIND>(v0[k] + b[k]);
      g1[k] *= ftn_gelu_grad_bw<KIND>(v1[k] + b[k]);
      acc[k] += g0[k];
      acc[k] += g1[k];
    }
    ftn_store<T, VEC>(dx + off0, g0);
    ftn_store<T, VEC>(dx + off1, g1);
  }
  if (r < r1) {
    const int64_t off = r * p.cols + c0;
    float g[VEC];
    float v[VEC];
    ftn_load<T, VEC>(dy + off, g);
    ftn_load<T, VEC>(x + off, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      g[k] *= ftn_gelu_grad_bw<KIND>(v[k] + b[k]);
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

template <typename T, unsigned KIND>
FTN_DEVICE void bias_gelu_bwd(const FtnBiasGeluBwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  const int64_t unit = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * p.rows_per_chunk;
  const int64_t r1 = r0 + p.rows_per_chunk < p.rows ? r0 + p.rows_per_chunk : p.rows;
  if (p.vec == 1) {
    if (unit < p.cols) bias_gelu_bwd_columns<T, KIND, 1>(p, unit, r0, r1);
    return;
  }
  FTN_ASSERT(p.vec == (uint32_t)V && p.cols % V == 0);
  if (unit * V < p.cols) bias_gelu_bwd_columns<T, KIND, V>(p, unit * V, r0, r1);
}

template <typename T>
FTN_DEVICE void bias_gelu_bwd_dispatch(const FtnBiasGeluBwdParams &p) {
  if (p.gelu == FTN_GELU_ERF) {
    bias_gelu_bwd<T, FTN_GELU_ERF>(p);
  } else {
    bias_gelu_bwd<T, FTN_GELU_TANH>(p);
  }
}

// Stage two of the bias gradient: one thread per column sums the chunks in
// order (ftn_column_chunk_sum: eight loads in flight).
// Floor: reads chunks*cols*4 bytes, writes cols*sizeof(T).
template <typename T>
FTN_DEVICE void column_sum_partials(const FtnColumnSumParams &p) {
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= p.cols) return;
  const float s = ftn_column_chunk_sum(p.partial, p.cols, c, 0, 1, p.chunks);
  static_cast<T *>(p.out)[c] = ftn_from_float<T>(s);
}

#define FTN_STAMP_BIAS_GELU(suffix, T)                                                  \
  FTN_KERNEL_BOUNDED(ftn_bias_gelu_fwd_##suffix, FtnBiasGeluFwdParams, p, 256) {        \
    bias_gelu_fwd_dispatch<T>(p);                                                       \
  }                                                                                     \
  FTN_KERNEL_BOUNDED(ftn_bias_gelu_bwd_##suffix, FtnBiasGeluBwdParams, p, 256) {        \
    bias_gelu_bwd_dispatch<T>(p);                                                       \
  }                                                                                     \
  FTN_KERNEL_BOUNDED(ftn_column_sum_partials_##suffix, FtnColumnSumParams, p, 256) {    \
    column_sum_partials<T>(p);                                                          \
  }

FTN_STAMP_BIAS_GELU(f32, float)
FTN_STAMP_BIAS_GELU(f16, __half)
FTN_STAMP_BIAS_GELU(bf16, __nv_bfloat16)
