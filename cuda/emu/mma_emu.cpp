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
// the 16 products is summed in fp64 and rounded once to fp32. Hardware sums
// with its own (unspecified) internal precision, so results can differ from
// the GPU in the last bits of fp32 -- far below the fp16/bf16 tolerances.
#include <cstring>

#include "emu_internal.h"

namespace ftn_emu {
namespace {

struct MmaLane {
  bool bf16;
  float *d;
  const uint32_t *a, *b;
  const float *c;
};

double elem(bool bf16, uint32_t reg, int half) {
  const uint16_t bits = uint16_t(half ? reg >> 16 : reg & 0xFFFFu);
  return bf16 ? double(bf16_to_f32(bits)) : double(f16_to_f32(bits));
}

void mma_collective(unsigned mask, void *const *data) {
  if (mask != 0xFFFFFFFFu)
    detail::fail(detail::strprintf("mma.sync m16n8k16 needs the full warp, got mask 0x%08x", mask));
  const bool bf16 = static_cast<MmaLane *>(data[0])->bf16;
  double A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const MmaLane &ln = *static_cast<MmaLane *>(data[l]);
    if (ln.bf16 != bf16)
      detail::fail("mma.sync m16n8k16: lanes disagree on the input type (f16 vs bf16)");
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 8; ++i) {
      const int row = g + ((i & 2) ? 8 : 0), col = 2 * t + (i & 1) + ((i & 4) ? 8 : 0);
      A[row][col] = elem(bf16, ln.a[i >> 1], i & 1);
    }
    for (int i = 0; i < 4; ++i) {
      const int k = 2 * t + (i & 1) + ((i & 2) ? 8 : 0);
      B[k][g] = elem(bf16, ln.b[i >> 1], i & 1);
    }
    for (int i = 0; i < 4; ++i) C[g + ((i & 2) ? 8 : 0)][2 * t + (i & 1)] = double(ln.c[i]);
  }
  float D[16][8];
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double s = C[m][n];
      for (int k = 0; k < 16; ++k) s += A[m][k] * B[k][n];
      D[m][n] = float(s);
    }
  for (int l = 0; l < 32; ++l) {
    const MmaLane &ln = *static_cast<MmaLane *>(data[l]);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) ln.d[i] = D[g + ((i & 2) ? 8 : 0)][2 * t + (i & 1)];
  }
}

struct LdmLane {
  int count;
  bool trans;
  uint32_t *r;
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
    const LdmLane &ln = *static_cast<LdmLane *>(data[l]);
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
  float out[4];
  MmaLane me{bf16, out, a, b, c};
  detail::warp_collective(0xFFFFFFFFu, &mma_collective, &me, file, line);
  std::memcpy(d, out, sizeof out);  // d may alias c
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
  uint32_t out[4];
  LdmLane me{count, trans, out, row};
  detail::warp_collective(0xFFFFFFFFu, &ldmatrix_collective, &me, file, line);
  std::memcpy(r, out, sizeof(uint32_t) * size_t(count));
}

}  // namespace ftn_emu
