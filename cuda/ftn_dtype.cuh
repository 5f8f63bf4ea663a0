// Storage-type helpers shared by the kernels: fp32 <-> storage conversion and
// the fp32 constants kernels share. Arithmetic is always fp32 (docs/semantics.md).
// Vector (128-bit) access: vec.cuh; warp/block reductions: reduce.cuh.
#ifndef FTN_DTYPE_CUH
#define FTN_DTYPE_CUH

#include "ftn_kernel.cuh"

FTN_DEVICE float ftn_to_float(float v) { return v; }
FTN_DEVICE float ftn_to_float(__half v) { return __half2float(v); }
FTN_DEVICE float ftn_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> FTN_DEVICE T ftn_from_float(float v);
template <> FTN_DEVICE float ftn_from_float<float>(float v) { return v; }
template <> FTN_DEVICE __half ftn_from_float<__half>(float v) { return __float2half_rn(v); }
template <> FTN_DEVICE __nv_bfloat16 ftn_from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// fp32 -infinity (bit pattern 0xff800000): the max identity, causal-masked
// logits. Bit-cast, so it holds under fast-math.
#define FTN_NEG_INF (__int_as_float((int)0xff800000u))

#endif  // FTN_DTYPE_CUH
