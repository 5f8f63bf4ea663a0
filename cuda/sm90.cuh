// Hopper (sm_90a) asynchronous building blocks: wgmma.mma_async from
// shared-memory matrix descriptors, mbarrier, TMA tile loads
// (cp.async.bulk.tensor), fence.proxy.async and setmaxnreg.
//
// Under nvcc these are inline PTX, emitted only for sm_90a (__CUDA_ARCH__ >=
// 900 with the `a` features); other targets get a trap (kernels using them
// are built for sm_90a only). Under the CPU emulator they call
// cuda/emu/hopper.cpp, which models their asynchrony and checks their rules
// (cuda/emu/README.md, "Hopper asynchronous instructions").
//
//   ftn_wgmma_desc(smem, lbo, sbo, swizzle)      64-bit matrix descriptor
//   FtnWgmmaAcc<N> acc                           N/2 fp32 registers per thread
//   ftn_wgmma<N, T, TA, TB, SA, SB>(acc, da, db, scale_d)
//       m64nNk16: acc = A(64x16) * B(16xN) (+ acc if scale_d), warpgroup-wide
//   ftn_wgmma_fence(), ftn_wgmma_commit(), ftn_wgmma_wait<K>()
//   ftn_mbar_init / _arrive / _arrive_expect_tx / _try_wait_parity / _wait
//   ftn_tma_load_2d(smem, tmap, x, y, bar)       completes bytes on bar
//   ftn_tma_load_3d(smem, tmap, x, y, z, bar)    the same for a rank-3 map
//   ftn_fence_proxy_async(), ftn_setmaxnreg_inc<R>() / _dec<R>()
#ifndef FTN_SM90_CUH
#define FTN_SM90_CUH

#include "ftn_kernel.cuh"

// Descriptor swizzle modes (bits 62-63 of a wgmma matrix descriptor).
enum : uint32_t {
  FTN_WGMMA_SWIZZLE_NONE = 0,
  FTN_WGMMA_SWIZZLE_128B = 1,
  FTN_WGMMA_SWIZZLE_64B = 2,
  FTN_WGMMA_SWIZZLE_32B = 3
};

// A shared-memory matrix descriptor from a shared-window address: start
// address, leading and stride byte offsets (all >> 4, 14 bits each), base
// offset 0, swizzle mode.
FTN_DEVICE uint64_t ftn_wgmma_desc_from_addr(uint32_t addr, uint32_t lbo, uint32_t sbo,
                                             uint32_t swizzle) {
  return uint64_t((addr & 0x3FFFF) >> 4) | uint64_t((lbo & 0x3FFFF) >> 4) << 16 |
         uint64_t((sbo & 0x3FFFF) >> 4) << 32 | uint64_t(swizzle & 3) << 62;
}

template <typename T> struct FtnWgmmaIsBf16;
template <> struct FtnWgmmaIsBf16<__half> { static constexpr bool value = false; };
template <> struct FtnWgmmaIsBf16<__nv_bfloat16> { static constexpr bool value = true; };

#if defined(__CUDACC__)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FTN_SM90_PTX 1
#include "sm90_wgmma_ptx.cuh"
#endif

FTN_DEVICE uint32_t ftn_sm90_smem(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
FTN_DEVICE uint64_t ftn_wgmma_desc(const void *smem, uint32_t lbo, uint32_t sbo,
                                   uint32_t swizzle) {
  return ftn_wgmma_desc_from_addr(ftn_sm90_smem(smem), lbo, sbo, swizzle);
}

template <int N>
struct FtnWgmmaAcc {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma N is a multiple of 8 in [8, 256]");
  float v[N / 2];
  FTN_DEVICE float &operator[](int i) { return v[i]; }
  FTN_DEVICE float operator[](int i) const { return v[i]; }
};

#ifdef FTN_SM90_PTX
template <int N, typename T, int TA, int TB, int SA, int SB>
FTN_DEVICE void ftn_wgmma_ptx(float *d, uint64_t da, uint64_t db, int sd) {
  static_assert(FtnWgmmaIsBf16<T>::value || !FtnWgmmaIsBf16<T>::value);
#define X(n)                                                                      \
  if constexpr (N == n) {                                                         \
    if constexpr (FtnWgmmaIsBf16<T>::value) {                                     \
      FTN_WGMMA_PTX_##n("bf16", d, da, db, sd, SA, SB, TA, TB);                   \
    } else {                                                                      \
      FTN_WGMMA_PTX_##n("f16", d, da, db, sd, SA, SB, TA, TB);                    \
    }                                                                             \
    return;                                                                       \
  }
  FTN_WGMMA_NS
#undef X
  __trap();  // an N without generated PTX (cuda/gen_sm90_wgmma.py)
}
#endif

template <int N, typename T, int TA = 0, int TB = 0, int SA = 1, int SB = 1>
FTN_DEVICE void ftn_wgmma(FtnWgmmaAcc<N> &acc, uint64_t da, uint64_t db, bool scale_d) {
#ifdef FTN_SM90_PTX
  ftn_wgmma_ptx<N, T, TA, TB, SA, SB>(acc.v, da, db, scale_d ? 1 : 0);
#else
  __trap();
#endif
}

#ifdef FTN_SM90_PTX
#define FTN_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define FTN_SM90_ASM(...) __trap()
#endif

FTN_DEVICE void ftn_wgmma_fence() { FTN_SM90_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
FTN_DEVICE void ftn_wgmma_commit() {
  FTN_SM90_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int K>
FTN_DEVICE void ftn_wgmma_wait() {
  FTN_SM90_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(K) : "memory");
}

FTN_DEVICE void ftn_mbar_init(uint64_t *bar, uint32_t count) {
  FTN_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(ftn_sm90_smem(bar)), "r"(count)
               : "memory");
}
FTN_DEVICE uint64_t ftn_mbar_arrive(uint64_t *bar) {
  uint64_t state = 0;
  FTN_SM90_ASM("mbarrier.arrive.shared::cta.b64 %0, [%1];\n"
               : "=l"(state)
               : "r"(ftn_sm90_smem(bar))
               : "memory");
  return state;
}
FTN_DEVICE uint64_t ftn_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
  uint64_t state = 0;
  FTN_SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;\n"
               : "=l"(state)
               : "r"(ftn_sm90_smem(bar)), "r"(bytes)
               : "memory");
  return state;
}
FTN_DEVICE void ftn_mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
  FTN_SM90_ASM("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(
                   ftn_sm90_smem(bar)),
               "r"(bytes)
               : "memory");
}
FTN_DEVICE bool ftn_mbar_try_wait_parity(uint64_t *bar, uint32_t parity) {
  uint32_t ok = 0;
  FTN_SM90_ASM(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(ftn_sm90_smem(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}
FTN_DEVICE bool ftn_mbar_test_wait_parity(uint64_t *bar, uint32_t parity) {
  uint32_t ok = 0;
  FTN_SM90_ASM(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(ftn_sm90_smem(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}
FTN_DEVICE void ftn_fence_proxy_async() {
  FTN_SM90_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}
template <int R>
FTN_DEVICE void ftn_setmaxnreg_inc() {
  static_assert(R % 8 == 0 && R >= 24 && R <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  FTN_SM90_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
FTN_DEVICE void ftn_setmaxnreg_dec() {
  static_assert(R % 8 == 0 && R >= 24 && R <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  FTN_SM90_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
// tmap: a __grid_constant__ CUtensorMap (or one in global memory).
FTN_DEVICE void ftn_tma_load_2d(void *smem, const void *tmap, int32_t x, int32_t y,
                                uint64_t *bar) {
  FTN_SM90_ASM(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(ftn_sm90_smem(smem)),
      "l"(tmap), "r"(x), "r"(y), "r"(ftn_sm90_smem(bar))
      : "memory");
}
FTN_DEVICE void ftn_tma_load_3d(void *smem, const void *tmap, int32_t x, int32_t y, int32_t z,
                                uint64_t *bar) {
  FTN_SM90_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(ftn_sm90_smem(smem)),
      "l"(tmap), "r"(x), "r"(y), "r"(z), "r"(ftn_sm90_smem(bar))
      : "memory");
}
#undef FTN_SM90_ASM

#else  // the CPU emulator

#include "emu/hopper_emu.h"

FTN_DEVICE uint64_t ftn_wgmma_desc(const void *smem, uint32_t lbo, uint32_t sbo,
                                   uint32_t swizzle FTN_CALLER_LOC) {
  return ftn_wgmma_desc_from_addr(
      ::ftn_emu::smem_addr(smem, 16, "wgmma descriptor start", ftn_loc.file_name(),
                           ftn_loc.line()),
      lbo, sbo, swizzle);
}

// The registers, and the emulator's record of the wgmma in flight on them:
// any access before the wgmma.wait_group that retires it fails the launch.
template <int N>
struct FtnWgmmaAcc {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma N is a multiple of 8 in [8, 256]");
  float v[N / 2];
  ::ftn_emu::WgmmaAccState st{0, ::ftn_emu::wgmma_fences(), nullptr, 0};
  float &operator[](int i) {
    if (st.op) ::ftn_emu::wgmma_acc_fail(st, i, true);
    st.touch = ::ftn_emu::wgmma_fences();
    return v[i];
  }
  float operator[](int i) const {
    if (st.op) ::ftn_emu::wgmma_acc_fail(st, i, false);
    return v[i];
  }
};

template <int N, typename T, int TA = 0, int TB = 0, int SA = 1, int SB = 1>
FTN_DEVICE void ftn_wgmma(FtnWgmmaAcc<N> &acc, uint64_t da, uint64_t db, bool scale_d
                          FTN_CALLER_LOC) {
  ::ftn_emu::wgmma(N, FtnWgmmaIsBf16<T>::value, acc.v, &acc.st, da, db, scale_d, SA, SB, TA, TB,
                   ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_wgmma_fence() { ::ftn_emu::wgmma_fence(); }
FTN_DEVICE void ftn_wgmma_commit() { ::ftn_emu::wgmma_commit(); }
template <int K>
FTN_DEVICE void ftn_wgmma_wait(std::source_location ftn_loc = std::source_location::current()) {
  ::ftn_emu::wgmma_wait(K, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_mbar_init(uint64_t *bar, uint32_t count FTN_CALLER_LOC) {
  ::ftn_emu::mbar_init(bar, count, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE uint64_t ftn_mbar_arrive(uint64_t *bar FTN_CALLER_LOC) {
  return ::ftn_emu::mbar_arrive(bar, 1, 0, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE uint64_t ftn_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes FTN_CALLER_LOC) {
  return ::ftn_emu::mbar_arrive(bar, 1, bytes, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_mbar_expect_tx(uint64_t *bar, uint32_t bytes FTN_CALLER_LOC) {
  ::ftn_emu::mbar_expect_tx(bar, bytes, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE bool ftn_mbar_try_wait_parity(uint64_t *bar, uint32_t parity FTN_CALLER_LOC) {
  return ::ftn_emu::mbar_wait_parity(bar, parity, true, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE bool ftn_mbar_test_wait_parity(uint64_t *bar, uint32_t parity FTN_CALLER_LOC) {
  return ::ftn_emu::mbar_wait_parity(bar, parity, false, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_fence_proxy_async() { ::ftn_emu::fence_proxy_async(); }
template <int R>
FTN_DEVICE void ftn_setmaxnreg_inc(std::source_location ftn_loc = std::source_location::current()) {
  ::ftn_emu::setmaxnreg(true, R, ftn_loc.file_name(), ftn_loc.line());
}
template <int R>
FTN_DEVICE void ftn_setmaxnreg_dec(std::source_location ftn_loc = std::source_location::current()) {
  ::ftn_emu::setmaxnreg(false, R, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_tma_load_2d(void *smem, const void *tmap, int32_t x, int32_t y,
                                uint64_t *bar FTN_CALLER_LOC) {
  const int32_t c[2] = {x, y};
  ::ftn_emu::tma_load(smem, tmap, c, 2, bar, ftn_loc.file_name(), ftn_loc.line());
}

FTN_DEVICE void ftn_tma_load_3d(void *smem, const void *tmap, int32_t x, int32_t y, int32_t z,
                                uint64_t *bar FTN_CALLER_LOC) {
  const int32_t c[3] = {x, y, z};
  ::ftn_emu::tma_load(smem, tmap, c, 3, bar, ftn_loc.file_name(), ftn_loc.line());
}

#endif

// Waits for the phase of `parity` to complete (try_wait may time out on a GPU).
FTN_DEVICE void ftn_mbar_wait(uint64_t *bar, uint32_t parity) {
  while (!ftn_mbar_try_wait_parity(bar, parity)) {
  }
}

#endif  // FTN_SM90_CUH
