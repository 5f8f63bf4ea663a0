// Warp collectives: every __shfl*_sync, __ballot/any/all_sync, __syncwarp and
// __reduce_*_sync meets at a warp-level rendezvous of exactly the lanes named
// in its mask. The last lane to arrive computes every participant's result
// (shuffles follow the PTX ISA shfl.sync definition, width segments included)
// and wakes the others. Misuse -- the caller not in its mask, a mask naming
// lanes that do not exist or have exited, two different ops or masks meeting
// -- fails the launch.
#include <cstring>

#include "emu_internal.h"

namespace ftn_emu::detail {

const char *warp_op_name(int op) {
  static const char *const names[kWarpOpCount] = {
      "__shfl_sync",       "__shfl_up_sync",    "__shfl_down_sync",  "__shfl_xor_sync",
      "__ballot_sync",     "__any_sync",        "__all_sync",        "__syncwarp",
      "__reduce_add_sync", "__reduce_min_sync", "__reduce_max_sync", "__reduce_and_sync",
      "__reduce_or_sync",  "__reduce_xor_sync", "warp collective (mma, ldmatrix, ftn_warp_allreduce)",
      "__activemask"};
  return op >= 0 && op < kWarpOpCount ? names[op] : "warp op";
}

namespace {

bool is_shfl(int op) { return op <= kShflXor; }

// PTX shfl.sync: with c = ((32 - width) << 8) | (up ? 0 : 31),
//   segmask = c[12:8], maxLane = (lane & segmask) | (c[4:0] & ~segmask),
//   minLane = lane & segmask; the source j is lane -/+/^ b or
//   minLane | (b & ~segmask); if j falls outside [.., maxLane] (or below
//   maxLane for up) the lane keeps its own value.
int shfl_source(int op, int lane, int b, int width) {
  const int segmask = (32 - width) & 31;
  const int cval = op == kShflUp ? 0 : 31;
  const int max_lane = (lane & segmask) | (cval & ~segmask);
  const int min_lane = lane & segmask;
  const int bval = b & 31;
  int j = lane;
  bool ok = false;
  switch (op) {
    case kShflUp: j = lane - bval; ok = j >= max_lane; break;
    case kShflDown: j = lane + bval; ok = j <= max_lane; break;
    case kShflXor: j = lane ^ bval; ok = j <= max_lane; break;
    default: j = min_lane | (bval & ~segmask); ok = j <= max_lane; break;
  }
  return ok ? j : lane;
}

void complete(Worker &w, unsigned warp_index, const WarpSlot &s) {
  Thread *lanes = &w.threads[size_t(warp_index) * 32];
  const unsigned mask = s.mask;
  uint64_t acc = 0;
  if (s.op == kCollective) {
    // Every participant is parked (or is the caller), so the lane data they
    // point at on their own stacks is stable while fn reads and writes it.
    void *data[32];
    for (unsigned l = 0; l < 32; ++l)
      data[l] = (mask >> l & 1u) ? reinterpret_cast<void *>(uintptr_t(lanes[l].wval)) : nullptr;
    reinterpret_cast<WarpCollectiveFn>(s.aux)(mask, data);
  }
  // Recorded tensor-core ops run before any op of the whole warp (their
  // results may be what it exchanges); a partial-mask op leaves them pending.
  if (w.warps[warp_index].batch_pending && mask == w.warps[warp_index].existing)
    mma_batch_flush(w, warp_index);
  if (s.op == kSyncWarp && w.racecheck) race_syncwarp(w, warp_index, mask);
  switch (s.op) {
    case kBallot:
    case kAny:
    case kAll:
      for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l & 1u) && lanes[l].wval) acc |= 1ull << l;
      acc = s.op == kBallot ? acc : s.op == kAny ? (acc != 0) : (acc == mask);
      break;
    case kReduceAdd: case kReduceMin: case kReduceMax:
    case kReduceAnd: case kReduceOr: case kReduceXor: {
      bool first = true;
      for (unsigned l = 0; l < 32; ++l) {
        if (!(mask >> l & 1u)) continue;
        const Thread &t = lanes[l];
        uint64_t v = t.wval & 0xFFFFFFFFull;
        if (first) { acc = v; first = false; continue; }
        const bool sgn = t.wparam != 0;
        const int32_t sa = int32_t(uint32_t(acc)), sv = int32_t(uint32_t(v));
        switch (s.op) {
          case kReduceAdd: acc = uint32_t(acc + v); break;
          case kReduceMin: acc = sgn ? uint32_t(sv < sa ? sv : sa) : (v < acc ? v : acc); break;
          case kReduceMax: acc = sgn ? uint32_t(sv > sa ? sv : sa) : (v > acc ? v : acc); break;
          case kReduceAnd: acc &= v; break;
          case kReduceOr: acc |= v; break;
          default: acc ^= v; break;
        }
      }
      break;
    }
    case kActiveMask: acc = mask; break;
    default: break;
  }
  for (unsigned l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    Thread &t = lanes[l];
    if (is_shfl(s.op)) {
      int j = shfl_source(s.op, int(l), t.wparam, t.wwidth);
      // A source lane outside the mask is undefined in PTX: give garbage.
      t.wresult = (mask >> j & 1u) ? lanes[j].wval : ~0ull;
    } else {
      t.wresult = acc;
    }
    if (t.state == TState::WaitWarp) t.state = TState::Runnable;
  }
}

std::string lanes_str(unsigned m) { return strprintf("0x%08x", m); }

}  // namespace

namespace {
// The misuse checks' messages, out of line: the rendezvous below runs for
// every lane of every warp op, and its frame and registers stay small.
[[gnu::noinline, gnu::cold]] void caller_misuse(int op, unsigned mask, int width,
                                                const Warp &wp, unsigned wi, unsigned lane,
                                                const char *file, unsigned line) {
  const char *name = warp_op_name(op);
  if (is_shfl(op) && (width < 1 || width > 32 || (width & (width - 1))))
    fail(strprintf("%s at %s:%u: width %d is not a power of two in [1, 32]", name, file, line,
                   width));
  if (!(mask & (1u << lane)))
    fail(strprintf("%s at %s:%u: calling lane %u is not in mask %s", name, file, line, lane,
                   lanes_str(mask).c_str()));
  if (mask & ~wp.existing)
    fail(strprintf("%s at %s:%u: mask %s names lanes %s that do not exist (warp %u has lanes %s)",
                   name, file, line, lanes_str(mask).c_str(),
                   lanes_str(mask & ~wp.existing).c_str(), wi, lanes_str(wp.existing).c_str()));
  fail(strprintf("%s at %s:%u: mask %s names lanes %s that have already exited", name, file,
                 line, lanes_str(mask).c_str(), lanes_str(mask & wp.exited).c_str()));
}

[[gnu::noinline, gnu::cold]] void slot_mismatch(int op, unsigned mask, const WarpSlot &s,
                                                unsigned lane,
                                                const char *file, unsigned line) {
  const char *name = warp_op_name(op);
  if ((op == kActiveMask || s.op == kActiveMask) &&
      (s.op != op || s.line != line || std::strcmp(s.file, file) != 0))
    fail(strprintf("__activemask() in a diverged warp: lane %u is in %s at %s:%u while lanes "
                   "%s are in %s at %s:%u; the emulator does not model partial convergence, "
                   "so every lane that has not exited must reach the same __activemask() call",
                   lane, name, file, line, lanes_str(s.arrived).c_str(), warp_op_name(s.op),
                   s.file, s.line));
  fail(strprintf("lane %u calls %s(mask=%s) at %s:%u while lanes %s wait in "
                 "%s(mask=%s) at %s:%u; lanes must meet in the same op with the same mask",
                 lane, name, lanes_str(mask).c_str(), file, line, lanes_str(s.arrived).c_str(),
                 warp_op_name(s.op), lanes_str(s.mask).c_str(), s.file, s.line));
}

bool slot_matches(int op, unsigned mask, const void *aux, const WarpSlot &s, const char *file,
                  unsigned line) {
  if (s.op != op || s.mask != mask || s.aux != aux) return false;
  // __activemask() also needs the same call site.
  return op != kActiveMask || (s.line == line && std::strcmp(s.file, file) == 0);
}

[[gnu::always_inline]] inline uint64_t rendezvous(int op, unsigned mask, uint64_t value, int param,
                                                  int width, void *aux, const char *file,
                                                  unsigned line) {
  Worker &w = *tl_worker;
  Thread &t = *w.cur;
  const unsigned lane = t.pub.linear & 31u, bit = 1u << lane;
  const unsigned wi = t.pub.linear >> 5;
  Warp &wp = w.warps[wi];
  const bool bad_width = is_shfl(op) && (width < 1 || width > 32 || (width & (width - 1)));
  if (__builtin_expect(bad_width || !(mask & bit) || (mask & ~wp.existing) || (mask & wp.exited),
                       0))
    caller_misuse(op, mask, width, wp, wi, lane, file, line);
  WarpSlot *s = nullptr;
  for (int i = 0; i < wp.nslots; ++i)
    if (wp.slots[i].mask & mask) {
      s = &wp.slots[i];
      break;
    }
  if (s) {
    if (__builtin_expect(!slot_matches(op, mask, aux, *s, file, line), 0))
      slot_mismatch(op, mask, *s, lane, file, line);
  } else {
    s = &wp.slots[wp.nslots++];
    *s = WarpSlot{op, mask, 0, file, line, aux};
  }
  t.wval = value;
  t.wparam = param;
  t.wwidth = width;
  s->arrived |= bit;
  if (s->arrived != mask) {
    t.state = TState::WaitWarp;
    t.wait_op = op;
    t.wait_mask = mask;
    t.wait_file = file;
    t.wait_line = line;
    block_current(w, t);
    return t.wresult;
  }
  complete(w, wi, *s);
  *s = wp.slots[--wp.nslots];  // drop the slot
  return t.wresult;
}
}  // namespace

uint64_t warp_op(int op, unsigned mask, uint64_t value, int param, int width, const char *file,
                 unsigned line) {
  return rendezvous(op, mask, value, param, width, nullptr, file, line);
}

namespace {
// A warp_collective's rendezvous, inline for callers in this file
// (warp_allreduce_f32: one call level less between the kernel and the
// context switch, for every lane of every row).
[[gnu::always_inline]] inline void collective_rendezvous(unsigned mask, WarpCollectiveFn fn,
                                                         void *lane_data, const char *file,
                                                         unsigned line) {
  rendezvous(kCollective, mask, uint64_t(uintptr_t(lane_data)), 0, 32,
             reinterpret_cast<void *>(fn), file, line);
}
}  // namespace

void warp_collective(unsigned mask, WarpCollectiveFn fn, void *lane_data, const char *file,
                     unsigned line) {
  collective_rendezvous(mask, fn, lane_data, file, line);
}

// A rendezvous of every lane of the warp that has not exited, all at the same
// call site; lanes that exit meanwhile drop out (warp_lane_exited). A lane
// elsewhere -- another warp op, another __activemask() call, __syncthreads --
// fails the launch (mismatch or deadlock), as the GPU's answer would depend
// on convergence the emulator does not model.
unsigned active_mask(const char *file, unsigned line) {
  Worker &w = *tl_worker;
  const Warp &wp = w.warps[w.cur->pub.linear >> 5];
  return unsigned(
      rendezvous(kActiveMask, wp.existing & ~wp.exited, 0, 0, 32, nullptr, file, line));
}

void warp_lane_exited(Worker &w, Thread &t) {
  const unsigned bit = 1u << (t.pub.linear & 31u);
  Warp &wp = w.warps[t.pub.linear >> 5];
  wp.exited |= bit;
  for (int i = 0; i < wp.nslots; ++i) {
    WarpSlot &s = wp.slots[i];
    if (s.op == kActiveMask && (s.mask & bit)) {  // an exited lane is not active
      s.mask &= ~bit;
      if (s.arrived == s.mask) {
        complete(w, t.pub.linear >> 5, s);
        s = wp.slots[--wp.nslots];
        --i;
      }
      continue;
    }
    if ((s.mask & bit) && !(s.arrived & bit))
      fail(strprintf("exited, but lanes %s wait for it in %s(mask=%s) at %s:%u",
                     lanes_str(s.arrived).c_str(), warp_op_name(s.op),
                     lanes_str(s.mask).c_str(), s.file, s.line));
  }
}

}  // namespace ftn_emu::detail

namespace ftn_emu {
namespace {
// One lane's part of warp_allreduce_f32: its values in, the results out.
struct AllreduceLane {
  float *v;
  unsigned n, width;
  void (*butterfly)(float *x, unsigned width);
};

// The xor butterflies of ftn_group_allreduce_n (cuda/reduce.cuh), all lanes
// at once: at each step lane l computes op(own, lane l ^ off's), as its
// __shfl_xor_sync would give it, so every lane's results are bitwise the
// same as with the shuffles.
void allreduce_collective(unsigned mask, void *const *data) {
  if (mask != 0xFFFFFFFFu)
    detail::fail(detail::strprintf("ftn_group_allreduce_n needs the full warp, got mask 0x%08x",
                                   mask));
  const AllreduceLane &first = *static_cast<AllreduceLane *>(data[0]);
  float v[4][32];
  for (unsigned l = 0; l < 32; ++l) {
    const AllreduceLane &x = *static_cast<AllreduceLane *>(data[l]);
    if (x.butterfly != first.butterfly || x.n != first.n || x.width != first.width)
      detail::fail(detail::strprintf(
          "ftn_group_allreduce_n: lanes of one warp meet with different operations, counts or "
          "widths (lane 0: %u value(s) over %u lanes; lane %u: %u over %u)",
          first.n, first.width, l, x.n, x.width));
    for (unsigned i = 0; i < x.n; ++i) v[i][l] = x.v[i];
  }
  for (unsigned i = 0; i < first.n; ++i) first.butterfly(v[i], first.width);
  for (unsigned l = 0; l < 32; ++l) {
    const AllreduceLane &x = *static_cast<AllreduceLane *>(data[l]);
    for (unsigned i = 0; i < x.n; ++i) x.v[i] = v[i][l];
  }
}
}  // namespace

void warp_allreduce_f32(float *v, unsigned n, unsigned width,
                        void (*butterfly)(float *x, unsigned width), const char *file,
                        unsigned line) {
  if (n < 1 || n > 4 || width < 1 || width > 32 || (width & (width - 1)) != 0)
    detail::fail(detail::strprintf(
        "ftn_group_allreduce_n at %s:%u: %u value(s) over groups of %u lanes (expected 1..4 "
        "values, a power-of-two width <= 32)",
        file, line, n, width));
  AllreduceLane me{v, n, width, butterfly};
  detail::collective_rendezvous(0xFFFFFFFFu, &allreduce_collective, &me, file, line);
}
}  // namespace ftn_emu
