// Hopper's asynchronous instructions under the emulator (cuda/sm90.cuh):
// mbarrier phases and transaction counts, TMA tile loads (deferred in strict
// mode: the destination reads as poison until a wait on the mbarrier lands
// the copy), wgmma.mma_async as a warpgroup op computed once all 128 threads
// have issued it and retired per thread by wgmma.wait_group, and the checks
// of cuda/emu/README.md, "Hopper asynchronous instructions". The layouts
// follow the PTX ISA's wgmma sections; tests/test_hopper.cu checks them
// against an independent derivation from CuTe's SM90 GMMA layouts.
#include <algorithm>
#include <cstring>
#include <deque>
#include <unordered_map>

#include "emu_internal.h"
#include "hopper_emu.h"

namespace ftn_emu::detail {

struct TmaCopy {
  char *dst;
  std::vector<unsigned char> data;  // read at issue
  uint32_t bar;                     // the mbarrier's shared address
  const char *file;
  unsigned line;
};

struct Mbar {
  uint32_t expected = 0, pending = 0;  // arrivals per phase, still due in this one
  int64_t tx = 0;                      // transaction bytes still due in this phase
  uint32_t phase = 0;                  // phases completed
  const char *file = nullptr;          // mbarrier.init
  unsigned line = 0;
};

struct WgOp {
  uint32_t serial;
  int n;
  bool bf16, scale_d;
  int sa, sb, ta, tb;
  uint64_t da, db;
  const char *file;
  unsigned line;
  unsigned issued = 0, retired = 0;
  bool done = false, checked = false;
  std::vector<float> c, d;           // [slot][n/2]
  std::vector<int64_t> chain;        // per slot: serial of the op whose D is C, or -1
  std::vector<float *> dst;          // per slot: the registers
  std::vector<ftn_emu::WgmmaAccState *> st;
  uint32_t lo = 0, hi = 0;           // shared-address range of A and B
  std::vector<unsigned char> snap;   // its bytes when the op was computed
};

struct HopperBlock {
  std::unordered_map<uint32_t, Mbar> bars;
  std::vector<TmaCopy> tma;
  std::vector<std::deque<WgOp>> wg;  // per warpgroup, ops by serial from wg_base
  std::vector<uint32_t> wg_base;
};

void hopper_block_reset(HopperBlock *&h) {
  if (!h) return;  // allocated on first use
  h->bars.clear();
  h->tma.clear();
  h->wg.clear();
  h->wg_base.clear();
}
void hopper_free(HopperBlock *h) { delete h; }

namespace {
HopperBlock &hb(Worker &w) {
  if (!w.hopper) w.hopper = new HopperBlock;
  return *w.hopper;
}

void wake_async(Worker &w) {
  for (Thread &t : w.threads)
    if (t.state == TState::WaitAsync) t.state = TState::Runnable;
}

// Parks the running thread until something async completes (it re-checks).
void wait_async(Worker &w, const char *file, unsigned line) {
  Thread &t = *w.cur;
  t.state = TState::WaitAsync;
  t.wait_file = file;
  t.wait_line = line;
  block_current(w, t);
}

uint32_t shared_off(Worker &w, const void *p) {
  return uint32_t(static_cast<const char *>(p) - w.arena);
}

Mbar &bar_at(Worker &w, const uint64_t *bar, const char *what, const char *file,
             unsigned line) {
  check_aligned(bar, 8, "mbarrier", file, line);
  if (!in_shared(bar, 8))
    fail(strprintf("%s at %s:%u: mbarrier %p is not in the block's shared memory", what, file,
                   line, static_cast<const void *>(bar)));
  auto it = hb(w).bars.find(shared_off(w, bar));
  if (it == hb(w).bars.end())
    fail(strprintf("%s at %s:%u: the mbarrier at shared address 0x%x was never initialised "
                   "(mbarrier.init) in this block",
                   what, file, line, shared_off(w, bar)));
  return it->second;
}

// Completes the phase when nothing is due.
void maybe_complete(Worker &w, Mbar &b) {
  if (b.pending != 0 || b.tx != 0) return;
  ++b.phase;
  b.pending = b.expected;
  wake_async(w);
}

}  // namespace

void mbar_complete_tx(Worker &w, uint32_t off, uint32_t bytes, const char *file, unsigned line) {
  auto it = hb(w).bars.find(off);
  if (it == hb(w).bars.end())
    fail(strprintf("st.async at %s:%u: no mbarrier at shared address 0x%x of the destination "
                   "block (mbarrier.init; and the cluster barrier after it before peers send)",
                   file, line, off));
  it->second.tx -= int64_t(bytes);
  maybe_complete(w, it->second);
}

bool has_async_waiters(const Worker &w) {
  for (const Thread &t : w.threads)
    if (t.state == TState::WaitAsync) return true;
  return false;
}

namespace {
// Lands the TMA copies that complete transactions on the mbarrier at `off`.
void land_tma(Worker &w, uint32_t off) {
  HopperBlock &h = hb(w);
  size_t keep = 0;
  std::vector<TmaCopy> landed;
  for (size_t i = 0; i < h.tma.size(); ++i) {
    if (h.tma[i].bar == off) landed.push_back(std::move(h.tma[i]));
    else if (keep++ != i) h.tma[keep - 1] = std::move(h.tma[i]);  // never a self-move
  }
  h.tma.resize(keep);
  for (TmaCopy &c : landed) {
    race_mark_pending(w, c.dst, c.data.size(), false);
    std::memcpy(c.dst, c.data.data(), c.data.size());
    auto it = h.bars.find(off);
    if (it == h.bars.end()) continue;  // re-initialised meanwhile
    it->second.tx -= int64_t(c.data.size());
    maybe_complete(w, it->second);
  }
}

// Byte address swizzle of the 32/64/128-byte modes (span bytes): the 16-byte
// chunk index (bits 4..) XOR the 128-byte row index (bits 7..), over
// log2(span / 16) bits.
uint32_t swizzle(uint32_t a, uint32_t span) {
  if (span == 0) return a;
  return a ^ (((a >> 7) & (span / 16 - 1)) << 4);
}
}  // namespace

// The emulator's 128-byte tensor map (ftn_emu_tensor_map's opaque bytes).
constexpr uint32_t kTmapMagic = 0x544D4150;  // "TMAP"
struct TMap {
  uint32_t magic;
  uint8_t dtype, rank, interleave, swz, fill, esize, pad[2];
  uint64_t addr;
  uint64_t dim[5];
  uint64_t stride[4];  // bytes, of dims 1..; dim 0 is the element size
  uint32_t box[5];
  uint8_t estride[5];
};
static_assert(sizeof(TMap) <= 128);
const uint8_t kDtypeSize[13] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
uint32_t span_bytes(int swz) { return swz == 0 ? 0 : 16u << swz; }

std::string tma_pending_name(Worker &w, const char *addr) {
  if (!w.hopper) return "";
  for (const TmaCopy &c : w.hopper->tma)
    if (addr >= c.dst && addr < c.dst + c.data.size())
      return strprintf("the mbarrier wait that completes the TMA copy (cp.async.bulk.tensor at "
                       "%s:%u) writing it",
                       c.file, c.line);
  return "";
}

}  // namespace ftn_emu::detail

namespace ftn_emu {
using namespace detail;

uint32_t smem_addr(const void *p, uint32_t bytes, const char *what, const char *file,
                   unsigned line) {
  if (!in_shared(p, bytes))
    fail(strprintf("%s at %s:%u: %p (+%u bytes) is not in the block's shared memory", what,
                   file, line, p, bytes));
  return shared_off(*tl_worker, p);
}

// ------------------------------------------------------------------ mbarrier
void mbar_init(uint64_t *bar, uint32_t count, const char *file, unsigned line) {
  Worker &w = *tl_worker;
  check_aligned(bar, 8, "mbarrier", file, line);
  if (!in_shared(bar, 8))
    fail(strprintf("mbarrier.init at %s:%u: %p is not in the block's shared memory", file, line,
                   static_cast<void *>(bar)));
  if (count < 1 || count > (1u << 20) - 1)
    fail(strprintf("mbarrier.init at %s:%u: count %u is outside [1, 2^20 - 1]", file, line,
                   count));
  Mbar &b = hb(w).bars[shared_off(w, bar)];
  b = Mbar{count, count, 0, 0, file, line};
  std::memset(bar, 0, 8);  // the object's bytes are the barrier's on a GPU
}

uint64_t mbar_arrive(uint64_t *bar, uint32_t count, uint32_t tx, const char *file,
                     unsigned line) {
  Worker &w = *tl_worker;
  Mbar &b = bar_at(w, bar, "mbarrier.arrive", file, line);
  const uint64_t token = b.phase;
  b.tx += tx;
  if (count > b.pending)
    fail(strprintf("mbarrier.arrive at %s:%u: arrive count overflow: %u arrival(s) in phase %u "
                   "where only %u of the %u (mbarrier.init at %s:%u) are still due",
                   file, line, count, b.phase, b.pending, b.expected, b.file, b.line));
  b.pending -= count;
  maybe_complete(w, b);
  return token;
}

void mbar_expect_tx(uint64_t *bar, uint32_t tx, const char *file, unsigned line) {
  Worker &w = *tl_worker;
  Mbar &b = bar_at(w, bar, "mbarrier.expect_tx", file, line);
  b.tx += tx;
}

bool mbar_wait_parity(uint64_t *bar, uint32_t parity, bool blocking, const char *file,
                      unsigned line) {
  Worker &w = *tl_worker;
  if (parity > 1)
    fail(strprintf("mbarrier wait at %s:%u: parity %u is not 0 or 1", file, line, parity));
  const uint32_t off = shared_off(w, bar);
  for (;;) {
    bar_at(w, bar, "mbarrier.try_wait.parity", file, line);
    cluster_drain(w);  // st.async from the cluster's other blocks
    land_tma(w, off);  // the copies it waits for complete (a GPU: some time after issue)
    Mbar &b = bar_at(w, bar, "mbarrier.try_wait.parity", file, line);
    Thread &t = *w.cur;
    if ((b.phase & 1u) != parity) {  // the phase of this parity has completed
      t.spins = 0;
      if (b.phase > 0) {  // phase b.phase - 1 (phase "-1" of a fresh barrier passes always)
        auto it = std::find_if(t.mbar_seen.begin(), t.mbar_seen.end(),
                               [&](const auto &e) { return e.first == off; });
        if (it != t.mbar_seen.end() && it->second == b.phase && w.strict)
          fail(strprintf("mbarrier wait at %s:%u: phase/parity mismatch: parity %u names phase "
                         "%u of the mbarrier at shared address 0x%x, which this thread already "
                         "waited for (flip the parity each round)",
                         file, line, parity, b.phase - 1, off));
        if (it != t.mbar_seen.end()) it->second = b.phase;
        else t.mbar_seen.push_back({off, b.phase});
      }
      return true;
    }
    if (blocking) {
      wait_async(w, file, line);
      continue;
    }
    if (++t.spins > (1u << 20))
      fail(strprintf("mbarrier.test_wait at %s:%u: 2^20 polls and phase %u of the mbarrier at "
                     "0x%x never completed",
                     file, line, b.phase, off));
    t.state = TState::Runnable;  // let the others run before the caller polls again
    block_current(w, t);
    return false;
  }
}

void fence_proxy_async() {}  // one proxy: generic and async accesses are ordered already

void setmaxnreg(bool inc, uint32_t n, const char *file, unsigned line) {
  if (n < 24 || n > 256 || n % 8 != 0)
    fail(strprintf("setmaxnreg.%s at %s:%u: %u registers is not a multiple of 8 in [24, 256]",
                   inc ? "inc" : "dec", file, line, n));
}

// ---------------------------------------------------------------------- TMA

void tma_load(void *dst, const void *tmap, const int32_t *coords, int rank, uint64_t *bar,
              const char *file, unsigned line) {
  Worker &w = *tl_worker;
  TMap m;
  std::memcpy(&m, tmap, sizeof m);
  if (m.magic != kTmapMagic)
    fail(strprintf("cp.async.bulk.tensor at %s:%u: %p is not a tensor map encoded by "
                   "cuTensorMapEncodeTiled",
                   file, line, tmap));
  if (m.rank != rank)
    fail(strprintf("cp.async.bulk.tensor.%dd at %s:%u: the tensor map has rank %u", rank, file,
                   line, m.rank));
  uint32_t cnt[5] = {1, 1, 1, 1, 1};
  uint64_t bytes = m.esize;
  for (int i = 0; i < rank; ++i) {
    cnt[i] = (m.box[i] + m.estride[i] - 1) / m.estride[i];
    bytes *= cnt[i];
  }
  check_aligned(dst, 128, "cp.async.bulk.tensor shared-memory destination", file, line);
  const uint32_t off = smem_addr(dst, uint32_t(bytes), "cp.async.bulk.tensor destination", file,
                                 line);
  Mbar &b = bar_at(w, bar, "cp.async.bulk.tensor (its mbarrier)", file, line);
  bool any_in = true;
  for (int i = 0; i < rank; ++i) {
    const int64_t lo = coords[i], hi = lo + int64_t(m.box[i]) - 1;
    if (hi < 0 || lo >= int64_t(m.dim[i])) any_in = false;
  }
  if (!any_in && w.strict)
    fail(strprintf("cp.async.bulk.tensor at %s:%u: the box at (%d, %d) lies entirely outside "
                   "the tensor map's limits (%llu x %llu): every byte would be fill",
                   file, line, coords[0], rank > 1 ? coords[1] : 0,
                   (unsigned long long)m.dim[0], rank > 1 ? (unsigned long long)m.dim[1] : 1ull));
  std::vector<unsigned char> data(bytes);
  const uint32_t span = span_bytes(m.swz);
  const bool nan = m.fill == 1;
  const uint64_t nelem = bytes / m.esize;
  for (uint64_t e = 0; e < nelem; ++e) {
    uint64_t rest = e, src = m.addr;
    bool in = true;
    for (int i = 0; i < rank; ++i) {
      const int64_t c = int64_t(coords[i]) + int64_t(rest % cnt[i]) * m.estride[i];
      rest /= cnt[i];
      if (c < 0 || c >= int64_t(m.dim[i])) in = false;
      else src += uint64_t(c) * (i == 0 ? m.esize : m.stride[i - 1]);
    }
    // Dense box offset e * esize, swizzled on the shared-window address.
    const uint32_t to = swizzle(off + uint32_t(e * m.esize), span) - off;
    if (in) std::memcpy(&data[to], reinterpret_cast<const void *>(src), m.esize);
    else if (nan && m.esize == 2) std::memcpy(&data[to], m.dtype == 9 ? "\xC0\x7F" : "\x00\x7E", 2);
    else if (nan && m.esize == 4) std::memcpy(&data[to], "\x00\x00\xC0\x7F", 4);
    else std::memset(&data[to], 0, m.esize);
  }
  if (!w.strict) {  // lands at once and completes its bytes
    std::memcpy(dst, data.data(), bytes);
    b.tx -= int64_t(bytes);
    maybe_complete(w, b);
    return;
  }
  std::memset(dst, 0xFF, bytes);
  race_mark_pending(w, dst, bytes, true);
  hb(w).tma.push_back(TmaCopy{static_cast<char *>(dst), std::move(data), shared_off(w, bar),
                              file, line});
  // Threads already parked on this barrier (e.g. consumer warps that waited
  // before the producer issued) re-poll, and their wait lands the copy.
  wake_async(w);
}

// -------------------------------------------------------------------- wgmma
uint32_t wgmma_fences() { return tl_worker->cur->wg_fences; }

void wgmma_acc_fail(const WgmmaAccState &st, int reg, bool write) {
  fail(strprintf("thread %s accumulator register %d of the wgmma issued at %s:%u before the "
                 "wgmma.wait_group that retires it (its value is undefined on a GPU)",
                 write ? "accesses" : "reads", reg, st.file, st.line));
}

void wgmma_fence() { ++tl_worker->cur->wg_fences; }

namespace {
// The shared address of element (i, k) of an operand (i: the row for A, the
// column for B; k: 0..15) under its descriptor: 8x16-byte core matrices,
// spaced by the leading / stride byte offsets (no swizzle), or rows of the
// swizzle span, XOR-swizzled (PTX ISA, "Shared memory matrix layout").
uint32_t operand_addr(uint64_t d, int i, int k, bool mn_major) {
  const uint32_t start = uint32_t(d & 0x3FFF) << 4, lbo = uint32_t((d >> 16) & 0x3FFF) << 4,
                 sbo = uint32_t((d >> 32) & 0x3FFF) << 4;
  const uint32_t layout = uint32_t(d >> 62) & 3;
  const uint32_t span = layout == 0 ? 0 : layout == 1 ? 128 : layout == 2 ? 64 : 32;
  const uint32_t ui = uint32_t(i), uk = uint32_t(k);
  if (span == 0)
    return mn_major ? start + ui / 8 * sbo + uk / 8 * lbo + uk % 8 * 16 + ui % 8 * 2
                    : start + ui / 8 * sbo + uk / 8 * lbo + ui % 8 * 16 + uk % 8 * 2;
  const uint32_t e = span / 2;  // elements per swizzle row
  const uint32_t a = mn_major ? start + ui / e * lbo + uk / 8 * sbo + uk % 8 * span + ui % e * 2
                              : start + ui / 8 * sbo + ui % 8 * span + uk * 2;
  return swizzle(a, span);
}

double operand(Worker &w, const WgOp &op, bool is_a, int i, int k) {
  const uint32_t a = operand_addr(is_a ? op.da : op.db, i, k, is_a ? op.ta : op.tb);
  uint16_t v;
  std::memcpy(&v, w.arena + a, 2);
  return op.bf16 ? double(bf16_to_f32(v)) : double(f16_to_f32(v));
}

void check_desc(Worker &w, const WgOp &op, bool is_a, uint32_t &lo, uint32_t &hi) {
  const uint64_t d = is_a ? op.da : op.db;
  const char *nm = is_a ? "A" : "B";
  const uint32_t layout = uint32_t(d >> 62) & 3;
  const uint32_t span = layout == 0 ? 0 : layout == 1 ? 128 : layout == 2 ? 64 : 32;
  const uint32_t start = uint32_t(d & 0x3FFF) << 4;
  if ((d >> 49) & 7)
    fail(strprintf("wgmma at %s:%u: descriptor %s has base offset %u; only 0 is modelled "
                   "(align the swizzle atoms to their repeat)",
                   op.file, op.line, nm, unsigned((d >> 49) & 7)));
  if (span && ((start >> 7) & (span / 16 - 1)))
    fail(strprintf("wgmma at %s:%u: descriptor %s starts at shared address 0x%x, inside a "
                   "%u-byte swizzle repeat (base offset not modelled)",
                   op.file, op.line, nm, start, span * 8));
  const int rows = is_a ? 64 : op.n;
  for (int i = 0; i < rows; ++i)
    for (int k = 0; k < 16; ++k) {
      const uint32_t a = operand_addr(d, i, k, is_a ? op.ta : op.tb);
      if (!in_shared(w.arena + a, 2))
        fail(strprintf("wgmma at %s:%u: descriptor %s points outside shared memory: element "
                       "(%d, %d) at shared address 0x%x",
                       op.file, op.line, nm, i, k, a));
      lo = std::min(lo, a);
      hi = std::max(hi, a + 2);
    }
}

// The operands' bytes as at the first thread's issue (snapshot), checked
// when the op is computed and at its first retirement: shared memory
// operands may not change while the wgmma is in flight.
void snapshot(Worker &w, WgOp &op) {
  uint32_t lo = ~0u, hi = 0;
  check_desc(w, op, true, lo, hi);
  check_desc(w, op, false, lo, hi);
  op.lo = lo;
  op.hi = hi;
  op.snap.assign(w.arena + lo, w.arena + hi);
}
void check_snapshot(Worker &w, const WgOp &op, const char *file, unsigned line) {
  if (std::memcmp(op.snap.data(), w.arena + op.lo, op.snap.size()) != 0)
    fail(strprintf("%s at %s:%u: a shared-memory operand of the wgmma issued at %s:%u was "
                   "modified while it was in flight (smem operands may not be written between "
                   "the warpgroup's wgmma and the wait_group that retires it)",
                   file == op.file ? "wgmma" : "wgmma.wait_group", file, line, op.file, op.line));
}

void compute(Worker &w, HopperBlock &h, std::deque<WgOp> &ops, uint32_t base, WgOp &op) {
  check_snapshot(w, op, op.file, op.line);
  const int n = op.n, regs = n / 2;
  std::vector<double> a(64 * 16), b(size_t(n) * 16);
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < 16; ++k) a[m * 16 + k] = op.sa * operand(w, op, true, m, k);
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < 16; ++k) b[j * 16 + k] = op.sb * operand(w, op, false, j, k);
  op.d.assign(size_t(128) * regs, 0.0f);
  for (int s = 0; s < 128; ++s) {
    const float *c = op.chain[s] < 0 ? &op.c[size_t(s) * regs]
                                     : &ops[size_t(op.chain[s] - base)].d[size_t(s) * regs];
    const int warp = s / 32, lane = s % 32;
    for (int r = 0; r < regs; ++r) {
      // Accumulator fragment (PTX ISA, "wgmma .m64nNk16 register fragment D").
      const int row = 16 * warp + lane / 4 + 8 * ((r % 4) / 2);
      const int col = 8 * (r / 4) + 2 * (lane % 4) + r % 2;
      double acc = op.scale_d ? double(c[r]) : 0.0;
      for (int k = 0; k < 16; ++k) acc += a[row * 16 + k] * b[col * 16 + k];
      op.d[size_t(s) * regs + r] = float(acc);
    }
  }
  (void)h;
  op.done = true;
  wake_async(w);
}
}  // namespace

void wgmma(int n, bool bf16, float *d, WgmmaAccState *st, uint64_t desc_a, uint64_t desc_b,
           bool scale_d, int scale_a, int scale_b, int tnsp_a, int tnsp_b, const char *file,
           unsigned line) {
  Worker &w = *tl_worker;
  Thread &t = *w.cur;
  if (n < 8 || n > 256 || n % 8)
    fail(strprintf("wgmma at %s:%u: N = %d is not a multiple of 8 in [8, 256]", file, line, n));
  if ((scale_a != 1 && scale_a != -1) || (scale_b != 1 && scale_b != -1) || tnsp_a < 0 ||
      tnsp_a > 1 || tnsp_b < 0 || tnsp_b > 1)
    fail(strprintf("wgmma at %s:%u: imm-scale-a/b must be +-1 and imm-trans-a/b 0 or 1", file,
                   line));
  const unsigned wgi = t.pub.linear / 128, slot = t.pub.linear % 128;
  if ((wgi + 1) * 128 > w.nthreads)
    fail(strprintf("wgmma at %s:%u: warpgroup %u is incomplete (%u threads in the block; a "
                   "warpgroup is 128)",
                   file, line, wgi, w.nthreads));
  if (st->op == 0 && !(t.wg_fences > st->touch))
    fail(strprintf("wgmma at %s:%u: the accumulator registers were accessed with no "
                   "wgmma.fence since (one is required before the first wgmma and between "
                   "register accesses and a wgmma)",
                   file, line));
  HopperBlock &h = hb(w);
  if (h.wg.size() <= wgi) {
    h.wg.resize(wgi + 1);
    h.wg_base.resize(wgi + 1, 0);
  }
  std::deque<WgOp> &ops = h.wg[wgi];
  const uint32_t serial = t.wg_issued++, base = h.wg_base[wgi];
  const size_t idx = serial - base;
  if (idx == ops.size()) {
    WgOp op{};
    op.serial = serial;
    op.n = n;
    op.bf16 = bf16;
    op.scale_d = scale_d;
    op.sa = scale_a;
    op.sb = scale_b;
    op.ta = tnsp_a;
    op.tb = tnsp_b;
    op.da = desc_a;
    op.db = desc_b;
    op.file = file;
    op.line = line;
    op.c.assign(size_t(128) * (n / 2), 0.0f);
    op.chain.assign(128, -1);
    op.dst.assign(128, nullptr);
    op.st.assign(128, nullptr);
    ops.push_back(std::move(op));
    snapshot(w, ops.back());
  }
  WgOp &op = ops[idx];
  if (op.n != n || op.bf16 != bf16 || op.scale_d != scale_d || op.sa != scale_a ||
      op.sb != scale_b || op.ta != tnsp_a || op.tb != tnsp_b || op.da != desc_a ||
      op.db != desc_b)
    fail(strprintf("wgmma at %s:%u: its operands (shape, descriptors, scales, transposes) "
                   "differ from those of the warpgroup's other threads for the same wgmma "
                   "(issued at %s:%u); .sync.aligned needs them uniform",
                   file, line, op.file, op.line));
  if (st->op != 0) {  // accumulating onto a wgmma still in flight: its D is our C
    const WgOp &prev = ops[st->op - 1 - base];
    if (prev.n != n)
      fail(strprintf("wgmma at %s:%u: accumulator in flight from a wgmma of another shape", file,
                     line));
    op.chain[slot] = int64_t(st->op - 1);
  } else {
    std::memcpy(&op.c[size_t(slot) * (n / 2)], d, sizeof(float) * size_t(n / 2));
  }
  op.dst[slot] = d;
  op.st[slot] = st;
  st->op = serial + 1;
  st->file = file;
  st->line = line;
  std::memset(d, 0xFF, sizeof(float) * size_t(n / 2));
  t.wg_pending.push_back({serial, 0});
  if (++op.issued == 128) compute(w, h, ops, base, op);
}

void wgmma_commit() {
  Thread &t = *tl_worker->cur;
  ++t.wg_groups;
  for (auto &p : t.wg_pending)
    if (p.second == 0) p.second = t.wg_groups;
}

void wgmma_wait(int n, const char *file, unsigned line) {
  Worker &w = *tl_worker;
  Thread &t = *w.cur;
  if (n < 0 || n > 7)
    fail(strprintf("wgmma.wait_group at %s:%u: N = %d is outside [0, 7]", file, line, n));
  const uint32_t last = t.wg_groups > uint32_t(n) ? t.wg_groups - uint32_t(n) : 0;
  const unsigned wgi = t.pub.linear / 128, slot = t.pub.linear % 128;
  size_t keep = 0;
  for (size_t i = 0; i < t.wg_pending.size(); ++i) {
    const auto p = t.wg_pending[i];
    if (p.second == 0 || p.second > last) {
      t.wg_pending[keep++] = p;
      continue;
    }
    HopperBlock &h = hb(w);
    for (;;) {
      WgOp &op = h.wg[wgi][p.first - h.wg_base[wgi]];
      if (op.done) break;
      wait_async(w, file, line);  // the warpgroup's other threads have not issued it yet
    }
    std::deque<WgOp> &ops = h.wg[wgi];
    WgOp &op = ops[p.first - h.wg_base[wgi]];
    if (!op.checked) {
      op.checked = true;
      check_snapshot(w, op, file, line);
    }
    WgmmaAccState *st = op.st[slot];
    if (st->op == op.serial + 1) {  // no later wgmma accumulates onto it
      std::memcpy(op.dst[slot], &op.d[size_t(slot) * (op.n / 2)], sizeof(float) * size_t(op.n / 2));
      st->op = 0;
      st->touch = t.wg_fences ? t.wg_fences - 1 : 0;  // wgmma's own write needs no fence
    }
    ++op.retired;
    while (!ops.empty() && ops.front().retired == 128) {
      ops.pop_front();
      ++h.wg_base[wgi];
    }
  }
  t.wg_pending.resize(keep);
}

}  // namespace ftn_emu

// ------------------------------------------------- cuTensorMapEncodeTiled
extern "C" int ftn_emu_tensor_map_encode_tiled(ftn_emu_tensor_map *map, int dtype,
                                               uint32_t rank, void *global_address,
                                               const uint64_t *global_dim,
                                               const uint64_t *global_strides,
                                               const uint32_t *box_dim,
                                               const uint32_t *element_strides, int interleave,
                                               int swizzle, int l2_promotion, int oob_fill,
                                               char *err, size_t err_len) {
  using namespace ftn_emu;
  using ftn_emu::detail::strprintf;
  auto bad = [&](const std::string &m) {
    if (err && err_len) std::snprintf(err, err_len, "cuTensorMapEncodeTiled: %s", m.c_str());
    return 1;  // CUDA_ERROR_INVALID_VALUE
  };
  if (!map) return bad("tensorMap is NULL");
  if (dtype < 0 || dtype > 12) return bad(strprintf("tensorDataType %d is not a CUtensorMapDataType", dtype));
  if (rank < 1 || rank > 5) return bad(strprintf("tensorRank %u is outside [1, 5]", rank));
  if (interleave != FTN_TMAP_INTERLEAVE_NONE)
    return bad("interleave: only CU_TENSOR_MAP_INTERLEAVE_NONE is modelled by the emulator");
  if (swizzle < 0 || swizzle > 3) return bad(strprintf("swizzle %d is not a CUtensorMapSwizzle", swizzle));
  if (l2_promotion < 0 || l2_promotion > 3)
    return bad(strprintf("l2Promotion %d is not a CUtensorMapL2promotion", l2_promotion));
  if (oob_fill != 0 && oob_fill != 1) return bad(strprintf("oobFill %d is not a CUtensorMapFloatOOBfill", oob_fill));
  const unsigned es = ftn_emu::detail::kDtypeSize[dtype];
  if (oob_fill == 1 && !(dtype == 6 || dtype == 7 || dtype == 8 || dtype == 9 || dtype >= 10))
    return bad("oobFill NAN_REQUEST_ZERO_FMA needs a floating-point tensorDataType");
  if (!global_address || reinterpret_cast<uintptr_t>(global_address) % 16)
    return bad(strprintf("globalAddress %p is not 16-byte aligned", global_address));
  if (!global_dim || !box_dim || !element_strides || (rank > 1 && !global_strides))
    return bad("globalDim, globalStrides, boxDim and elementStrides must not be NULL");
  for (uint32_t i = 0; i < rank; ++i) {
    if (global_dim[i] < 1 || global_dim[i] > (1ull << 32))
      return bad(strprintf("globalDim[%u] = %llu is outside [1, 2^32]", i, (unsigned long long)global_dim[i]));
    if (box_dim[i] < 1 || box_dim[i] > 256)
      return bad(strprintf("boxDim[%u] = %u is outside [1, 256]", i, box_dim[i]));
    if (element_strides[i] < 1 || element_strides[i] > 8)
      return bad(strprintf("elementStrides[%u] = %u is outside [1, 8]", i, element_strides[i]));
  }
  for (uint32_t i = 0; i + 1 < rank; ++i)
    if (global_strides[i] % 16 || global_strides[i] >= (1ull << 40))
      return bad(strprintf("globalStrides[%u] = %llu is not a multiple of 16 below 2^40", i,
                           (unsigned long long)global_strides[i]));
  if (box_dim[0] * es % 16)
    return bad(strprintf("boxDim[0] * element size = %u bytes is not a multiple of 16", box_dim[0] * es));
  if (swizzle != 0 && box_dim[0] * es > (16u << swizzle))
    return bad(strprintf("boxDim[0] * element size = %u bytes exceeds the swizzle span of %u bytes",
                         box_dim[0] * es, 16u << swizzle));
  ftn_emu::detail::TMap m{};
  std::memset(map, 0, sizeof *map);
  m.magic = ftn_emu::detail::kTmapMagic;
  m.dtype = uint8_t(dtype);
  m.rank = uint8_t(rank);
  m.swz = uint8_t(swizzle);
  m.fill = uint8_t(oob_fill);
  m.esize = uint8_t(es);
  m.addr = reinterpret_cast<uint64_t>(global_address);
  for (uint32_t i = 0; i < rank; ++i) {
    m.dim[i] = global_dim[i];
    if (i > 0) m.stride[i - 1] = global_strides[i - 1];
    m.box[i] = box_dim[i];
    m.estride[i] = uint8_t(element_strides[i]);
  }
  std::memcpy(map, &m, sizeof m);
  return 0;
}
