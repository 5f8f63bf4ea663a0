// The emulator's side of cuda/sm90.cuh: Hopper's asynchronous instructions
// (wgmma.mma_async, mbarrier, TMA cp.async.bulk.tensor, fence.proxy.async,
// setmaxnreg), implemented in hopper.cpp. Kernels use the ftn_* wrappers in
// cuda/sm90.cuh, never these directly. See cuda/emu/README.md, "Hopper
// asynchronous instructions".
#ifndef FTN_EMU_HOPPER_H
#define FTN_EMU_HOPPER_H

#include <cstdint>

namespace ftn_emu {

// The shared-window address of p (what cvta.to.shared gives on a GPU): its
// offset in the block's shared-memory arena, which is 1024-byte aligned.
// Fails unless [p, p + bytes) is in the block's shared memory.
uint32_t smem_addr(const void *p, uint32_t bytes, const char *what, const char *file,
                   unsigned line);

// mbarrier: a 64-bit object in shared memory (8-byte aligned); its state is
// kept by the emulator, keyed by address.
void mbar_init(uint64_t *bar, uint32_t count, const char *file, unsigned line);
// arrive (count arrivals, after adding tx expected transaction bytes);
// returns the state token (the phase it arrived in).
uint64_t mbar_arrive(uint64_t *bar, uint32_t count, uint32_t tx, const char *file,
                     unsigned line);
void mbar_expect_tx(uint64_t *bar, uint32_t tx, const char *file, unsigned line);
// try_wait.parity (blocking: waits until the phase completes, as a GPU may
// within its time limit) / test_wait.parity (non-blocking).
bool mbar_wait_parity(uint64_t *bar, uint32_t parity, bool blocking, const char *file,
                      unsigned line);
void fence_proxy_async();
void setmaxnreg(bool inc, uint32_t n, const char *file, unsigned line);

// TMA: cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes
void tma_load(void *dst, const void *tmap, const int32_t *coords, int rank, uint64_t *bar,
              const char *file, unsigned line);

// wgmma. An accumulator fragment's emulator state: the serial + 1 of the
// in-flight wgmma that writes it (0: none), and the wgmma.fence count of its
// thread when its registers were last touched.
struct WgmmaAccState {
  uint32_t op;
  uint32_t touch;
  const char *file;  // the wgmma in flight
  unsigned line;
};
uint32_t wgmma_fences();  // this thread's wgmma.fence count
[[noreturn]] void wgmma_acc_fail(const WgmmaAccState &st, int reg, bool write);
void wgmma_fence();
// d: this thread's n/2 accumulator registers of m64n{n}k16.
void wgmma(int n, bool bf16, float *d, WgmmaAccState *st, uint64_t desc_a, uint64_t desc_b,
           bool scale_d, int scale_a, int scale_b, int tnsp_a, int tnsp_b, const char *file,
           unsigned line);
void wgmma_commit();
void wgmma_wait(int n, const char *file, unsigned line);

}  // namespace ftn_emu

#endif  // FTN_EMU_HOPPER_H
