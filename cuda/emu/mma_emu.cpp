// Tensor-core building blocks on the CPU: mma.sync m16n8k16 (f16/bf16 in,
// f32 accumulate) and ldmatrix m8n8 .x1/.x2/.x4 (.trans), each one warp
// rendezvous (detail::warp_collective) in which the last lane to arrive
// computes for the whole warp. Each lane first puts its operands in its
// warp's scratch area (emu_internal.h, WarpScratch) -- for mma straight into
// the 16x16 / 16x8 operand tiles, for ldmatrix into its own lane slot -- and
// after the rendezvous reads its results from there.
//
// Fragment layouts, from the PTX ISA ("Matrix Fragments for mma.m16n8k16
// with floating point type" and "Warp-level matrix load instruction:
// ldmatrix"), with groupID g = laneid >> 2, threadID_in_group t = laneid % 4:
//   A (16x16, .row), a0..a7 packed two per .b32 register (a0 in the low half):
//     row = g      for a0,a1,a4,a5;  g + 8 for a2,a3,a6,a7
//     col = 2t + (i & 1) for a0..a3;  2t + (i & 1) + 8 for a4..a7
//   B (16x8, .col), b0..b3 in two registers:
//     row (k) = 2t + (i & 1) for b0,b1;  2t + (i & 1) + 8 for b2,b3;  col = g
//   C, D (16x8, f32), c0..c3:
//     row = g for c0,c1;  g + 8 for c2,c3;   col = 2t + (i & 1)
//   ldmatrix: lanes 8i..8i+7 give the row addresses (16 bytes each, 16-byte
//     aligned, in shared memory: each such lane checks its own) of matrix
//     i; register i of lane l holds row g, cols 2t, 2t+1 of matrix i
//     (.trans: rows 2t, 2t+1 of col g, i.e. of the transpose).
//
// Arithmetic: products of fp16/bf16 values are exact in fp64; D = C + sum of
// the 16 products is summed in fp64 (in k order) and rounded once to fp32
// (vectorised over n, AVX2 when the CPU has it: bit-identical either way, and
// the same as the scalar loop this replaced). Hardware sums
// with its own (unspecified) internal precision, so results can differ from
// the GPU in the last bits of fp32 -- far below the fp16/bf16 tolerances.
#include <cstring>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "emu_internal.h"

namespace ftn_emu {
namespace {

using TileA = double[16][16];  // A[m][k]
using TileF = float[16][8];    // B[k][n], C and D [m][n]

// The warp's mma operands in the warp scratch (exact for f16/bf16 inputs):
// each lane writes its fragment elements to their places. A is stored as
// fp64, ready to broadcast.
struct MmaTile {
  alignas(32) TileA a;
  alignas(32) TileF b;
  alignas(32) TileF c;
  alignas(32) TileF d;  // written by the completing lane
  unsigned char bf16[32];       // per lane: its input type (all must agree)
};
// The warp scratch holds the MmaTile at 0 and the ldmatrix lanes after it.
constexpr size_t kLdmOffset = 4096;
static_assert(sizeof(MmaTile) <= kLdmOffset);

// The low / high 16-bit element of a packed register as fp32 (exact). bf16
// is the top half of an fp32, so for it these are a shift and a mask.
template <bool BF16>
float lo_f32(uint32_t reg) {
  return BF16 ? bits_f32(reg << 16) : f16_to_f32(uint16_t(reg & 0xFFFFu));
}
template <bool BF16>
float hi_f32(uint32_t reg) {
  return BF16 ? bits_f32(reg & 0xFFFF0000u) : f16_to_f32(uint16_t(reg >> 16));
}

// Lane l = 4g + t holds A rows g (a0, a2) and g+8 (a1, a3), cols 2t, 2t+1
// (a0, a1) and 2t+8, 2t+9 (a2, a3); B rows (k) 2t, 2t+1 (b0) and 2t+8, 2t+9
// (b1) of col g; C/D rows g (c0, c1) and g+8 (c2, c3) of cols 2t, 2t+1.
template <bool BF16>
void mma_put_a(TileA &x, unsigned lane, const uint32_t *a) {
  const unsigned g = lane >> 2, c0 = 2 * (lane & 3);
  for (unsigned r = 0; r < 4; ++r) {
    double *row = &x[g + ((r & 1) ? 8 : 0)][c0 + ((r & 2) ? 8 : 0)];
    row[0] = lo_f32<BF16>(a[r]);
    row[1] = hi_f32<BF16>(a[r]);
  }
}
template <bool BF16>
void mma_put_b(TileF &x, unsigned lane, const uint32_t *b) {
  const unsigned g = lane >> 2, c0 = 2 * (lane & 3);
  for (unsigned r = 0; r < 2; ++r) {
    x[c0 + 8 * r][g] = lo_f32<BF16>(b[r]);
    x[c0 + 8 * r + 1][g] = hi_f32<BF16>(b[r]);
  }
}
// (c0, c1) and (c2, c3) are adjacent in D's rows: two 8-byte moves.
void mma_put_c(TileF &x, unsigned lane, const float *c) {
  const unsigned g = lane >> 2, c0 = 2 * (lane & 3);
  std::memcpy(&x[g][c0], c, 8);
  std::memcpy(&x[g + 8][c0], c + 2, 8);
}
template <bool BF16>
void mma_put(MmaTile &x, unsigned lane, const uint32_t *a, const uint32_t *b, const float *c) {
  mma_put_a<BF16>(x.a, lane, a);
  mma_put_b<BF16>(x.b, lane, b);
  mma_put_c(x.c, lane, c);
  x.bf16[lane] = BF16;
}

void mma_take(const TileF &x, unsigned lane, float *d) {
  const unsigned g = lane >> 2, c0 = 2 * (lane & 3);
  std::memcpy(d, &x[g][c0], 8);
  std::memcpy(d + 2, &x[g + 8][c0], 8);
}

// The 32 lanes' accumulator (c) and destination (dst) pointers of a
// recorded mma op or tile.
void lane_cd(const detail::LaneOp *const *ops, const float **c, float **d) {
  for (unsigned l = 0; l < 32; ++l) {
    c[l] = static_cast<const float *>(ops[l]->c);
    d[l] = static_cast<float *>(ops[l]->dst);
  }
}

// mma_put_c / mma_take for the whole warp at once: c[l] + off is lane l's
// (c0, c1, c2, c3). Rows g and g + 8 of C are the low and the high halves
// of lanes 4g .. 4g+3's four values, so four 16-byte loads and four
// shuffles make the two rows (and the same backwards for D), instead of
// eight 8-byte moves with their address arithmetic.
void mma_put_c_warp(TileF &x, const float *const *c, unsigned off) {
#if defined(__x86_64__)
  for (unsigned g = 0; g < 8; ++g) {
    const __m128 q0 = _mm_loadu_ps(c[4 * g] + off), q1 = _mm_loadu_ps(c[4 * g + 1] + off);
    const __m128 q2 = _mm_loadu_ps(c[4 * g + 2] + off), q3 = _mm_loadu_ps(c[4 * g + 3] + off);
    _mm_storeu_ps(&x[g][0], _mm_movelh_ps(q0, q1));
    _mm_storeu_ps(&x[g][4], _mm_movelh_ps(q2, q3));
    _mm_storeu_ps(&x[g + 8][0], _mm_movehl_ps(q1, q0));
    _mm_storeu_ps(&x[g + 8][4], _mm_movehl_ps(q3, q2));
  }
#else
  for (unsigned l = 0; l < 32; ++l) mma_put_c(x, l, c[l] + off);
#endif
}
void mma_take_warp(const TileF &x, float *const *d, unsigned off) {
#if defined(__x86_64__)
  for (unsigned g = 0; g < 8; ++g) {
    const __m128 r0 = _mm_loadu_ps(&x[g][0]), r1 = _mm_loadu_ps(&x[g][4]);
    const __m128 s0 = _mm_loadu_ps(&x[g + 8][0]), s1 = _mm_loadu_ps(&x[g + 8][4]);
    _mm_storeu_ps(d[4 * g] + off, _mm_movelh_ps(r0, s0));
    _mm_storeu_ps(d[4 * g + 1] + off, _mm_movehl_ps(s0, r0));
    _mm_storeu_ps(d[4 * g + 2] + off, _mm_movelh_ps(r1, s1));
    _mm_storeu_ps(d[4 * g + 3] + off, _mm_movehl_ps(s1, r1));
  }
#else
  for (unsigned l = 0; l < 32; ++l) mma_take(x, l, d[l] + off);
#endif
}

// D = C + A * B: each D[m][n] is C[m][n] + p_0 + ... + p_15 (p_k = A[m][k] *
// B[k][n], exact in fp64) summed in k order in fp64, then rounded once to
// fp32. Every variant below does exactly this sequence per element (vector
// lanes are elements), so they give bit-identical results; a fused
// multiply-add could not change them either, as the products are exact.
[[maybe_unused]] void mma_compute_portable(const TileA &a, const TileF &b, const TileF &c,
                                           TileF &d) {
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double s = c[m][n];
      for (int k = 0; k < 16; ++k) s += a[m][k] * double(b[k][n]);
      d[m][n] = float(s);
    }
}

#if defined(__x86_64__)
// Two 4-wide fp64 vectors per row of D, four rows at a time (eight
// independent chains hide the latency); fused multiply-adds, exact here.
__attribute__((target("avx2,fma"))) void mma_compute_avx2(const TileA &a, const TileF &bt,
                                                          const TileF &c, TileF &d) {
  __m256d b[16][2];
  for (int k = 0; k < 16; ++k) {
    b[k][0] = _mm256_cvtps_pd(_mm_load_ps(&bt[k][0]));
    b[k][1] = _mm256_cvtps_pd(_mm_load_ps(&bt[k][4]));
  }
  for (int m0 = 0; m0 < 16; m0 += 4) {
    __m256d acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      acc[r][0] = _mm256_cvtps_pd(_mm_load_ps(&c[m0 + r][0]));
      acc[r][1] = _mm256_cvtps_pd(_mm_load_ps(&c[m0 + r][4]));
    }
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k)
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const __m256d av = _mm256_broadcast_sd(&a[m0 + r][k]);
        acc[r][0] = _mm256_fmadd_pd(av, b[k][0], acc[r][0]);
        acc[r][1] = _mm256_fmadd_pd(av, b[k][1], acc[r][1]);
      }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      _mm_store_ps(&d[m0 + r][0], _mm256_cvtpd_ps(acc[r][0]));
      _mm_store_ps(&d[m0 + r][4], _mm256_cvtpd_ps(acc[r][1]));
    }
  }
}

// Baseline x86-64 (SSE2): 2-wide fp64 vectors, one row at a time.
void mma_compute_sse2(const TileA &a, const TileF &b, const TileF &c, TileF &d) {
  for (int m = 0; m < 16; ++m) {
    __m128d acc[4];
    for (int q = 0; q < 4; ++q) acc[q] = _mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64(
                                    reinterpret_cast<const __m128i *>(&c[m][2 * q]))));
    for (int k = 0; k < 16; ++k) {
      const __m128d av = _mm_set1_pd(a[m][k]);
      for (int q = 0; q < 4; ++q) {
        const __m128d bk = _mm_cvtps_pd(_mm_castsi128_ps(
            _mm_loadl_epi64(reinterpret_cast<const __m128i *>(&b[k][2 * q]))));
        acc[q] = _mm_add_pd(acc[q], _mm_mul_pd(av, bk));
      }
    }
    for (int q = 0; q < 4; ++q) {
      const __m128 f = _mm_cvtpd_ps(acc[q]);
      _mm_storel_pi(reinterpret_cast<__m64 *>(&d[m][2 * q]), f);
    }
  }
}
#endif

void mma_compute(const TileA &a, const TileF &b, const TileF &c, TileF &d) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2)
    mma_compute_avx2(a, b, c, d);
  else
    mma_compute_sse2(a, b, c, d);
#else
  mma_compute_portable(a, b, c, d);
#endif
}
void mma_compute(MmaTile &x) { mma_compute(x.a, x.b, x.c, x.d); }

void mma_collective(unsigned mask, void *const *data) {
  if (mask != 0xFFFFFFFFu)
    detail::fail(detail::strprintf("mma.sync m16n8k16 needs the full warp, got mask 0x%08x", mask));
  MmaTile &x = *static_cast<MmaTile *>(data[0]);  // every lane passes the tile
  for (int l = 1; l < 32; ++l)
    if (x.bf16[l] != x.bf16[0])
      detail::fail("mma.sync m16n8k16: lanes disagree on the input type (f16 vs bf16)");
  mma_compute(x);
}

// One lane's part of an ldmatrix, in the warp scratch at kLdmOffset.
struct LdmLane {
  int count;
  bool trans;
  uint32_t r[4];
  const void *row;
};
static_assert(kLdmOffset + 32 * sizeof(LdmLane) <= detail::kWarpScratchBytes);

}  // namespace

namespace {
constexpr uint32_t kPoisonWord = 0xFFFFFFFFu;  // a NaN as fp32, two NaNs as bf16/f16

// All bits set in `words` (2 or 4) 32-bit words at p?
template <unsigned words>
[[gnu::always_inline]] inline bool all_poison(const void *p) {
  static_assert(words == 2 || words == 4);
  uint64_t x[words / 2];
  std::memcpy(x, p, sizeof x);
  return words == 2 ? x[0] == ~0ull : (x[0] & x[words / 2 - 1]) == ~0ull;
}

#if defined(__x86_64__)
// ldmatrix_warp for .x4 with SSE2: each 8x8 matrix of 16-bit elements
// transposed (.trans) by three rounds of unpacks, then the 4 x 32 words
// (lane l's register i is word l of matrix i) handed out as 4x4 word
// transposes, a 16-byte store per lane. Pure bit moves: the same registers
// as the scalar path (self-tests `ldmatrix_seq`, `mma_tile`).
void ldmatrix_warp_x4(bool trans, const unsigned char *const *rows, void *const *dst) {
  alignas(16) __m128i M[4][8];
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 8; ++r)
      M[i][r] = _mm_loadu_si128(reinterpret_cast<const __m128i *>(rows[8 * i + r]));
  if (trans) {
    for (int i = 0; i < 4; ++i) {
      __m128i *a = M[i];
      const __m128i t0 = _mm_unpacklo_epi16(a[0], a[1]), t1 = _mm_unpackhi_epi16(a[0], a[1]);
      const __m128i t2 = _mm_unpacklo_epi16(a[2], a[3]), t3 = _mm_unpackhi_epi16(a[2], a[3]);
      const __m128i t4 = _mm_unpacklo_epi16(a[4], a[5]), t5 = _mm_unpackhi_epi16(a[4], a[5]);
      const __m128i t6 = _mm_unpacklo_epi16(a[6], a[7]), t7 = _mm_unpackhi_epi16(a[6], a[7]);
      const __m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2);
      const __m128i u2 = _mm_unpacklo_epi32(t1, t3), u3 = _mm_unpackhi_epi32(t1, t3);
      const __m128i u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6);
      const __m128i u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
      a[0] = _mm_unpacklo_epi64(u0, u4);
      a[1] = _mm_unpackhi_epi64(u0, u4);
      a[2] = _mm_unpacklo_epi64(u1, u5);
      a[3] = _mm_unpackhi_epi64(u1, u5);
      a[4] = _mm_unpacklo_epi64(u2, u6);
      a[5] = _mm_unpackhi_epi64(u2, u6);
      a[6] = _mm_unpacklo_epi64(u3, u7);
      a[7] = _mm_unpackhi_epi64(u3, u7);
    }
  }
  // Word l of matrix i is M[i][l / 4], 32-bit element l % 4.
  for (int g = 0; g < 8; ++g) {
    const __m128i w0 = M[0][g], w1 = M[1][g], w2 = M[2][g], w3 = M[3][g];
    const __m128i p0 = _mm_unpacklo_epi32(w0, w1), p1 = _mm_unpackhi_epi32(w0, w1);
    const __m128i p2 = _mm_unpacklo_epi32(w2, w3), p3 = _mm_unpackhi_epi32(w2, w3);
    _mm_storeu_si128(static_cast<__m128i *>(dst[4 * g]), _mm_unpacklo_epi64(p0, p2));
    _mm_storeu_si128(static_cast<__m128i *>(dst[4 * g + 1]), _mm_unpackhi_epi64(p0, p2));
    _mm_storeu_si128(static_cast<__m128i *>(dst[4 * g + 2]), _mm_unpacklo_epi64(p1, p3));
    _mm_storeu_si128(static_cast<__m128i *>(dst[4 * g + 3]), _mm_unpackhi_epi64(p1, p3));
  }
}
#endif

// An ldmatrix for the whole warp: M[i][r] = lane (8i + r)'s 16-byte row
// (eight 16-bit elements), transposed first for .trans; then lane l = 4g + t
// takes elements 2t, 2t+1 of row g of each matrix as one register (the PTX
// fragment layout; for .trans that is rows 2t, 2t+1 of column g).
void ldmatrix_warp(int count, bool trans, const unsigned char *const *rows, void *const *dst) {
#if defined(__x86_64__)
  if (count == 4) return ldmatrix_warp_x4(trans, rows, dst);
#endif
  alignas(16) uint16_t M[4][8][8];
  for (int i = 0; i < count; ++i)
    for (int r = 0; r < 8; ++r) std::memcpy(M[i][r], rows[8 * i + r], 16);
  if (trans)
    for (int i = 0; i < count; ++i)
      for (int r = 0; r < 8; ++r)
        for (int c = r + 1; c < 8; ++c) std::swap(M[i][r][c], M[i][c][r]);
  for (unsigned l = 0; l < 32; ++l) {
    uint32_t *r = static_cast<uint32_t *>(dst[l]);
    for (int i = 0; i < count; ++i) std::memcpy(&r[i], &M[i][l >> 2][2 * (l & 3)], 4);
  }
}

// The warp collective of an ldmatrix outside a batch: every lane's row in,
// its registers out, through ldmatrix_warp as at a batch's flush.
void ldmatrix_collective(unsigned mask, void *const *data) {
  if (mask != 0xFFFFFFFFu)
    detail::fail(detail::strprintf("ldmatrix needs the full warp, got mask 0x%08x", mask));
  const LdmLane &l0 = *static_cast<LdmLane *>(data[0]);
  const unsigned char *rows[32];
  void *dst[32];
  for (int l = 0; l < 32; ++l) {
    LdmLane &ln = *static_cast<LdmLane *>(data[l]);
    if (ln.count != l0.count || ln.trans != l0.trans)
      detail::fail("ldmatrix: lanes disagree on .num or .trans");
    // Checked (aligned, shared) by the lane itself in ldmatrix() below.
    rows[l] = static_cast<const unsigned char *>(ln.row);
    dst[l] = ln.r;
  }
  ldmatrix_warp(l0.count, l0.trans, rows, dst);
}

// Lane `lane`'s next op slot in its warp's batch; the op's kind and
// parameters go to the warp's list, or are checked against it.
[[gnu::noinline, gnu::cold]] void batch_alloc(detail::Warp &wp) {  // uninitialised
  using detail::kBatchCap;
  wp.batch_ops.reset(new detail::LaneOp[32 * kBatchCap]);
  wp.batch_cap.reset(new uint32_t[32 * kBatchCap * detail::kBatchCapWords]);
  wp.batch_desc.reset(new detail::BatchOp[kBatchCap]);
}

// (Inlined: mma.sync and ldmatrix inside a batch are little more than this.)
[[gnu::always_inline]] inline detail::LaneOp &record(detail::Warp &wp, unsigned lane,
                                                     uint8_t kind, uint8_t param, uint8_t trans,
                                                     const char *file, unsigned line) {
  if (__builtin_expect(!wp.batch_ops, 0)) batch_alloc(wp);
  const unsigned i = wp.batch_n[lane]++;
  if (i == wp.batch_nd) {
    wp.batch_desc[i] = detail::BatchOp{kind, param, trans, uint8_t(lane), line, file};
    ++wp.batch_nd;
  } else {
    const detail::BatchOp &d = wp.batch_desc[i];
    if (__builtin_expect(d.kind != kind || d.param != param || d.trans != trans, 0) &&
        !wp.batch_bad) {
      wp.batch_bad = true;
      wp.bad_index = i;
      wp.bad_op = detail::BatchOp{kind, param, trans, uint8_t(lane), line, file};
    }
  }
  ++wp.batch_pending;
  return wp.batch_ops[i * 32 + lane];
}

void flush_collective(unsigned mask, void *const *);

// Reserves `words` of the lane's capture area for its next op (the op's
// worst case, so every lane of the warp takes the same decisions); when they
// would not fit, the warp's batch is flushed first.
[[gnu::always_inline]] inline void reserve_words(detail::Warp &wp, unsigned lane, unsigned words,
                                                 const char *file, unsigned line) {
  if (__builtin_expect(wp.batch_rw[lane] + words > detail::kBatchCapTotal, 0))
    detail::warp_collective(0xFFFFFFFFu, &flush_collective, nullptr, file, line);
  wp.batch_rw[lane] = uint16_t(wp.batch_rw[lane] + words);
}

[[gnu::always_inline]] inline uint32_t *cap_slot(detail::Warp &wp, unsigned lane,
                                                 unsigned words) {
  uint32_t *cap = wp.batch_cap.get() + size_t(lane) * detail::kBatchCap * detail::kBatchCapWords +
                  wp.batch_w[lane];
  wp.batch_w[lane] = uint16_t(wp.batch_w[lane] + words);
  return cap;
}

// Where a recorded op reads `words` 32-bit operand words at the flush: p
// itself while it holds a result still in flight (all bits set, almost
// surely), else a copy of it taken now in the lane's capture area.
template <unsigned words>
[[gnu::always_inline]] inline const void *capture(detail::Warp &wp, unsigned lane, const void *p) {
  if (all_poison<words>(p)) return p;
  uint32_t *cap = cap_slot(wp, lane, words);
  std::memcpy(cap, p, 4 * words);
  return cap;
}

void flush_collective(unsigned mask, void *const *) {
  if (mask != 0xFFFFFFFFu)
    detail::fail(detail::strprintf("mma batch flush needs the full warp, got mask 0x%08x", mask));
  // complete() has already flushed the warp (it does before any full-warp op).
}

// A lane whose batch is full: flush now, with the whole warp.
void flush_if_full(detail::Warp &wp, unsigned lane, const char *file, unsigned line) {
  if (wp.batch_n[lane] >= detail::kBatchCap)
    detail::warp_collective(0xFFFFFFFFu, &flush_collective, nullptr, file, line);
}

detail::Warp &my_warp(unsigned &lane) {
  detail::Worker &w = *detail::tl_worker;
  lane = w.cur->pub.linear & 31u;
  return w.warps[w.cur->pub.linear >> 5];
}
}  // namespace

void mma_m16n8k16(bool bf16, float *d, const uint32_t *a, const uint32_t *b, const float *c,
                  const char *file, unsigned line) {
  detail::Worker &w = *detail::tl_worker;
  const unsigned lane = w.cur->pub.linear & 31u;
  if (w.cur->in_mma_batch) {
    detail::Warp &wp = w.warps[w.cur->pub.linear >> 5];
    reserve_words(wp, lane, 10, file, line);
    detail::LaneOp &o = record(wp, lane, detail::kOpMma, bf16, 0, file, line);
    o.a = capture<4>(wp, lane, a);
    o.b = capture<2>(wp, lane, b);
    o.c = capture<4>(wp, lane, c);
    o.dst = d;
    std::memset(d, 0xFF, 4 * sizeof(float));
    flush_if_full(wp, lane, file, line);
    return;
  }
  MmaTile &x = *reinterpret_cast<MmaTile *>(detail::warp_scratch());
  if (bf16)
    mma_put<true>(x, lane, a, b, c);
  else
    mma_put<false>(x, lane, a, b, c);
  detail::warp_collective(0xFFFFFFFFu, &mma_collective, &x, file, line);
  mma_take(x.d, lane, d);  // d may alias c: read only now
}

namespace {
[[gnu::noinline, gnu::cold]] void ldmatrix_not_shared(const void *row, unsigned lane, unsigned i,
                                                      unsigned n, const char *file,
                                                      unsigned line) {
  const std::string which = n == 1 ? detail::strprintf("lane %u", lane)
                                   : detail::strprintf("lane %u, load %u of %u", lane, i, n);
  detail::fail(detail::strprintf("ldmatrix at %s:%u: row address %p (%s) is not in the block's "
                                 "shared memory (ldmatrix reads .shared)",
                                 file, line, row, which.c_str()));
}

// One lane's row address of an ldmatrix (load i of n): 16-byte aligned and
// 16 bytes inside the block's shared memory; the read goes to the race check
// with `ret`, the kernel's return address.
[[gnu::always_inline]] inline void check_ldmatrix_row(detail::Worker &w, const void *row,
                                                      unsigned lane, unsigned i, unsigned n,
                                                      const char *file, unsigned line,
                                                      void *ret) {
  check_aligned(row, 16, "ldmatrix row address", file, line);
  if (!detail::shared_contains(w, row, 16)) ldmatrix_not_shared(row, lane, i, n, file, line);
  if (w.racecheck) detail::race_access(w, row, 16, false, ret);
}

// How many of `chunks` chunks of `words` 32-bit words at p read as in flight.
template <unsigned words>
unsigned poison_chunks(const uint32_t *p, unsigned chunks) {
  unsigned n = 0;
  for (unsigned i = 0; i < chunks; ++i) n += all_poison<words>(p + i * words);
  return n;
}
}  // namespace

void mma_tile_m16n8k16(bool bf16, unsigned mi, unsigned ni, float *acc, const uint32_t *a,
                       const uint32_t *b, const char *file, unsigned line) {
  if (mi < 1 || mi > 8 || ni < 1 || ni > 8)
    detail::fail(detail::strprintf("mma tile at %s:%u: %ux%u mma tiles, expected 1..8 each",
                                   file, line, mi, ni));
  detail::Worker &w = *detail::tl_worker;
  auto one_by_one = [&] {
    for (unsigned i = 0; i < mi; ++i)
      for (unsigned j = 0; j < ni; ++j) {
        float *d = acc + 4 * (i * ni + j);
        mma_m16n8k16(bf16, d, a + 4 * i, b + 2 * j, d, file, line);
      }
  };
  if (!w.cur->in_mma_batch) return one_by_one();
  const unsigned lane = w.cur->pub.linear & 31u;
  detail::Warp &wp = w.warps[w.cur->pub.linear >> 5];
  // One op reads each operand array through one pointer: all of it in
  // flight (read at the flush), or none (captured now). A mix -- some
  // fragments produced in this batch, some not -- is recorded op by op.
  const unsigned pa = poison_chunks<4>(a, mi), pb = poison_chunks<2>(b, ni);
  const unsigned pc = poison_chunks<4>(reinterpret_cast<const uint32_t *>(acc), mi * ni);
  if ((pa != 0 && pa != mi) || (pb != 0 && pb != ni) || (pc != 0 && pc != mi * ni))
    return one_by_one();
  reserve_words(wp, lane, 4 * mi + 2 * ni + 4 * mi * ni, file, line);
  detail::LaneOp &o = record(wp, lane, detail::kOpMmaTile, uint8_t(mi << 4 | ni), bf16, file,
                             line);
  auto take = [&](const void *p, unsigned words, bool in_flight) -> const void * {
    if (in_flight) return p;
    uint32_t *cap = cap_slot(wp, lane, words);
    std::memcpy(cap, p, 4 * words);
    return cap;
  };
  o.a = take(a, 4 * mi, pa != 0);
  o.b = take(b, 2 * ni, pb != 0);
  o.c = take(acc, 4 * mi * ni, pc != 0);
  o.dst = acc;
  std::memset(acc, 0xFF, 4 * sizeof(float) * mi * ni);
  flush_if_full(wp, lane, file, line);
}

void ldmatrix(int count, bool trans, uint32_t *r, const void *row, const char *file,
              unsigned line) {
  const unsigned lane = ftn_emu_tl_thread->linear & 31u;
  const bool used = lane < 8u * unsigned(count);  // lanes whose row address is used
  if (used) {
    check_ldmatrix_row(*detail::tl_worker, row, lane, 0, 1, file, line,
                       __builtin_return_address(0));
  }
  detail::Worker &w = *detail::tl_worker;
  if (w.cur->in_mma_batch) {
    detail::Warp &wp = w.warps[w.cur->pub.linear >> 5];
    reserve_words(wp, lane, 4, file, line);
    detail::LaneOp &o =
        record(wp, lane, detail::kOpLdmatrix, uint8_t(count), trans, file, line);
    o.a = nullptr;
    if (used) {  // the data as it is now
      uint32_t *cap = cap_slot(wp, lane, 4);
      std::memcpy(cap, row, 16);
      o.a = cap;
    }
    o.dst = r;
    std::memset(r, 0xFF, sizeof(uint32_t) * size_t(count));
    flush_if_full(wp, lane, file, line);
    return;
  }
  LdmLane &me = reinterpret_cast<LdmLane *>(detail::warp_scratch() + kLdmOffset)[lane];
  me.count = count;
  me.trans = trans;
  me.row = row;
  detail::warp_collective(0xFFFFFFFFu, &ldmatrix_collective, &me, file, line);
  std::memcpy(r, me.r, sizeof(uint32_t) * size_t(count));
}

void ldmatrix_x4_seq(unsigned n, bool trans, uint32_t *r, const void *row0, ptrdiff_t step_bytes,
                     const char *file, unsigned line) {
  if (n < 1 || n > 8)
    detail::fail(detail::strprintf("ldmatrix sequence at %s:%u: %u loads, expected 1..8", file,
                                   line, n));
  const unsigned char *row = static_cast<const unsigned char *>(row0);
  detail::Worker &w = *detail::tl_worker;
  if (!w.cur->in_mma_batch) {
    for (unsigned i = 0; i < n; ++i) ldmatrix(4, trans, r + 4 * i, row + i * step_bytes, file, line);
    return;
  }
  const unsigned lane = w.cur->pub.linear & 31u;
  for (unsigned i = 0; i < n; ++i) {  // every lane's rows are used by .x4
    const unsigned char *ri = row + i * step_bytes;
    check_ldmatrix_row(w, ri, lane, i, n, file, line, __builtin_return_address(0));
  }
  detail::Warp &wp = w.warps[w.cur->pub.linear >> 5];
  reserve_words(wp, lane, 4 * n, file, line);
  detail::LaneOp &o = record(wp, lane, detail::kOpLdmatrixSeq, uint8_t(n), trans, file, line);
  uint32_t *cap = cap_slot(wp, lane, 4 * n);  // the rows as they are now
  for (unsigned i = 0; i < n; ++i) std::memcpy(cap + 4 * i, row + i * step_bytes, 16);
  o.a = cap;
  o.dst = r;
  std::memset(r, 0xFF, 16 * size_t(n));
  flush_if_full(wp, lane, file, line);
}

void mma_batch_begin(const char *file, unsigned line) {
  detail::Thread &t = *detail::tl_worker->cur;
  if (t.in_mma_batch)
    detail::fail(detail::strprintf("ftn_mma_batch_begin at %s:%u inside a batch (batches do "
                                   "not nest)",
                                   file, line));
  t.in_mma_batch = true;
}

void mma_batch_end(const char *file, unsigned line) {
  detail::Thread &t = *detail::tl_worker->cur;
  if (!t.in_mma_batch)
    detail::fail(detail::strprintf("ftn_mma_batch_end at %s:%u without ftn_mma_batch_begin",
                                   file, line));
  t.in_mma_batch = false;
  unsigned lane;
  detail::Warp &wp = my_warp(lane);
  // Lanes record the same ops, so they agree on whether a flush is needed.
  if (wp.batch_n[lane] != 0)
    detail::warp_collective(0xFFFFFFFFu, &flush_collective, nullptr, file, line);
}

namespace {
// The converted operand tiles of a flush, reused by value: a GEMM's warp
// multiplies each A fragment by several B fragments and each B by several
// A (4 x 4 in cuda/gemm.cu), so most mma ops of a batch find their A and B
// already converted. A tile is reused only when all 32 lanes' raw register
// words are equal to those it was built from, so the result is the same as
// converting afresh, bit for bit.
struct MmaOperandCache {
  static constexpr int kB = 8;  // B tiles kept (round robin)
  bool a_valid = false, a_bf16 = false;
  uint32_t a_raw[32][4];
  int nb = 0, b_next = 0;
  bool b_bf16[kB];
  uint32_t b_raw[kB][32][2];
  alignas(32) float b_tile[kB][16][8];

  template <bool BF16>
  void run(MmaTile &x, const detail::LaneOp *const *ops) {
    uint32_t ra[32][4], rb[32][2];
    for (unsigned l = 0; l < 32; ++l) {
      std::memcpy(ra[l], ops[l]->a, sizeof ra[l]);
      std::memcpy(rb[l], ops[l]->b, sizeof rb[l]);
    }
    if (!a_valid || a_bf16 != BF16 || std::memcmp(ra, a_raw, sizeof ra) != 0) {
      for (unsigned l = 0; l < 32; ++l) mma_put_a<BF16>(x.a, l, ra[l]);
      std::memcpy(a_raw, ra, sizeof ra);
      a_valid = true;
      a_bf16 = BF16;
    }
    int j = 0;
    while (j < nb && (b_bf16[j] != BF16 || std::memcmp(rb, b_raw[j], sizeof rb) != 0)) ++j;
    if (j == nb) {
      if (nb < kB) {
        ++nb;
      } else {
        j = b_next;
        b_next = (b_next + 1) % kB;
      }
      for (unsigned l = 0; l < 32; ++l) mma_put_b<BF16>(b_tile[j], l, rb[l]);
      std::memcpy(b_raw[j], rb, sizeof rb);
      b_bf16[j] = BF16;
    }
    const float *c[32];
    float *d[32];
    lane_cd(ops, c, d);
    mma_put_c_warp(x.c, c, 0);
    mma_compute(x.a, b_tile[j], x.c, x.d);
    mma_take_warp(x.d, d, 0);
  }
};

// A recorded warp tile (kOpMmaTile): each A and B fragment converted once,
// then the mi * ni products in the order the lanes' loop would issue them.
template <bool BF16>
void run_mma_tile(unsigned mi, unsigned ni, const detail::LaneOp *const *ops) {
  struct Scratch {
    alignas(32) TileA a[8];
    alignas(32) TileF b[8];
    alignas(32) TileF c, d;
  };
  static thread_local Scratch tl_scratch;  // 20 KiB: not on a fiber's stack
  // Its address taken once, and hidden from g++ (the empty asm): position-
  // independent code reaches a thread_local through a (linker-relaxed)
  // __tls_get_addr call, and g++ re-derived the address that way, with
  // spills of the live registers around the call, inside every per-lane
  // loop below.
  Scratch *sp = &tl_scratch;
  asm("" : "+r"(sp));
  Scratch &s = *sp;
  for (unsigned i = 0; i < mi; ++i)
    for (unsigned l = 0; l < 32; ++l)
      mma_put_a<BF16>(s.a[i], l, static_cast<const uint32_t *>(ops[l]->a) + 4 * i);
  for (unsigned j = 0; j < ni; ++j)
    for (unsigned l = 0; l < 32; ++l)
      mma_put_b<BF16>(s.b[j], l, static_cast<const uint32_t *>(ops[l]->b) + 2 * j);
  const float *c[32];
  float *d[32];
  lane_cd(ops, c, d);
  for (unsigned i = 0; i < mi; ++i)
    for (unsigned j = 0; j < ni; ++j) {
      const unsigned off = 4 * (i * ni + j);
      mma_put_c_warp(s.c, c, off);
      mma_compute(s.a[i], s.b[j], s.c, s.d);
      mma_take_warp(s.d, d, off);
    }
}


const char *op_name(const detail::BatchOp &o) {
  switch (o.kind) {
    case detail::kOpMma: return "mma.sync";
    case detail::kOpMmaTile: return "an mma tile";
    case detail::kOpLdmatrixSeq: return "an ldmatrix sequence";
    default: return "ldmatrix";
  }
}
}  // namespace

namespace detail {
void mma_batch_flush(Worker &w, unsigned wi) {
  Warp &wp = w.warps[wi];
  if (!wp.batch_pending) return;
  const size_t n = wp.batch_n[0];
  auto op = [&](unsigned l, size_t i) -> const LaneOp & { return wp.batch_ops[i * 32 + l]; };
  for (unsigned l = 1; l < 32; ++l)
    if (wp.batch_n[l] != n)
      fail(strprintf("mma batch of warp %u: lane 0 recorded %zu tensor-core ops but lane %u "
                     "%zu before this synchronisation point (the warp diverged around "
                     "mma.sync/ldmatrix, which need the whole warp)",
                     wi, n, l, size_t(wp.batch_n[l])));
  MmaTile &x = *reinterpret_cast<MmaTile *>(wp.scratch);
  MmaOperandCache cache;
  if (wp.batch_bad) {
    const BatchOp &d = wp.batch_desc[wp.bad_index], &o = wp.bad_op;
    fail(strprintf("mma batch of warp %u: op %u is %s at %s:%u on lane %u but %s at %s:%u on "
                   "lane %u (lanes must issue the same tensor-core ops)",
                   wi, unsigned(wp.bad_index), op_name(d), d.file, d.line, unsigned(d.lane),
                   op_name(o), o.file, o.line, unsigned(o.lane)));
  }
  for (size_t i = 0; i < n; ++i) {
    const BatchOp &o0 = wp.batch_desc[i];
    if (o0.kind == kOpMma) {
      const LaneOp *lane_ops[32];
      for (unsigned l = 0; l < 32; ++l) lane_ops[l] = &op(l, i);
      if (o0.param)
        cache.run<true>(x, lane_ops);
      else
        cache.run<false>(x, lane_ops);
    } else if (o0.kind == kOpMmaTile) {
      const LaneOp *lane_ops[32];
      for (unsigned l = 0; l < 32; ++l) lane_ops[l] = &op(l, i);
      if (o0.trans)
        run_mma_tile<true>(o0.param >> 4, o0.param & 15u, lane_ops);
      else
        run_mma_tile<false>(o0.param >> 4, o0.param & 15u, lane_ops);
    } else if (o0.kind == kOpLdmatrixSeq) {
      const unsigned char *rows[32];
      void *dst[32];
      for (unsigned k = 0; k < o0.param; ++k) {
        for (int l = 0; l < 32; ++l) {
          rows[l] = static_cast<const unsigned char *>(op(l, i).a) + 16 * k;
          dst[l] = static_cast<uint32_t *>(op(l, i).dst) + 4 * k;
        }
        ldmatrix_warp(4, o0.trans != 0, rows, dst);
      }
    } else {
      const unsigned char *rows[32];
      void *dst[32];
      for (int l = 0; l < 32; ++l) {
        rows[l] = static_cast<const unsigned char *>(op(l, i).a);
        dst[l] = op(l, i).dst;
      }
      ldmatrix_warp(o0.param, o0.trans != 0, rows, dst);
    }
  }
  batch_reset(wp);
}

void mma_batch_exit_check(Worker &w, Thread &t) {
  if (t.in_mma_batch || w.warps[t.pub.linear >> 5].batch_n[t.pub.linear & 31u] != 0)
    fail("exited inside an mma batch (ftn_mma_batch_begin without ftn_mma_batch_end): its "
         "mma.sync/ldmatrix results were never delivered");
}
}  // namespace detail

}  // namespace ftn_emu
