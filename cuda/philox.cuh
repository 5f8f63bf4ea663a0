// Philox 4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel Random Numbers: As
// Easy as 1, 2, 3", SC'11; the Random123 library): a counter-based RNG. One
// call maps a 128-bit counter and a 64-bit key to 128 random bits with ten
// rounds of two 32x32->64 multiplies; there is no state to carry between
// threads, so any element's random bits are computed independently.
//
// ferrotron's convention (docs/semantics.md, "Dropout"): random value number
// j = offset + i of a stream with seed s is word (j % 4) of
// philox4x32_10(counter = {lo32(j/4), hi32(j/4), 0, 0}, key = {lo32(s), hi32(s)}).
// The host twin (src/core/philox.rs) is bit-identical; tests compare them.
#ifndef FTN_PHILOX_CUH
#define FTN_PHILOX_CUH

#include "ftn_kernel.cuh"

#define FTN_PHILOX_M0 0xD2511F53u
#define FTN_PHILOX_M1 0xCD9E8D57u
#define FTN_PHILOX_W0 0x9E3779B9u
#define FTN_PHILOX_W1 0xBB67AE85u

struct FtnPhilox4 {
  uint32_t v[4];
};

// One Philox4x32 round on ctr with key (k0, k1).
FTN_DEVICE void ftn_philox_round(uint32_t (&c)[4], uint32_t k0, uint32_t k1) {
  const uint32_t lo0 = FTN_PHILOX_M0 * c[0];
  const uint32_t hi0 = __umulhi(FTN_PHILOX_M0, c[0]);
  const uint32_t lo1 = FTN_PHILOX_M1 * c[2];
  const uint32_t hi1 = __umulhi(FTN_PHILOX_M1, c[2]);
  const uint32_t n0 = hi1 ^ c[1] ^ k0;
  const uint32_t n2 = hi0 ^ c[3] ^ k1;
  c[0] = n0;
  c[1] = lo1;
  c[2] = n2;
  c[3] = lo0;
}

// philox4x32_10(ctr, key): ten rounds, the key bumped by the Weyl constants
// before every round but the first (Random123's order).
FTN_DEVICE FtnPhilox4 ftn_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                        uint32_t k0, uint32_t k1) {
  uint32_t c[4] = {c0, c1, c2, c3};
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += FTN_PHILOX_W0;
      k1 += FTN_PHILOX_W1;
    }
    ftn_philox_round(c, k0, k1);
  }
  FtnPhilox4 out;
#pragma unroll
  for (int k = 0; k < 4; ++k) out.v[k] = c[k];
  return out;
}

// The four random words of block b (values 4b .. 4b+3) of stream `seed`.
FTN_DEVICE FtnPhilox4 ftn_philox_block(uint64_t seed, uint64_t b) {
  return ftn_philox4x32_10((uint32_t)b, (uint32_t)(b >> 32), 0u, 0u, (uint32_t)seed,
                           (uint32_t)(seed >> 32));
}

// Random value number j of stream `seed`.
FTN_DEVICE uint32_t ftn_philox_value(uint64_t seed, uint64_t j) {
  return ftn_philox_block(seed, j >> 2).v[j & 3];
}

// Dropout multipliers (scale or 0) of the V elements whose random values are
// j0 .. j0+V-1: one Philox block per 4 values, fetched when j crosses a
// block boundary; an element is kept iff its word >= threshold. threshold 0
// keeps everything without calling Philox. Shared by dropout.cu and the
// attention dropout of softmax.cu.
template <int V>
FTN_DEVICE void ftn_dropout_factors(uint64_t seed, uint64_t j0, uint32_t threshold, float scale,
                                    float (&f)[V]) {
  if (threshold == 0u) {
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = scale;
    return;
  }
  FtnPhilox4 blk = ftn_philox_block(seed, j0 >> 2);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const uint64_t j = j0 + (uint64_t)k;
    if (k > 0 && (j & 3u) == 0u) blk = ftn_philox_block(seed, j >> 2);
    f[k] = blk.v[j & 3u] >= threshold ? scale : 0.0f;
  }
}

// The same rule as keep bits: bit k is set iff element k (random value
// j0 + k) is kept. One register instead of V multipliers, for kernels that
// hold many values in registers (softmax.cu). V <= 32.
template <int V>
FTN_DEVICE uint32_t ftn_dropout_keep_bits(uint64_t seed, uint64_t j0, uint32_t threshold) {
  static_assert(V <= 32, "at most 32 keep bits");
  if (threshold == 0u) return 0xffffffffu;
  uint32_t bits = 0u;
  FtnPhilox4 blk = ftn_philox_block(seed, j0 >> 2);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const uint64_t j = j0 + (uint64_t)k;
    if (k > 0 && (j & 3u) == 0u) blk = ftn_philox_block(seed, j >> 2);
    // Word j % 4 by selects: a runtime index into blk.v would put the
    // block in local memory.
    const uint32_t q = (uint32_t)(j & 3u);
    const uint32_t w = q == 0u ? blk.v[0] : q == 1u ? blk.v[1] : q == 2u ? blk.v[2] : blk.v[3];
    bits |= (w >= threshold ? 1u : 0u) << k;
  }
  return bits;
}

// A dropped element is exactly 0 (a select, not a multiply by 0: an inf or
// NaN input of a dropped element does not leak into the output).
FTN_DEVICE float ftn_dropout_apply(float f, float v) { return f != 0.0f ? v * f : 0.0f; }

#endif /* FTN_PHILOX_CUH */
