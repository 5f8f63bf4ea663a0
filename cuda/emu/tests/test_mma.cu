// Self-tests of the tensor-core emulations behind cuda/mma.cuh: ldmatrix
// (.x1/.x2/.x4, plain and .trans) and mma.sync m16n8k16 (f16 and bf16), each
// on known matrices with every lane's fragment checked against the PTX ISA
// layout, written here per register (independently of mma_emu.cpp's
// per-element formulas); cp.async zero-fill; misaligned ldmatrix fails loudly.
#include <cmath>
#include <cstring>
#include <vector>

#include "../../mma.cuh"
#include "selftest.h"

namespace {
struct LdmParams {
  int count, trans;
  uint32_t *out;  // [32 lanes][4]
  int batch;      // inside ftn_mma_batch_begin/end
};
struct MmaParams {
  int bf16;
  const float *a;  // [16][16]
  const float *b;  // [16][8]  (k, n)
  const float *c;  // [16][8]
  float *out;      // [32 lanes][4]
  int batch;       // 1: inside a batch; 2: also chain D = A*B + D twice more
};
// A 3x2 warp tile of mma ops: ftn_mma_tile_m16n8k16 against the same
// products issued one by one (checked against the PTX layouts above).
struct MmaTileParams {
  int bf16;
  int mode;  // 0: no batch; 1: batch; 2: batch, tile twice (the second reads
             // in-flight accumulators); 3: batch, one accumulator in flight
             // before the tile (a mix: recorded op by op)
  float *tile_out;  // [32 lanes][3][2][4]
  float *ref_out;   // the same, from single mma ops
};
struct CpParams {
  const uint16_t *src;
  int bytes;
  uint16_t *out;  // [8]
};

uint16_t ldm_value(int mat, int row, int col) { return uint16_t(1000 + mat * 64 + row * 8 + col); }

// `mats` 8x8 matrices of ldm_value in shared memory, rows padded to 24
// elements (48 bytes), written by the warp's 32 lanes, then a __syncwarp.
__device__ void fill_ldm_tile(uint16_t *tile, int mats, unsigned lane) {
  for (unsigned i = lane; i < unsigned(mats) * 64; i += 32) {
    const int mat = int(i / 64), row = int(i / 8 % 8), col = int(i % 8);
    tile[(mat * 8 + row) * 24 + col] = ldm_value(mat, row, col);
  }
  __syncwarp();
}
}  // namespace

FTN_KERNEL(st_ldmatrix, LdmParams, p) {
  FTN_SHARED(uint16_t, tile, [4 * 8 * 24]);  // 4 matrices, rows padded to 48 bytes
  const unsigned lane = threadIdx.x;
  fill_ldm_tile(tile, 4, lane);
  const void *row = &tile[((lane >> 3) * 8 + (lane & 7)) * 24];
  uint32_t r[4] = {0, 0, 0, 0};
  if (p.batch) ftn_mma_batch_begin();
  if (p.count == 4) p.trans ? ftn_ldmatrix_x4_trans(r, row) : ftn_ldmatrix_x4(r, row);
  if (p.count == 2) p.trans ? ftn_ldmatrix_x2_trans(r, row) : ftn_ldmatrix_x2(r, row);
  if (p.count == 1) p.trans ? ftn_ldmatrix_x1_trans(r, row) : ftn_ldmatrix_x1(r, row);
  if (p.batch) ftn_mma_batch_end();
  for (int i = 0; i < 4; ++i) p.out[lane * 4 + i] = r[i];
}

// ftn_ldmatrix_x4_seq<2> against two ldmatrix.x4 calls (checked against the
// PTX layout above), in and out of a batch, plain and .trans.
FTN_KERNEL(st_ldmatrix_seq, LdmParams, p) {
  FTN_SHARED(uint16_t, tile, [8 * 8 * 24]);  // 8 matrices, rows padded to 48 bytes
  const unsigned lane = threadIdx.x;
  fill_ldm_tile(tile, 8, lane);
  const uint16_t *row = &tile[((lane >> 3) * 8 + (lane & 7)) * 24];
  uint32_t seq[8], one[8];
  if (p.batch) ftn_mma_batch_begin();
  if (p.trans) {
    ftn_ldmatrix_x4_seq<2, true>(seq, row, 4 * 8 * 24);
    ftn_ldmatrix_x4_trans(one, row);
    ftn_ldmatrix_x4_trans(one + 4, row + 4 * 8 * 24);
  } else {
    ftn_ldmatrix_x4_seq<2, false>(seq, row, 4 * 8 * 24);
    ftn_ldmatrix_x4(one, row);
    ftn_ldmatrix_x4(one + 4, row + 4 * 8 * 24);
  }
  if (p.batch) ftn_mma_batch_end();
  for (int i = 0; i < 8; ++i) p.out[lane * 8 + i] = seq[i] == one[i] ? seq[i] : 0xBAD0BAD0u;
}

FTN_KERNEL(st_ldmatrix_misaligned, LdmParams, p) {
  FTN_SHARED(uint16_t, tile, [8 * 16]);
  const unsigned lane = threadIdx.x;
  uint32_t r[4];
  ftn_ldmatrix_x1(r, &tile[(lane & 7) * 16 + 1]);  // 2-byte offset: illegal
  p.out[lane] = r[0];
}

FTN_KERNEL(st_mma, MmaParams, p) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  // Registers of the fragments (PTX ISA): A reg j holds row g + 8*(j%2),
  // columns 2t + 8*(j/2) (low half) and +1 (high half); B reg j holds
  // rows 2t + 8*j and +1 of column g; C/D element i is row g + 8*(i/2),
  // column 2t + i%2.
  auto pack = [&](float lo, float hi) -> uint32_t {
    uint16_t l, h;
    if (p.bf16) {
      l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
      h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
    } else {
      l = __half_as_ushort(__float2half_rn(lo));
      h = __half_as_ushort(__float2half_rn(hi));
    }
    return uint32_t(l) | uint32_t(h) << 16;
  };
  uint32_t a[4], b[2];
  for (int j = 0; j < 4; ++j) {
    const int row = g + 8 * (j % 2), col = 2 * t + 8 * (j / 2);
    a[j] = pack(p.a[row * 16 + col], p.a[row * 16 + col + 1]);
  }
  for (int j = 0; j < 2; ++j) {
    const int k = 2 * t + 8 * j;
    b[j] = pack(p.b[k * 8 + g], p.b[(k + 1) * 8 + g]);
  }
  float c[4];
  for (int i = 0; i < 4; ++i) c[i] = p.c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  float d[4];
  if (p.batch) ftn_mma_batch_begin();
  if (p.bf16) {
    ftn_mma_m16n8k16<__nv_bfloat16>(d, a, b, c);
  } else {
    ftn_mma_m16n8k16<__half>(d, a, b, c);
  }
  // d aliasing c (accumulate in place) gives the same result.
  if (p.bf16) {
    ftn_mma_m16n8k16<__nv_bfloat16>(c, a, b, c);
  } else {
    ftn_mma_m16n8k16<__half>(c, a, b, c);
  }
  if (p.batch == 2) {  // c = C + AB is still in flight: the chain reads it at the flush
    for (int rep = 0; rep < 2; ++rep) {
      if (p.bf16)
        ftn_mma_m16n8k16<__nv_bfloat16>(c, a, b, c);
      else
        ftn_mma_m16n8k16<__half>(c, a, b, c);
    }
    ftn_mma_batch_end();
    for (int i = 0; i < 4; ++i) p.out[lane * 4 + i] = c[i];  // C + 3AB
    return;
  }
  if (p.batch) ftn_mma_batch_end();
  for (int i = 0; i < 4; ++i) p.out[lane * 4 + i] = d[i] == c[i] ? d[i] : NAN;
}

template <typename T>
__device__ void mma_tile_case(const MmaTileParams &p) {
  const unsigned lane = threadIdx.x;
  constexpr int MI = 3, NI = 2;
  uint32_t a[MI][4], b[NI][2];
  float acc[MI][NI][4], ref[MI][NI][4];
  auto word = [&](unsigned salt) {  // two finite inputs in [-2, 2) per word
    uint32_t w = 0;
    for (int h = 0; h < 2; ++h) {
      const float v = float(((lane * 131u + salt * 7919u + unsigned(h) * 31u) * 2654435761u) >> 26) /
                          16.0f - 2.0f;
      const uint16_t bits = p.bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v))
                                   : __half_as_ushort(__float2half_rn(v));
      w |= uint32_t(bits) << (16 * h);
    }
    return w;
  };
  for (int i = 0; i < MI; ++i)
    for (int r = 0; r < 4; ++r) a[i][r] = word(unsigned(i * 4 + r));
  for (int j = 0; j < NI; ++j)
    for (int r = 0; r < 2; ++r) b[j][r] = word(unsigned(100 + j * 2 + r));
  for (int i = 0; i < MI; ++i)
    for (int j = 0; j < NI; ++j)
      for (int e = 0; e < 4; ++e)
        acc[i][j][e] = ref[i][j][e] = float(int(lane) - 16 + i * 8 + j * 4 + e) / 8.0f;
  const int reps = p.mode == 2 ? 2 : 1;
  if (p.mode != 0) ftn_mma_batch_begin();
  if (p.mode == 3) {  // acc[1][0] in flight, the others not
    ftn_mma_m16n8k16<T>(acc[1][0], a[1], b[0], acc[1][0]);
    ftn_mma_m16n8k16<T>(ref[1][0], a[1], b[0], ref[1][0]);
  }
  for (int rep = 0; rep < reps; ++rep) {
    ftn_mma_tile_m16n8k16<T>(acc, a, b);
    for (int i = 0; i < MI; ++i)
      for (int j = 0; j < NI; ++j) ftn_mma_m16n8k16<T>(ref[i][j], a[i], b[j], ref[i][j]);
  }
  if (p.mode != 0) ftn_mma_batch_end();
  for (int i = 0; i < MI; ++i)
    for (int j = 0; j < NI; ++j)
      for (int e = 0; e < 4; ++e) {
        p.tile_out[((lane * MI + i) * NI + j) * 4 + e] = acc[i][j][e];
        p.ref_out[((lane * MI + i) * NI + j) * 4 + e] = ref[i][j][e];
      }
}

FTN_KERNEL(st_mma_tile, MmaTileParams, p) {
  if (p.bf16)
    mma_tile_case<__nv_bfloat16>(p);
  else
    mma_tile_case<__half>(p);
}

FTN_KERNEL(st_cp_async, CpParams, p) {
  FTN_SHARED(uint16_t, buf, [8]);
  for (int i = 0; i < 8; ++i) buf[i] = 0xFFFF;
  ftn_cp_async_16(buf, p.src, p.bytes);
  ftn_cp_async_commit();
  ftn_cp_async_wait<0>();
  for (int i = 0; i < 8; ++i) p.out[i] = buf[i];
}

void test_ldmatrix() {
  for (int count : {1, 2, 4})
    for (int trans : {0, 1}) {
     for (int batch : {0, 1}) {
      std::vector<uint32_t> out(128, 0xDEADBEEFu);
      LdmParams p{count, trans, out.data(), batch};
      LAUNCH_OK(st_ldmatrix, p, dim3(1), dim3(32), 0, 1);
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < count; ++i) {
          const int g = lane / 4, t = lane % 4;
          // Plain: row g, columns 2t, 2t+1. Trans: column g, rows 2t, 2t+1.
          const uint16_t lo = trans ? ldm_value(i, 2 * t, g) : ldm_value(i, g, 2 * t);
          const uint16_t hi = trans ? ldm_value(i, 2 * t + 1, g) : ldm_value(i, g, 2 * t + 1);
          const uint32_t want = uint32_t(lo) | uint32_t(hi) << 16;
          CHECK(out[lane * 4 + i] == want,
                "x%d trans=%d batch=%d lane %d reg %d: got 0x%08x want 0x%08x", count, trans,
                batch, lane, i, out[lane * 4 + i], want);
        }
     }
    }
}

void test_ldmatrix_misaligned() {
  std::vector<uint32_t> out(128);
  LdmParams p{1, 0, out.data(), 0};
  LAUNCH_FAILS(st_ldmatrix_misaligned, p, dim3(1), dim3(32), 0, "not 16-byte aligned");
}

void test_mma_m16n8k16() {
  for (int bf16 : {0, 1})
   for (int batch : {0, 1, 2}) {
    // Small integers: exact in f16 and bf16, and every sum exact in f32, so
    // the expected D is exact whatever the order of summation.
    std::vector<float> a(256), b(128), c(128), out(128, -1.0f);
    for (int m = 0; m < 16; ++m)
      for (int k = 0; k < 16; ++k) a[m * 16 + k] = float((m * 3 + k * 5 + bf16) % 11 - 5);
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < 8; ++n) b[k * 8 + n] = float((k * 7 + n * 2) % 13 - 6);
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) c[m * 8 + n] = float(m * 8 - n * 3) * 0.5f;
    MmaParams p{bf16, a.data(), b.data(), c.data(), out.data(), batch};
    LAUNCH_OK(st_mma, p, dim3(1), dim3(64), 0, 1);  // two warps
    const int reps = batch == 2 ? 3 : 1;  // D = C + reps * A*B (exact: small integers)
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const int m = lane / 4 + 8 * (i / 2), n = 2 * (lane % 4) + i % 2;
        double want = c[m * 8 + n];
        for (int r = 0; r < reps; ++r)
          for (int k = 0; k < 16; ++k) want += double(a[m * 16 + k]) * b[k * 8 + n];
        CHECK(out[lane * 4 + i] == float(want),
              "bf16=%d batch=%d lane %d d%d (row %d col %d): got %g want %g", bf16, batch, lane,
              i, m, n, double(out[lane * 4 + i]), want);
      }
   }
}

// Misuse of an mma batch: reading a result before a flush point sees the
// NaN poison (variant 1); leaving the kernel inside a batch (2) and lanes
// issuing different tensor-core ops (3) fail the launch.
FTN_KERNEL(st_mma_batch_misuse, MmaParams, p) {
  const unsigned lane = threadIdx.x % 32;
  FTN_SHARED(uint16_t, tile, [8 * 8]);
  for (unsigned i = lane; i < 64; i += 32) tile[i] = uint16_t(i);
  __syncwarp();
  uint32_t r[4] = {0, 0, 0, 0};
  ftn_mma_batch_begin();
  ftn_ldmatrix_x1(r, &tile[(lane & 7) * 8]);
  if (p.batch == 1) {
    p.out[lane] = __uint_as_float(r[0]);  // read in flight: poison
    ftn_mma_batch_end();
    return;
  }
  if (p.batch == 2) return;  // no ftn_mma_batch_end
  if (lane < 16) ftn_ldmatrix_x1(r, &tile[(lane & 7) * 8]);  // half the warp
  __syncthreads();
  ftn_mma_batch_end();
}

void test_mma_batch_misuse() {
  std::vector<float> out(32, 0.0f);
  MmaParams p{1, nullptr, nullptr, nullptr, out.data(), 1};
  LAUNCH_OK(st_mma_batch_misuse, p, dim3(1), dim3(32), 0, 1);
  for (int l = 0; l < 32; ++l)
    CHECK(std::isnan(out[l]), "lane %d read an in-flight ldmatrix result as %g, not NaN", l,
          double(out[l]));
  p.batch = 2;
  LAUNCH_FAILS(st_mma_batch_misuse, p, dim3(1), dim3(32), 0, "exited inside an mma batch");
  p.batch = 3;
  LAUNCH_FAILS(st_mma_batch_misuse, p, dim3(1), dim3(32), 0, "the warp diverged");
}

void test_ldmatrix_seq() {
  for (int trans : {0, 1})
    for (int batch : {0, 1}) {
      std::vector<uint32_t> out(32 * 8, 0xDEADBEEFu);
      LdmParams p{4, trans, out.data(), batch};
      LAUNCH_OK(st_ldmatrix_seq, p, dim3(1), dim3(32), 0, 1);
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 8; ++i) {
          const int g = lane / 4, t = lane % 4, m = i;  // register i: matrix i
          const uint16_t lo = trans ? ldm_value(m, 2 * t, g) : ldm_value(m, g, 2 * t);
          const uint16_t hi = trans ? ldm_value(m, 2 * t + 1, g) : ldm_value(m, g, 2 * t + 1);
          const uint32_t want = uint32_t(lo) | uint32_t(hi) << 16;
          CHECK(out[lane * 8 + i] == want, "trans %d batch %d lane %d reg %d: 0x%08x want 0x%08x",
                trans, batch, lane, i, out[lane * 8 + i], want);
        }
    }
}

void test_mma_tile() {
  for (int bf16 : {0, 1})
    for (int mode : {0, 1, 2, 3}) {
      std::vector<float> tile(32 * 24, -1.0f), ref(32 * 24, -2.0f);
      MmaTileParams p{bf16, mode, tile.data(), ref.data()};
      LAUNCH_OK(st_mma_tile, p, dim3(1), dim3(32), 0, 1);
      for (size_t i = 0; i < tile.size(); ++i)
        CHECK(std::memcmp(&tile[i], &ref[i], 4) == 0 && !std::isnan(tile[i]),
              "bf16 %d mode %d: element %zu (lane %zu) is %.9g from the tile, %.9g one by one",
              bf16, mode, i, i / 24, double(tile[i]), double(ref[i]));
    }
}

void test_cp_async_zero_fill() {
  alignas(16) uint16_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int bytes : {0, 2, 6, 16}) {
    uint16_t out[8];
    CpParams p{src, bytes, out};
    LAUNCH_OK(st_cp_async, p, dim3(1), dim3(1), 0, 1);
    for (int i = 0; i < 8; ++i)
      CHECK(out[i] == (2 * i < bytes ? src[i] : 0), "bytes %d elem %d: %u", bytes, i, out[i]);
  }
}
