// Emulator internals shared by runtime.cpp, warp.cpp and fiber.cpp; never
// included by kernels. One Worker per OS thread runs one block at a time; the
// block's threads are fibers (Thread) that the worker's scheduler loop
// switches into until each blocks (barrier, warp rendezvous) or finishes.
#ifndef FTN_EMU_INTERNAL_H
#define FTN_EMU_INTERNAL_H

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <cstdint>
#include <memory>
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

// WaitAsync: in an mbarrier wait or wgmma.wait_group (hopper.cpp), runnable
// again when an mbarrier phase or a wgmma completes (it then re-checks).
enum class TState : uint8_t { NotStarted, Runnable, WaitBarrier, WaitWarp, WaitAsync, Done };

struct Stack {
  char *base = nullptr;  // usable [base, base + size); a guard page lies below
  size_t size = 0;
};

// A cp.async in flight under strict mode: its destination is poisoned until
// the cp.async.wait_group that covers its group lands `data` there.
struct PendingCopy {
  void *dst;
  unsigned char data[16];  // what lands at the wait (read at issue)
  int size;
  uint32_t group;  // 0: not committed yet; else the commit_group's number
  const char *file;
  unsigned line;
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
  // Strict mode's deferred cp.async (cp_async.cpp): copies issued and not
  // yet landed by a cp.async.wait_group, and this thread's group counter.
  std::vector<PendingCopy> pending;
  uint32_t groups_committed = 0;
  bool in_mma_batch = false;  // between ftn_mma_batch_begin and _end
  // Hopper asynchronous instructions (hopper.cpp): wgmma.fence count,
  // wgmmas issued and groups committed, this thread's wgmmas not yet
  // retired by a wgmma.wait_group (op serial, group; 0 = uncommitted), and
  // for each mbarrier it waited on the last phase it saw complete.
  uint32_t wg_fences = 0, wg_issued = 0, wg_groups = 0;
  std::vector<std::pair<uint32_t, uint32_t>> wg_pending;
  std::vector<std::pair<uint32_t, uint32_t>> mbar_seen;  // (smem offset, phase + 1)
  unsigned spins = 0;  // consecutive test_waits that found the phase incomplete
};

struct HopperBlock;  // hopper.cpp: a block's mbarriers, TMA copies and wgmma ops
void hopper_block_reset(HopperBlock *&h);  // a new block (frees with nullptr)
void hopper_free(HopperBlock *h);


// A tensor-core op a lane recorded inside an emulator mma batch
// (mma_emu.cpp, ftn_mma_batch_begin/end): executed for the whole warp at the
// next flush point. a, b, c point at the operands: at the lane's own
// registers for a result still in flight (read at the flush, after the op
// that produces it), else at a copy taken at the call in the lane's
// capture area (Warp::batch_cap); an ldmatrix's row, read at the call, is a
// copy there too (a). What the op is (BatchOp) is kept once per warp. 32
// bytes: the recorded ops of a block between two __syncthreads stay in the
// cache for the flush.
struct LaneOp {
  const void *a, *b, *c;
  void *dst;  // mma: float d[4]; ldmatrix: uint32_t r[num]
};
static_assert(sizeof(LaneOp) == 32);
// The i-th op of a warp's batch, as the first lane to record it gave it;
// the other lanes compare theirs with it.
struct BatchOp {
  uint8_t kind;   // kOpMma or kOpLdmatrix
  uint8_t param;  // mma: bf16 inputs; ldmatrix: .num
  uint8_t trans;  // ldmatrix .trans
  uint8_t lane;   // who recorded it first
  unsigned line;
  const char *file;
};
// kOpMmaTile: a warp tile of mma.sync ops (ftn_mma_tile_m16n8k16); param =
// mi << 4 | ni, trans = bf16 inputs.
// kOpLdmatrixSeq: n ldmatrix.x4 (ftn_ldmatrix_x4_seq); param = n, trans.
enum : uint8_t { kOpMma = 1, kOpLdmatrix = 2, kOpMmaTile = 3, kOpLdmatrixSeq = 4 };
constexpr unsigned kBatchCap = 64;
// 32-bit words of captured operands a lane may hold per recorded op (an mma
// capturing A, B and C: 4 + 2 + 4), on average: the capture area holds
// kBatchCap * kBatchCapWords words per lane. Every op reserves its worst
// case (Warp::batch_rw), so all lanes agree on when the area is full.
constexpr unsigned kBatchCapWords = 10;
constexpr unsigned kBatchCapTotal = kBatchCap * kBatchCapWords;

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
  // Race check: completed __syncwarp()s of the current barrier interval
  // (racecheck.cpp), as (count, mask); sync_count numbers them.
  uint32_t sync_count = 0;
  uint32_t sync_epoch = 0;
  // Tensor-core ops recorded in an mma batch: lane l's i-th is
  // batch_ops[i * 32 + l] (i < batch_n[l]; an op's 32 lanes side by side,
  // as the flush reads them: a lane-major layout put every lane's entry
  // 2 KiB apart, in the same few L1 sets), their captured operands
  // batch_cap[l * kBatchCap * kBatchCapWords ..][0 .. batch_w[l]) (both
  // allocated on first use); batch_pending is their total.
  // batch_desc[0 .. batch_nd) says what each op is; batch_bad holds the
  // first lane whose op disagreed with it (reported at the flush).
  std::unique_ptr<LaneOp[]> batch_ops;
  std::unique_ptr<uint32_t[]> batch_cap;
  std::unique_ptr<BatchOp[]> batch_desc;
  uint16_t batch_n[32] = {};
  uint16_t batch_w[32] = {};
  uint16_t batch_rw[32] = {};  // words reserved: the sum of each op's worst case
  uint32_t batch_pending = 0;
  uint32_t batch_nd = 0;
  bool batch_bad = false;
  uint32_t bad_index = 0;
  BatchOp bad_op{};
  std::vector<std::pair<uint32_t, unsigned>> sync_events;
  alignas(64) unsigned char scratch[kWarpScratchBytes];
};

// Forgets a warp's recorded tensor-core ops (after a flush; a new block).
inline void batch_reset(Warp &wp) {
  std::memset(wp.batch_n, 0, sizeof wp.batch_n);
  std::memset(wp.batch_w, 0, sizeof wp.batch_w);
  std::memset(wp.batch_rw, 0, sizeof wp.batch_rw);
  wp.batch_pending = wp.batch_nd = 0;
  wp.batch_bad = false;
}

struct Launch {
  const ftn_emu_launch_desc *desc;
  const char *name;
  uint64_t nblocks;
  unsigned nthreads;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  // Strict-mode settings, read once per launch (strict.cpp).
  bool strict = false;
  int schedule = 0;
  uint64_t seed = 0;
  std::mutex mu;
  std::string err;
  // Global-memory race check (racecheck.cpp): this launch's tag in the
  // shared write table (0: unchecked) and the table entries it wrote.
  unsigned race_slot = 0;
  std::vector<uint32_t> race_touched;
};

struct Worker;

// The blocks of one thread block cluster (cluster.cpp): they run at once,
// one Worker (OS thread) per rank, and meet at barrier.cluster through
// this; a cluster launch runs its clusters one after another.
// An st.async into another block of the cluster, queued until that
// block's own OS thread lands it (cluster.cpp: its mbarrier state is that
// thread's).
struct ClusterMail {
  uint32_t dst;  // arena offset of the destination
  uint32_t bar;  // arena offset of the mbarrier it completes bytes on
  uint32_t bytes;
  unsigned char data[16];
  const char *file;
  unsigned line;
};

struct ClusterGroup {
  explicit ClusterGroup(unsigned n)
      : size(n), members(n, nullptr), mail(n), gone(n, 0) {}
  // Block `rank` of the current cluster finished (call with mu held). The
  // only writer of gone[r] = 1, so `exited` stays its count.
  void mark_gone(unsigned rank) {
    if (!gone[rank]) ++exited;
    gone[rank] = 1;
  }
  const unsigned size;
  std::vector<Worker *> members;  // by rank, for mapa (distributed shared memory)
  std::vector<std::vector<ClusterMail>> mail;  // by destination rank
  std::vector<char> gone;                      // by rank: exited in this cluster
  unsigned mail_waiters = 0;  // blocks whose threads all wait, for mail among others
  bool stuck = false;         // no block of the cluster can go on: a deadlock
  std::mutex mu;
  std::condition_variable cv;
  unsigned arrived = 0;  // blocks whose threads all reached the current barrier.cluster
  uint64_t gen = 0;      // completed barrier.cluster of the current cluster
  unsigned exited = 0;   // the count of gone (kept by mark_gone; the wait predicates read it)
  bool aborted = false;  // one of them failed (its error is already recorded)
  uint64_t round = 0;    // clusters finished
  bool stop = false;     // the launch failed: no more clusters
  int start = 0;         // 1: every worker started; -1: give up
};

struct Worker {
  Launch *launch = nullptr;
  ClusterGroup *cluster = nullptr;  // a cluster launch's group, else null
  unsigned cluster_rank = 0;
  ftn_emu_block_pub blk{};
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  unsigned nthreads = 0, done_count = 0;
  // __syncthreads state.
  unsigned bar_count = 0;
  int bar_acc = 0, bar_result = 0;
  int bar_kind = 0;  // what the first arriver called (kBarCluster or another)
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
  // Strict mode (strict.cpp), fixed for the launch: race check on, and the
  // order threads run in between synchronisation points (order[k] is the
  // k-th thread of a scheduler pass, rank its inverse; warps stay together).
  bool strict = false, racecheck = false;
  int launch_schedule = 0;  // StrictConfig::schedule
  uint64_t launch_seed = 0;
  uint32_t epoch = 0;  // barrier interval, unique over the process (racecheck)
  uint32_t block_serial = 0;
  uint64_t block_linear = 0;             // the running block's index in the grid
  std::vector<uint32_t> race_touched;    // global write-table entries this worker set
  std::vector<unsigned> order, rank, warp_pos;  // warp_pos: where a warp starts in order
  HopperBlock *hopper = nullptr;  // allocated on first use (hopper.cpp)
  // ASan bookkeeping: the scheduler's own stack.
  const void *sched_stack_bottom = nullptr;
  size_t sched_stack_size = 0;
};

extern __thread Worker *tl_worker;

// Whether [p, p + bytes) lies in w's block's shared memory (its dynamic
// part or the static variables declared so far), and whether it touches
// the arena at all. Inline, for the per-lane checks of cp.async and
// ldmatrix (ftn_emu::in_shared / overlaps_shared are these for the
// running worker).
inline bool shared_contains(const Worker &w, const void *p, size_t bytes) {
  if (!w.arena) return false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(w.arena);
  auto within = [a, bytes](uintptr_t lo, size_t n) {
    return a >= lo && a - lo <= n && bytes <= n - (a - lo);
  };
  return within(base, w.dyn_bytes) || within(base + w.static_off, w.static_used);
}
inline bool shared_overlaps(const Worker &w, const void *p, size_t bytes) {
  if (!w.arena || bytes == 0) return false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(w.arena);
  return a < base + w.arena_size && base < a + bytes;
}

// fiber.cpp
Stack stack_acquire(Worker &w);
void stacks_return(std::vector<Stack> &stacks);
void fiber_prepare(Thread &t, void (*fn)(void *), void *arg);
void switch_to_fiber(Worker &w, Thread &t);          // scheduler -> fiber
void switch_to_scheduler(Worker &w, Thread &t, bool exiting);  // fiber -> scheduler
void fiber_entered(Worker &w, Thread &t);             // first thing a new fiber does

// runtime.cpp
struct Unwind {};  // thrown in fibers of an aborted block; not an error
struct KernelError {
  std::string msg;
};
[[noreturn]] void fail(const std::string &what);  // throws KernelError with context
std::string thread_name(const Worker &w, const Thread &t);
const char *warp_op_name(int op);
std::string strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void start_fiber(Worker &w, Thread &t);  // a stack and first frame for a NotStarted thread

}  // namespace ftn_emu::detail

// fiber.cpp (assembly, described there): saves the callee-saved registers on
// the current stack, stores the stack pointer in *save_sp, and resumes the
// fiber whose stack pointer is new_sp.
extern "C" void ftn_emu_ctx_switch(void **save_sp, void *new_sp);

namespace ftn_emu::detail {

// fiber -> fiber (no ASan bookkeeping). Inline, as the two functions below:
// a lane parks at every warp op, and each call level on that path is a frame
// on its stack and a return after it resumes.
inline void switch_fiber_to_fiber(Thread &from, Thread &to) {
  ftn_emu_ctx_switch(&from.sp, to.sp);
}

// The fiber to switch to straight from t when t blocks, or null to go back
// to the scheduler. First the next lane of t's own warp that can run
// (after t in the schedule's lane order, wrapping around): a warp keeps
// running through its warp ops with its 32 stacks hot in the cache, which
// matters for mma/ldmatrix loops. Else the thread the scheduler's pass
// would run next: the first one after t's warp in the schedule's order
// (linear order unless strict mode perturbs it, strict.cpp) that can run.
// "Can run": runnable, or not started yet (block_current gives it a stack
// and starts it, saving the round trip through the scheduler per thread
// that a block with barriers would otherwise pay). Null when there is none,
// when aborting, and under ASan.
inline Thread *next_runnable(Worker &w, const Thread &t) {
#ifdef FTN_EMU_ASAN
  (void)w;
  (void)t;
  return nullptr;  // fiber-to-fiber switches skip the ASan stack bookkeeping
#else
  if (w.aborting) return nullptr;
  auto can_run = [](const Thread &o) {
    return o.state == TState::Runnable || o.state == TState::NotStarted;
  };
  const unsigned base = t.pub.linear & ~31u;
  const unsigned lanes = w.nthreads - base < 32 ? w.nthreads - base : 32;
  const unsigned start = w.warp_pos[t.pub.linear >> 5];
  const Warp &wp = w.warps[t.pub.linear >> 5];
  if (wp.exited != wp.existing) {  // else every lane is done (the last one exiting)
    unsigned pos = w.rank[t.pub.linear] - start;
    for (unsigned i = 1; i < lanes; ++i) {
      if (++pos == lanes) pos = 0;
      Thread &o = w.threads[w.order[start + pos]];
      if (can_run(o)) return &o;
    }
  }
  for (unsigned j = start + lanes; j < w.nthreads; ++j) {
    Thread &o = w.threads[w.order[j]];
    if (can_run(o)) return &o;
  }
  return nullptr;
#endif
}

// Switches t out: straight to another started fiber when there is one to run
// (one context switch instead of two through the scheduler), else to the
// scheduler. Whoever switches back to t has set w.cur = &t.
inline void block_current(Worker &w, Thread &t) {
  if (Thread *next = next_runnable(w, t)) {
    if (next->state == TState::NotStarted) start_fiber(w, *next);
    w.cur = next;
    ftn_emu_tl_thread = &next->pub;
    switch_fiber_to_fiber(t, *next);
  } else {
    switch_to_scheduler(w, t, false);
  }
  if (w.aborting) throw Unwind{};
}

// cluster.cpp: the cross-block half of barrier.cluster, run by the last
// thread of the block to arrive (may throw: a peer exited or failed);
// a cluster launch (desc->cluster_x > 1).
void cluster_barrier_wait(Worker &w, const char *file, unsigned line);
void run_cluster_launch(Launch &l);
void cluster_blocks(Worker &w);  // worker_main's loop for rank w.cluster_rank
// Lands the st.async copies queued for this block (no-op outside a cluster).
void cluster_drain(Worker &w);
// The block's threads all wait and some wait on an mbarrier: blocks until
// mail arrives (true, landed) or the whole cluster is stuck (false).
bool cluster_wait_mail(Worker &w);
// hopper.cpp: completes `bytes` transaction bytes on this block's mbarrier
// at arena offset `off` (an st.async landing).
void mbar_complete_tx(Worker &w, uint32_t off, uint32_t bytes, const char *file, unsigned line);
bool has_async_waiters(const Worker &w);
// runtime.cpp: an OS thread's share of a launch (the blocks it takes from
// the grid; in a cluster launch, its rank of every cluster), and one block.
void worker_main(Launch &l, ClusterGroup *cluster, unsigned rank);
void run_block(Worker &w, uint64_t b);
void poison_block_shared(Worker &w);  // a finished block's shared memory
void record_error(Launch &l, const std::string &msg);

// strict.cpp: the process's strict-mode settings.
struct StrictConfig {
  bool strict;      // FTN_EMU_STRICT (default: on when the race check is compiled in)
  int schedule;     // 0 forward, 1 reverse, 2 random
  uint64_t seed;    // for random
};
StrictConfig strict_config();
std::string schedule_name(const StrictConfig &c);
// Fills w.order / w.rank for block b under the launch's schedule.
void schedule_block(Worker &w, uint64_t b);

// racecheck.cpp: shadow state of the block's shared memory.
bool racecheck_compiled();  // kernels were built with -fsanitize=thread hooks
uint32_t next_epoch();      // a fresh barrier-interval id
void race_new_interval(Worker &w);  // block start, __syncthreads completion
void race_syncwarp(Worker &w, unsigned warp_index, unsigned mask);
// An access the runtime makes for the running thread (ldmatrix reads,
// cp.async issue and landing); `pc` is the kernel code address it was
// called from (__builtin_return_address), for the report's source line.
// No-op unless w.racecheck and p is in the block's shared memory.
void race_access(Worker &w, const void *p, size_t n, bool write, const void *pc);
// Marks [p, p + n) as the destination of a cp.async in flight (or landed):
// any access to it before then fails the launch.
void race_mark_pending(Worker &w, const void *p, size_t n, bool pending);
// Global memory: a launch takes a slot in the process's write table before
// its blocks run and gives it back (clearing what its workers wrote) after.
void race_launch_begin(Launch &l);
void race_launch_end(Launch &l);

// cp_async.cpp
void cp_async_drop(Thread &t);

// hopper.cpp: where a TMA copy in flight over arena byte `addr` was issued
// ("" if none), for the race check's report of an early access.
std::string tma_pending_name(Worker &w, const char *addr);

// mma_emu.cpp: runs the warp's recorded tensor-core ops (a no-op when there
// are none). Called where every lane of the warp is parked or running the
// call: the completion of a full-warp rendezvous, of __syncthreads.
void mma_batch_flush(Worker &w, unsigned warp_index);
// A lane leaving its kernel: fails if it is still inside a batch.
void mma_batch_exit_check(Worker &w, Thread &t);  // a finished or reset thread's copies

// warp.cpp
void warp_lane_exited(Worker &w, Thread &t);  // may fail: lane named in a pending op

// The calling thread's warp's scratch bytes (kWarpScratchBytes, 64-aligned).
inline unsigned char *warp_scratch() {
  return tl_worker->warps[tl_worker->cur->pub.linear >> 5].scratch;
}

}  // namespace ftn_emu::detail

#endif  // FTN_EMU_INTERNAL_H
