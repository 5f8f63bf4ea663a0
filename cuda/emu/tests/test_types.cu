// Self-tests: __half/__nv_bfloat16 conversions bit-exact with the CUDA
// headers (round to nearest even, subnormals, overflow, NaN -> 0x7FFF),
// vector-type sizes and alignments, 64-bit grid-stride indexing, and the
// inline fmaxf/fminf of cuda_emu.h (scalar and vector forms).
#include <cmath>
#include <cstring>
#include <vector>

#include "reduce.cuh"
#include "selftest.h"
#include "vec.cuh"

static float fbits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void test_half_conversions() {
  struct Case {
    float in;
    uint16_t half, bf16;
  };
  const Case cases[] = {
      {1.0f, 0x3C00, 0x3F80},
      {-2.0f, 0xC000, 0xC000},
      {0.0f, 0x0000, 0x0000},
      {-0.0f, 0x8000, 0x8000},
      {65504.0f, 0x7BFF, 0x4780},
      {65519.99f, 0x7BFF, 0x4780},        // just under the half-way point to 65536
      {65520.0f, 0x7C00, 0x4780},         // ties to even -> inf for half
      {1e6f, 0x7C00, 0x4974},
      {-1e6f, 0xFC00, 0xC974},
      {fbits(0x33800000), 0x0001, 0x3380},  // 2^-24: smallest half subnormal
      {fbits(0x33000000), 0x0000, 0x3300},  // 2^-25: tie -> even (0)
      {fbits(0x33400000), 0x0001, 0x3340},  // 1.5 * 2^-25 -> 1 ulp
      {fbits(0x33C00000), 0x0002, 0x33C0},  // 3 * 2^-25 = 1.5 ulp: tie -> 2
      {fbits(0x34400000), 0x0003, 0x3440},  // 3 * 2^-24: exact
      {fbits(0x38800000), 0x0400, 0x3880},  // 2^-14: smallest normal
      {fbits(0x387FF000), 0x0400, 0x3880},  // just under 2^-14: rounds up into normal
      {fbits(0x3F801000), 0x3C00, 0x3F80},  // 1 + 2^-11: tie -> even 1.0
      {fbits(0x3F803000), 0x3C02, 0x3F80},  // 1 + 3*2^-11: tie -> even 1+2^-9
      {fbits(0x3F808000), 0x3C04, 0x3F80},  // 1 + 2^-8: bf16 tie -> even
      {fbits(0x3F818000), 0x3C0C, 0x3F82},  // 1 + 3*2^-8: bf16 tie -> up (even)
      {fbits(0x3F808001), 0x3C04, 0x3F81},  // just above the bf16 tie
      {fbits(0x7F7FFFFF), 0x7C00, 0x7F80},  // FLT_MAX -> inf for both
      {fbits(0x7F800000), 0x7C00, 0x7F80},
      {fbits(0xFF800000), 0xFC00, 0xFF80},
      {fbits(0x7FC00000), 0x7FFF, 0x7FFF},  // NaN -> canonical
      {fbits(0xFFC00001), 0x7FFF, 0x7FFF},
      {fbits(0x00000001), 0x0000, 0x0000},  // float subnormal
      {fbits(0x80400000), 0x8000, 0x8040},
  };
  for (const Case &c : cases) {
    uint16_t h = ftn_emu_f32_to_f16_bits(c.in), b = ftn_emu_f32_to_bf16_bits(c.in);
    CHECK(h == c.half, "f16(%a) = 0x%04x want 0x%04x", double(c.in), h, c.half);
    CHECK(b == c.bf16, "bf16(%a) = 0x%04x want 0x%04x", double(c.in), b, c.bf16);
    CHECK(__half_as_ushort(__float2half_rn(c.in)) == c.half, "__float2half_rn(%a)", double(c.in));
    CHECK(__bfloat16_as_ushort(__float2bfloat16(c.in)) == c.bf16, "__float2bfloat16(%a)",
          double(c.in));
  }
  // Every finite half survives f16 -> f32 -> f16; values are exact.
  for (uint32_t u = 0; u < 0x10000; ++u) {
    const uint16_t h = uint16_t(u);
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
    float f = ftn_emu_f16_bits_to_f32(h);
    if (nan) {
      CHECK(f != f, "half 0x%04x should be NaN", h);
      continue;
    }
    CHECK(ftn_emu_f32_to_f16_bits(f) == h, "round trip of half 0x%04x", h);
    float b = ftn_emu_bf16_bits_to_f32(h);
    const bool bnan = (h & 0x7F80) == 0x7F80 && (h & 0x7F);
    if (!bnan) CHECK(ftn_emu_f32_to_bf16_bits(b) == h, "round trip of bf16 0x%04x", h);
  }
  CHECK(ftn_emu_f16_bits_to_f32(0x0001) == fbits(0x33800000), "subnormal half to float");
  CHECK(ftn_emu_f16_bits_to_f32(0x7BFF) == 65504.0f, "max half");
  CHECK(ftn_emu_f16_bits_to_f32(0xFC00) == -INFINITY, "-inf half");
  // Arithmetic rounds the exact result once: 2049 is not a half; ties to 2048.
  __half a = __float2half(2048.0f), one = __float2half(1.0f);
  CHECK(__half2float(__hadd(a, one)) == 2048.0f, "hadd rounding");
  CHECK(__half2float(__hmul(__float2half(3.0f), __float2half(0.5f))) == 1.5f, "hmul");
  float2 f2 = __half22float2(__floats2half2_rn(0.1f, -3.0f));
  CHECK(f2.x == ftn_emu_f16_bits_to_f32(0x2E66) && f2.y == -3.0f, "half2 %g", double(f2.x));
  float2 b2 = __bfloat1622float2(__floats2bfloat162_rn(1.0f, 3.14159f));
  CHECK(b2.x == 1.0f && b2.y == ftn_emu_bf16_bits_to_f32(0x4049), "bf162 %g", double(b2.y));
}

void test_vector_types() {
  static_assert(sizeof(float4) == 16 && alignof(float4) == 16);
  static_assert(sizeof(int4) == 16 && alignof(int4) == 16);
  static_assert(sizeof(uint4) == 16 && alignof(uint4) == 16);
  static_assert(sizeof(float2) == 8 && alignof(float2) == 8);
  static_assert(sizeof(int2) == 8 && alignof(int2) == 8);
  static_assert(sizeof(uint2) == 8 && alignof(uint2) == 8);
  static_assert(sizeof(double2) == 16 && alignof(double2) == 16);
  static_assert(sizeof(float3) == 12 && alignof(float3) == 4);
  static_assert(sizeof(uchar4) == 4 && alignof(uchar4) == 4);
  static_assert(sizeof(short2) == 4 && alignof(short2) == 4);
  static_assert(sizeof(__half) == 2 && sizeof(__half2) == 4 && alignof(__half2) == 4);
  static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__nv_bfloat162) == 4);
  static_assert(std::is_trivially_copyable_v<__half> && std::is_trivial_v<__half>);
  float4 v = make_float4(1, 2, 3, 4);
  CHECK(v.x + v.y + v.z + v.w == 10.0f, "make_float4");
  CHECK(__float_as_uint(1.0f) == 0x3F800000u && __int_as_float(0x40000000) == 2.0f, "bit casts");
  CHECK(min(3, 5u) == 3u && max(-1.0f, 2.0) == 2.0 && min(7LL, 2LL) == 2LL, "min/max");
  CHECK(__popc(0xF0F0u) == 8 && __clz(1) == 31 && __brev(1u) == 0x80000000u, "bit ops");
  CHECK(rsqrtf(4.0f) == 0.5f && __fdividef(1.0f, 4.0f) == 0.25f, "math");
}

namespace {
struct StrideParams {
  uint64_t n;
  uint64_t base;
  uint64_t *out;
  unsigned *gridx_seen;
};
}  // namespace

FTN_KERNEL(st_grid_stride, StrideParams, p) {
  const uint64_t stride = uint64_t(blockDim.x) * gridDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride)
    p.out[i] = i + p.base;
  if (threadIdx.x == 0 && blockIdx.x == gridDim.x - 1) *p.gridx_seen = blockIdx.x;
}

void test_grid_stride_64bit() {
  const uint64_t n = 1000003;
  std::vector<uint64_t> out(n, 0);
  unsigned seen = 0;
  StrideParams p{n, 5000000000ull, out.data(), &seen};
  LAUNCH_OK(st_grid_stride, p, dim3(61), dim3(128), 0, 2);
  for (uint64_t i = 0; i < n; ++i)
    CHECK(out[i] == i + 5000000000ull, "out[%llu] = %llu", (unsigned long long)i,
          (unsigned long long)out[i]);
  CHECK(seen == 60, "last block %u", seen);
  // A grid wider than 65535 blocks in x (and 1 thread per block).
  std::vector<uint64_t> out2(70001, 0);
  StrideParams q{70001, 1, out2.data(), &seen};
  LAUNCH_OK(st_grid_stride, q, dim3(70001), dim3(1), 0, 2);
  CHECK(seen == 70000, "last block %u", seen);
  for (uint64_t i = 0; i < 70001; ++i) CHECK(out2[i] == i + 1, "wide grid out[%llu]", (unsigned long long)i);
}

// ex2_f32 (cuda_emu.h), the model of ex2.approx behind __expf: within
// 1 ulp of the exact 2^x (the double exp2, rounded to float at the end, is
// exact enough to judge by) over a sweep of every 509th float from -151 to
// 129, subnormal results included; exact at the integers; the limits and
// NaN as the GPU gives them.
void test_ex2() {
  double worst = 0.0;
  float worst_x = 0.0f;
  auto check_at = [&](float x) {
    const float r = ftn_emu::ex2_f32(x);
    const double e = std::exp2(double(x));
    // One ulp of a float of magnitude e: 2^(exponent - 23), 2^-149 at least.
    const double ulp = e < 0x1p-126 ? 0x1p-149 : std::ldexp(1.0, std::ilogb(e) - 23);
    const double err = e > 0x1.fffffep127 ? (std::isinf(r) ? 0.0 : 1e9) : std::fabs(r - e) / ulp;
    if (err > worst) {
      worst = err;
      worst_x = x;
    }
  };
  for (uint32_t u = 0; u <= 0x43010000u; u += 509u) check_at(ftn_emu::bits_f32(u));
  for (uint32_t u = 0x80000000u; u <= 0xC3170000u; u += 509u) check_at(ftn_emu::bits_f32(u));
  CHECK(worst <= 1.0, "ex2_f32: %.3f ulp from exact at x = %a (expected at most 1)", worst,
        double(worst_x));
  for (int k = -149; k <= 127; ++k)
    CHECK(ftn_emu::ex2_f32(float(k)) == std::ldexp(1.0f, k), "ex2_f32(%d) = %a, expected 2^%d", k,
          double(ftn_emu::ex2_f32(float(k))), k);
  CHECK(ftn_emu::ex2_f32(-INFINITY) == 0.0f && ftn_emu::ex2_f32(-150.0f) == 0.0f,
        "ex2_f32: 0 below -150");
  CHECK(std::isinf(ftn_emu::ex2_f32(INFINITY)) && std::isinf(ftn_emu::ex2_f32(128.0f)),
        "ex2_f32: inf from 128 up");
  CHECK(std::isnan(ftn_emu::ex2_f32(NAN)), "ex2_f32(NaN) = %a", double(ftn_emu::ex2_f32(NAN)));
}

// fmaxf/fminf in kernel code (inline in cuda_emu.h): the larger/smaller of
// two ordered values, the other operand when one is NaN, NaN for two NaNs,
// and -0 below +0 in either order; the same as libm wherever libm's result
// is specified (all but the sign of an equal pair of zeros).
void test_fmax_fmin() {
  const float vals[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, INFINITY, -INFINITY, NAN, -NAN,
                        0x1p-149f, 3.4e38f};
  // Through volatile pointers: the library functions themselves, not the
  // compiler's constant folding of them.
  float (*volatile libm_max)(float, float) = &::fmaxf;
  float (*volatile libm_min)(float, float) = &::fminf;
  auto same = [](float x, float y) {
    return std::memcmp(&x, &y, 4) == 0 || (std::isnan(x) && std::isnan(y));
  };
  for (float a : vals) {
    for (float b : vals) {
      const float mx = fmaxf(a, b), mn = fminf(a, b);
      if (a == 0.0f && b == 0.0f) {
        const bool neg = std::signbit(a) && std::signbit(b), pos = !std::signbit(a) && !std::signbit(b);
        CHECK(std::signbit(mx) == neg && mx == 0.0f, "fmaxf(%a, %a) = %a", double(a), double(b),
              double(mx));
        CHECK(std::signbit(mn) == !pos && mn == 0.0f, "fminf(%a, %a) = %a", double(a), double(b),
              double(mn));
        continue;
      }
      CHECK(same(mx, libm_max(a, b)), "fmaxf(%a, %a) = %a, libm %a", double(a), double(b),
            double(mx), double(libm_max(a, b)));
      CHECK(same(mn, libm_min(a, b)), "fminf(%a, %a) = %a, libm %a", double(a), double(b),
            double(mn), double(libm_min(a, b)));
      if (std::isnan(a) && !std::isnan(b)) CHECK(same(mx, b) && same(mn, b), "NaN first");
      if (std::isnan(b) && !std::isnan(a)) CHECK(same(mx, a) && same(mn, a), "NaN second");
    }
  }
  // The vector form (fmax_into: eight, four, then one at a time) bit for bit
  // fmax_f32 on every pair, in every position of a 13-long array.
  constexpr int kVals = sizeof vals / sizeof vals[0], kLen = 13;
  for (int shift = 0; shift < kLen; ++shift) {
    float a[kLen], a0[kLen], b[kLen], want[kLen];
    for (int i = 0; i < kVals * kVals; i += kLen) {
      for (int j = 0; j < kLen; ++j) {
        const int pair = (i + (j + shift) % kLen) % (kVals * kVals);
        a[j] = a0[j] = vals[pair / kVals];
        b[j] = vals[pair % kVals];
        want[j] = ftn_emu::fmax_f32(a[j], b[j]);
      }
      ftn_emu::fmax_into(a, b, kLen);
      for (int j = 0; j < kLen; ++j)
        CHECK(std::memcmp(&a[j], &want[j], 4) == 0, "fmax_into[%d](%a, %a) = %a, fmax_f32 %a",
              j, double(a0[j]), double(b[j]), double(a[j]),
              double(want[j]));
    }
  }
  // ftn_thread_max (reduce.cuh: element-wise, then pairs) equals the serial
  // chain fmaxf(...fmaxf(-inf, v0)..., v31) on rows mixing NaN, zeros, inf.
  for (int seed = 0; seed < 200; ++seed) {
    float v[4][8];
    float chain = -INFINITY;
    for (int r = 0; r < 4; ++r)
      for (int k = 0; k < 8; ++k) {
        const int pick = (seed * 7 + r * 13 + k * 5 + (seed >> 3) * k) % (kVals + 3);
        v[r][k] = pick < kVals ? vals[pick] : NAN;  // extra NaNs: all-NaN rows happen
        chain = fmaxf(chain, v[r][k]);
      }
    if (seed % 10 == 0) {  // an all-NaN row: the chain stays at -inf
      for (int r = 0; r < 4; ++r)
        for (int k = 0; k < 8; ++k) v[r][k] = NAN;
      chain = -INFINITY;
    }
    const float tree = ftn_thread_max(v);
    CHECK(std::memcmp(&tree, &chain, 4) == 0, "ftn_thread_max seed %d: %a, serial chain %a", seed,
          double(tree), double(chain));
  }
}

// The kernels' 128-bit bf16 access (cuda/vec.cuh: ftn_store_vec narrows
// eight fp32 values, ftn_load_vec widens eight bf16), which on an AVX2 host
// has its own 256-bit code: bit for bit the scalar conversions
// (ftn_emu::f32_to_bf16: nearest even, NaN -> 0x7FFF; bf16_to_f32) for the
// special values and a sweep of bit patterns.
namespace {
struct Bf16VecParams {
  const float *in;
  __nv_bfloat16 *stored;
  float *widened;
  uint64_t vectors;
};
}  // namespace

FTN_KERNEL(st_bf16_vec, Bf16VecParams, p) {
  const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.vectors) return;
  float v[8];
  for (int k = 0; k < 8; ++k) v[k] = p.in[i * 8 + k];
  ftn_store_vec<__nv_bfloat16>(p.stored + i * 8, v);
  float w[8];
  ftn_load_vec<__nv_bfloat16>(p.stored + i * 8, w);
  for (int k = 0; k < 8; ++k) p.widened[i * 8 + k] = w[k];
}

void test_bf16_vector_access() {
  std::vector<float> in = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, -NAN,
                           3.3895314e38f,          // the largest finite bf16
                           3.4028235e38f,          // rounds up to inf
                           -3.4028235e38f,         // rounds down to -inf
                           0x1p-149f, -0x1p-149f,  // the smallest subnormals
                           0x1p-133f, 0x1.008p0f,  // exact; a tie, even below
                           0x1.018p0f, 0x1.0081p0f, 0x1.00ffp-126f};
  // NaNs with payloads in the high and the low half, both signs.
  for (uint32_t u : {0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0xFF800001u, 0xFFC12345u, 0x7F810000u})
    in.push_back(ftn_emu::bits_f32(u));
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099) in.push_back(ftn_emu::bits_f32(uint32_t(u)));
  while (in.size() % 8 != 0) in.push_back(0.5f);
  const uint64_t vectors = in.size() / 8;
  std::vector<__nv_bfloat16> stored(in.size());
  std::vector<float> widened(in.size(), -1.0f);
  Bf16VecParams p{in.data(), stored.data(), widened.data(), vectors};
  LAUNCH_OK(st_bf16_vec, p, dim3(unsigned((vectors + 255) / 256)), dim3(256), 0, 2);
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, &stored[i], 2);
    const uint16_t want = ftn_emu::f32_to_bf16(in[i]);
    CHECK(got == want, "ftn_store_vec<bf16>(%a = 0x%08x) stored 0x%04x, expected 0x%04x",
          double(in[i]), ftn_emu::f32_bits(in[i]), got, want);
    const uint32_t back = ftn_emu::f32_bits(widened[i]);
    CHECK(back == uint32_t(want) << 16, "ftn_load_vec<bf16>(0x%04x) gave 0x%08x", want, back);
  }
}
