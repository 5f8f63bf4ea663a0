// Warp and block all-reductions in fp32, in a fixed order (xor butterfly over
// lanes, then over warps), so every thread gets bitwise the same result on
// every run. The one copy used by every kernel (softmax, layernorm,
// multi-tensor, vocab-parallel). FTN_DEVICE (forceinline) and templated on
// the operation and the count, so the values stay in registers.
#ifndef FTN_REDUCE_CUH
#define FTN_REDUCE_CUH

#include "ftn_dtype.cuh"

struct FtnMaxOp {
  static FTN_DEVICE float apply(float a, float b) { return a > b ? a : b; }
  static FTN_DEVICE float identity() { return FTN_NEG_INF; }
};
struct FtnSumOp {
  static FTN_DEVICE float apply(float a, float b) { return a + b; }
  static FTN_DEVICE float identity() { return 0.0f; }
};

// A thread's own values reduced before any cross-lane step: element-wise
// down the R rows of v[R][V], then pairs across the V columns (R - 1 +
// log2 V dependent steps instead of R * V, and the emulator's g++
// vectorises the element-wise part). The order is fixed, so sums are
// bitwise deterministic; fmaxf is associative and commutative (a NaN
// operand yields the other), so the max equals any serial chain's, and
// ftn_thread_max ends with -inf as such a chain starts (all-NaN gives -inf).
template <int V> FTN_DEVICE float ftn_pairwise_sum(float (&a)[V]) {
  static_assert(V >= 1 && (V & (V - 1)) == 0, "V must be a power of two");
#pragma unroll
  for (int w = V / 2; w > 0; w /= 2) {
#pragma unroll
    for (int k = 0; k < w; ++k) a[k] += a[k + w];
  }
  return a[0];
}
template <int R, int V> FTN_DEVICE float ftn_thread_sum(const float (&v)[R][V]) {
  float a[V];
#pragma unroll
  for (int k = 0; k < V; ++k) a[k] = v[0][k];
#pragma unroll
  for (int r = 1; r < R; ++r) {
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] += v[r][k];
  }
  return ftn_pairwise_sum<V>(a);
}
// a[k] = fmaxf(a[k], b[k]) for k < N (the emulator's: in host vectors).
template <int N> FTN_DEVICE void ftn_fmax_into(float *a, const float *b) {
#if defined(__CUDACC__)
#pragma unroll
  for (int k = 0; k < N; ++k) a[k] = fmaxf(a[k], b[k]);
#else
  ftn_emu::fmax_into(a, b, N);
#endif
}
// a[k] = max(a[k], a[k + W]) for k < W, then the same for W / 2, ... 1.
template <int W> FTN_DEVICE void ftn_fmax_halves(float *a) {
  if constexpr (W >= 1) {
    ftn_fmax_into<W>(a, a + W);
    ftn_fmax_halves<W / 2>(a);
  }
}
template <int R, int V> FTN_DEVICE float ftn_thread_max(const float (&v)[R][V]) {
  static_assert(V >= 1 && (V & (V - 1)) == 0, "V must be a power of two");
  float a[V];
#pragma unroll
  for (int k = 0; k < V; ++k) a[k] = v[0][k];
#pragma unroll
  for (int r = 1; r < R; ++r) ftn_fmax_into<V>(a, v[r]);
  ftn_fmax_halves<V / 2>(a);
  return fmaxf(FTN_NEG_INF, a[0]);
}

// Each aligned group of LANES lanes (a power of two <= 32) reduces each of
// its N values with an xor butterfly (offsets LANES/2, ..., 1); every lane of
// the warp must call it. On the emulator, one warp rendezvous computing the
// same butterflies (cuda/emu/warp.cpp) instead of log2(LANES) * N shuffles:
// bitwise the same results.
#if defined(__CUDACC__)
template <class Op, int LANES, int N> FTN_DEVICE void ftn_group_allreduce_n(float (&v)[N]) {
  static_assert(LANES >= 1 && LANES <= 32 && (LANES & (LANES - 1)) == 0, "group width");
#pragma unroll
  for (int off = LANES / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = Op::apply(v[i], __shfl_xor_sync(0xffffffffu, v[i], off));
  }
}
#else
// The emulator's side: one value's butterfly over all 32 lanes at once
// (v[l] is lane l's), Op inlined rather than called per lane and step.
template <class Op> void ftn_emu_butterfly(float *v, unsigned width) {
  for (unsigned off = width / 2; off > 0; off >>= 1) {
    float n[32];
    for (unsigned l = 0; l < 32; ++l) n[l] = Op::apply(v[l], v[l ^ off]);
    for (unsigned l = 0; l < 32; ++l) v[l] = n[l];
  }
}
template <class Op, int LANES, int N>
FTN_DEVICE void ftn_group_allreduce_n(float (&v)[N], std::source_location ftn_loc =
                                                         std::source_location::current()) {
  static_assert(LANES >= 1 && LANES <= 32 && (LANES & (LANES - 1)) == 0, "group width");
  static_assert(N >= 1 && N <= 4, "the emulator's collective takes 1..4 values");
  ::ftn_emu::warp_allreduce_f32(v, N, LANES, &ftn_emu_butterfly<Op>, ftn_loc.file_name(),
                                ftn_loc.line());
}
#endif

// One value over a group of LANES lanes.
template <class Op, int LANES> FTN_DEVICE float ftn_group_allreduce(float v) {
  float a[1] = {v};
  ftn_group_allreduce_n<Op, LANES, 1>(a);
  return a[0];
}

// One value over the whole warp.
template <class Op> FTN_DEVICE float ftn_warp_allreduce(float v) {
  return ftn_group_allreduce<Op, 32>(v);
}

// Every thread of the block gets the reduction of each of the N values v[i],
// through one pair of barriers for all N. `red` holds 32 floats per value
// (value i uses red[32*i, 32*i + blockDim.x/32)). Needs blockDim.x % 32 == 0
// and all threads of the block; `red` may be reused as soon as it returns.
template <class Op, int N> FTN_DEVICE void ftn_block_allreduce_n(float (&v)[N], float *red) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  ftn_group_allreduce_n<Op, 32, N>(v);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) red[32 * i + warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = lane < warps ? red[32 * i + lane] : Op::identity();
  ftn_group_allreduce_n<Op, 32, N>(v);
  __syncthreads();  // `red` may be reused by the next call
}

// One value: `red` holds >= blockDim.x / 32 floats (32 serve any block).
template <class Op> FTN_DEVICE float ftn_block_allreduce(float v, float *red) {
  float a[1] = {v};
  ftn_block_allreduce_n<Op, 1>(a, red);
  return a[0];
}

// Sum over chunks k = first, first + step, ... < chunks of partial[k * cols
// + c], added in chunk order; the loads go in batches of eight issued
// together before their adds (an unrolled loop with a runtime trip count
// keeps its exit test between the loads, so each would wait for the one
// before), the last batch predicated: a thread's whole share is
// ceil(share / 8) load latencies. Stage two of the deterministic column
// gradients.
FTN_DEVICE float ftn_column_chunk_sum(const float *partial, int64_t cols, int64_t c, int64_t first,
                                      int64_t step, int64_t chunks) {
  constexpr int kBatch = 8;
  float s = 0.0f;
#pragma unroll 1
  for (int64_t k = first; k < chunks; k += kBatch * step) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      v[u] = k + u * step < chunks ? partial[(k + u * step) * cols + c] : 0.0f;
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (k + u * step < chunks) s += v[u];
  }
  return s;
}

#endif  // FTN_REDUCE_CUH
