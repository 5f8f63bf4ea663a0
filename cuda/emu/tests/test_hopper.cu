// Self-tests of the emulator's Hopper asynchronous instructions
// (cuda/sm90.cuh, cuda/emu/hopper.cpp). Fidelity: the expected layouts here
// are derived independently of hopper.cpp, from CUTLASS CuTe's SM90 GMMA
// definitions -- the canonical smem atoms Layout_{K,MN}_{INTER,SW32,SW64,
// SW128}_Atom tiled MN-first over the operand, the Swizzle<B,4,3> functor
// (addr ^ ((addr & yyy_mask) >> S)), the descriptor fields of
// GmmaDescriptor, and the accumulator CLayout_64xN ((4,8,4),(2,2,N/8)) :
// ((128,1,16),(64,8,512)) -- and every lane, register and byte is compared;
// products are checked against an f64 oracle. The planted bugs below must
// fail with the right message.
#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "../../sm90.cuh"
#include "selftest.h"

using ftn_emu_test::Failure;
using ftn_emu_test::StrictOn;

namespace {
// ------------------------------------------- the CuTe-side derivation
// Swizzle<B, M=4, S=3> on a byte address.
uint32_t cute_swizzle(uint32_t addr, int b) {
  const uint32_t yyy = ((1u << b) - 1u) << (4 + 3);
  return addr ^ ((addr & yyy) >> 3);
}
int swizzle_bits(int span) { return span == 128 ? 3 : span == 64 ? 2 : span == 32 ? 1 : 0; }

// Byte offset (before swizzling) of element (i, k) of an MN x 16 operand
// tile of 16-bit elements built from CuTe's canonical atom for (major,
// span) -- 8 rows x W bytes for K-major (W = 16 for INTER), W/2 MN-elements
// x 8 k-rows for MN-major -- tiled MN-first (atoms along MN, then K).
uint32_t tile_offset(bool mn_major, int span, int mn, int i, int k) {
  const int w = span ? span : 16, atom = 8 * w;
  if (!mn_major) {
    const int ke = w / 2;  // k elements per atom row
    const int idx = i / 8 + (mn / 8) * (k / ke);
    return uint32_t(idx * atom + (i % 8) * w + (k % ke) * 2);
  }
  const int e = w / 2;
  const int idx = i / e + (mn / e) * (k / 8);
  return uint32_t(idx * atom + (k % 8) * w + (i % e) * 2);
}
// The descriptor's (LBO, SBO) for that tile, per CuTe's make_gmma_desc
// table: K-major INTER ((8,m),(T,2)):((1T,SBO),(1,LBO)); K-major SWx
// ((8,m),(T,2)):((xT,SBO),(1,T)) (LBO unused); MN-major INTER
// ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)); MN-major SWx
// ((T,x,m),(8,k)):((1,T,LBO),(xT,SBO)).
std::pair<uint32_t, uint32_t> tile_lbo_sbo(bool mn_major, int span, int mn) {
  const int w = span ? span : 16, atom = 8 * w;
  if (!mn_major) return span ? std::pair<uint32_t, uint32_t>(16, atom)
                             : std::pair<uint32_t, uint32_t>((mn / 8) * atom, atom);
  if (!span) return {uint32_t((mn / 8) * atom), uint32_t(atom)};
  return {uint32_t(atom), uint32_t((mn / (w / 2)) * atom)};
}
uint32_t desc_mode(int span) {
  return span == 128 ? FTN_WGMMA_SWIZZLE_128B : span == 64 ? FTN_WGMMA_SWIZZLE_64B
         : span == 32 ? FTN_WGMMA_SWIZZLE_32B : FTN_WGMMA_SWIZZLE_NONE;
}
// CLayout_64xN: (thread, value) -> (m, n).
std::pair<int, int> cute_acc(int t, int v) {
  const int idx = 128 * (t % 4) + (t / 4) % 8 + 16 * (t / 32) + 64 * (v % 2) + 8 * ((v / 2) % 2) +
                  512 * (v / 4);
  return {idx % 64, idx / 64};
}

struct Operand {
  bool mn_major;
  int span;
};

// The bytes of a 64x16 A and an N x 16 B (B[n][k], i.e. column n of the
// K x N matrix) placed in a shared-memory image, with their descriptors'
// fields. A sits at 0, B at b_off (both 1024-aligned).
struct Image {
  std::vector<uint16_t> bytes;  // 16-bit units
  uint32_t a_lbo, a_sbo, b_lbo, b_sbo, b_off;
};
Image place(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b, int n, Operand oa,
            Operand ob) {
  Image im;
  // Footprints: a K-major swizzled atom holds 8 rows of the span, of which
  // the 16 k-elements use 32 bytes.
  uint32_t a_end = 0, b_end = 0;
  for (int k = 0; k < 16; ++k) {
    for (int m = 0; m < 64; ++m) a_end = std::max(a_end, tile_offset(oa.mn_major, oa.span, 64, m, k) + 2);
    for (int j = 0; j < n; ++j) b_end = std::max(b_end, tile_offset(ob.mn_major, ob.span, n, j, k) + 2);
  }
  im.b_off = (a_end + 1023) / 1024 * 1024;
  const uint32_t total = im.b_off + (b_end + 1023) / 1024 * 1024;
  im.bytes.assign(total / 2, 0xFFFF);
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < 16; ++k)
      im.bytes[cute_swizzle(tile_offset(oa.mn_major, oa.span, 64, m, k), swizzle_bits(oa.span)) /
               2] = a[m * 16 + k];
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < 16; ++k)
      im.bytes[(im.b_off + cute_swizzle(tile_offset(ob.mn_major, ob.span, n, j, k),
                                        swizzle_bits(ob.span))) /
               2] = b[j * 16 + k];
  std::tie(im.a_lbo, im.a_sbo) = tile_lbo_sbo(oa.mn_major, oa.span, 64);
  std::tie(im.b_lbo, im.b_sbo) = tile_lbo_sbo(ob.mn_major, ob.span, n);
  return im;
}

struct WgParams {
  const uint16_t *image;  // shared-memory image to copy in
  uint32_t image_units;
  uint32_t a_lbo, a_sbo, b_lbo, b_sbo, b_off, a_mode, b_mode;
  int n, bf16, ta, tb, neg_a, twice, planted;
  float *out;  // [128][n/2]
  float init;  // accumulator's value before the first wgmma
};

template <int N, typename T, int TA, int TB, int SA>
void wg_body(const WgParams &p, uint16_t *smem) {
  for (uint32_t i = threadIdx.x; i < p.image_units; i += blockDim.x) smem[i] = p.image[i];
  __syncthreads();
  const uint64_t da = ftn_wgmma_desc(smem, p.a_lbo, p.a_sbo, p.a_mode);
  const uint64_t db = ftn_wgmma_desc(reinterpret_cast<char *>(smem) + p.b_off, p.b_lbo, p.b_sbo,
                                     p.b_mode);
  FtnWgmmaAcc<N> acc;
  for (int i = 0; i < N / 2; ++i) acc[i] = p.init;
  if (p.planted != 2) ftn_wgmma_fence();                   // PLANTED(2): no fence
  uint64_t bad_a = da;
  if (p.planted == 3) bad_a = ftn_wgmma_desc_from_addr(0x30000, p.a_lbo, p.a_sbo, p.a_mode);
  ftn_wgmma<N, T, TA, TB, SA>(acc, bad_a, db, false);      // PLANTED(3): A outside smem
  if (p.twice) ftn_wgmma<N, T, TA, TB, SA>(acc, da, db, true);  // chained, in flight
  ftn_wgmma_commit();
  if (p.planted == 1) p.out[threadIdx.x] = acc[0];         // PLANTED(1): read before the wait
  if (p.planted == 4 && threadIdx.x == 5) smem[1] ^= 1;    // PLANTED(4): operand written in flight
  ftn_wgmma_wait<0>();
  for (int i = 0; i < N / 2; ++i) p.out[threadIdx.x * (N / 2) + i] = acc[i];
}

template <int N>
void wg_dispatch(const WgParams &p, uint16_t *smem) {
  const int sel = (p.bf16 ? 8 : 0) + p.ta * 4 + p.tb * 2 + p.neg_a;
  switch (sel) {
#define C(s, T, TA, TB, SA) \
  case s: wg_body<N, T, TA, TB, SA>(p, smem); return;
    C(0, __half, 0, 0, 1) C(1, __half, 0, 0, -1) C(2, __half, 0, 1, 1) C(3, __half, 0, 1, -1)
    C(4, __half, 1, 0, 1) C(5, __half, 1, 0, -1) C(6, __half, 1, 1, 1) C(7, __half, 1, 1, -1)
    C(8, __nv_bfloat16, 0, 0, 1) C(9, __nv_bfloat16, 0, 0, -1) C(10, __nv_bfloat16, 0, 1, 1)
    C(11, __nv_bfloat16, 0, 1, -1) C(12, __nv_bfloat16, 1, 0, 1) C(13, __nv_bfloat16, 1, 0, -1)
    C(14, __nv_bfloat16, 1, 1, 1) C(15, __nv_bfloat16, 1, 1, -1)
#undef C
  }
}

template <int... Is>
void wg_by_n(const WgParams &p, uint16_t *smem, std::integer_sequence<int, Is...>) {
  ((p.n == 8 * (Is + 1) ? wg_dispatch<8 * (Is + 1)>(p, smem) : void()), ...);
}
}  // namespace

FTN_KERNEL(st_wgmma, WgParams, p) {
  FTN_DYNAMIC_SHARED(uint16_t, smem);
  wg_by_n(p, smem, std::make_integer_sequence<int, 32>{});
}

namespace {
uint16_t enc(float x, bool bf16) {
  return bf16 ? ftn_emu_f32_to_bf16_bits(x) : ftn_emu_f32_to_f16_bits(x);
}
float dec(uint16_t h, bool bf16) {
  return bf16 ? ftn_emu_bf16_bits_to_f32(h) : ftn_emu_f16_bits_to_f32(h);
}

// Runs one wgmma configuration; returns out[128][n/2].
std::vector<float> run_wg(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b, int n,
                          bool bf16, Operand oa, Operand ob, int neg_a, int twice, float init,
                          int planted = 0, std::string *err = nullptr) {
  const Image im = place(a, b, n, oa, ob);
  std::vector<float> out(size_t(128) * n / 2, NAN);
  WgParams p{im.bytes.data(), uint32_t(im.bytes.size()), im.a_lbo, im.a_sbo, im.b_lbo, im.b_sbo,
             im.b_off, desc_mode(oa.span), desc_mode(ob.span), n, bf16, oa.mn_major,
             ob.mn_major, neg_a, twice, planted, out.data(), init};
  const size_t dyn = im.bytes.size() * 2;
  if (err) {
    ftn_emu_test::launch("st_wgmma", FTN_ENTRY(st_wgmma), &p, dim3(1), dim3(128), dyn, 1, err);
  } else {
    LAUNCH_OK(st_wgmma, p, dim3(1), dim3(128), dyn, 1);
  }
  return out;
}
}  // namespace

// Every register of every thread holds D[m][n] = m + 64 n at the (m, n)
// CuTe's CLayout_64xN gives it, for every N in 8..256: A[m][0] = m,
// A[m][1] = 1, B[n][0] = 1, B[n][1] = 64 n, the rest 0 (exact in fp16).
void test_wgmma_accumulator_layout() {
  for (int n = 8; n <= 256; n += 8) {
    std::vector<uint16_t> a(64 * 16, enc(0, false)), b(size_t(n) * 16, enc(0, false));
    for (int m = 0; m < 64; ++m) {
      a[m * 16 + 0] = enc(float(m), false);
      a[m * 16 + 1] = enc(1, false);
    }
    for (int j = 0; j < n; ++j) {
      b[j * 16 + 0] = enc(1, false);
      b[j * 16 + 1] = enc(float(64 * j), false);
    }
    const std::vector<float> out = run_wg(a, b, n, false, {false, 0}, {false, 0}, 0, 0, 0);
    for (int t = 0; t < 128; ++t)
      for (int v = 0; v < n / 2; ++v) {
        const auto [m, col] = cute_acc(t, v);
        const float got = out[size_t(t) * n / 2 + v];
        CHECK(got == float(m + 64 * col), "N=%d thread %d register %d: %g, want D[%d][%d] = %d",
              n, t, v, double(got), m, col, m + 64 * col);
      }
  }
}

// Operand layouts: every (A major, B major, swizzle) combination, f16 and
// bf16, small-integer operands (exact), against the f64 product; scale-d
// (the initial accumulator ignored, then a chained second wgmma adds the
// product again) and imm-scale-a = -1.
void test_wgmma_operand_layouts() {
  std::mt19937 rng(19);
  std::uniform_int_distribution<int> small(-8, 8);
  const int spans[] = {0, 32, 64, 128};
  for (int bf = 0; bf < 2; ++bf)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int sa : spans)
          for (int sb : spans) {
            const int n = tb && sb ? 128 : 64;  // an MN-major swizzle atom is span/2 wide
            std::vector<uint16_t> a(64 * 16), b(size_t(n) * 16);
            std::vector<double> fa(64 * 16), fb(size_t(n) * 16);
            for (size_t i = 0; i < a.size(); ++i) fa[i] = dec(a[i] = enc(float(small(rng)), bf), bf);
            for (size_t i = 0; i < b.size(); ++i) fb[i] = dec(b[i] = enc(float(small(rng)), bf), bf);
            const int neg = (sa + sb) % 64 == 0 ? 1 : 0, twice = ta ^ tb;
            const std::vector<float> out =
                run_wg(a, b, n, bf, {bool(ta), sa}, {bool(tb), sb}, neg, twice, 1000.0f);
            for (int t = 0; t < 128; ++t)
              for (int v = 0; v < n / 2; ++v) {
                const auto [m, col] = cute_acc(t, v);
                double want = 0;
                for (int k = 0; k < 16; ++k) want += fa[m * 16 + k] * fb[col * 16 + k];
                want *= (neg ? -1 : 1) * (twice ? 2 : 1);
                const float got = out[size_t(t) * n / 2 + v];
                CHECK(double(got) == want,
                      "%s A %s-major sw%d, B %s-major sw%d, N=%d: thread %d reg %d (D[%d][%d]) = "
                      "%g, want %g",
                      bf ? "bf16" : "f16", ta ? "MN" : "K", sa, tb ? "MN" : "K", sb, n, t, v, m,
                      col, double(got), want);
              }
          }
}

// Random bf16/f16 operands in [-1, 1]: the fp32 result within 2^-22
// relative of the f64 oracle (the emulator sums in fp64 and rounds once).
void test_wgmma_f64_oracle() {
  std::mt19937 rng(1919);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int bf = 0; bf < 2; ++bf)
    for (int n : {8, 72, 256}) {
      std::vector<uint16_t> a(64 * 16), b(size_t(n) * 16);
      std::vector<double> fa(a.size()), fb(b.size());
      for (size_t i = 0; i < a.size(); ++i) fa[i] = dec(a[i] = enc(u(rng), bf), bf);
      for (size_t i = 0; i < b.size(); ++i) fb[i] = dec(b[i] = enc(u(rng), bf), bf);
      const std::vector<float> out = run_wg(a, b, n, bf, {false, 128}, {false, 128}, 0, 0, 0);
      for (int t = 0; t < 128; ++t)
        for (int v = 0; v < n / 2; ++v) {
          const auto [m, col] = cute_acc(t, v);
          double want = 0, mag = 0;
          for (int k = 0; k < 16; ++k) {
            want += fa[m * 16 + k] * fb[col * 16 + k];
            mag += std::fabs(fa[m * 16 + k] * fb[col * 16 + k]);
          }
          const double got = out[size_t(t) * n / 2 + v];
          CHECK(std::fabs(got - want) <= mag * 0x1p-22 + 1e-30, "N=%d t %d v %d: %.9g vs %.9g", n,
                t, v, got, want);
        }
    }
}

// Planted wgmma bugs, each failing with its message.
void test_wgmma_strict() {
  std::vector<uint16_t> a(64 * 16, enc(1, false)), b(64 * 16, enc(1, false));
  const char *want[] = {"", "accumulator register 0 of the wgmma issued at",
                        "no wgmma.fence since", "descriptor A points outside shared memory",
                        "was modified while it was in flight"};
  for (int planted = 1; planted <= 4; ++planted) {
    std::string err;
    run_wg(a, b, 64, false, {false, 0}, {false, 0}, 0, 0, 0, planted, &err);
    CHECK(err.find(want[planted]) != std::string::npos, "planted %d: got '%s'", planted,
          err.c_str());
    CHECK(err.find("st_wgmma") != std::string::npos, "no kernel name: %s", err.c_str());
  }
}

// ------------------------------------------------------------ mbarrier
namespace {
struct BarParams {
  int rounds, planted;
  unsigned *out;
};
}  // namespace

// 128 threads, one barrier of 128 arrivals: each round every thread
// arrives and waits for that phase; test_wait says false before the last
// arrival (thread 0 checks it is not complete before arriving in round 0).
FTN_KERNEL(st_mbarrier, BarParams, p) {
  FTN_SHARED(uint64_t, bar, [1]);
  if (threadIdx.x == 0) ftn_mbar_init(&bar[0], 128);
  __syncthreads();
  if (threadIdx.x == 0) p.out[0] = ftn_mbar_test_wait_parity(&bar[0], 0) ? 1 : 0;
  uint32_t parity = 0;
  for (int r = 0; r < p.rounds; ++r) {
    const uint64_t token = ftn_mbar_arrive(&bar[0]);
    if (threadIdx.x == 1) p.out[1 + r] = unsigned(token);
    ftn_mbar_wait(&bar[0], parity);
    if (p.planted != 1) parity ^= 1;  // PLANTED(1): the parity is never flipped
    __syncthreads();
  }
}

// One arrival expected; the phase waits for 64 transaction bytes, and a
// second arrive comes meanwhile.
FTN_KERNEL(st_mbarrier_overflow, BarParams, p) {
  FTN_SHARED(uint64_t, bar, [1]);
  ftn_mbar_init(&bar[0], 1);
  ftn_mbar_arrive_expect_tx(&bar[0], 64);
  if (p.planted) ftn_mbar_arrive(&bar[0]);  // PLANTED: one arrival too many
  p.out[0] = ftn_mbar_test_wait_parity(&bar[0], 0) ? 1 : 0;
}

void test_mbarrier_phases() {
  StrictOn strict;
  unsigned out[8] = {};
  BarParams p{4, 0, out};
  LAUNCH_OK(st_mbarrier, p, dim3(1), dim3(128));
  CHECK(out[0] == 0, "test_wait passed before any arrival");
  for (int r = 0; r < 4; ++r) CHECK(out[1 + r] == unsigned(r), "round %d token %u", r, out[1 + r]);
  p.planted = 1;
  LAUNCH_FAILS(st_mbarrier, p, dim3(1), dim3(128), 0, "phase/parity mismatch");
  p.planted = 0;
  LAUNCH_OK(st_mbarrier_overflow, p, dim3(1), dim3(1));
  CHECK(out[0] == 0, "phase completed with 64 transaction bytes due");
  p.planted = 1;
  LAUNCH_FAILS(st_mbarrier_overflow, p, dim3(1), dim3(1), 0, "arrive count overflow");
}

FTN_KERNEL(st_setmaxnreg, BarParams, p) {
  if (p.planted) ftn_setmaxnreg_inc<20>();  // PLANTED: below 24
  else ftn_setmaxnreg_dec<40>();
}

void test_setmaxnreg() {
  BarParams p{0, 0, nullptr};
  LAUNCH_OK(st_setmaxnreg, p, dim3(1), dim3(128));
  p.planted = 1;
  LAUNCH_FAILS(st_setmaxnreg, p, dim3(1), dim3(128), 0, "is not a multiple of 8 in [24, 256]");
}

// ----------------------------------------------------------------- TMA
namespace {
struct TmaParams {
  const ftn_emu_tensor_map *map;
  int x, y, planted;
  uint32_t bytes;
  uint8_t *out;
};
constexpr int kW = 200, kH = 50;  // u16 tensor, rows of 400 bytes
}  // namespace

FTN_KERNEL(st_tma, TmaParams, p) {
  FTN_DYNAMIC_SHARED(uint8_t, smem);  // 1024-aligned arena start
  uint64_t *bar = reinterpret_cast<uint64_t *>(smem + 8192);
  if (threadIdx.x == 0) {
    ftn_mbar_init(bar, 1);
    ftn_fence_proxy_async();
    ftn_mbar_arrive_expect_tx(bar, p.bytes);
    ftn_tma_load_2d(smem + (p.planted == 2 ? 64 : 0), p.map, p.x, p.y, bar);  // PLANTED(2)
    if (p.planted == 1) p.out[0] = smem[0];  // PLANTED(1): read before the mbarrier wait
    ftn_mbar_wait(bar, 0);
    for (uint32_t i = 0; i < p.bytes; ++i) p.out[i] = smem[i];
  }
}

namespace {
int encode(ftn_emu_tensor_map *m, uint16_t *t, uint32_t bx, uint32_t by, int swz,
           std::string *err = nullptr) {
  const uint64_t dims[2] = {kW, kH}, strides[1] = {kW * 2};
  const uint32_t box[2] = {bx, by}, es[2] = {1, 1};
  char buf[256] = {};
  const int rc = ftn_emu_tensor_map_encode_tiled(m, FTN_TMAP_UINT16, 2, t, dims, strides, box, es,
                                                 FTN_TMAP_INTERLEAVE_NONE, swz, 0,
                                                 FTN_TMAP_OOB_FILL_NONE, buf, sizeof buf);
  if (err) *err = buf;
  return rc;
}
}  // namespace

// A TMA copy of an iota tensor, every byte against the swizzle formula
// from CuTe's Swizzle<B,4,3> on the (1024-aligned) destination, with zero
// fill out of bounds (boxes straddling the right and top edges).
void test_tma_swizzle_bytes() {
  alignas(16) static uint16_t t[kH * kW];
  for (int i = 0; i < kH * kW; ++i) t[i] = uint16_t(i);
  struct Case { int swz, span; uint32_t bx; };
  const Case cases[] = {{FTN_TMAP_SWIZZLE_NONE, 0, 64}, {FTN_TMAP_SWIZZLE_32B, 32, 16},
                        {FTN_TMAP_SWIZZLE_64B, 64, 32}, {FTN_TMAP_SWIZZLE_128B, 128, 64}};
  const int coords[][2] = {{0, 0}, {8, 3}, {160, 40}, {-8, -4}};
  for (const Case &c : cases)
    for (const auto &xy : coords) {
      ftn_emu_tensor_map m;
      CHECK(encode(&m, t, c.bx, 16, c.swz) == 0, "encode sw%d", c.span);
      const uint32_t bytes = c.bx * 16 * 2;
      std::vector<uint8_t> out(bytes, 0xAB);
      TmaParams p{&m, xy[0], xy[1], 0, bytes, out.data()};
      LAUNCH_OK(st_tma, p, dim3(1), dim3(32), 8192 + 64);
      for (uint32_t r = 0; r < 16; ++r)
        for (uint32_t col = 0; col < c.bx; ++col) {
          const uint32_t o = (r * c.bx + col) * 2;
          const uint32_t phys = cute_swizzle(o, swizzle_bits(c.span));
          const int gx = xy[0] + int(col), gy = xy[1] + int(r);
          const bool in = gx >= 0 && gx < kW && gy >= 0 && gy < kH;
          const uint16_t want = in ? t[gy * kW + gx] : 0;
          const uint16_t got = uint16_t(out[phys] | out[phys + 1] << 8);
          CHECK(got == want, "sw%d box at (%d,%d): element (%u,%u) at smem byte %u = %u, want %u",
                c.span, xy[0], xy[1], r, col, phys, got, want);
        }
    }
}

// Planted TMA bugs and cuTensorMapEncodeTiled's argument checks.
void test_tma_strict() {
  StrictOn strict;
  alignas(16) static uint16_t t[kH * kW];
  ftn_emu_tensor_map m;
  CHECK(encode(&m, t, 64, 16, FTN_TMAP_SWIZZLE_128B) == 0, "encode");
  std::vector<uint8_t> out(2048);
  TmaParams p{&m, 0, 0, 1, 2048, out.data()};
  if (ftn_emu_racecheck_compiled())
    LAUNCH_FAILS(st_tma, p, dim3(1), dim3(32), 8192 + 64,
                 "before the mbarrier wait that completes the TMA copy");
  p.planted = 2;
  LAUNCH_FAILS(st_tma, p, dim3(1), dim3(32), 8192 + 64, "is not 128-byte aligned");
  p.planted = 0;
  p.x = 300;
  LAUNCH_FAILS(st_tma, p, dim3(1), dim3(32), 8192 + 64, "lies entirely outside");
  std::string err;
  CHECK(encode(&m, t, 72, 16, FTN_TMAP_SWIZZLE_128B, &err) == 1 &&
            err.find("exceeds the swizzle span") != std::string::npos,
        "box 72 with SW128: %s", err.c_str());
  CHECK(encode(&m, t, 64, 300, FTN_TMAP_SWIZZLE_NONE, &err) == 1 &&
            err.find("boxDim[1] = 300") != std::string::npos,
        "box 300: %s", err.c_str());
  CHECK(encode(&m, t + 1, 64, 16, FTN_TMAP_SWIZZLE_NONE, &err) == 1 &&
            err.find("globalAddress") != std::string::npos,
        "misaligned address: %s", err.c_str());
  CHECK(encode(&m, t, 4, 16, FTN_TMAP_SWIZZLE_NONE, &err) == 1 &&
            err.find("multiple of 16") != std::string::npos,
        "8-byte rows: %s", err.c_str());
}
