// The CUDA surface on the CPU: everything a ferrotron kernel may use when its
// .cu file is compiled by the host C++ compiler (g++ -x c++ -std=c++20)
// against the emulator instead of nvcc.
//
// Sections, in order: qualifiers; dim3/uint3 and the built-in index
// variables; the FTN_* kernel macros; vector types; __half/__nv_bfloat16;
// math and bit intrinsics; atomics; block barrier and warp collectives.
// Everything that needs the scheduler (barriers, warp rendezvous, shared
// memory, assert) is a call into the runtime in cuda/emu/*.cpp; the rest is
// inline here. See cuda/emu/README.md for how the emulator runs a grid.
#ifndef FTN_CUDA_EMU_H
#define FTN_CUDA_EMU_H

#include <atomic>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <source_location>
#include <type_traits>

#include "emu_api.h"

// ---------------------------------------------------------------- qualifiers
#define __device__
#define __global__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// __restrict__ is already a GNU C++ keyword. __shared__ is deliberately not
// defined: use FTN_SHARED / FTN_DYNAMIC_SHARED, which are per block here.

// ------------------------------------------------ dim3, uint3, index builtins
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// Per-thread and per-block state the runtime points at before it switches to
// a fiber. In gdb: `p *ftn_emu_tl_thread`, `p *ftn_emu_tl_block`.
struct ftn_emu_thread_pub {
  uint3 tid;        // threadIdx
  unsigned linear;  // x + y*bx + z*bx*by; lane = linear % 32
};
struct ftn_emu_block_pub {
  uint3 bid;   // blockIdx
  dim3 bdim;   // blockDim
  dim3 gdim;   // gridDim
};
extern __thread ftn_emu_thread_pub *ftn_emu_tl_thread;
extern __thread ftn_emu_block_pub *ftn_emu_tl_block;

#define threadIdx (static_cast<const uint3 &>(ftn_emu_tl_thread->tid))
#define blockIdx (static_cast<const uint3 &>(ftn_emu_tl_block->bid))
#define blockDim (static_cast<const dim3 &>(ftn_emu_tl_block->bdim))
#define gridDim (static_cast<const dim3 &>(ftn_emu_tl_block->gdim))
constexpr int warpSize = 32;

// --------------------------------------------------------- runtime interface
namespace ftn_emu {
// Fails the running launch (message names the kernel, condition, file:line).
[[noreturn]] void assert_fail(const char *cond, const char *file, unsigned line);
// The block's copy of the static shared array declared at call site `site`.
void *static_shared_alloc(const void *site, size_t bytes, size_t align);
void *dynamic_shared();
template <class T>
inline T *static_shared(const void *site) {
  return static_cast<T *>(static_shared_alloc(site, sizeof(T), alignof(T)));
}

// Address checks (runtime.cpp). A GPU faults on a misaligned vector access
// ("misaligned address"); here it fails the launch with the kernel, the
// thread and block, `what`, and file:line.
[[noreturn]] void misaligned_fail(const char *what, const void *p, size_t align,
                                  const char *file, unsigned line);
inline void check_aligned(const void *p, size_t align, const char *what, const char *file,
                          unsigned line) {
  if (reinterpret_cast<uintptr_t>(p) & (align - 1)) misaligned_fail(what, p, align, file, line);
}
// Whether [p, p + bytes) lies inside the running block's shared memory (its
// dynamic part or a static array declared so far).
bool in_shared(const void *p, size_t bytes);
// Whether [p, p + bytes) overlaps the running block's shared-memory arena.
bool overlaps_shared(const void *p, size_t bytes);

namespace detail {
enum BarrierKind : int { kBarPlain, kBarCount, kBarAnd, kBarOr, kBarCluster };
int block_barrier(int kind, int pred, const char *file, unsigned line);

enum WarpOp : int {
  kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSyncWarp,
  kReduceAdd, kReduceMin, kReduceMax, kReduceAnd, kReduceOr, kReduceXor,
  kCollective,  // warp_collective (tensor-core emulations, mma_emu.cpp)
  kActiveMask,  // __activemask: every non-exited lane, same call site
  kWarpOpCount
};
// Meets the lanes named in `mask` at a warp rendezvous; returns this lane's
// result (shuffle value, ballot bits, ...).
uint64_t warp_op(int op, unsigned mask, uint64_t value, int param, int width,
                 const char *file, unsigned line);
unsigned active_mask(const char *file, unsigned line);

template <class T>
inline uint64_t to_bits(const T &v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                "warp shuffles take trivially-copyable values of <= 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
inline T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
}  // namespace detail
}  // namespace ftn_emu

// ------------------------------------------------------------ kernel macros
// Always inlined, as nvcc's __forceinline__: left to g++, small helpers
// (vector loads/stores, per-thread reductions) stay calls, 5-20 % of a row
// kernel's time in the emulator.
#define FTN_DEVICE inline __attribute__((always_inline))
#define FTN_KERNEL(name, Params, p)                                        \
  static void ftn_emu_body_##name(const Params &p);                        \
  extern "C" void ftn_emu_entry_##name(const void *ftn_emu_raw) {          \
    ftn_emu_body_##name(*static_cast<const Params *>(ftn_emu_raw));        \
  }                                                                        \
  extern "C" size_t ftn_emu_params_size_##name(void) { return sizeof(Params); } \
  static void ftn_emu_body_##name(const Params &p)
#define FTN_KERNEL_BOUNDED(name, Params, p, max_threads)                   \
  static void ftn_emu_body_##name(const Params &p);                        \
  extern "C" void ftn_emu_entry_##name(const void *ftn_emu_raw) {          \
    ::ftn_emu::check_launch_bounds((max_threads), #max_threads);           \
    ftn_emu_body_##name(*static_cast<const Params *>(ftn_emu_raw));        \
  }                                                                        \
  extern "C" size_t ftn_emu_params_size_##name(void) { return sizeof(Params); } \
  static void ftn_emu_body_##name(const Params &p)
// A kernel launched in thread block clusters of `cluster` blocks along x
// (the emulator fails a launch with another cluster size).
#define FTN_KERNEL_CLUSTER(name, Params, p, max_threads, cluster)          \
  static void ftn_emu_body_##name(const Params &p);                        \
  extern "C" void ftn_emu_entry_##name(const void *ftn_emu_raw) {          \
    ::ftn_emu::check_launch_bounds((max_threads), #max_threads);           \
    ::ftn_emu::check_cluster((cluster));                                   \
    ftn_emu_body_##name(*static_cast<const Params *>(ftn_emu_raw));        \
  }                                                                        \
  extern "C" size_t ftn_emu_params_size_##name(void) { return sizeof(Params); } \
  static void ftn_emu_body_##name(const Params &p)
#define FTN_SHARED(T, name, dims)        \
  static char ftn_emu_smem_site_##name;  \
  auto &name = *::ftn_emu::static_shared<T dims>(&ftn_emu_smem_site_##name)
#define FTN_DYNAMIC_SHARED(T, name) \
  T *name = reinterpret_cast<T *>(::ftn_emu::dynamic_shared())
#define FTN_ASSERT(cond) \
  ((cond) ? (void)0 : ::ftn_emu::assert_fail(#cond, __FILE__, __LINE__))
// Fails the launch unless `ptr` is `bytes`-aligned (a GPU faults on a
// misaligned vector access). A no-op under nvcc, where the hardware checks.
#define FTN_ASSERT_ALIGNED(ptr, bytes) \
  ::ftn_emu::check_aligned((ptr), (bytes), #ptr, __FILE__, __LINE__)
// For helpers that should report their caller's line: a trailing defaulted
// parameter `ftn_loc` (FTN_CALLER_LOC), passed on with FTN_CALLER_FWD, and
// FTN_ASSERT_ALIGNED_CALLER(ptr, bytes, what) reporting ftn_loc. All three
// are empty / no-ops under nvcc.
#define FTN_CALLER_LOC , std::source_location ftn_loc = std::source_location::current()
#define FTN_CALLER_FWD , ftn_loc
#define FTN_ASSERT_ALIGNED_CALLER(ptr, bytes, what) \
  ::ftn_emu::check_aligned((ptr), (bytes), (what), ftn_loc.file_name(), ftn_loc.line())

namespace ftn_emu {
[[noreturn]] void launch_bounds_fail(unsigned max_threads, const char *text);
inline void check_launch_bounds(unsigned max_threads, const char *text) {
  const dim3 &b = ftn_emu_tl_block->bdim;
  if (b.x * b.y * b.z > max_threads) launch_bounds_fail(max_threads, text);
}

// Thread block clusters (cluster.cpp; cuda/cluster.cuh wraps these). The
// blocks of a cluster are consecutive along x and run at once.
unsigned cluster_ctarank();   // this block's rank in its cluster (0 without one)
unsigned cluster_nctarank();  // blocks per cluster (1 without one)
// Fails unless the launch's cluster size is `declared` (the kernel's).
void check_cluster(unsigned declared);
// barrier.cluster.arrive.release + wait.acquire: every thread of every
// block of the cluster.
void cluster_sync(const char *file, unsigned line);
// mapa: the address of the variable at p (this block's shared memory) in
// the shared memory of block `rank` of the cluster.
void *cluster_map_shared(const void *p, unsigned rank, const char *file, unsigned line);
// st.async.shared::cluster.mbarrier::complete_tx::bytes: `bytes` (<= 16) from
// data to the variable at local_dst (this block's shared memory) in block
// `rank`, completing them on that block's copy of the mbarrier local_bar.
void cluster_st_async(void *local_dst, unsigned rank, const void *data, uint32_t bytes,
                      uint64_t *local_bar, const char *file, unsigned line);
}  // namespace ftn_emu

// -------------------------------------------------------------- vector types
#define FTN_EMU_VEC1(n, T, A)                                     \
  struct alignas(A) n##1 { T x; };                                \
  inline constexpr n##1 make_##n##1(T x) { return n##1{x}; }
#define FTN_EMU_VEC2(n, T, A)                                     \
  struct alignas(A) n##2 { T x, y; };                             \
  inline constexpr n##2 make_##n##2(T x, T y) { return n##2{x, y}; }
#define FTN_EMU_VEC3(n, T)                                        \
  struct n##3 { T x, y, z; };                                     \
  inline constexpr n##3 make_##n##3(T x, T y, T z) { return n##3{x, y, z}; }
#define FTN_EMU_VEC4(n, T, A)                                     \
  struct alignas(A) n##4 { T x, y, z, w; };                       \
  inline constexpr n##4 make_##n##4(T x, T y, T z, T w) { return n##4{x, y, z, w}; }
#define FTN_EMU_VECS(n, T, A1, A2, A4) \
  FTN_EMU_VEC1(n, T, A1) FTN_EMU_VEC2(n, T, A2) FTN_EMU_VEC3(n, T) FTN_EMU_VEC4(n, T, A4)

FTN_EMU_VECS(char, signed char, 1, 2, 4)
FTN_EMU_VECS(uchar, unsigned char, 1, 2, 4)
FTN_EMU_VECS(short, short, 2, 4, 8)
FTN_EMU_VECS(ushort, unsigned short, 2, 4, 8)
FTN_EMU_VECS(int, int, 4, 8, 16)
FTN_EMU_VECS(float, float, 4, 8, 16)
FTN_EMU_VECS(long, long, 8, 16, 16)
FTN_EMU_VECS(ulong, unsigned long, 8, 16, 16)
FTN_EMU_VECS(longlong, long long, 8, 16, 16)
FTN_EMU_VECS(ulonglong, unsigned long long, 8, 16, 16)
FTN_EMU_VECS(double, double, 8, 16, 16)
// uint3 is declared above (it doubles as the threadIdx type).
struct alignas(4) uint1 { unsigned int x; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
inline constexpr uint1 make_uint1(unsigned x) { return uint1{x}; }
inline constexpr uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline constexpr uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }
inline constexpr uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return uint4{x, y, z, w};
}
#undef FTN_EMU_VECS
#undef FTN_EMU_VEC1
#undef FTN_EMU_VEC2
#undef FTN_EMU_VEC3
#undef FTN_EMU_VEC4

// ------------------------------------------------ __half and __nv_bfloat16
namespace ftn_emu {
inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// f32 -> f16, round to nearest even, subnormals, overflow to inf, any NaN ->
// 0x7FFF (what cvt.rn.f16.f32 produces).
inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7FFF;
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // >= 65520: inf
  if (a >= 0x38800000u) {                                  // normal half
    uint32_t h = (a - 0x38000000u) >> 13;
    const uint32_t rem = a & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  const uint32_t e = a >> 23;  // subnormal half (or zero)
  const uint32_t shift = 126u - e;
  if (shift > 24u) return uint16_t(sign);
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  uint32_t h = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return uint16_t(sign | h);
}
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return bits_f32(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    e = 113;  // normalise the subnormal
    while (!(m & 0x400u)) { m <<= 1; --e; }
    return bits_f32(sign | (e << 23) | ((m & 0x3FFu) << 13));
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}
inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  return uint16_t((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}
inline float bf16_to_f32(uint16_t b) { return bits_f32(uint32_t(b) << 16); }
}  // namespace ftn_emu

struct __half_raw { unsigned short x; };
struct __nv_bfloat16_raw { unsigned short x; };

#define FTN_EMU_HALF_TYPE(H, RAW, TO, FROM)                                   \
  struct alignas(2) H {                                                       \
    unsigned short __x;                                                       \
    H() = default;                                                            \
    constexpr H(const RAW &r) : __x(r.x) {}                                   \
    H(float f) : __x(::ftn_emu::TO(f)) {}                                     \
    H(double d) : __x(::ftn_emu::TO(float(d))) {}                            \
    H(int i) : __x(::ftn_emu::TO(float(i))) {}                                \
    H(unsigned i) : __x(::ftn_emu::TO(float(i))) {}                           \
    H(long long i) : __x(::ftn_emu::TO(float(i))) {}                          \
    H(unsigned long long i) : __x(::ftn_emu::TO(float(i))) {}                 \
    operator float() const { return ::ftn_emu::FROM(__x); }                   \
    operator RAW() const { return RAW{__x}; }                                 \
  };                                                                          \
  inline H operator+(const H &a, const H &b) { return H(float(a) + float(b)); } \
  inline H operator-(const H &a, const H &b) { return H(float(a) - float(b)); } \
  inline H operator*(const H &a, const H &b) { return H(float(a) * float(b)); } \
  inline H operator/(const H &a, const H &b) { return H(float(a) / float(b)); } \
  inline H operator-(const H &a) { H r; r.__x = uint16_t(a.__x ^ 0x8000u); return r; } \
  inline H &operator+=(H &a, const H &b) { return a = a + b; }                \
  inline H &operator-=(H &a, const H &b) { return a = a - b; }                \
  inline H &operator*=(H &a, const H &b) { return a = a * b; }                \
  inline H &operator/=(H &a, const H &b) { return a = a / b; }                \
  inline bool operator==(const H &a, const H &b) { return float(a) == float(b); } \
  inline bool operator!=(const H &a, const H &b) { return float(a) != float(b); } \
  inline bool operator<(const H &a, const H &b) { return float(a) < float(b); } \
  inline bool operator>(const H &a, const H &b) { return float(a) > float(b); } \
  inline bool operator<=(const H &a, const H &b) { return float(a) <= float(b); } \
  inline bool operator>=(const H &a, const H &b) { return float(a) >= float(b); } \
  inline H __hadd(H a, H b) { return a + b; }                                 \
  inline H __hsub(H a, H b) { return a - b; }                                 \
  inline H __hmul(H a, H b) { return a * b; }                                 \
  inline H __hdiv(H a, H b) { return a / b; }                                 \
  inline H __hneg(H a) { return -a; }                                         \
  inline H __habs(H a) { H r; r.__x = uint16_t(a.__x & 0x7FFFu); return r; } \
  inline H __hfma(H a, H b, H c) { return H(std::fma(float(a), float(b), float(c))); } \
  inline H __hmax(H a, H b) { return H(std::fmax(float(a), float(b))); }    \
  inline H __hmin(H a, H b) { return H(std::fmin(float(a), float(b))); }    \
  inline bool __heq(H a, H b) { return a == b; }                              \
  inline bool __hne(H a, H b) { return a != b; }                              \
  inline bool __hlt(H a, H b) { return a < b; }                               \
  inline bool __hle(H a, H b) { return a <= b; }                              \
  inline bool __hgt(H a, H b) { return a > b; }                               \
  inline bool __hge(H a, H b) { return a >= b; }                              \
  inline bool __hisnan(H a) { return std::isnan(float(a)); }                  \
  inline int __hisinf(H a) { float f = float(a); return std::isinf(f) ? (f < 0 ? -1 : 1) : 0; }

FTN_EMU_HALF_TYPE(__half, __half_raw, f32_to_f16, f16_to_f32)
FTN_EMU_HALF_TYPE(__nv_bfloat16, __nv_bfloat16_raw, f32_to_bf16, bf16_to_f32)
#undef FTN_EMU_HALF_TYPE
using half = __half;
using nv_bfloat16 = __nv_bfloat16;

struct alignas(4) __half2 {
  __half x, y;
  __half2() = default;
  constexpr __half2(__half a, __half b) : x(a), y(b) {}
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  constexpr __nv_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) : x(a), y(b) {}
};
using half2 = __half2;
using nv_bfloat162 = __nv_bfloat162;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return float(h); }
inline __half __double2half(double d) { return __half(float(d)); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return short(h.__x); }
inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
inline __half __short_as_half(short s) { return __half(__half_raw{(unsigned short)s}); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2(__half(a), __half(b)); }
inline __half2 __float22half2_rn(float2 v) { return __floats2half2_rn(v.x, v.y); }
inline __half2 __float2half2_rn(float a) { return __floats2half2_rn(a, a); }
inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
inline __half2 __half2half2(__half a) { return __half2(a, a); }
inline float2 __half22float2(__half2 v) { return make_float2(float(v.x), float(v.y)); }
inline __half __low2half(__half2 v) { return v.x; }
inline __half __high2half(__half2 v) { return v.y; }
inline float __low2float(__half2 v) { return float(v.x); }
inline float __high2float(__half2 v) { return float(v.y); }
inline __half2 __hadd2(__half2 a, __half2 b) { return __half2(a.x + b.x, a.y + b.y); }
inline __half2 __hsub2(__half2 a, __half2 b) { return __half2(a.x - b.x, a.y - b.y); }
inline __half2 __hmul2(__half2 a, __half2 b) { return __half2(a.x * b.x, a.y * b.y); }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return __half2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return float(b); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline short __bfloat16_as_short(__nv_bfloat16 b) { return short(b.__x); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  return __nv_bfloat16(__nv_bfloat16_raw{u});
}
inline __nv_bfloat16 __short_as_bfloat16(short s) {
  return __nv_bfloat16(__nv_bfloat16_raw{(unsigned short)s});
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162(__nv_bfloat16(a), __nv_bfloat16(b));
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return __floats2bfloat162_rn(a, a); }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __nv_bfloat162(a, b);
}
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162(a, a); }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return make_float2(float(v.x), float(v.y)); }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 v) { return v.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 v) { return v.y; }
inline float __low2float(__nv_bfloat162 v) { return float(v.x); }
inline float __high2float(__nv_bfloat162 v) { return float(v.y); }
inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __nv_bfloat162(a.x + b.x, a.y + b.y);
}
inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __nv_bfloat162(a.x - b.x, a.y - b.y);
}
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __nv_bfloat162(a.x * b.x, a.y * b.y);
}
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
  return __nv_bfloat162(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}

// ------------------------------------------------------------ math, bits
// fmaxf/fminf inline (the libm calls cost a call per element): a NaN
// operand yields the other, and -0 counts as less than +0 (libm leaves the
// sign of an equal pair open; IEEE 754-2019 maximumNumber/minimumNumber
// order it so, and so do the builtins Rust links in place of glibc's).
// Self-test `fmax_fmin` checks them.
namespace ftn_emu {
// Selects only, no branches, so g++ vectorises a loop of them.
inline float fmax_f32(float a, float b) {
  const float r = (a > b || b != b) ? a : b;
  return a == b ? bits_f32(f32_bits(a) & f32_bits(b)) : r;  // +0 if either is +0
}
inline float fmin_f32(float a, float b) {
  const float r = (a < b || b != b) ? a : b;
  return a == b ? bits_f32(f32_bits(a) | f32_bits(b)) : r;  // -0 if either is -0
}
// a[i] = fmax_f32(a[i], b[i]) for i < n, four or eight at a time in GCC
// vectors: the selects stay selects (unrolled, g++ turns the scalar form's
// selects into branches). Self-test `fmax_fmin` checks it against fmax_f32.
template <int W> [[gnu::always_inline]] inline void fmax_into_w(float *a, const float *b) {
  typedef float F __attribute__((vector_size(4 * W)));
  typedef int32_t I __attribute__((vector_size(4 * W)));
  F x, y;
  std::memcpy(&x, a, sizeof x);
  std::memcpy(&y, b, sizeof y);
  const F r = ((x > y) | (y != y)) ? x : y;
  const F m = (x == y) ? (F)((I)x & (I)y) : r;  // +0 if either is +0
  std::memcpy(a, &m, sizeof m);
}
[[gnu::always_inline]] inline void fmax_into(float *a, const float *b, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) fmax_into_w<8>(a + i, b + i);
  for (; i + 4 <= n; i += 4) fmax_into_w<4>(a + i, b + i);
  for (; i < n; ++i) a[i] = fmax_f32(a[i], b[i]);
}
}  // namespace ftn_emu
#define fmaxf(a, b) ::ftn_emu::fmax_f32(a, b)
#define fminf(a, b) ::ftn_emu::fmin_f32(a, b)
namespace ftn_emu {
// 2^x in fp32, the model of ex2.approx: no libm call and no branch, so g++
// vectorises a loop of them (a kernel's per-thread vector of elements).
// x = n + f, n = round(x) (1.5 * 2^23 added and taken away: round to
// nearest even for |x| < 2^22), |f| <= 1/2; 2^f by its Taylor series to
// degree 7 (truncation below 5.2e-9 relative, 0.09 ulp) in Horner form with
// fma; 2^n as two exact powers of two, so that a subnormal result is
// rounded once. x is clamped to [-150, 128] first (beyond it 2^x is 0 or
// inf either way; a NaN clamps too, and is returned at the end). Measured:
// at most 1 ulp from the exact 2^x (self-test `ex2`); PTX allows
// ex2.approx 2 ulp.
inline float ex2_f32(float x) {
  float c = x > -150.0f ? x : -150.0f;
  c = c < 128.0f ? c : 128.0f;
  const float n = (c + 12582912.0f) - 12582912.0f;
  const float f = c - n;  // exact
  float p = 1.525273365e-05f;  // (ln 2)^k / k!, k = 7 .. 1, then 1
  p = fmaf(p, f, 1.540352969e-04f);
  p = fmaf(p, f, 1.333355787e-03f);
  p = fmaf(p, f, 9.618128650e-03f);
  p = fmaf(p, f, 5.550410971e-02f);
  p = fmaf(p, f, 2.402265072e-01f);
  p = fmaf(p, f, 6.931471825e-01f);
  p = fmaf(p, f, 1.0f);
  const int k = (int)n, k1 = k >> 1, k2 = k - k1;  // each in [-75, 64]
  const float r = p * bits_f32(uint32_t(k1 + 127) << 23) * bits_f32(uint32_t(k2 + 127) << 23);
  return x != x ? x : r;
}
}  // namespace ftn_emu
// __expf as the GPU computes it: ex2.approx of the fp32 product
// x * log2(e), so with that product's rounding (|x| * 2^-24 relative).
inline float __expf(float x) { return ::ftn_emu::ex2_f32(x * 1.4426950408889634f); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }

inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }

// Byte n of the result is byte (s >> 4n) & 7 of the 8-byte value y:x (x the
// low four bytes).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long xy = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
#pragma GCC unroll 4
  for (int n = 0; n < 4; ++n) r |= (unsigned)((xy >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
  return r;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
  return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
  return ((unsigned long long)__brev(unsigned(x)) << 32) | __brev(unsigned(x >> 32));
}
inline int __mul24(int a, int b) { return (a << 8 >> 8) * (b << 8 >> 8); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xFFFFFFu) * (b & 0xFFFFFFu); }
inline int __mulhi(int a, int b) { return int((long long)a * b >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return unsigned((unsigned long long)a * b >> 32);
}
inline long long __mul64hi(long long a, long long b) { return (long long)((__int128)a * b >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)((unsigned __int128)a * b >> 64);
}

#define FTN_EMU_MINMAX(T)                                      \
  inline constexpr T min(T a, T b) { return b < a ? b : a; }   \
  inline constexpr T max(T a, T b) { return a < b ? b : a; }
FTN_EMU_MINMAX(int)
FTN_EMU_MINMAX(unsigned)
FTN_EMU_MINMAX(long)
FTN_EMU_MINMAX(unsigned long)
FTN_EMU_MINMAX(long long)
FTN_EMU_MINMAX(unsigned long long)
#undef FTN_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
// Mixed arithmetic types: the common type, as CUDA's mixed overloads do.
template <class A, class B>
  requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B> && !std::is_same_v<A, B>)
inline constexpr std::common_type_t<A, B> min(A a, B b) {
  return min(std::common_type_t<A, B>(a), std::common_type_t<A, B>(b));
}
template <class A, class B>
  requires(std::is_arithmetic_v<A> && std::is_arithmetic_v<B> && !std::is_same_v<A, B>)
inline constexpr std::common_type_t<A, B> max(A a, B b) {
  return max(std::common_type_t<A, B>(a), std::common_type_t<A, B>(b));
}

template <class T>
inline T __ldg(const T *p) { return *p; }
template <class T>
inline T __ldcg(const T *p) { return *p; }
template <class T>
inline T __ldcs(const T *p) { return *p; }
template <class T>
inline void __stcs(T *p, T v) { *p = v; }
template <class T>
inline void __stcg(T *p, T v) { *p = v; }

// ------------------------------------------------------------------ atomics
// Blocks run in parallel on several OS threads, so these are real atomics.
#define FTN_EMU_SC __ATOMIC_SEQ_CST
#define FTN_EMU_ATOMIC_INT(T)                                                        \
  inline T atomicAdd(T *a, T v) { return __atomic_fetch_add(a, v, FTN_EMU_SC); }     \
  inline T atomicSub(T *a, T v) { return __atomic_fetch_sub(a, v, FTN_EMU_SC); }     \
  inline T atomicExch(T *a, T v) { return __atomic_exchange_n(a, v, FTN_EMU_SC); }   \
  inline T atomicAnd(T *a, T v) { return __atomic_fetch_and(a, v, FTN_EMU_SC); }     \
  inline T atomicOr(T *a, T v) { return __atomic_fetch_or(a, v, FTN_EMU_SC); }       \
  inline T atomicXor(T *a, T v) { return __atomic_fetch_xor(a, v, FTN_EMU_SC); }     \
  inline T atomicCAS(T *a, T cmp, T v) {                                             \
    __atomic_compare_exchange_n(a, &cmp, v, false, FTN_EMU_SC, FTN_EMU_SC);          \
    return cmp;                                                                      \
  }                                                                                  \
  inline T atomicMax(T *a, T v) {                                                    \
    T old = __atomic_load_n(a, FTN_EMU_SC);                                          \
    while (old < v &&                                                                \
           !__atomic_compare_exchange_n(a, &old, v, true, FTN_EMU_SC, FTN_EMU_SC)) { \
    }                                                                                \
    return old;                                                                      \
  }                                                                                  \
  inline T atomicMin(T *a, T v) {                                                    \
    T old = __atomic_load_n(a, FTN_EMU_SC);                                          \
    while (v < old &&                                                                \
           !__atomic_compare_exchange_n(a, &old, v, true, FTN_EMU_SC, FTN_EMU_SC)) { \
    }                                                                                \
    return old;                                                                      \
  }
FTN_EMU_ATOMIC_INT(int)
FTN_EMU_ATOMIC_INT(unsigned int)
FTN_EMU_ATOMIC_INT(long long)
FTN_EMU_ATOMIC_INT(unsigned long long)
#undef FTN_EMU_ATOMIC_INT
inline unsigned short atomicCAS(unsigned short *a, unsigned short cmp, unsigned short v) {
  __atomic_compare_exchange_n(a, &cmp, v, false, FTN_EMU_SC, FTN_EMU_SC);
  return cmp;
}
inline float atomicAdd(float *a, float v) { return std::atomic_ref<float>(*a).fetch_add(v); }
inline double atomicAdd(double *a, double v) { return std::atomic_ref<double>(*a).fetch_add(v); }
inline float atomicExch(float *a, float v) { return std::atomic_ref<float>(*a).exchange(v); }
inline unsigned atomicInc(unsigned *a, unsigned lim) {
  unsigned old = __atomic_load_n(a, FTN_EMU_SC);
  while (!__atomic_compare_exchange_n(a, &old, old >= lim ? 0u : old + 1u, true, FTN_EMU_SC,
                                      FTN_EMU_SC)) {
  }
  return old;
}
inline unsigned atomicDec(unsigned *a, unsigned lim) {
  unsigned old = __atomic_load_n(a, FTN_EMU_SC);
  while (!__atomic_compare_exchange_n(a, &old, (old == 0 || old > lim) ? lim : old - 1u, true,
                                      FTN_EMU_SC, FTN_EMU_SC)) {
  }
  return old;
}
#define FTN_EMU_HALF_ATOMIC_ADD(H)                                            \
  inline H atomicAdd(H *a, H v) {                                             \
    unsigned short *p = reinterpret_cast<unsigned short *>(a);               \
    unsigned short old = __atomic_load_n(p, FTN_EMU_SC), nv;                  \
    do {                                                                      \
      H o; o.__x = old;                                                       \
      nv = (o + v).__x;                                                       \
    } while (!__atomic_compare_exchange_n(p, &old, nv, true, FTN_EMU_SC, FTN_EMU_SC)); \
    H r; r.__x = old;                                                         \
    return r;                                                                 \
  }
FTN_EMU_HALF_ATOMIC_ADD(__half)
FTN_EMU_HALF_ATOMIC_ADD(__nv_bfloat16)
#undef FTN_EMU_HALF_ATOMIC_ADD
#undef FTN_EMU_SC
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ------------------------------------------- block barrier, warp collectives
#define FTN_EMU_LOC std::source_location loc = std::source_location::current()
#define FTN_EMU_AT loc.file_name(), loc.line()

inline void __syncthreads(FTN_EMU_LOC) {
  ftn_emu::detail::block_barrier(ftn_emu::detail::kBarPlain, 0, FTN_EMU_AT);
}
inline int __syncthreads_count(int pred, FTN_EMU_LOC) {
  return ftn_emu::detail::block_barrier(ftn_emu::detail::kBarCount, pred != 0, FTN_EMU_AT);
}
inline int __syncthreads_and(int pred, FTN_EMU_LOC) {
  return ftn_emu::detail::block_barrier(ftn_emu::detail::kBarAnd, pred != 0, FTN_EMU_AT);
}
inline int __syncthreads_or(int pred, FTN_EMU_LOC) {
  return ftn_emu::detail::block_barrier(ftn_emu::detail::kBarOr, pred != 0, FTN_EMU_AT);
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu, FTN_EMU_LOC) {
  ftn_emu::detail::warp_op(ftn_emu::detail::kSyncWarp, mask, 0, 0, 32, FTN_EMU_AT);
}
// Not modelled: which lanes a GPU happens to have converged. Every lane of the
// warp that has not exited must reach the same __activemask() call (then it
// returns those lanes); a diverged call fails the launch (warp.cpp).
inline unsigned __activemask(FTN_EMU_LOC) { return ftn_emu::detail::active_mask(FTN_EMU_AT); }
inline unsigned __ballot_sync(unsigned mask, int pred, FTN_EMU_LOC) {
  return unsigned(
      ftn_emu::detail::warp_op(ftn_emu::detail::kBallot, mask, pred != 0, 0, 32, FTN_EMU_AT));
}
inline int __any_sync(unsigned mask, int pred, FTN_EMU_LOC) {
  return int(ftn_emu::detail::warp_op(ftn_emu::detail::kAny, mask, pred != 0, 0, 32, FTN_EMU_AT));
}
inline int __all_sync(unsigned mask, int pred, FTN_EMU_LOC) {
  return int(ftn_emu::detail::warp_op(ftn_emu::detail::kAll, mask, pred != 0, 0, 32, FTN_EMU_AT));
}

#define FTN_EMU_SHFL(fn, op, ArgT)                                                     \
  template <class T>                                                                   \
  inline T fn(unsigned mask, T var, ArgT arg, int width = 32, FTN_EMU_LOC) {           \
    return ftn_emu::detail::from_bits<T>(ftn_emu::detail::warp_op(                     \
        ftn_emu::detail::op, mask, ftn_emu::detail::to_bits(var), int(arg), width,     \
        FTN_EMU_AT));                                                                  \
  }
FTN_EMU_SHFL(__shfl_sync, kShflIdx, int)
FTN_EMU_SHFL(__shfl_up_sync, kShflUp, unsigned)
FTN_EMU_SHFL(__shfl_down_sync, kShflDown, unsigned)
FTN_EMU_SHFL(__shfl_xor_sync, kShflXor, int)
#undef FTN_EMU_SHFL

// sm_80 warp reductions over 32-bit integers.
#define FTN_EMU_REDUCE(fn, op, T)                                                      \
  inline T fn(unsigned mask, T v, FTN_EMU_LOC) {                                       \
    return T(ftn_emu::detail::warp_op(ftn_emu::detail::op, mask,                       \
                                      std::is_signed_v<T> ? uint64_t(int64_t(v))       \
                                                          : uint64_t(v),               \
                                      std::is_signed_v<T>, 32, FTN_EMU_AT));           \
  }
FTN_EMU_REDUCE(__reduce_add_sync, kReduceAdd, unsigned)
FTN_EMU_REDUCE(__reduce_add_sync, kReduceAdd, int)
FTN_EMU_REDUCE(__reduce_min_sync, kReduceMin, unsigned)
FTN_EMU_REDUCE(__reduce_min_sync, kReduceMin, int)
FTN_EMU_REDUCE(__reduce_max_sync, kReduceMax, unsigned)
FTN_EMU_REDUCE(__reduce_max_sync, kReduceMax, int)
FTN_EMU_REDUCE(__reduce_and_sync, kReduceAnd, unsigned)
FTN_EMU_REDUCE(__reduce_or_sync, kReduceOr, unsigned)
FTN_EMU_REDUCE(__reduce_xor_sync, kReduceXor, unsigned)
#undef FTN_EMU_REDUCE
#undef FTN_EMU_LOC
#undef FTN_EMU_AT

// ------------------------------- warp collectives for the tensor-core helpers
// cuda/mma.cuh calls these under the emulator; mma_emu.cpp implements them
// following the PTX ISA fragment layouts.
namespace ftn_emu {
namespace detail {
// One rendezvous of the lanes in `mask`: each lane deposits `lane_data` (a
// pointer to its own inputs and outputs); the last lane to arrive calls
// fn(mask, data), where data[l] is lane l's pointer (nullptr outside the
// mask), while the others are parked, then every lane resumes. Lanes that
// meet must pass the same fn.
using WarpCollectiveFn = void (*)(unsigned mask, void *const *lane_data);
void warp_collective(unsigned mask, WarpCollectiveFn fn, void *lane_data, const char *file,
                     unsigned line);
}  // namespace detail
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (full warp).
// Operands are registers (no addresses to check).
void mma_m16n8k16(bool bf16, float *d, const uint32_t *a, const uint32_t *b, const float *c,
                  const char *file, unsigned line);
// ftn_group_allreduce_n (cuda/reduce.cuh) in one rendezvous instead of
// log2(width) shuffles per value: in each aligned group of `width` lanes (a
// power of two <= 32), the xor butterfly of each of the n <= 4 values v[i],
// lane l combining op(own value, lane l ^ off's) for off = width/2, ..., 1,
// exactly as the shuffles would. `butterfly(x, width)` runs those steps on
// one value of all 32 lanes (x[l] is lane l's; reduce.cuh instantiates it
// per op). Full warp; v is updated in place.
void warp_allreduce_f32(float *v, unsigned n, unsigned width,
                        void (*butterfly)(float *x, unsigned width), const char *file,
                        unsigned line);
// A warp tile of mma.sync ops, in place: for i < mi, j < ni (i outer),
// acc[i][j] = a[i] * b[j] + acc[i][j], with acc float[mi][ni][4], a
// uint32_t[mi][4], b uint32_t[ni][2] (1 <= mi, ni <= 8). Exactly the mi * ni
// mma_m16n8k16 calls in that order; inside a batch, one recorded op.
void mma_tile_m16n8k16(bool bf16, unsigned mi, unsigned ni, float *acc, const uint32_t *a,
                       const uint32_t *b, const char *file, unsigned line);
// ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 (full warp); `row`
// is this lane's row address (lanes 8i..8i+7 give matrix i's rows). Each
// lane whose address is used checks it: 16-byte aligned, and 16 bytes inside
// the block's shared memory.
void ldmatrix(int count, bool trans, uint32_t *r, const void *row, const char *file,
              unsigned line);
// n ldmatrix.x4[.trans] in a row (1 <= n <= 8): the i-th reads this lane's
// row at row0 + i * step_bytes into r[4i .. 4i + 4). The same as n ldmatrix
// calls, with the same checks on every address; inside a batch, one
// recorded op.
void ldmatrix_x4_seq(unsigned n, bool trans, uint32_t *r, const void *row0, ptrdiff_t step_bytes,
                     const char *file, unsigned line);
// The emulator's mma batch (cuda/mma.cuh ftn_mma_batch_begin/end; no-ops
// on a GPU): between begin and end, mma.sync and ldmatrix record their
// operands and return without a warp rendezvous; their destination
// registers read as NaN (0xFFFFFFFF) until the warp's next flush point --
// __syncthreads, any full-warp op, batch end -- runs them in order.
void mma_batch_begin(const char *file, unsigned line);
void mma_batch_end(const char *file, unsigned line);
// cp.async.{ca,cg}.shared.global of `size` bytes (4, 8 or 16): reads
// src_bytes (0..size) from src and zero-fills the rest of dst. dst:
// `size`-aligned, in the block's shared memory; src (when src_bytes > 0):
// `size`-aligned, not in shared memory. Outside strict mode the copy is
// done at once; in strict mode (cp_async.cpp) it lands at the
// cp.async.wait_group that covers it, and dst reads as poison until then.
void cp_async(void *dst, const void *src, int size, int src_bytes, const char *file,
              unsigned line);
// cp.async.commit_group / cp.async.wait_group n (this thread's copies).
void cp_async_commit();
void cp_async_wait(int n, const char *file, unsigned line);
}  // namespace ftn_emu

#endif  // FTN_CUDA_EMU_H
