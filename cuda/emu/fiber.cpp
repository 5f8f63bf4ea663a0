// Fibers for the emulator: the register-saving context switch (x86-64 and
// aarch64, as top-level asm), fiber stacks from mmap with a guard page, a
// global pool that reuses them, and the AddressSanitizer fiber annotations
// around every switch.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "emu_internal.h"

#ifdef FTN_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// void ftn_emu_ctx_switch(void **save_sp, void *new_sp): pushes the
// callee-saved registers on the current stack, stores the stack pointer in
// *save_sp, loads new_sp and pops the same frame there. The floating-point
// control state (MXCSR and the x87 control word; FPCR on aarch64) is not
// switched: every fiber of a worker shares the worker's, as nothing in the
// emulator or the kernels changes rounding modes (loading MXCSR/FPCR on each
// switch cost more than the rest of the switch). The frame keeps a spare
// slot where it used to keep it, so the stack stays 16-byte aligned.
// ftn_emu_fiber_trampoline is where a fresh fiber's first switch "returns"
// to: it calls fn(arg) with fn/arg left in callee-saved registers by
// fiber_prepare. Its CFI marks the bottom of the fiber's call stack.
// (ftn_emu_ctx_switch is declared in emu_internal.h.)
extern "C" void ftn_emu_fiber_trampoline();

#if defined(__x86_64__)
asm(R"(
  .pushsection .text
  .globl ftn_emu_ctx_switch
  .hidden ftn_emu_ctx_switch
  .type ftn_emu_ctx_switch, @function
  .p2align 4
ftn_emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ftn_emu_ctx_switch, .-ftn_emu_ctx_switch

  .globl ftn_emu_fiber_trampoline
  .hidden ftn_emu_fiber_trampoline
  .type ftn_emu_fiber_trampoline, @function
  .p2align 4
ftn_emu_fiber_trampoline:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size ftn_emu_fiber_trampoline, .-ftn_emu_fiber_trampoline
  .popsection
)");
#elif defined(__aarch64__)
asm(R"(
  .pushsection .text
  .globl ftn_emu_ctx_switch
  .hidden ftn_emu_ctx_switch
  .type ftn_emu_ctx_switch, %function
  .p2align 4
ftn_emu_ctx_switch:
  sub sp, sp, #176
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mov x2, sp
  str x2, [x0]
  mov sp, x1
  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  add sp, sp, #176
  ret
  .size ftn_emu_ctx_switch, .-ftn_emu_ctx_switch

  .globl ftn_emu_fiber_trampoline
  .hidden ftn_emu_fiber_trampoline
  .type ftn_emu_fiber_trampoline, %function
  .p2align 4
ftn_emu_fiber_trampoline:
  .cfi_startproc
  .cfi_undefined x30
  mov x0, x19
  blr x20
  brk #0
  .cfi_endproc
  .size ftn_emu_fiber_trampoline, .-ftn_emu_fiber_trampoline
  .popsection
)");
#else
#error "ftn emulator: context switch written for x86-64 and aarch64 only"
#endif

namespace ftn_emu::detail {
namespace {

std::mutex g_pool_mu;
std::vector<Stack> *g_pool = new std::vector<Stack>();  // never freed: reachable

size_t stack_bytes() {
  static const size_t bytes = [] {
    size_t kib = 256;
#ifdef FTN_EMU_ASAN
    kib = 1024;  // instrumented frames are several times larger
#endif
    if (const char *e = std::getenv("FTN_EMU_STACK_KIB")) {
      long v = std::atol(e);
      if (v >= 64) kib = size_t(v);
    }
    return kib * 1024;
  }();
  return bytes;
}

Stack stack_map() {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t size = stack_bytes();
  void *p = mmap(nullptr, size + page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("emulator: cannot mmap a fiber stack");
  mprotect(p, page, PROT_NONE);  // guard page: an overflow faults, not corrupts
  Stack s;
  s.base = static_cast<char *>(p) + page;
  s.size = size;
  return s;
}

}  // namespace

Stack stack_acquire(Worker &w) {
  if (!w.free_stacks.empty()) {
    Stack s = w.free_stacks.back();
    w.free_stacks.pop_back();
    return s;
  }
  {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    if (!g_pool->empty()) {
      // Take a batch so a worker does not lock once per thread.
      size_t take = g_pool->size() < 64 ? g_pool->size() : 64;
      w.free_stacks.insert(w.free_stacks.end(), g_pool->end() - long(take), g_pool->end());
      g_pool->resize(g_pool->size() - take);
    }
  }
  if (!w.free_stacks.empty()) return stack_acquire(w);
  return stack_map();
}

void stacks_return(std::vector<Stack> &stacks) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_pool->insert(g_pool->end(), stacks.begin(), stacks.end());
  stacks.clear();
}

void fiber_prepare(Thread &t, void (*fn)(void *), void *arg) {
#ifdef FTN_EMU_ASAN
  // A fiber that was unwound or never returned leaves poisoned redzones.
  __asan_unpoison_memory_region(t.stack.base, t.stack.size);
#endif
  // Cache colouring: every stack is page-aligned, so without an offset the
  // hot top frames of all fibers of a block map to the same cache sets and
  // evict each other on every switch. Stagger the tops by 64-byte lines
  // (0..63 lines, by thread index).
  const uintptr_t colour = uintptr_t((t.pub.linear * 37u) % 64u) * 64u;
  uintptr_t top =
      (reinterpret_cast<uintptr_t>(t.stack.base) + t.stack.size - colour) & ~uintptr_t(15);
#if defined(__x86_64__)
  // Frame popped by ftn_emu_ctx_switch: [spare] r15 r14 r13 r12 rbx rbp ret.
  // After `ret` rsp = top - 16, 16-byte aligned, as the trampoline's call needs.
  uint64_t *sp = reinterpret_cast<uint64_t *>(top - 16 - 64);
  sp[0] = 0;                                    // spare slot
  sp[1] = 0;                                    // r15
  sp[2] = 0;                                    // r14
  sp[3] = reinterpret_cast<uint64_t>(fn);       // r13
  sp[4] = reinterpret_cast<uint64_t>(arg);      // r12
  sp[5] = 0;                                    // rbx
  sp[6] = 0;                                    // rbp: ends frame-pointer walks
  sp[7] = reinterpret_cast<uint64_t>(&ftn_emu_fiber_trampoline);
#elif defined(__aarch64__)
  uint64_t *sp = reinterpret_cast<uint64_t *>(top - 176);
  for (int i = 0; i < 22; ++i) sp[i] = 0;
  sp[0] = reinterpret_cast<uint64_t>(arg);      // x19
  sp[1] = reinterpret_cast<uint64_t>(fn);       // x20
  sp[10] = 0;                                   // x29
  sp[11] = reinterpret_cast<uint64_t>(&ftn_emu_fiber_trampoline);  // x30
#endif
  t.sp = sp;
  t.asan_fake = nullptr;
}

void switch_to_fiber(Worker &w, Thread &t) {
#ifdef FTN_EMU_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, t.stack.base, t.stack.size);
  ftn_emu_ctx_switch(&w.sched_sp, t.sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  ftn_emu_ctx_switch(&w.sched_sp, t.sp);
#endif
}

void fiber_entered(Worker &w, Thread &t) {
#ifdef FTN_EMU_ASAN
  __sanitizer_finish_switch_fiber(t.asan_fake, &w.sched_stack_bottom, &w.sched_stack_size);
#else
  (void)w;
  (void)t;
#endif
}

void switch_to_scheduler(Worker &w, Thread &t, bool exiting) {
#ifdef FTN_EMU_ASAN
  __sanitizer_start_switch_fiber(exiting ? nullptr : &t.asan_fake, w.sched_stack_bottom,
                                 w.sched_stack_size);
  ftn_emu_ctx_switch(&t.sp, w.sched_sp);
  __sanitizer_finish_switch_fiber(t.asan_fake, &w.sched_stack_bottom, &w.sched_stack_size);
#else
  (void)exiting;
  ftn_emu_ctx_switch(&t.sp, w.sched_sp);
#endif
}

}  // namespace ftn_emu::detail
