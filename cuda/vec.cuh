// Vector access to typed kernel data: the one place kernels reinterpret
// elements as uint4 / uint2 / uint32_t (copy.cu moves untyped bytes in uint4
// units itself). Values widen to fp32 on load and narrow to the storage type
// on store (ftn_dtype.cuh); arithmetic stays fp32.
//
//   FtnVec<T>::N             elements of T in one 16-byte (128-bit) access
//   ftn_load_vec / _store_vec  exactly N elements, one 128-bit access
//   ftn_load<T, V> / ftn_store<T, V>
//                            V elements: the 128-bit access when V == N, a
//                            scalar one when V == 1 (a kernel's `vec` path)
//   ftn_load_bytes<V>        V bytes (a mask): one 4- or 8-byte access, else bytewise
//   ftn_wrap_add             a column index advanced by a grid stride, wrapped
//   ftn_grid_stride_cols     a grid-stride loop over elements with their column
//   ftn_opaque_words         packed row words hidden from the optimiser between passes
// Every helper is FTN_DEVICE (forceinline) and templated on the width, so the
// element arrays stay in registers. Under the emulator every vector access
// checks its alignment and fails the launch at the caller's line otherwise
// (FTN_CALLER_LOC, ftn_kernel.cuh), as a GPU would fault.
#ifndef FTN_VEC_CUH
#define FTN_VEC_CUH

#include <type_traits>
#if !defined(__CUDACC__) && defined(__AVX2__)
#include <immintrin.h>
#endif

#include "ftn_dtype.cuh"

// Elements of T in one 16-byte access.
template <typename T> struct FtnVec {
  static constexpr int N = 16 / sizeof(T);
};

// Widens the W words of V packed elements of T (element 2k in the low half
// of word k for 16-bit types) to fp32, exactly. bf16 is the top half of an
// fp32: one shift or one byte permute per element (the generic conversion
// of the high half costs a permute and a shift; a mask here made ptxas spill
// in multi_tensor's unscale on sm_90a).
template <typename T, int V, int W>
FTN_DEVICE void ftn_widen_words(const uint32_t (&w)[W], float *out) {
#if !defined(__CUDACC__) && defined(__AVX2__)
  // Emulator on an AVX2 host: eight bf16 widen in one 256-bit op and one
  // 32-byte store (g++'s own code stores two 16-byte halves, which a
  // following 32-byte load of `out` cannot forward from).
  if constexpr (std::is_same<T, __nv_bfloat16>::value && V == 8) {
    const __m128i packed = _mm_setr_epi32(int(w[0]), int(w[1]), int(w[2]), int(w[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(out),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(packed), 16));
    return;
  }
#endif
  if constexpr (std::is_same<T, __nv_bfloat16>::value && V % 2 == 0) {
    static_assert(W == V / 2, "two bf16 per word");
#pragma unroll
    for (int k = 0; k < W; ++k) {
      out[2 * k] = __uint_as_float(w[k] << 16);
      out[2 * k + 1] = __uint_as_float(__byte_perm(w[k], 0u, 0x3254));
    }
  } else {
    union {
      uint32_t w[W];
      T v[V];
    } u;
#pragma unroll
    for (int k = 0; k < W; ++k) u.w[k] = w[k];
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = ftn_to_float(u.v[k]);
  }
}

// Loads N = FtnVec<T>::N elements at p (16-byte aligned) with one 128-bit
// load and widens them to fp32.
template <typename T>
FTN_DEVICE void ftn_load_vec(const T *__restrict__ p,
                             float (&out)[FtnVec<T>::N] FTN_CALLER_LOC) {
  FTN_ASSERT_ALIGNED_CALLER(p, 16, "128-bit (uint4) load");
  const uint4 raw = *reinterpret_cast<const uint4 *>(p);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  ftn_widen_words<T, FtnVec<T>::N>(w, out);
}

// Narrows N fp32 values to T and stores them with one 128-bit store.
template <typename T>
FTN_DEVICE void ftn_store_vec(T *__restrict__ p,
                              const float (&in)[FtnVec<T>::N] FTN_CALLER_LOC) {
  FTN_ASSERT_ALIGNED_CALLER(p, 16, "128-bit (uint4) store");
#if !defined(__CUDACC__) && defined(__AVX2__)
  // Emulator on an AVX2 host: the eight bf16 roundings of
  // ftn_emu::f32_to_bf16 (nearest even; a NaN becomes 0x7FFF) in 256-bit
  // ops. Every rounded value fits in 16 bits, so the pack is exact.
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(in));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
    const __m256i bits = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FFF), nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0xD8);
    _mm_store_si128(reinterpret_cast<__m128i *>(p), _mm256_castsi256_si128(packed));
    return;
  }
#endif
  union {
    uint4 raw;
    T v[FtnVec<T>::N];
  } u;
#pragma unroll
  for (int k = 0; k < FtnVec<T>::N; ++k) u.v[k] = ftn_from_float<T>(in[k]);
  *reinterpret_cast<uint4 *>(p) = u.raw;
}

// V consecutive elements at p as fp32: one 128-bit load when V == N (p
// 16-byte aligned), one scalar load when V == 1.
template <typename T, int V> FTN_DEVICE void ftn_load(const T *p, float *out FTN_CALLER_LOC) {
  static_assert(V == 1 || V == FtnVec<T>::N, "vector width");
  if constexpr (V == 1) {
    out[0] = ftn_to_float(p[0]);
  } else {
#if !defined(__CUDACC__)
    // Emulator: widen straight into `out`. Through a copy, g++ moves the
    // vector in 8- and 16-byte pieces, and the caller's 32-byte read of
    // `out` then waits for the pieces to leave the store buffer.
    ftn_load_vec<T>(p, *reinterpret_cast<float(*)[V]>(out) FTN_CALLER_FWD);
#else
    float tmp[V];
    ftn_load_vec<T>(p, tmp FTN_CALLER_FWD);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = tmp[k];
#endif
  }
}

// V elements of T held packed, unconverted, in W 32-bit words (V == 1: one
// word). Loading a row packed first and widening it afterwards keeps every
// load of a thread in flight at once: a conversion between two guarded loads
// makes the second wait for the first (in-order issue), and the packed form
// takes half the registers of fp32 for 16-bit types.
template <typename T, int V> struct FtnPacked {
  static constexpr int W = (V * (int)sizeof(T) + 3) / 4;
  union U {
    uint32_t w[W];
    T v[V];
  };
};

// V consecutive elements at p, unconverted, into W words: one 128-bit load
// when V == N (p 16-byte aligned), one scalar load when V == 1.
template <typename T, int V>
FTN_DEVICE void ftn_load_packed(const T *p, uint32_t *words FTN_CALLER_LOC) {
  static_assert(V == 1 || V == FtnVec<T>::N, "vector width");
  typename FtnPacked<T, V>::U u;
  if constexpr (V == 1) {
    u.w[0] = 0u;
    u.v[0] = p[0];
  } else {
    FTN_ASSERT_ALIGNED_CALLER(p, 16, "128-bit (uint4) load");
    const uint4 raw = *reinterpret_cast<const uint4 *>(p);
    u.w[0] = raw.x;
    u.w[1] = raw.y;
    u.w[2] = raw.z;
    u.w[3] = raw.w;
  }
#pragma unroll
  for (int k = 0; k < FtnPacked<T, V>::W; ++k) words[k] = u.w[k];
}

// The V elements packed by ftn_load_packed, widened to fp32 (exact).
template <typename T, int V> FTN_DEVICE void ftn_unpack(const uint32_t *words, float *out) {
  uint32_t w[FtnPacked<T, V>::W];
#pragma unroll
  for (int k = 0; k < FtnPacked<T, V>::W; ++k) w[k] = words[k];
  ftn_widen_words<T, V>(w, out);
}

// Stores V fp32 values as T at p: one 128-bit store when V == N, one scalar
// store when V == 1.
template <typename T, int V> FTN_DEVICE void ftn_store(T *p, const float *in FTN_CALLER_LOC) {
  static_assert(V == 1 || V == FtnVec<T>::N, "vector width");
  if constexpr (V == 1) {
    p[0] = ftn_from_float<T>(in[0]);
  } else {
#if !defined(__CUDACC__)
    // Emulator: narrow straight from `in` (as ftn_load, no copy in pieces).
    ftn_store_vec<T>(p, *reinterpret_cast<const float(*)[V]>(in) FTN_CALLER_FWD);
#else
    float tmp[V];
#pragma unroll
    for (int k = 0; k < V; ++k) tmp[k] = in[k];
    ftn_store_vec<T>(p, tmp FTN_CALLER_FWD);
#endif
  }
}

// Loads V = sizeof(Raw) bytes at m (V-byte aligned) with one access.
template <typename Raw, int V>
FTN_DEVICE void ftn_load_bytes_as(const uint8_t *m, uint8_t (&out)[V] FTN_CALLER_LOC) {
  static_assert(sizeof(Raw) == V, "access width");
  FTN_ASSERT_ALIGNED_CALLER(m, V, V == 8 ? "64-bit (uint2) load" : "32-bit load");
  union {
    Raw raw;
    uint8_t b[V];
  } u;
  u.raw = *reinterpret_cast<const Raw *>(m);
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = u.b[k];
}

// Loads V bytes at m (V-byte aligned): one access when V is 4 or 8.
template <int V>
FTN_DEVICE void ftn_load_bytes(const uint8_t *m, uint8_t (&out)[V] FTN_CALLER_LOC) {
  if constexpr (V == 8) {
    ftn_load_bytes_as<uint2>(m, out FTN_CALLER_FWD);
  } else if constexpr (V == 4) {
    ftn_load_bytes_as<uint32_t>(m, out FTN_CALLER_FWD);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = m[k];
  }
}

// c + d wrapped into [0, n), for 0 <= c, d < n: a column index advanced by
// a grid stride. Kernels keep one per thread instead of a 64-bit remainder
// per element (a subroutine call in SASS).
template <typename I> FTN_DEVICE I ftn_wrap_add(I c, I d, I n) {
  c += d;
  return c >= n ? c - n : c;
}

// f(i, c) for i = first, first + stride, ... < n, where c is the column of
// element i * unit (i counts elements, unit 1, or vectors of unit
// elements) when with_cols, else 0, kept by ftn_wrap_add: the grid-stride
// loops of the elementwise kernels with a per-column bias. A thread with no
// i returns before the two 64-bit remainders (most threads of a tail).
template <typename F>
FTN_DEVICE void ftn_grid_stride_cols(int64_t first, int64_t n, int64_t stride, int64_t unit,
                                     int64_t cols, bool with_cols, F f) {
  if (first >= n) return;
  int64_t c = with_cols ? (first * unit) % cols : 0;
  const int64_t dc = with_cols ? (stride * unit) % cols : 0;
  for (int64_t i = first; i < n; i += stride) {
    f(i, c);
    c = ftn_wrap_add(c, dc, cols);
  }
}

// Hides packed words from the optimiser between passes over a row held in
// registers, so that values widened from them in one pass are recomputed in
// the next, not kept (the registers packing saves). A no-op emulated.
template <int N>
FTN_DEVICE void ftn_opaque_words(uint32_t (&w)[N]) {
#if defined(__CUDACC__)
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(w[i]));
#else
  (void)w;
#endif
}

#endif  // FTN_VEC_CUH
