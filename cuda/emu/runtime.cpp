// ftn_emu_launch: validates a launch against the device limits, spreads the
// grid's blocks over worker OS threads, and runs each block's threads as
// fibers under a small scheduler that implements __syncthreads, detects
// deadlock, and aborts the block (unwinding every fiber) on any error.
// Also here: static/dynamic shared memory and FTN_ASSERT.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <thread>

#include "emu_internal.h"

#ifdef FTN_EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

__thread ftn_emu_thread_pub *ftn_emu_tl_thread = nullptr;
__thread ftn_emu_block_pub *ftn_emu_tl_block = nullptr;

namespace ftn_emu::detail {

__thread Worker *tl_worker = nullptr;

namespace {
constexpr size_t kRedzone = 64;
constexpr unsigned char kPoison = 0xFF;  // 0xFFFFFFFF is a NaN as a float

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

void record_error(Launch &l, const std::string &msg) {
  std::lock_guard<std::mutex> lock(l.mu);
  if (l.err.empty()) l.err = msg;
  l.failed.store(true);
}

std::string strprintf(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string thread_name(const Worker &w, const Thread &t) {
  return strprintf("thread (%u,%u,%u)", t.pub.tid.x, t.pub.tid.y, t.pub.tid.z) +
         strprintf(" of block (%u,%u,%u)", w.blk.bid.x, w.blk.bid.y, w.blk.bid.z);
}

void fail(const std::string &what) {
  Worker *w = tl_worker;
  std::string msg = "kernel '";
  msg += (w && w->launch) ? w->launch->name : "?";
  msg += "': " + what;
  if (w && w->cur) msg += " [" + thread_name(*w, *w->cur) + "]";
  throw KernelError{msg};
}

namespace {
void fiber_main(void *arg);  // a fiber's body (below)
}  // namespace

// Gives a not-started thread its stack and first frame (fiber_main), ready
// to be switched to: for the scheduler (run_fiber) and for a blocking
// thread that starts the next one itself (block_current).
void start_fiber(Worker &w, Thread &t) {
  t.stack = stack_acquire(w);
  fiber_prepare(t, fiber_main, &t);
  t.state = TState::Runnable;
}

// ------------------------------------------------------------- barrier
int block_barrier(int kind, int pred, const char *file, unsigned line) {
  Worker &w = *tl_worker;
  Thread &t = *w.cur;
  if (w.done_count > 0) {
    for (const Thread &o : w.threads)
      if (o.state == TState::Done)
        fail(strprintf("__syncthreads at %s:%u can never complete: %u of %u threads already "
                       "exited without reaching it (e.g. thread (%u,%u,%u))",
                       file, line, w.done_count, w.nthreads, o.pub.tid.x, o.pub.tid.y,
                       o.pub.tid.z));
  }
  if (w.bar_count == 0) {
    w.bar_file = file;
    w.bar_line = line;
    w.bar_kind = kind;
  } else if ((kind == kBarCluster) != (w.bar_kind == kBarCluster)) {
    fail(strprintf("%s at %s:%u while %u thread(s) of the block wait at %s (%s:%u)",
                   kind == kBarCluster ? "barrier.cluster" : "__syncthreads", file, line,
                   w.bar_count, w.bar_kind == kBarCluster ? "barrier.cluster" : "__syncthreads",
                   w.bar_file, w.bar_line));
  }
  ++w.bar_count;
  w.bar_acc += pred;
  if (w.bar_count == w.nthreads) {  // last to arrive: release everyone
    // barrier.cluster: every block of the cluster, too.
    if (kind == kBarCluster && w.cluster) cluster_barrier_wait(w, file, line);
    w.bar_result = w.bar_acc;
    w.bar_count = 0;
    w.bar_acc = 0;
    if (w.racecheck) race_new_interval(w);  // accesses after this are ordered after those before
    for (unsigned wi = 0; wi < w.warps.size(); ++wi) mma_batch_flush(w, wi);
    for (Thread &o : w.threads)
      if (o.state == TState::WaitBarrier) o.state = TState::Runnable;
  } else {
    t.state = TState::WaitBarrier;
    t.wait_file = file;
    t.wait_line = line;
    block_current(w, t);
  }
  switch (kind) {
    case kBarCount: return w.bar_result;
    case kBarAnd: return w.bar_result == int(w.nthreads);
    case kBarOr: return w.bar_result > 0;
    default: return 0;
  }
}

}  // namespace ftn_emu::detail

namespace ftn_emu {
using namespace detail;

void *dynamic_shared() { return tl_worker->arena; }

void *static_shared_alloc(const void *site, size_t bytes, size_t align) {
  Worker &w = *tl_worker;
  for (auto &s : w.smem_sites)
    if (s.first == site) return s.second;
  // First thread of this block to reach the declaration allocates it, at an
  // address aligned to max(16, alignof(T)).
  const uintptr_t region = reinterpret_cast<uintptr_t>(w.arena + w.static_off);
  size_t off = round_up(region + w.static_used, align < 16 ? 16 : align) - region;
  if (off + bytes > FTN_EMU_MAX_STATIC_SMEM)
    fail(strprintf("static shared memory of %zu bytes exceeds the %u-byte limit", off + bytes,
                   FTN_EMU_MAX_STATIC_SMEM));
  if (w.dyn_bytes + off + bytes > FTN_EMU_MAX_SMEM_PER_BLOCK)
    fail(strprintf("shared memory %zu static + %zu dynamic bytes exceeds the %u-byte limit",
                   off + bytes, w.dyn_bytes, FTN_EMU_MAX_SMEM_PER_BLOCK));
  char *p = w.arena + w.static_off + off;
#ifdef FTN_EMU_ASAN
  __asan_unpoison_memory_region(p, bytes);
#endif
  std::memset(p, kPoison, bytes);
  w.static_used = off + bytes;
  w.smem_sites.emplace_back(site, p);
  return p;
}

void assert_fail(const char *cond, const char *file, unsigned line) {
  fail(strprintf("device assertion `%s` failed at %s:%u", cond, file, line));
}

void misaligned_fail(const char *what, const void *p, size_t align, const char *file,
                     unsigned line) {
  fail(strprintf("misaligned address: %s = %p is not %zu-byte aligned at %s:%u (a GPU faults)",
                 what, p, align, file, line));
}

bool in_shared(const void *p, size_t bytes) {
  const Worker *w = tl_worker;
  return w != nullptr && shared_contains(*w, p, bytes);
}

bool overlaps_shared(const void *p, size_t bytes) {
  const Worker *w = tl_worker;
  return w != nullptr && shared_overlaps(*w, p, bytes);
}

void launch_bounds_fail(unsigned max_threads, const char *text) {
  const dim3 &b = ftn_emu_tl_block->bdim;
  fail(strprintf("launch with blockDim (%u,%u,%u) = %u threads exceeds __launch_bounds__(%s) = %u",
                 b.x, b.y, b.z, b.x * b.y * b.z, text, max_threads));
}
}  // namespace ftn_emu

namespace ftn_emu::detail {
namespace {

// ------------------------------------------------------------- fibers
// The body of a fiber: runs its thread's kernel, then hands the worker to
// the thread block_current would pick (next_runnable: the next lane of the
// same warp that can run, else the next thread in the schedule's order after
// the warp) without going back to the scheduler. One not started yet runs
// on the same stack, as a finished thread's stack is reused at once anyway
// (a kernel without synchronisation runs its block in one fiber); one parked
// in a warp op or released by a barrier is switched to directly, after the
// finished stack goes back to the free list (nothing touches it after the
// switch; the next start_fiber may reuse it). Lanes of a warp thus finish
// one after another while their stacks are hot, instead of each going back
// through the scheduler after every other warp has run. No next thread (or
// aborting, or ASan): back to the scheduler, which frees the last stack.
void fiber_main(void *arg) {
  Thread *tp = static_cast<Thread *>(arg);
  Worker &w = *tl_worker;
  fiber_entered(w, *tp);
  for (;;) {
    Thread &t = *tp;
    try {
      w.launch->desc->entry(w.launch->desc->params);
      mma_batch_exit_check(w, t);
      warp_lane_exited(w, t);
      if (w.bar_count > 0)
        fail(strprintf("exited while %u of %u threads wait at __syncthreads (%s:%u); that "
                       "barrier can never complete",
                       w.bar_count, w.nthreads, w.bar_file, w.bar_line));
    } catch (const Unwind &) {
    } catch (const KernelError &e) {
      record_error(*w.launch, e.msg);
      w.aborting = true;
    } catch (const std::exception &e) {
      record_error(*w.launch, strprintf("kernel '%s': uncaught C++ exception: %s [%s]",
                                        w.launch->name, e.what(), thread_name(w, t).c_str()));
      w.aborting = true;
    } catch (...) {
      record_error(*w.launch, strprintf("kernel '%s': uncaught C++ exception [%s]",
                                        w.launch->name, thread_name(w, t).c_str()));
      w.aborting = true;
    }
    t.state = TState::Done;
    ++w.done_count;
    Thread *next =
        w.launch->failed.load(std::memory_order_relaxed) ? nullptr : next_runnable(w, t);
    if (!next) break;
    w.cur = next;
    ftn_emu_tl_thread = &next->pub;
    if (next->state == TState::Runnable) {
      w.free_stacks.push_back(t.stack);
      t.stack = Stack{};
      switch_fiber_to_fiber(t, *next);
      __builtin_unreachable();  // a finished thread is never switched back to
    }
    next->stack = t.stack;
    t.stack = Stack{};
    next->state = TState::Runnable;
    tp = next;
  }
  switch_to_scheduler(w, *tp, true);
  __builtin_unreachable();
}

// Runs t until control comes back to the scheduler, possibly from a later
// fiber t handed over to (block_current); returns that last fiber's index.
unsigned run_fiber(Worker &w, Thread &t) {
  if (t.state == TState::NotStarted) start_fiber(w, t);
  t.state = TState::Runnable;
  w.cur = &t;
  ftn_emu_tl_thread = &t.pub;
  switch_to_fiber(w, t);
  Thread &last = *w.cur;
  w.cur = nullptr;
  ftn_emu_tl_thread = nullptr;
  if (last.state == TState::Done) {
    w.free_stacks.push_back(last.stack);
    last.stack = Stack{};
  }
  return last.pub.linear;
}

std::string describe_deadlock(const Worker &w) {
  struct Group {
    TState st;
    int op;
    unsigned mask;
    const char *file;
    unsigned line;
    unsigned count;
    const Thread *first;
  };
  std::vector<Group> groups;
  for (const Thread &t : w.threads) {
    if (t.state != TState::WaitBarrier && t.state != TState::WaitWarp &&
        t.state != TState::WaitAsync)
      continue;
    int op = t.state == TState::WaitWarp ? t.wait_op : -1;
    unsigned mask = t.state == TState::WaitWarp ? t.wait_mask : 0;
    bool found = false;
    for (Group &g : groups)
      if (g.st == t.state && g.op == op && g.mask == mask && g.line == t.wait_line &&
          g.file == t.wait_file) {
        ++g.count;
        found = true;
        break;
      }
    if (!found) groups.push_back({t.state, op, mask, t.wait_file, t.wait_line, 1, &t});
  }
  std::string msg = strprintf("deadlock in block (%u,%u,%u): no thread can run;", w.blk.bid.x,
                              w.blk.bid.y, w.blk.bid.z);
  for (size_t i = 0; i < groups.size() && i < 8; ++i) {
    const Group &g = groups[i];
    std::string what = g.st == TState::WaitBarrier ? std::string("__syncthreads")
                       : g.st == TState::WaitAsync
                           ? std::string("an mbarrier wait or wgmma.wait_group")
                           : strprintf("%s(mask=0x%08x)", warp_op_name(g.op), g.mask);
    msg += strprintf(" %u thread(s) wait at %s (%s:%u), e.g. thread (%u,%u,%u);", g.count,
                     what.c_str(), g.file, g.line, g.first->pub.tid.x, g.first->pub.tid.y,
                     g.first->pub.tid.z);
  }
  if (w.done_count) msg += strprintf(" %u thread(s) exited", w.done_count);
  return msg;
}

void setup_launch(Worker &w, Launch &l) {
  const ftn_emu_launch_desc &d = *l.desc;
  w.launch = &l;
  w.nthreads = l.nthreads;
  w.strict = l.strict;
  w.racecheck = l.strict && racecheck_compiled();
  w.launch_schedule = l.schedule;
  w.launch_seed = l.seed;
  w.blk.bdim = dim3(d.block[0], d.block[1], d.block[2]);
  w.blk.gdim = dim3(d.grid[0], d.grid[1], d.grid[2]);
  w.threads.assign(w.nthreads, Thread{});
  for (unsigned i = 0; i < w.nthreads; ++i) {
    Thread &t = w.threads[i];
    t.pub.linear = i;
    t.pub.tid.x = i % d.block[0];
    t.pub.tid.y = (i / d.block[0]) % d.block[1];
    t.pub.tid.z = i / (d.block[0] * d.block[1]);
  }
  w.warps.clear();
  w.warps.resize((w.nthreads + 31) / 32);
  for (size_t i = 0; i < w.warps.size(); ++i) {
    unsigned lanes = w.nthreads - unsigned(i) * 32;
    w.warps[i].existing = lanes >= 32 ? 0xFFFFFFFFu : ((1u << lanes) - 1u);
  }
  w.dyn_bytes = d.dynamic_smem_bytes;
  w.static_off = round_up(w.dyn_bytes, 64) + kRedzone;
  w.arena_size = w.static_off + FTN_EMU_MAX_STATIC_SMEM + kRedzone;
  w.arena = static_cast<char *>(::operator new(w.arena_size, std::align_val_t(1024)));
}

void teardown_launch(Worker &w) {
#ifdef FTN_EMU_ASAN
  __asan_unpoison_memory_region(w.arena, w.arena_size);
#endif
  ::operator delete(w.arena, std::align_val_t(1024));
  hopper_free(w.hopper);
  w.hopper = nullptr;
  w.arena = nullptr;
  stacks_return(w.free_stacks);
}

}  // namespace

void run_block(Worker &w, uint64_t b) {
  const ftn_emu_launch_desc &d = *w.launch->desc;
  w.blk.bid.x = unsigned(b % d.grid[0]);
  w.blk.bid.y = unsigned((b / d.grid[0]) % d.grid[1]);
  w.blk.bid.z = unsigned(b / (uint64_t(d.grid[0]) * d.grid[1]));
  w.block_linear = b;
  for (Thread &t : w.threads) {
    t.state = TState::NotStarted;
    t.in_mma_batch = false;
    cp_async_drop(t);
    t.wg_fences = t.wg_issued = t.wg_groups = t.spins = 0;
    t.wg_pending.clear();
    t.mbar_seen.clear();
  }
  hopper_block_reset(w.hopper);
  schedule_block(w, b);
  w.epoch = w.block_serial = next_epoch();
  for (Warp &wp : w.warps) {
    wp.exited = 0;
    wp.nslots = 0;
    batch_reset(wp);
  }
  w.done_count = w.bar_count = 0;
  w.bar_acc = w.bar_result = 0;
  w.aborting = false;
  // Shared memory: dynamic part poisoned now, static parts when declared.
  w.smem_sites.clear();
  w.static_used = 0;
#ifdef FTN_EMU_ASAN
  __asan_unpoison_memory_region(w.arena, w.dyn_bytes);
  __asan_poison_memory_region(w.arena + w.dyn_bytes, w.arena_size - w.dyn_bytes);
#endif
  std::memset(w.arena, kPoison, w.dyn_bytes);

  const unsigned n = w.nthreads;
  try {
    for (;;) {
      if (w.launch->failed.load(std::memory_order_relaxed)) break;  // another block failed
      bool progress = false;
      for (unsigned k = 0; k < n && !w.aborting; ++k) {
        Thread &t = w.threads[w.order[k]];
        if (t.state != TState::NotStarted && t.state != TState::Runnable) continue;
        progress = true;
        k = w.rank[run_fiber(w, t)];  // the pass goes on after the last fiber that ran
      }
      if (w.aborting || w.done_count == n) break;
      // All wait, some on an mbarrier another block of the cluster completes.
      if (!progress && cluster_wait_mail(w)) continue;
      if (!progress) {
        record_error(*w.launch,
                     strprintf("kernel '%s': ", w.launch->name) + describe_deadlock(w));
        break;
      }
    }
  } catch (const KernelError &e) {  // e.g. no memory for a fiber stack
    record_error(*w.launch, e.msg);
  }
  if (w.done_count == n) return;
  // Abort: resume every suspended fiber so its wait throws Unwind.
  w.aborting = true;
  for (Thread &t : w.threads) {
    if (t.state == TState::NotStarted) {
      t.state = TState::Done;
      ++w.done_count;
    } else if (t.state != TState::Done) {
      run_fiber(w, t);
    }
  }
}

void poison_block_shared(Worker &w) {
  std::memset(w.arena, kPoison, w.dyn_bytes);
  std::memset(w.arena + w.static_off, kPoison, w.static_used);
}

void worker_main(Launch &l, ClusterGroup *cluster, unsigned rank) {
  Worker w;
  Worker *prev = tl_worker;
  ftn_emu_block_pub *prev_blk = ftn_emu_tl_block;
  ftn_emu_thread_pub *prev_thr = ftn_emu_tl_thread;
  tl_worker = &w;
  ftn_emu_tl_block = &w.blk;
  w.cluster = cluster;
  w.cluster_rank = rank;
  try {
    setup_launch(w, l);
    if (cluster) {
      cluster_blocks(w);
    } else {
      while (!l.failed.load(std::memory_order_relaxed)) {
        uint64_t b = l.next.fetch_add(1, std::memory_order_relaxed);
        if (b >= l.nblocks) break;
        run_block(w, b);
      }
    }
  } catch (const std::exception &e) {
    record_error(l, strprintf("kernel '%s': emulator error: %s", l.name, e.what()));
  }
  if (w.arena) teardown_launch(w);
  if (!w.race_touched.empty()) {
    std::lock_guard<std::mutex> lock(l.mu);
    l.race_touched.insert(l.race_touched.end(), w.race_touched.begin(), w.race_touched.end());
  }
  tl_worker = prev;
  ftn_emu_tl_block = prev_blk;
  ftn_emu_tl_thread = prev_thr;
}

namespace {
unsigned default_workers() {
  if (const char *e = std::getenv("FTN_EMU_THREADS")) {
    long v = std::atol(e);
    if (v > 0) return unsigned(v);
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? hw : 1;
}

std::string validate(const ftn_emu_launch_desc &d, const char *name) {
  const uint32_t *g = d.grid, *b = d.block;
  std::string pre = strprintf("kernel '%s': ", name);
  if (!d.entry) return pre + "launch without an entry function";
  if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2])
    return pre + strprintf("zero launch dimension: grid (%u,%u,%u), block (%u,%u,%u)", g[0],
                           g[1], g[2], b[0], b[1], b[2]);
  uint64_t threads = uint64_t(b[0]) * b[1] * b[2];
  if (threads > FTN_EMU_MAX_THREADS_PER_BLOCK)
    return pre + strprintf("block (%u,%u,%u) has %llu threads, over the limit of %u", b[0], b[1],
                           b[2], (unsigned long long)threads, FTN_EMU_MAX_THREADS_PER_BLOCK);
  if (b[0] > FTN_EMU_MAX_BLOCK_X || b[1] > FTN_EMU_MAX_BLOCK_Y || b[2] > FTN_EMU_MAX_BLOCK_Z)
    return pre + strprintf("block (%u,%u,%u) exceeds the per-dimension limits (%u,%u,%u)", b[0],
                           b[1], b[2], FTN_EMU_MAX_BLOCK_X, FTN_EMU_MAX_BLOCK_Y,
                           FTN_EMU_MAX_BLOCK_Z);
  if (g[0] > FTN_EMU_MAX_GRID_X || g[1] > FTN_EMU_MAX_GRID_YZ || g[2] > FTN_EMU_MAX_GRID_YZ)
    return pre + strprintf("grid (%u,%u,%u) exceeds the limits (%u,%u,%u)", g[0], g[1], g[2],
                           FTN_EMU_MAX_GRID_X, FTN_EMU_MAX_GRID_YZ, FTN_EMU_MAX_GRID_YZ);
  if (d.dynamic_smem_bytes > FTN_EMU_MAX_SMEM_PER_BLOCK)
    return pre + strprintf("%zu bytes of dynamic shared memory exceed the %u-byte limit",
                           d.dynamic_smem_bytes, FTN_EMU_MAX_SMEM_PER_BLOCK);
  if (d.cluster_x > FTN_EMU_MAX_CLUSTER)
    return pre + strprintf("cluster of %u blocks exceeds the portable limit of %u", d.cluster_x,
                           FTN_EMU_MAX_CLUSTER);
  if (d.cluster_x > 1 && g[0] % d.cluster_x != 0)
    return pre + strprintf("gridDim.x = %u is not a multiple of the cluster size %u", g[0],
                           d.cluster_x);
  return {};
}

void write_err(char *err, size_t len, const std::string &msg) {
  if (!err || !len) return;
  size_t n = msg.size() < len - 1 ? msg.size() : len - 1;
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

}  // namespace
}  // namespace ftn_emu::detail

extern "C" int ftn_emu_launch(const ftn_emu_launch_desc *desc, char *err, size_t err_len) {
  using namespace ftn_emu::detail;
  if (err && err_len) err[0] = '\0';
  if (!desc) {
    write_err(err, err_len, "ftn_emu_launch: null launch descriptor");
    return 1;
  }
  const char *name = desc->kernel_name ? desc->kernel_name : "?";
  try {
    std::string bad = validate(*desc, name);
    if (!bad.empty()) {
      write_err(err, err_len, bad);
      return 1;
    }
    Launch l;
    l.desc = desc;
    l.name = name;
    const StrictConfig cfg = strict_config();
    l.strict = cfg.strict;
    l.schedule = cfg.schedule;
    l.seed = cfg.seed;
    l.nblocks = uint64_t(desc->grid[0]) * desc->grid[1] * desc->grid[2];
    l.nthreads = desc->block[0] * desc->block[1] * desc->block[2];
    uint64_t nw = desc->num_workers ? desc->num_workers : default_workers();
    if (nw > l.nblocks) nw = l.nblocks;
    if (nw > 1024) nw = 1024;
    race_launch_begin(l);  // before any worker writes
    if (desc->cluster_x > 1) {
      run_cluster_launch(l);
      nw = 0;
    }
    std::vector<std::thread> pool;
    for (uint64_t i = 1; i < nw; ++i) {
      try {
        pool.emplace_back(worker_main, std::ref(l), nullptr, 0u);
      } catch (const std::exception &) {
        break;  // fewer workers than asked; the blocks still all run
      }
    }
    if (nw > 0) worker_main(l, nullptr, 0);  // the caller is worker 0 (keeps 1-worker runs debuggable)
    for (std::thread &t : pool) t.join();
    race_launch_end(l);
    if (l.failed.load()) {
      if (l.strict) {
        const std::string sched = schedule_name(cfg);
        l.err += strprintf(" [strict mode, schedule %s: replay with FTN_EMU_SCHEDULE=%s]",
                           sched.c_str(), sched.c_str());
      }
      write_err(err, err_len, l.err);
      return 1;
    }
    return 0;
  } catch (const std::exception &e) {
    write_err(err, err_len,
              ftn_emu::detail::strprintf("kernel '%s': emulator error: %s", name, e.what()));
    return 1;
  }
}
