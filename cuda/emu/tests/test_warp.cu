// Self-tests: every shuffle kind with full and partial masks and widths
// 32/16/8/4/2 (expected values from the CUDA programming guide's description,
// written per segment, independent of the runtime's PTX formula), shuffles of
// every supported value type, ballot/any/all, __syncwarp and __reduce_*.
#include <cmath>
#include <cstring>
#include <vector>

#include "../../reduce.cuh"
#include "selftest.h"

namespace {
enum { kIdx, kUp, kDown, kXor };
struct ShflParams {
  int op;
  unsigned mask;
  int arg;
  int width;
  int *out;  // one per thread; -2 where the lane did not participate
};

// Value each lane offers: distinct per warp and lane.
int offered(unsigned linear) { return int(linear) * 10 + 7; }

// The guide's semantics: lanes form segments of `width`; idx reads lane
// (arg mod width) of its segment; up/down read lane -/+ arg and keep their own
// value when that leaves the segment; xor reads lane ^ arg, keeping its own
// value when that lies above its segment.
int expected_source(int op, int lane, int arg, int width) {
  const int seg = lane / width * width, end = seg + width - 1;
  switch (op) {
    case kIdx: return seg + (arg % width);
    case kUp: return lane - arg >= seg ? lane - arg : lane;
    case kDown: return lane + arg <= end ? lane + arg : lane;
    default: return (lane ^ arg) <= end ? (lane ^ arg) : lane;
  }
}
}  // namespace

FTN_KERNEL(st_shfl, ShflParams, p) {
  const unsigned lin = threadIdx.x + threadIdx.y * blockDim.x;
  const unsigned lane = lin % 32;
  int r = -2;
  if (p.mask >> lane & 1u) {
    const int v = offered(lin);
    switch (p.op) {
      case kIdx: r = __shfl_sync(p.mask, v, p.arg, p.width); break;
      case kUp: r = __shfl_up_sync(p.mask, v, unsigned(p.arg), p.width); break;
      case kDown: r = __shfl_down_sync(p.mask, v, unsigned(p.arg), p.width); break;
      default: r = __shfl_xor_sync(p.mask, v, p.arg, p.width); break;
    }
  }
  p.out[lin] = r;
}

static void run_shfl(int op, const std::vector<int> &args_for_width_32) {
  const unsigned masks[] = {0xFFFFFFFFu, 0x0000FFFFu, 0xF0F0F0F0u, 0x55555555u};
  for (int width = 32; width >= 2; width /= 2) {
    std::vector<int> args;
    for (int a : args_for_width_32) args.push_back(a < 0 ? width + a : a);
    for (unsigned mask : masks)
      for (int arg : args) {
        std::vector<int> out(64, -99);
        ShflParams p{op, mask, arg, width, out.data()};
        // 16x4 block: two warps, lanes from the linear index x + y*16.
        LAUNCH_OK(st_shfl, p, dim3(1), dim3(16, 4), 0, 1);
        for (int lin = 0; lin < 64; ++lin) {
          const int lane = lin % 32, base = lin - lane;
          if (!(mask >> lane & 1u)) {
            CHECK(out[lin] == -2, "non-participant %d was written", lin);
            continue;
          }
          const int src = expected_source(op, lane, arg, width);
          if (!(mask >> src & 1u)) continue;  // undefined: source not in mask
          CHECK(out[lin] == offered(unsigned(base + src)),
                "op %d width %d mask 0x%08x arg %d: thread %d got %d want %d", op, width, mask,
                arg, lin, out[lin], offered(unsigned(base + src)));
        }
      }
  }
}

void test_shfl_idx() { run_shfl(kIdx, {0, 3, -1, 33, 31, 5}); }
void test_shfl_up() { run_shfl(kUp, {0, 1, 2, -1}); }
void test_shfl_down() { run_shfl(kDown, {0, 1, 3, -1}); }
void test_shfl_xor() { run_shfl(kXor, {1, 2, -1, 16}); }

namespace {
struct TypesParams {
  float *f;
  double *d;
  long long *ll;
  unsigned long long *ull;
  unsigned short *h;
  unsigned short *bf;
  unsigned *h2;
  float2 *f2;
};
}  // namespace

FTN_KERNEL(st_shfl_types, TypesParams, p) {
  const unsigned l = threadIdx.x;
  const unsigned m = 0xFFFFFFFFu;
  p.f[l] = __shfl_xor_sync(m, float(l) + 0.25f, 5);
  p.d[l] = __shfl_down_sync(m, double(l) * 1e300, 1);
  p.ll[l] = __shfl_up_sync(m, -(long long)l * 10000000000LL, 2);
  p.ull[l] = __shfl_sync(m, (unsigned long long)l << 40, 31);
  p.h[l] = __half_as_ushort(__shfl_xor_sync(m, __float2half(float(l)), 1));
  p.bf[l] = __bfloat16_as_ushort(__shfl_xor_sync(m, __float2bfloat16(float(l)), 2));
  __half2 h2 = __shfl_sync(m, __floats2half2_rn(float(l), -float(l)), 0);
  p.h2[l] = unsigned(__half_as_ushort(h2.x)) | (unsigned(__half_as_ushort(h2.y)) << 16);
  p.f2[l] = __shfl_xor_sync(m, make_float2(float(l), 2.0f * float(l)), 31);
}

void test_shfl_types() {
  float f[32]; double d[32]; long long ll[32]; unsigned long long ull[32];
  unsigned short h[32], bf[32]; unsigned h2[32]; float2 f2[32];
  TypesParams p{f, d, ll, ull, h, bf, h2, f2};
  LAUNCH_OK(st_shfl_types, p, dim3(1), dim3(32), 0, 1);
  for (unsigned l = 0; l < 32; ++l) {
    CHECK(f[l] == float(l ^ 5) + 0.25f, "float lane %u", l);
    CHECK(d[l] == double(l < 31 ? l + 1 : l) * 1e300, "double lane %u", l);
    CHECK(ll[l] == -(long long)(l >= 2 ? l - 2 : l) * 10000000000LL, "long long lane %u", l);
    CHECK(ull[l] == 31ull << 40, "ull lane %u", l);
    CHECK(h[l] == ftn_emu_f32_to_f16_bits(float(l ^ 1)), "half lane %u: 0x%04x", l, h[l]);
    CHECK(bf[l] == ftn_emu_f32_to_bf16_bits(float(l ^ 2)), "bf16 lane %u", l);
    CHECK(h2[l] == 0x80000000u, "half2 lane %u: 0x%08x", l, h2[l]);  // (0, -0)
    CHECK(f2[l].x == float(l ^ 31) && f2[l].y == 2.0f * float(l ^ 31), "float2 lane %u", l);
  }
}

namespace {
struct VoteParams {
  unsigned mask;
  unsigned modulo;
  unsigned *out;  // 3 per thread
};
}  // namespace

FTN_KERNEL(st_vote, VoteParams, p) {
  const unsigned lin = threadIdx.x, lane = lin % 32;
  if (lin < 32) return;  // warp 0 sits out: the rendezvous is per warp
  if (!(p.mask >> lane & 1u)) return;
  const int pred = (lin % p.modulo) == 0;
  p.out[3 * lin] = __ballot_sync(p.mask, pred);
  p.out[3 * lin + 1] = unsigned(__any_sync(p.mask, pred));
  p.out[3 * lin + 2] = unsigned(__all_sync(p.mask, pred));
}

void test_ballot_any_all() {
  for (unsigned mask : {0xFFFFFFFFu, 0x0F0F0F0Fu, 0x80000001u})
    for (unsigned modulo : {1u, 3u, 64u}) {
      std::vector<unsigned> out(3 * 64, 12345);
      VoteParams p{mask, modulo, out.data()};
      LAUNCH_OK(st_vote, p, dim3(1), dim3(64), 0, 1);
      unsigned ballot = 0;
      for (unsigned lane = 0; lane < 32; ++lane)
        if ((mask >> lane & 1u) && (32 + lane) % modulo == 0) ballot |= 1u << lane;
      for (unsigned lin = 32; lin < 64; ++lin) {
        if (!(mask >> (lin % 32) & 1u)) continue;
        CHECK(out[3 * lin] == ballot, "mask 0x%08x mod %u: ballot 0x%08x want 0x%08x", mask,
              modulo, out[3 * lin], ballot);
        CHECK(out[3 * lin + 1] == (ballot != 0), "any wrong");
        CHECK(out[3 * lin + 2] == (ballot == mask), "all wrong");
      }
    }
}

namespace {
struct SyncWarpParams {
  int *out;
};
}  // namespace

FTN_KERNEL(st_syncwarp, SyncWarpParams, p) {
  FTN_SHARED(int, buf, [64]);
  FTN_SHARED(int, buf2, [64]);
  const unsigned t = threadIdx.x, lane = t % 32, base = t - lane;
  buf[t] = int(t) * 3;
  __syncwarp();
  int v = buf[base + (lane + 1) % 32];  // written by the next lane
  if (lane < 16) {                      // a partial-mask __syncwarp
    buf2[t] = -int(t);
    __syncwarp(0x0000FFFFu);
    v += buf2[base + (lane + 15) % 16];
  }
  p.out[t] = v;
}

void test_syncwarp() {
  std::vector<int> out(64, 0);
  SyncWarpParams p{out.data()};
  LAUNCH_OK(st_syncwarp, p, dim3(1), dim3(64), 0, 1);
  for (int t = 0; t < 64; ++t) {
    int lane = t % 32, base = t - lane;
    int want = (base + (lane + 1) % 32) * 3;
    if (lane < 16) want += -(base + (lane + 15) % 16);
    CHECK(out[t] == want, "thread %d: %d want %d", t, out[t], want);
  }
}

namespace {
struct ReduceWarpParams {
  unsigned *out;  // 6 per lane
};
}  // namespace

FTN_KERNEL(st_warp_reduce, ReduceWarpParams, p) {
  const unsigned l = threadIdx.x;
  const unsigned m = 0xFFFFFFFFu;
  unsigned *o = p.out + 6 * l;
  o[0] = __reduce_add_sync(m, l * 3u);
  o[1] = unsigned(__reduce_min_sync(m, int(l) - 5));
  o[2] = __reduce_max_sync(m, l ^ 7u);
  o[3] = __reduce_and_sync(m, l | 0x100u);
  o[4] = __reduce_or_sync(m, 1u << l);
  o[5] = __reduce_xor_sync(m, l);
}

void test_warp_reduce() {
  unsigned out[6 * 32];
  ReduceWarpParams p{out};
  LAUNCH_OK(st_warp_reduce, p, dim3(1), dim3(32), 0, 1);
  for (unsigned l = 0; l < 32; ++l) {
    const unsigned *o = out + 6 * l;
    CHECK(o[0] == 3u * 496u, "add");
    CHECK(int(o[1]) == -5, "min %d", int(o[1]));
    CHECK(o[2] == 31u, "max");
    CHECK(o[3] == 0x100u, "and");
    CHECK(o[4] == 0xFFFFFFFFu, "or");
    CHECK(o[5] == 0u, "xor");  // 0^1^...^31 = 0
  }
}

// ftn_warp_allreduce (cuda/reduce.cuh: one emulator rendezvous) against the
// five __shfl_xor_sync steps it stands for, bitwise on every lane, for sums
// whose rounding depends on the order and for max with -0.0/+0.0 and NaN-free
// ties; and a block of 16 threads (no full warp) must fail loudly.
namespace {
// Per lane: sum via allreduce, sum via shuffles, max, max; then groups of 8
// lanes with two values at once (two sums) and the same by shuffles.
constexpr unsigned kAllreduceOut = 8;
struct AllreduceParams {
  float *out;
};
}  // namespace

namespace {
// The reference: x reduced over aligned groups of 2 * first_off lanes by
// shuffles, the butterfly ftn_group_allreduce_n must reproduce bitwise.
template <class Op> float by_shuffles(float x, int first_off) {
  for (int off = first_off; off > 0; off >>= 1)
    x = Op::apply(x, __shfl_xor_sync(0xFFFFFFFFu, x, off));
  return x;
}
}  // namespace

FTN_KERNEL(st_warp_allreduce, AllreduceParams, p) {
  const unsigned l = threadIdx.x % 32;
  // Full 24-bit mantissas in [1, 8): the rounding of their fp32 sum depends
  // on the order of the additions.
  const float v = 1.0f + 7.0f * float(((l + 1u) * 2654435761u) >> 8) / 16777216.0f;
  const float w = (l & 1) ? -0.0f : 0.0f;
  const float shfl_sum = by_shuffles<FtnSumOp>(v, 16), shfl_max = by_shuffles<FtnMaxOp>(w, 16);
  float *o = p.out + kAllreduceOut * threadIdx.x;
  o[0] = ftn_warp_allreduce<FtnSumOp>(v);
  o[1] = shfl_sum;
  o[2] = ftn_warp_allreduce<FtnMaxOp>(w);
  o[3] = shfl_max;
  float g[2] = {v, -3.0f * v};
  ftn_group_allreduce_n<FtnSumOp, 8, 2>(g);
  o[4] = g[0];
  o[5] = by_shuffles<FtnSumOp>(v, 4);
  o[6] = g[1];
  o[7] = by_shuffles<FtnSumOp>(-3.0f * v, 4);
}

// Lanes of one warp that meet with different group widths.
FTN_KERNEL(st_warp_allreduce_mixed, AllreduceParams, p) {
  float v = 1.0f;
  if (threadIdx.x < 16) {
    v = ftn_group_allreduce<FtnSumOp, 8>(v);
  } else {
    v = ftn_group_allreduce<FtnSumOp, 16>(v);
  }
  p.out[threadIdx.x] = v;
}

void test_warp_allreduce() {
  std::vector<float> out(kAllreduceOut * 64, 1.0f);
  AllreduceParams p{out.data()};
  LAUNCH_OK(st_warp_allreduce, p, dim3(1), dim3(64), 0, 1);
  for (unsigned t = 0; t < 64; ++t) {
    const float *o = &out[kAllreduceOut * t];
    CHECK(std::memcmp(&o[0], &o[1], 4) == 0, "thread %u: sum %.9g, shuffles %.9g", t,
          double(o[0]), double(o[1]));
    CHECK(std::memcmp(&o[2], &o[3], 4) == 0, "thread %u: max %g, shuffles %g", t, double(o[2]),
          double(o[3]));
    CHECK(std::memcmp(&o[4], &o[5], 4) == 0 && std::memcmp(&o[6], &o[7], 4) == 0,
          "thread %u: groups of 8 lanes gave %.9g, %.9g; shuffles %.9g, %.9g", t, double(o[4]),
          double(o[6]), double(o[5]), double(o[7]));
    // The group sums really are over 8 lanes: lane 0's and lane 8's differ.
    if (t % 32 == 8) CHECK(o[4] != out[kAllreduceOut * (t - 8) + 4], "thread %u: group of 8", t);
  }
  LAUNCH_FAILS(st_warp_allreduce, p, dim3(1), dim3(16), 0, "do not exist");
  LAUNCH_FAILS(st_warp_allreduce_mixed, p, dim3(1), dim3(32), 0, "widths");
}
