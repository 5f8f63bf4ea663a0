// Tensor-core building blocks on the CPU: mma.sync m16n8k16 (f16/bf16 in,
// f32 accumulate) and ldmatrix m8n8 .x1/.x2/.x4 (.trans), each one warp
// rendezvous (detail::warp_collective) in which the last lane to arrive
// gathers every lane's registers, computes, and scatters the results.
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
// the 16 products is summed in fp64 (in k order) and rounded once to fp32. Hardware sums
// with its own (unspecified) internal precision, so results can differ from
// the GPU in the last bits of fp32 -- far below the fp16/bf16 tolerances.
#include <cstring>

#include "emu_internal.h"

namespace ftn_emu {
namespace {

// One lane's part of an mma, in its LaneScratch (emu_internal.h).
struct MmaLane {
  uint32_t a[4], b[2];
  float c[4];
  float d[4];
  bool bf16;
};

// The fp32 bit pattern (exact) of the low / high 16-bit element of a packed
// register. bf16 is the top half of an fp32, so these are shifts and masks.
template <bool BF16>
uint32_t lo_bits(uint32_t reg) {
  return BF16 ? reg << 16 : f32_bits(f16_to_f32(uint16_t(reg & 0xFFFFu)));
}
template <bool BF16>
uint32_t hi_bits(uint32_t reg) {
  return BF16 ? reg & 0xFFFF0000u : f32_bits(f16_to_f32(uint16_t(reg >> 16)));
}

// The warp's operands gathered from the lanes' fragments (layout above), as
// fp32 bit patterns (exact for f16/bf16 inputs), and the fp32 result.
struct MmaTile {
  alignas(32) uint32_t a[16][16];  // A[m][k]
  alignas(32) uint32_t b[16][8];   // B[k][n]
  alignas(32) float c[16][8];      // C[m][n]
  alignas(32) float d[16][8];      // D[m][n]
};

// Lane l = 4g + t holds A rows g, g+8 and cols 2t, 2t+1, 2t+8, 2t+9
// (a0: row g, a1: row g+8, a2/a3: the same + 8 cols); B rows (k) 2t, 2t+1
// (b0) and 2t+8, 2t+9 (b1) of col g; C/D rows g (c0, c1), g+8 (c2, c3) of
// cols 2t, 2t+1.
template <bool BF16>
void mma_gather(void *const *data, MmaTile &x) {
  for (int l = 0; l < 32; ++l) {
    const MmaLane &ln = *static_cast<MmaLane *>(data[l]);
    if (ln.bf16 != BF16)
      detail::fail("mma.sync m16n8k16: lanes disagree on the input type (f16 vs bf16)");
    const int g = l >> 2, c0 = 2 * (l & 3);
    for (int r = 0; r < 4; ++r) {  // a0..a3
      uint32_t *row = &x.a[g + ((r & 1) ? 8 : 0)][c0 + ((r & 2) ? 8 : 0)];
      row[0] = lo_bits<BF16>(ln.a[r]);
      row[1] = hi_bits<BF16>(ln.a[r]);
    }
    for (int r = 0; r < 2; ++r) {  // b0, b1
      const int k = c0 + 8 * r;
      x.b[k][g] = lo_bits<BF16>(ln.b[r]);
      x.b[k + 1][g] = hi_bits<BF16>(ln.b[r]);
    }
    x.c[g][c0] = ln.c[0];
    x.c[g][c0 + 1] = ln.c[1];
    x.c[g + 8][c0] = ln.c[2];
    x.c[g + 8][c0 + 1] = ln.c[3];
  }
}

// D = C + A * B: each D[m][n] is C[m][n] + p_0 + ... + p_15 (p_k = A[m][k] *
// B[k][n], exact in fp64) summed in k order in fp64, then rounded once to
// fp32. The 8 columns of a row are two 4-wide vectors; every lane of a vector
// does exactly the scalar sequence, so the AVX2 clone (picked at load time
// when the CPU has it) and the baseline SSE2 one give bit-identical results.
// A fused multiply-add could not change them either: the products are exact.
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

// Four fp32 at p as fp64 into out. A macro, not a function: code inlined
// from a function without the clone's target attribute is lowered for the
// baseline ISA (and returning a 32-byte vector changes the non-AVX ABI).
#define FTN_WIDEN(out, p)                           \
  do {                                              \
    v4f f4_;                                        \
    std::memcpy(&f4_, (p), sizeof f4_);             \
    (out) = __builtin_convertvector(f4_, v4d);      \
  } while (0)

// Four rows at a time: eight independent fp64 add chains hide the adds'
// latency (one chain per row would wait on each add in turn).
__attribute__((target_clones("avx2", "default"))) void mma_compute(MmaTile &x) {
  v4d b[16][2];
  for (int k = 0; k < 16; ++k) {
    FTN_WIDEN(b[k][0], &x.b[k][0]);
    FTN_WIDEN(b[k][1], &x.b[k][4]);
  }
  for (int m0 = 0; m0 < 16; m0 += 4) {
    v4d acc[4][2], a[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      FTN_WIDEN(acc[r][0], &x.c[m0 + r][0]);
      FTN_WIDEN(acc[r][1], &x.c[m0 + r][4]);
    }
    for (int k0 = 0; k0 < 16; k0 += 4) {
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) FTN_WIDEN(a[r], &x.a[m0 + r][k0]);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k)
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          acc[r][0] += a[r][k] * b[k0 + k][0];
          acc[r][1] += a[r][k] * b[k0 + k][1];
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const v4f lo = __builtin_convertvector(acc[r][0], v4f);
      const v4f hi = __builtin_convertvector(acc[r][1], v4f);
      std::memcpy(&x.d[m0 + r][0], &lo, sizeof lo);
      std::memcpy(&x.d[m0 + r][4], &hi, sizeof hi);
    }
  }
}

#undef FTN_WIDEN

void mma_collective(unsigned mask, void *const *data) {
  if (mask != 0xFFFFFFFFu)
    detail::fail(detail::strprintf("mma.sync m16n8k16 needs the full warp, got mask 0x%08x", mask));
  MmaTile x;
  if (static_cast<MmaLane *>(data[0])->bf16)
    mma_gather<true>(data, x);
  else
    mma_gather<false>(data, x);
  mma_compute(x);
  for (int l = 0; l < 32; ++l) {
    MmaLane &ln = *static_cast<MmaLane *>(data[l]);
    const int g = l >> 2, c0 = 2 * (l & 3);
    ln.d[0] = x.d[g][c0];
    ln.d[1] = x.d[g][c0 + 1];
    ln.d[2] = x.d[g + 8][c0];
    ln.d[3] = x.d[g + 8][c0 + 1];
  }
}

// One lane's part of an ldmatrix, in its LaneScratch (emu_internal.h).
struct LdmLane {
  int count;
  bool trans;
  uint32_t r[4];
  const void *row;
};

void ldmatrix_collective(unsigned mask, void *const *data) {
  if (mask != 0xFFFFFFFFu)
    detail::fail(detail::strprintf("ldmatrix needs the full warp, got mask 0x%08x", mask));
  const LdmLane &l0 = *static_cast<LdmLane *>(data[0]);
  const int count = l0.count;
  const bool trans = l0.trans;
  uint16_t M[4][8][8];
  for (int l = 0; l < 32; ++l) {
    const LdmLane &ln = *static_cast<LdmLane *>(data[l]);
    if (ln.count != count || ln.trans != trans)
      detail::fail("ldmatrix: lanes disagree on .num or .trans");
  }
  for (int i = 0; i < count; ++i)
    for (int r = 0; r < 8; ++r) {
      // Checked (aligned, shared) by the lane itself in ldmatrix() below.
      std::memcpy(M[i][r], static_cast<LdmLane *>(data[8 * i + r])->row, 16);
    }
  for (int l = 0; l < 32; ++l) {
    LdmLane &ln = *static_cast<LdmLane *>(data[l]);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < count; ++i) {
      const uint16_t lo = trans ? M[i][2 * t][g] : M[i][g][2 * t];
      const uint16_t hi = trans ? M[i][2 * t + 1][g] : M[i][g][2 * t + 1];
      ln.r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
}

}  // namespace

void mma_m16n8k16(bool bf16, float *d, const uint32_t *a, const uint32_t *b, const float *c,
                  const char *file, unsigned line) {
  MmaLane &me = detail::lane_scratch<MmaLane>();
  std::memcpy(me.a, a, sizeof me.a);
  std::memcpy(me.b, b, sizeof me.b);
  std::memcpy(me.c, c, sizeof me.c);
  me.bf16 = bf16;
  detail::warp_collective(0xFFFFFFFFu, &mma_collective, &me, file, line);
  std::memcpy(d, me.d, sizeof me.d);  // d may alias c
}

void ldmatrix(int count, bool trans, uint32_t *r, const void *row, const char *file,
              unsigned line) {
  const unsigned lane = ftn_emu_tl_thread->linear & 31u;
  if (lane < 8u * unsigned(count)) {  // lanes whose row address is used
    check_aligned(row, 16, "ldmatrix row address", file, line);
    if (!in_shared(row, 16))
      detail::fail(detail::strprintf(
          "ldmatrix at %s:%u: row address %p (lane %u) is not in the block's shared memory "
          "(ldmatrix reads .shared)",
          file, line, row, lane));
  }
  LdmLane &me = detail::lane_scratch<LdmLane>();
  me.count = count;
  me.trans = trans;
  me.row = row;
  detail::warp_collective(0xFFFFFFFFu, &ldmatrix_collective, &me, file, line);
  std::memcpy(r, me.r, sizeof(uint32_t) * size_t(count));
}

}  // namespace ftn_emu
