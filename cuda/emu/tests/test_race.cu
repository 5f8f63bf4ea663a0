// Self-tests of strict mode's checks, each a planted bug that passes on the
// lenient emulator and that a GPU would punish (cuda/emu/README.md, "Strict
// mode"): shared-memory races (read/write after write, write after read,
// warp-synchronous code without __syncwarp), reading a cp.async destination
// before its wait_group (none, or too weak), and an order-dependent kernel
// that only the perturbed schedule shows. Each must fail the launch with the
// right message naming this file's planted line; the correct variants next
// to them must pass (no false positives).
#include <fstream>
#include <string>

#include "../../mma.cuh"
#include "selftest.h"

namespace {
struct RaceParams {
  int variant;
  int *out;  // >= 64 ints
  const float *src;  // >= 64 floats, 16-byte aligned
};

void need_racecheck() {
  if (!ftn_emu_racecheck_compiled())
    throw ftn_emu_test::Skip{"the race check is not compiled into this build (kernels built "
                             "without -fsanitize=thread hooks, e.g. release or ASan)"};
}

// The line of this file that carries the comment "// @<tag>".
std::string marker_line(const char *tag) {
  std::ifstream f(__FILE__);
  CHECK(f.good(), "cannot read %s (run from the repository root)", __FILE__);
  const std::string want = std::string("// @") + tag;
  std::string l;
  for (int n = 1; std::getline(f, l); ++n)
    if (l.size() >= want.size() && l.compare(l.size() - want.size(), want.size(), want) == 0)
      return std::to_string(n);
  CHECK(false, "no line ends with %s", want.c_str());
  return "";
}

// The message names the planted line of this file for the offending access.
void check_line(const std::string &e, const char *tag) {
  const std::string line = "test_race.cu:" + marker_line(tag);
  CHECK(e.find(line) != std::string::npos, "report does not name %s: %s", line.c_str(),
        e.c_str());
  CHECK(e.find("schedule") != std::string::npos, "report does not name the schedule: %s",
        e.c_str());
}
}  // namespace

// variant 0: correct (barrier between write and read); 1: read after write
// without a barrier; 2: write after read; 3: two threads write one word.
FTN_KERNEL(st_race_block, RaceParams, p) {
  FTN_SHARED(int, s, [64]);
  const unsigned t = threadIdx.x;
  if (p.variant == 2) {
    const int v = s[0];  // read by every thread
    if (t == 40) s[0] = 7;  // @planted-war
    if (blockIdx.x == 0) p.out[t] = v;
    return;
  }
  if (p.variant == 3) {
    s[t % 2] = int(t);  // @planted-waw
    return;
  }
  s[t] = int(t);
  if (p.variant == 0) __syncthreads();
  const int v = s[(t + 1) % 64];  // @planted-raw
  if (blockIdx.x == 0) p.out[t] = v;
}

void test_race_shared_memory() {
  need_racecheck();
  int out[64];
  RaceParams p{0, out, nullptr};
  LAUNCH_OK(st_race_block, p, dim3(1), dim3(64));
  for (int i = 0; i < 64; ++i) CHECK(out[i] == (i + 1) % 64, "out[%d] = %d", i, out[i]);
  // Which of the two accesses comes second (read after write, or write after
  // read) depends on the schedule; either way both lines are named.
  p.variant = 1;
  check_line(LAUNCH_FAILS(st_race_block, p, dim3(2), dim3(64), 0, "shared-memory race ("),
             "planted-raw");
  p.variant = 2;
  check_line(LAUNCH_FAILS(st_race_block, p, dim3(2), dim3(64), 0,
                          "shared-memory race (write after read)"),
             "planted-war");
  p.variant = 3;
  check_line(LAUNCH_FAILS(st_race_block, p, dim3(2), dim3(64), 0,
                          "shared-memory race (write after write)"),
             "planted-waw");
}

// Warp-synchronous exchange through shared memory: each lane writes its
// slot, then reads its neighbour's. variant 0: __syncwarp() in between
// (correct); 1: nothing in between (the planted bug, fine on the lenient
// emulator and on pre-Volta GPUs, a race on Volta and later); 2: a
// __syncwarp() whose mask leaves the neighbour out; 3: __syncwarp() but the
// neighbour is in the other warp (needs __syncthreads).
FTN_KERNEL(st_race_warp, RaceParams, p) {
  FTN_SHARED(int, s, [64]);
  const unsigned t = threadIdx.x, lane = t % 32;
  s[t] = int(t);
  if (p.variant == 0 || p.variant == 3) __syncwarp();
  if (p.variant == 2) __syncwarp(lane % 2 ? 0xAAAAAAAAu : 0x55555555u);
  const unsigned other = p.variant == 3 ? (t + 32) % 64 : (t & ~31u) | ((lane + 1) % 32);
  p.out[t] = s[other];  // @planted-warp
}

void test_race_warp_synchronous() {
  need_racecheck();
  int out[64];
  RaceParams p{0, out, nullptr};
  LAUNCH_OK(st_race_warp, p, dim3(1), dim3(64));
  for (int t = 0; t < 64; ++t)
    CHECK(out[t] == (t & ~31) + (t % 32 + 1) % 32, "out[%d] = %d", t, out[t]);
  for (int v = 1; v <= 3; ++v) {
    p.variant = v;
    check_line(LAUNCH_FAILS(st_race_warp, p, dim3(1), dim3(64), 0, "shared-memory race ("),
               "planted-warp");
  }
}

// Patterns that are NOT races and must pass: a tree reduction with barriers,
// a thread re-reading and re-writing its own words, atomics on one shared
// word, many threads reading one word written before a barrier, and a
// warp-level reduction through shared memory with __syncwarp between steps.
FTN_KERNEL(st_race_clean, RaceParams, p) {
  FTN_SHARED(int, s, [64]);
  FTN_SHARED(int, counter, [1]);
  FTN_SHARED(int, w, [64]);
  const unsigned t = threadIdx.x, lane = t % 32;
  if (t == 0) counter[0] = 0;
  s[t] = int(t);
  s[t] += 1;  // own word: read and write by one thread
  __syncthreads();
  atomicAdd(&counter[0], 1);
  for (unsigned stride = 32; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  w[t] = int(lane);
  __syncwarp();
  for (unsigned off = 16; off > 0; off /= 2) {
    const int v = lane < off ? w[t + off] : 0;
    __syncwarp();
    if (lane < off) w[t] += v;
    __syncwarp();
  }
  p.out[64 * blockIdx.x + t] = s[0] + counter[0] * 0 + w[t & ~31u];
}

void test_race_false_positives() {
  need_racecheck();
  int out[3 * 64];
  RaceParams p{0, out, nullptr};
  LAUNCH_OK(st_race_clean, p, dim3(3), dim3(64), 0, 2);
  for (int t = 0; t < 3 * 64; ++t)
    CHECK(out[t] == 64 * 65 / 2 + 31 * 32 / 2, "out[%d] = %d", t, out[t]);
}

// cp.async of 16 floats per warp into shared memory, then a read. variant 0:
// commit + wait_group 0 + __syncthreads (correct); 1: no wait at all; 2: two
// groups and wait_group 1, then reading the second (newest) group's data.
FTN_KERNEL(st_cp_async_early, RaceParams, p) {
  FTN_SHARED(float, s, [64]);
  const unsigned t = threadIdx.x;
  if (t < 4) ftn_cp_async_16(&s[4 * t], p.src + 4 * t, 16);
  ftn_cp_async_commit();
  if (t >= 4 && t < 8) ftn_cp_async_16(&s[4 * t], p.src + 4 * t, 16);  // @second-group
  ftn_cp_async_commit();
  if (p.variant == 0) ftn_cp_async_wait<0>();
  if (p.variant == 2) ftn_cp_async_wait<1>();
  if (p.variant != 0) {  // each thread reads what it copied itself
    if (t < 8) p.out[t] = int(s[4 * t]);  // @planted-early
    return;
  }
  __syncthreads();
  p.out[t] = int(s[t % 32]);
}

void test_cp_async_deferred() {
  need_racecheck();
  alignas(16) float src[64];
  for (int i = 0; i < 64; ++i) src[i] = float(i);
  int out[64];
  RaceParams p{0, out, src};
  LAUNCH_OK(st_cp_async_early, p, dim3(1), dim3(32));
  for (int t = 0; t < 32; ++t) CHECK(out[t] == t, "out[%d] = %d", t, out[t]);
  p.variant = 1;
  check_line(LAUNCH_FAILS(st_cp_async_early, p, dim3(1), dim3(32), 0,
                          "before the cp.async.wait_group that lands the copy"),
             "planted-early");
  p.variant = 2;  // threads 0..3 may read (group 1 landed), 4..7 may not
  const std::string e = LAUNCH_FAILS(st_cp_async_early, p, dim3(1), dim3(32), 0,
                                     "before the cp.async.wait_group that lands the copy");
  check_line(e, "planted-early");
  const std::string second = "test_race.cu:" + marker_line("second-group");
  CHECK(e.find(second) != std::string::npos,
        "report does not name the cp.async of the second group (%s): %s", second.c_str(),
        e.c_str());
}

// Blocks writing global memory. variant 0: each block its own word
// (correct); 1: every block stores to word 0 (the planted race); 2: every
// block exchanges word 0 atomically (correct); 3: blocks write adjacent
// bytes of one word (correct: different bytes).
FTN_KERNEL(st_race_global, RaceParams, p) {
  if (threadIdx.x != 0) return;
  const int b = int(blockIdx.x + gridDim.x * blockIdx.y);
  if (p.variant == 0) p.out[b] = b;
  if (p.variant == 1) p.out[0] = b;  // @planted-global
  if (p.variant == 2) atomicExch(&p.out[0], b);
  if (p.variant == 3) reinterpret_cast<unsigned char *>(p.out)[b % 4] = (unsigned char)b;
}

void test_race_global_memory() {
  need_racecheck();
  int out[64] = {};
  RaceParams p{0, out, nullptr};
  LAUNCH_OK(st_race_global, p, dim3(8, 2), dim3(32), 0, 2);
  for (int b = 0; b < 16; ++b) CHECK(out[b] == b, "out[%d] = %d", b, out[b]);
  p.variant = 2;
  LAUNCH_OK(st_race_global, p, dim3(8, 2), dim3(32), 0, 2);
  p.variant = 3;
  LAUNCH_OK(st_race_global, p, dim3(4), dim3(32), 0, 2);
  p.variant = 1;
  const std::string e = LAUNCH_FAILS(st_race_global, p, dim3(8, 2), dim3(32), 0,
                                     "global-memory race (write after write)");
  CHECK(e.find("test_race.cu:" + marker_line("planted-global")) != std::string::npos,
        "report does not name the planted line: %s", e.c_str());
  // Two launches writing the same word one after the other are not a race.
  p.variant = 0;
  LAUNCH_OK(st_race_global, p, dim3(1), dim3(32), 0, 1);
  LAUNCH_OK(st_race_global, p, dim3(1), dim3(32), 0, 1);
}

// An order-dependent bug no race check sees (a read of global memory):
// thread 0 publishes a value, the other threads of its warp assume it is
// there. Thread-id order always runs thread 0 first, so it passes there.
FTN_KERNEL(st_order_dependent, RaceParams, p) {
  if (threadIdx.x == 0) p.out[0] = 42;
  FTN_ASSERT(p.out[0] == 42);  // @planted-order
}

void test_schedule_perturbation() {
  // Schedules apply in strict mode (on by default only where the race check
  // is compiled in): turn it on for this test.
  struct StrictOn {
    int prev = ftn_emu_set_strict(1);
    ~StrictOn() { ftn_emu_set_strict(prev); }
  } strict_on;
  int out[64];
  RaceParams p{0, out, nullptr};
  {
    ftn_emu_test::ScheduleGuard g("forward");
    out[0] = 0;
    LAUNCH_OK(st_order_dependent, p, dim3(1), dim3(32));
  }
  {
    ftn_emu_test::ScheduleGuard g("reverse");
    out[0] = 0;
    const std::string e = LAUNCH_FAILS(st_order_dependent, p, dim3(1), dim3(32), 0,
                                       "device assertion");
    CHECK(e.find("FTN_EMU_SCHEDULE=reverse") != std::string::npos,
          "failure does not say how to replay: %s", e.c_str());
  }
  int failed = 0;
  for (int seed = 1; seed <= 8; ++seed) {
    const std::string spec = "random:" + std::to_string(seed);
    ftn_emu_test::ScheduleGuard g(spec.c_str());
    out[0] = 0;
    std::string err;
    if (ftn_emu_test::launch("st_order_dependent", FTN_ENTRY(st_order_dependent), &p, dim3(1),
                             dim3(32), 0, 1, &err) != 0) {
      ++failed;
      CHECK(err.find("FTN_EMU_SCHEDULE=" + spec) != std::string::npos,
            "failure does not name %s: %s", spec.c_str(), err.c_str());
    }
  }
  // Thread 0 comes first with probability 1/32 per seed.
  CHECK(failed >= 6, "random schedules exposed the bug in only %d of 8 seeds", failed);
}
