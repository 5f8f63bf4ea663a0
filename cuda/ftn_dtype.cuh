// Storage-type helpers shared by the kernels: fp32 <-> storage conversion and
// 128-bit vector access. Arithmetic is always fp32 (REFERENCE.md).
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

// Elements of T in one 16-byte access.
template <typename T> struct FtnVec {
  static constexpr int N = 16 / sizeof(T);
};

// Loads N = FtnVec<T>::N elements at p (16-byte aligned) with one 128-bit
// load and widens them to fp32.
template <typename T>
FTN_DEVICE void ftn_load_vec(const T *__restrict__ p, float (&out)[FtnVec<T>::N]) {
  union {
    uint4 raw;
    T v[FtnVec<T>::N];
  } u;
  u.raw = *reinterpret_cast<const uint4 *>(p);
#pragma unroll
  for (int k = 0; k < FtnVec<T>::N; ++k) out[k] = ftn_to_float(u.v[k]);
}

// Narrows N fp32 values to T and stores them with one 128-bit store.
template <typename T>
FTN_DEVICE void ftn_store_vec(T *__restrict__ p, const float (&in)[FtnVec<T>::N]) {
  union {
    uint4 raw;
    T v[FtnVec<T>::N];
  } u;
#pragma unroll
  for (int k = 0; k < FtnVec<T>::N; ++k) u.v[k] = ftn_from_float<T>(in[k]);
  *reinterpret_cast<uint4 *>(p) = u.raw;
}

#endif  // FTN_DTYPE_CUH
