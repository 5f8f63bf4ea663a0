// Strict mode's shared-memory race check, the CPU counterpart of
// compute-sanitizer's racecheck.
//
// Kernel sources are compiled with -fsanitize=thread (build.rs, debug builds)
// but linked WITHOUT ThreadSanitizer's runtime: the compiler's hooks
// (__tsan_read4(addr), __tsan_write_range(addr, n), the __tsan_atomic*
// family, ...) are defined here. A hook returns after one range test unless
// the address lies in the running block's shared-memory arena; then the
// access is checked against a shadow cell per byte:
//   * the barrier interval (epoch) of the last write and the writer, the
//     interval of the last read(s), the reader, whether several threads (of
//     several warps) read it;
//   * the writer's / reader's warp __syncwarp count at the access.
// A read or write of a byte another thread wrote in the same interval (or a
// write of a byte another thread read in it) is a race unless both threads
// are in one warp and a __syncwarp whose mask holds both completed after
// the first access. __syncthreads starts a new interval (epoch ids are
// unique over the process, so the shadow is never cleared). Atomics are not
// tracked (an atomic never races with an atomic). The report names both
// threads, the offset, and both source lines (addr2line on the hooks'
// return addresses; symbol+offset when addr2line is missing).
// Cost: one call and a compare per memory access of kernel code; ~48 bytes
// of shadow per byte of shared memory a block touches.
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <cstdlib>
#include <cstring>

#include "emu_internal.h"

namespace ftn_emu::detail {
namespace {

std::atomic<bool> g_hooks{false};
std::atomic<uint32_t> g_epoch{0};

struct Cell {
  uint32_t w_epoch, r_epoch;  // barrier interval of the last write / read(s)
  uint32_t w_sync, r_sync;    // the accessor's warp __syncwarp count then
  uint32_t pend_serial;       // block_serial while a cp.async is in flight to it
  uint16_t writer, reader;    // linear thread ids
  uint8_t r_many, r_multiwarp;
  const void *w_pc, *r_pc;  // code addresses of the accesses
};

// Per OS thread, grown on demand, never cleared (epochs are unique).
struct Shadow {
  Cell *cells = nullptr;
  size_t n = 0;
  ~Shadow() { std::free(cells); }
};
thread_local Shadow tl_shadow;

Cell *shadow(size_t need) {
  Shadow &s = tl_shadow;
  if (s.n < need) {
    std::free(s.cells);
    s.cells = static_cast<Cell *>(std::calloc(need, sizeof(Cell)));  // fresh pages: lazy zeros
    if (!s.cells) {
      s.n = 0;
      fail(strprintf("race check: no memory for the shadow of %zu bytes of shared memory", need));
    }
    s.n = need;
  }
  return s.cells;
}

uint32_t warp_sync_now(Worker &w, unsigned wi) {
  Warp &wp = w.warps[wi];
  if (wp.sync_epoch != w.epoch) {
    wp.sync_epoch = w.epoch;
    wp.sync_count = 0;
    wp.sync_events.clear();
  }
  return wp.sync_count;
}

// Did a __syncwarp with lanes a and b of warp wi complete after count `since`?
bool synced(Worker &w, unsigned wi, unsigned a, unsigned b, uint32_t since) {
  warp_sync_now(w, wi);
  const auto &ev = w.warps[wi].sync_events;
  for (auto it = ev.rbegin(); it != ev.rend() && it->first > since; ++it)
    if ((it->second >> a & 1u) && (it->second >> b & 1u)) return true;
  return false;
}

// ------------------------------------------------------------ reports
struct Found {
  uintptr_t pc;
  const char *file = nullptr;
  uintptr_t base = 0;
  bool hit = false;
};

int find_object(dl_phdr_info *info, size_t, void *arg) {
  Found &f = *static_cast<Found *>(arg);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) &ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (f.pc >= lo && f.pc < lo + ph.p_memsz) {
      f.file = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "/proc/self/exe";
      f.base = info->dlpi_addr;
      f.hit = true;
      return 1;
    }
  }
  return 0;
}

// "file:line" of the code at pc (inlined frames joined by " <- "), via
// addr2line; the raw address when that is not possible.
std::string where(const void *pc) {
  if (!pc) return "?";
  Found f{uintptr_t(pc) - 1};  // the call instruction, not the one after it
  dl_iterate_phdr(find_object, &f);
  std::string raw = strprintf("pc %p", pc);
  const char *sym = std::getenv("FTN_EMU_SYMBOLIZE");
  if (!f.hit || (sym && !std::strcmp(sym, "0"))) return raw;
  char exe[4096];
  if (!std::strcmp(f.file, "/proc/self/exe")) {  // addr2line's own "self" would be wrong
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return raw;
    exe[len] = '\0';
    f.file = exe;
  }
  std::string cmd = strprintf("addr2line -i -e '%s' 0x%llx 2>/dev/null", f.file,
                              (unsigned long long)(f.pc - f.base));
  FILE *pipe = popen(cmd.c_str(), "r");
  if (!pipe) return raw;
  std::string out;
  char line[512];
  while (std::fgets(line, sizeof line, pipe)) {
    std::string l(line);
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
    if (l.empty() || l.rfind("??", 0) == 0) continue;
    if (const size_t d = l.find(" (discriminator"); d != std::string::npos) l.resize(d);
    // Keep paths short: from the last "cuda/" on, where there is one.
    if (const size_t c = l.rfind("/cuda/"); c != std::string::npos) l = l.substr(c + 1);
    out += (out.empty() ? "" : " <- ") + l;
  }
  pclose(pipe);
  return out.empty() ? raw : out;
}

std::string offset_name(const Worker &w, uintptr_t off) {
  if (off < w.dyn_bytes) return strprintf("dynamic shared memory + %zu", size_t(off));
  if (off >= w.static_off) return strprintf("static shared memory + %zu", size_t(off - w.static_off));
  return strprintf("shared-memory redzone + %zu", size_t(off - w.dyn_bytes));
}

std::string tname(const Worker &w, unsigned linear) {
  const Thread &t = w.threads[linear];
  return strprintf("thread (%u,%u,%u)", t.pub.tid.x, t.pub.tid.y, t.pub.tid.z);
}

[[noreturn, gnu::cold, gnu::noinline]] void report_race(Worker &w, const char *kind,
                                                        bool write, uintptr_t off,
                                                        const void *pc, unsigned other,
                                                        const void *other_pc,
                                                        bool other_write) {
  fail(strprintf("shared-memory race (%s): %s %s %s at %s; %s %s it at %s in the same barrier "
                 "interval, with no __syncthreads (or __syncwarp naming both lanes) in between",
                 kind, tname(w, w.cur->pub.linear).c_str(), write ? "writes" : "reads",
                 offset_name(w, off).c_str(), where(pc).c_str(), tname(w, other).c_str(),
                 other_write ? "wrote" : "read", where(other_pc).c_str()));
}

[[noreturn, gnu::cold, gnu::noinline]] void report_pending(Worker &w, bool write, uintptr_t off,
                                                           const void *pc) {
  const char *addr = w.arena + off;
  std::string issuer = "a thread";
  for (const Thread &t : w.threads)
    for (const PendingCopy &c : t.pending)
      if (addr >= static_cast<const char *>(c.dst) &&
          addr < static_cast<const char *>(c.dst) + c.size)
        issuer = tname(w, t.pub.linear) + strprintf(" (cp.async at %s:%u)", c.file, c.line);
  std::string before = "the cp.async.wait_group that lands the copy " + issuer + " issued there";
  const std::string tma = tma_pending_name(w, addr);
  if (!tma.empty()) before = tma;
  fail(strprintf("%s %s %s at %s before %s (its data is not there yet on a GPU)",
                 tname(w, w.cur->pub.linear).c_str(), write ? "writes" : "reads",
                 offset_name(w, off).c_str(), where(pc).c_str(), before.c_str()));
}

void check(Worker &w, uintptr_t off, size_t n, bool write, const void *pc) {
  if (n > w.arena_size - off) n = w.arena_size - off;
  Cell *cells = shadow(w.arena_size);
  const unsigned me = w.cur->pub.linear, wi = me >> 5, lane = me & 31u;
  const uint32_t e = w.epoch, s = warp_sync_now(w, wi);
  for (size_t i = 0; i < n; ++i) {
    Cell &c = cells[off + i];
    if (c.pend_serial == w.block_serial) report_pending(w, write, off + i, pc);
    if (c.w_epoch == e && c.writer != me &&
        !((c.writer >> 5) == wi && synced(w, wi, c.writer & 31u, lane, c.w_sync)))
      report_race(w, write ? "write after write" : "read after write", write, off + i, pc,
                  c.writer, c.w_pc, true);
    if (write) {
      if (c.r_epoch == e && (c.r_many || c.reader != me) &&
          (c.r_multiwarp || (c.reader >> 5) != wi ||
           !synced(w, wi, c.reader & 31u, lane, c.r_sync)))
        report_race(w, "write after read", true, off + i, pc, c.reader, c.r_pc, false);
      c.w_epoch = e;
      c.writer = uint16_t(me);
      c.w_sync = s;
      c.w_pc = pc;
    } else {
      if (c.r_epoch != e) {
        c.r_epoch = e;
        c.r_many = c.r_multiwarp = 0;
      } else if (c.reader != me) {
        c.r_many = 1;
        if ((c.reader >> 5) != wi) c.r_multiwarp = 1;
      }
      c.reader = uint16_t(me);
      c.r_sync = s;
      c.r_pc = pc;
    }
  }
}

// ------------------------------------------------------ global memory
// Two blocks of one launch writing the same bytes without atomics. A table
// of 2^22 64-bit entries, direct-mapped by 4-byte word (index = low 22 bits
// of addr / 4, tag = the rest, so a hit is exact), shared by every worker
// and every concurrent launch: [valid:1 | tag:23 | launch slot:8 |
// block:28 | byte mask:4]. A write by block b finds its word's entry: same
// word, same launch, another block, overlapping bytes -> race; otherwise it
// takes the entry (a collision evicts: a race can be missed, never invented).
// A launch clears the entries it set when it ends. Blocks are compared mod
// 2^28; 255 launches can be checked at once (more run unchecked).
constexpr unsigned kTableBits = 22;
constexpr uint64_t kTableSize = 1ull << kTableBits;
std::atomic<uint64_t> *g_table = nullptr;
std::mutex g_table_mu;
uint64_t g_slots[4] = {1, 0, 0, 0};  // slot 0 means "unchecked": never handed out

uint64_t pack(uint64_t tag, unsigned slot, uint64_t block, unsigned mask) {
  return (1ull << 63) | (tag & 0x7FFFFFull) << 40 | uint64_t(slot & 0xFF) << 32 |
         (block & 0xFFFFFFFull) << 4 | (mask & 0xF);
}

std::string block_name(const Launch &l, uint64_t b) {
  const uint32_t *g = l.desc->grid;
  return strprintf("block (%llu,%llu,%llu)", (unsigned long long)(b % g[0]),
                   (unsigned long long)(b / g[0] % g[1]),
                   (unsigned long long)(b / (uint64_t(g[0]) * g[1])));
}

[[noreturn, gnu::cold, gnu::noinline]] void report_global(Worker &w, uintptr_t addr,
                                                          uint64_t other, const void *pc) {
  const uint64_t mine = w.block_linear & 0xFFFFFFFull;
  // The other block's index is known mod 2^28: name it exactly when the grid is smaller.
  std::string them = w.launch->nblocks <= 0xFFFFFFFull
                         ? block_name(*w.launch, other)
                         : strprintf("block #%llu (mod 2^28)", (unsigned long long)other);
  fail(strprintf("global-memory race (write after write): %s and %s both write the word at "
                 "%p in one launch without atomics (this write at %s); a GPU gives either "
                 "value, or a torn mix",
                 block_name(*w.launch, w.block_linear).c_str(), them.c_str(),
                 reinterpret_cast<void *>(addr), where(pc).c_str()));
  (void)mine;
}

void global_write(Worker &w, uintptr_t a, size_t n, const void *pc) {
  const unsigned slot = w.launch->race_slot;
  if (!slot || !g_table || n == 0) return;
  const uint64_t block = w.block_linear & 0xFFFFFFFull;
  for (uintptr_t word = a >> 2; word <= (a + n - 1) >> 2; ++word) {
    const uintptr_t lo = word << 2 > a ? word << 2 : a;
    const uintptr_t hi = (word << 2) + 4 < a + n ? (word << 2) + 4 : a + n;
    unsigned mask = 0;
    for (uintptr_t b = lo; b < hi; ++b) mask |= 1u << (b & 3);
    const uint32_t idx = uint32_t(word & (kTableSize - 1));
    const uint64_t tag = uint64_t(word) >> kTableBits;
    std::atomic<uint64_t> &e = g_table[idx];
    uint64_t cur = e.load(std::memory_order_relaxed);
    for (;;) {
      uint64_t next;
      const bool same = (cur >> 63) && ((cur >> 40) & 0x7FFFFF) == (tag & 0x7FFFFF) &&
                        ((cur >> 32) & 0xFF) == slot;
      if (same && ((cur >> 4) & 0xFFFFFFF) == block) {
        if ((cur & 0xF & mask) == mask) break;  // nothing new
        next = cur | mask;
      } else if (same && (cur & 0xF & mask)) {
        report_global(w, lo, (cur >> 4) & 0xFFFFFFF, pc);
      } else {
        next = pack(tag, slot, block, mask);
      }
      if (e.compare_exchange_weak(cur, next, std::memory_order_relaxed)) {
        if (!same) w.race_touched.push_back(idx);
        break;
      }
    }
  }
}

inline void hook(const void *p, size_t n, bool write, const void *pc) {
  Worker *w = tl_worker;
  if (!w) return;
  const uintptr_t off = uintptr_t(p) - uintptr_t(w->arena);
  if (off < w->arena_size) {
    if (w->racecheck && w->cur) check(*w, off, n, write, pc);
    return;
  }
  if (!write || !w->racecheck || !w->cur) return;
  const Stack &st = w->cur->stack;  // the thread's locals are not global memory
  if (uintptr_t(p) - uintptr_t(st.base) < st.size) return;
  global_write(*w, uintptr_t(p), n, pc);
}

}  // namespace

bool racecheck_compiled() { return g_hooks.load(std::memory_order_relaxed); }

uint32_t next_epoch() {
  uint32_t e = g_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
  return e ? e : g_epoch.fetch_add(1, std::memory_order_relaxed) + 1;  // 0 means "never"
}

void race_new_interval(Worker &w) { w.epoch = next_epoch(); }

void race_syncwarp(Worker &w, unsigned wi, unsigned mask) {
  warp_sync_now(w, wi);
  Warp &wp = w.warps[wi];
  wp.sync_events.emplace_back(++wp.sync_count, mask);
}

void race_access(Worker &w, const void *p, size_t n, bool write, const void *pc) {
  const uintptr_t off = uintptr_t(p) - uintptr_t(w.arena);
  if (off >= w.arena_size || !w.racecheck || !w.cur) return;
  check(w, off, n, write, pc);
}

void race_launch_begin(Launch &l) {
  l.race_slot = 0;
  if (!l.strict || !racecheck_compiled()) return;
  std::lock_guard<std::mutex> lock(g_table_mu);
  if (!g_table) {
    g_table = static_cast<std::atomic<uint64_t> *>(
        std::calloc(kTableSize, sizeof(std::atomic<uint64_t>)));  // lazily zeroed pages
    if (!g_table) return;
  }
  for (unsigned s = 1; s < 256; ++s)
    if (!(g_slots[s / 64] >> (s % 64) & 1)) {
      g_slots[s / 64] |= 1ull << (s % 64);
      l.race_slot = s;
      return;
    }
}

void race_launch_end(Launch &l) {
  if (!l.race_slot) return;
  for (uint32_t idx : l.race_touched) {
    uint64_t cur = g_table[idx].load(std::memory_order_relaxed);
    while ((cur >> 63) && ((cur >> 32) & 0xFF) == l.race_slot &&
           !g_table[idx].compare_exchange_weak(cur, 0, std::memory_order_relaxed)) {
    }
  }
  l.race_touched.clear();
  std::lock_guard<std::mutex> lock(g_table_mu);
  g_slots[l.race_slot / 64] &= ~(1ull << (l.race_slot % 64));
  l.race_slot = 0;
}

void race_mark_pending(Worker &w, const void *p, size_t n, bool pending) {
  const uintptr_t off = uintptr_t(p) - uintptr_t(w.arena);
  if (off >= w.arena_size || !w.racecheck) return;
  if (n > w.arena_size - off) n = w.arena_size - off;
  Cell *cells = shadow(w.arena_size);
  for (size_t i = 0; i < n; ++i) cells[off + i].pend_serial = pending ? w.block_serial : 0;
}

}  // namespace ftn_emu::detail

// ------------------------------------------------------------------ hooks
// The entry points -fsanitize=thread code calls (GCC and Clang agree on
// these names and signatures). Memory orders are ignored: every atomic is
// sequentially consistent here.
using ftn_emu::detail::hook;
#define FTN_RA __builtin_return_address(0)
#define FTN_TSAN_RW(n)                                                                      \
  void __tsan_read##n(void *p) { hook(p, n, false, FTN_RA); }                               \
  void __tsan_write##n(void *p) { hook(p, n, true, FTN_RA); }                               \
  void __tsan_unaligned_read##n(void *p) { hook(p, n, false, FTN_RA); }                     \
  void __tsan_unaligned_write##n(void *p) { hook(p, n, true, FTN_RA); }                     \
  void __tsan_volatile_read##n(void *p) { hook(p, n, false, FTN_RA); }                      \
  void __tsan_volatile_write##n(void *p) { hook(p, n, true, FTN_RA); }                      \
  void __tsan_read##n##_pc(void *p, void *pc) { hook(p, n, false, pc); }                    \
  void __tsan_write##n##_pc(void *p, void *pc) { hook(p, n, true, pc); }

#define FTN_TSAN_ATOMIC(bits, T)                                                            \
  T __tsan_atomic##bits##_load(const volatile T *a, int) {                                  \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                            \
  }                                                                                         \
  void __tsan_atomic##bits##_store(volatile T *a, T v, int) {                               \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                               \
  }                                                                                         \
  T __tsan_atomic##bits##_exchange(volatile T *a, T v, int) {                               \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                     \
  }                                                                                         \
  T __tsan_atomic##bits##_fetch_add(volatile T *a, T v, int) {                              \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                      \
  }                                                                                         \
  T __tsan_atomic##bits##_fetch_sub(volatile T *a, T v, int) {                              \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                      \
  }                                                                                         \
  T __tsan_atomic##bits##_fetch_and(volatile T *a, T v, int) {                              \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                      \
  }                                                                                         \
  T __tsan_atomic##bits##_fetch_or(volatile T *a, T v, int) {                               \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                       \
  }                                                                                         \
  T __tsan_atomic##bits##_fetch_xor(volatile T *a, T v, int) {                              \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                      \
  }                                                                                         \
  T __tsan_atomic##bits##_fetch_nand(volatile T *a, T v, int) {                             \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                     \
  }                                                                                         \
  int __tsan_atomic##bits##_compare_exchange_strong(volatile T *a, T *c, T v, int, int) {   \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
  }                                                                                         \
  int __tsan_atomic##bits##_compare_exchange_weak(volatile T *a, T *c, T v, int, int) {     \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);  \
  }                                                                                         \
  T __tsan_atomic##bits##_compare_exchange_val(volatile T *a, T c, T v, int, int) {         \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);       \
    return c;                                                                               \
  }

extern "C" {
void __tsan_init() { ftn_emu::detail::g_hooks.store(true, std::memory_order_relaxed); }
void __tsan_func_entry(void *) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void **, void *) {}
void __tsan_vptr_read(void **) {}
void __tsan_read_range(void *p, unsigned long n) { hook(p, n, false, FTN_RA); }
void __tsan_write_range(void *p, unsigned long n) { hook(p, n, true, FTN_RA); }
FTN_TSAN_RW(1)
FTN_TSAN_RW(2)
FTN_TSAN_RW(4)
FTN_TSAN_RW(8)
FTN_TSAN_RW(16)
FTN_TSAN_ATOMIC(8, char)
FTN_TSAN_ATOMIC(16, short)
FTN_TSAN_ATOMIC(32, int)
FTN_TSAN_ATOMIC(64, long)
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
}
