// Warp and block all-reductions in fp32, in a fixed order (xor butterfly over
// lanes, then over warps), so every thread gets bitwise the same result on
// every run. Shared by the softmax and vocab-parallel kernels.
#ifndef FTN_REDUCE_CUH
#define FTN_REDUCE_CUH

#include "ftn_kernel.cuh"

#define FTN_NEG_INF (__int_as_float((int)0xff800000u))

struct FtnMaxOp {
  static FTN_DEVICE float apply(float a, float b) { return a > b ? a : b; }
  static FTN_DEVICE float identity() { return FTN_NEG_INF; }
};
struct FtnSumOp {
  static FTN_DEVICE float apply(float a, float b) { return a + b; }
  static FTN_DEVICE float identity() { return 0.0f; }
};

template <class Op> FTN_DEVICE float ftn_warp_allreduce(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Every thread of the block gets the reduction of `v`; `red` holds >= 32
// floats. Needs blockDim.x % 32 == 0 and all threads of the block.
template <class Op> FTN_DEVICE float ftn_block_allreduce(float v, float *red) {
  v = ftn_warp_allreduce<Op>(v);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < warps ? red[lane] : Op::identity();
  v = ftn_warp_allreduce<Op>(v);
  __syncthreads();  // `red` may be reused by the next call
  return v;
}

#endif  // FTN_REDUCE_CUH
