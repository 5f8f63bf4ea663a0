// Emulator internals shared by runtime.cpp, warp.cpp and fiber.cpp; never
// included by kernels. One Worker per OS thread runs one block at a time; the
// block's threads are fibers (Thread) that the worker's scheduler loop
// switches into until each blocks (barrier, warp rendezvous) or finishes.
#ifndef FTN_EMU_INTERNAL_H
#define FTN_EMU_INTERNAL_H

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"

#if defined(__SANITIZE_ADDRESS__)
#define FTN_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FTN_EMU_ASAN 1
#endif
#endif

namespace ftn_emu::detail {

enum class TState : uint8_t { NotStarted, Runnable, WaitBarrier, WaitWarp, Done };

struct Stack {
  char *base = nullptr;  // usable [base, base + size); a guard page lies below
  size_t size = 0;
};

struct Thread {
  ftn_emu_thread_pub pub{};
  void *sp = nullptr;  // saved stack pointer while switched out
  Stack stack;
  TState state = TState::NotStarted;
  // Where it waits (for deadlock reports).
  int wait_op = 0;
  unsigned wait_mask = 0;
  const char *wait_file = nullptr;
  unsigned wait_line = 0;
  // Warp rendezvous exchange.
  uint64_t wval = 0, wresult = 0;
  int wparam = 0, wwidth = 32;
  void *asan_fake = nullptr;
};

struct WarpSlot {  // one pending warp rendezvous
  int op;
  unsigned mask, arrived;
  const char *file;
  unsigned line;
  void *aux = nullptr;  // kCollective: the WarpCollectiveFn
};

// Bytes per warp where a warp collective's lanes put their operands and find
// their results (mma_emu.cpp): the lane that completes the collective then
// reads and writes one small contiguous block instead of 32 fibers' stacks.
// Each lane writes only its own inputs, and only while it is not parked in a
// collective; the completing lane writes results while the others are parked.
constexpr size_t kWarpScratchBytes = 5120;

struct Warp {
  unsigned existing = 0;  // lanes that exist in this warp
  unsigned exited = 0;    // lanes whose thread has finished
  int nslots = 0;
  WarpSlot slots[32];
  alignas(64) unsigned char scratch[kWarpScratchBytes];
};

struct Launch {
  const ftn_emu_launch_desc *desc;
  const char *name;
  uint64_t nblocks;
  unsigned nthreads;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string err;
};

struct Worker {
  Launch *launch = nullptr;
  ftn_emu_block_pub blk{};
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  unsigned nthreads = 0, done_count = 0;
  // __syncthreads state.
  unsigned bar_count = 0;
  int bar_acc = 0, bar_result = 0;
  const char *bar_file = nullptr;
  unsigned bar_line = 0;
  bool aborting = false;  // unwind every fiber of this block
  Thread *cur = nullptr;  // running fiber, null in the scheduler
  void *sched_sp = nullptr;
  std::vector<Stack> free_stacks;
  // Shared memory arena: [dynamic | redzone | static (48 KiB) | redzone].
  char *arena = nullptr;
  size_t arena_size = 0, dyn_bytes = 0, static_off = 0, static_used = 0;
  std::vector<std::pair<const void *, void *>> smem_sites;
  // ASan bookkeeping: the scheduler's own stack.
  const void *sched_stack_bottom = nullptr;
  size_t sched_stack_size = 0;
};

extern __thread Worker *tl_worker;

// fiber.cpp
Stack stack_acquire(Worker &w);
void stacks_return(std::vector<Stack> &stacks);
void fiber_prepare(Thread &t, void (*fn)(void *), void *arg);
void switch_to_fiber(Worker &w, Thread &t);          // scheduler -> fiber
void switch_to_scheduler(Worker &w, Thread &t, bool exiting);  // fiber -> scheduler
void switch_fiber_to_fiber(Thread &from, Thread &to);  // fiber -> fiber (no ASan)
void fiber_entered(Worker &w, Thread &t);             // first thing a new fiber does

// runtime.cpp
struct Unwind {};  // thrown in fibers of an aborted block; not an error
struct KernelError {
  std::string msg;
};
[[noreturn]] void fail(const std::string &what);  // throws KernelError with context
void block_current(Worker &w, Thread &t);         // switch out; throws Unwind on abort
std::string thread_name(const Worker &w, const Thread &t);
const char *warp_op_name(int op);
std::string strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// warp.cpp
void warp_lane_exited(Worker &w, Thread &t);  // may fail: lane named in a pending op

// The calling thread's warp's scratch bytes (kWarpScratchBytes, 64-aligned).
inline unsigned char *warp_scratch() {
  return tl_worker->warps[tl_worker->cur->pub.linear >> 5].scratch;
}

}  // namespace ftn_emu::detail

#endif  // FTN_EMU_INTERNAL_H
