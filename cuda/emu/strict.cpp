// Strict mode's settings and the schedule of a block's threads.
//
// FTN_EMU_STRICT=1|0 turns strict mode on or off for the process (default:
// on when the kernels were compiled with the race check's hooks, i.e. debug
// builds; see README.md). Strict mode = the shared-memory race check (where
// compiled in), deferred cp.async, and a perturbed thread order:
// FTN_EMU_SCHEDULE=forward|reverse|random[:SEED] (default under strict mode:
// random with a seed drawn once per process, named in every launch error so
// a failure can be replayed). ftn_emu_set_strict / ftn_emu_set_schedule
// change both at run time (the self-tests use them).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unistd.h>

#include "emu_api.h"
#include "emu_internal.h"

namespace ftn_emu::detail {
namespace {

std::mutex g_mu;
bool g_loaded = false;
StrictConfig g_cfg{};

uint64_t splitmix(uint64_t &s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Parses "forward", "reverse", "random" or "random:SEED" into c; false if
// the text is none of these.
bool parse_schedule(const char *s, StrictConfig &c) {
  if (!std::strcmp(s, "forward")) return c.schedule = 0, true;
  if (!std::strcmp(s, "reverse")) return c.schedule = 1, true;
  if (!std::strncmp(s, "random", 6)) {
    if (s[6] == '\0') {
      uint64_t t = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
      t ^= uint64_t(getpid()) << 32;
      c.seed = splitmix(t) % 1000000000ull;
      return c.schedule = 2, true;
    }
    if (s[6] != ':' || s[7] == '\0') return false;
    char *end = nullptr;
    unsigned long long v = std::strtoull(s + 7, &end, 10);
    if (*end != '\0') return false;
    c.seed = v;
    return c.schedule = 2, true;
  }
  return false;
}

void load_locked() {
  if (g_loaded) return;
  g_loaded = true;
  g_cfg.strict = racecheck_compiled();
  if (const char *e = std::getenv("FTN_EMU_STRICT")) g_cfg.strict = std::strcmp(e, "0") != 0;
  g_cfg.schedule = 0;
  if (g_cfg.strict) parse_schedule("random", g_cfg);
  if (const char *e = std::getenv("FTN_EMU_SCHEDULE"); e && *e) {
    StrictConfig c = g_cfg;
    if (parse_schedule(e, c))
      g_cfg = c;
    else
      std::fprintf(stderr,
                   "ferrotron emulator: FTN_EMU_SCHEDULE='%s' is not forward, reverse, random "
                   "or random:SEED; keeping %s\n",
                   e, schedule_name(g_cfg).c_str());
  }
}

}  // namespace

StrictConfig strict_config() {
  std::lock_guard<std::mutex> lock(g_mu);
  load_locked();
  return g_cfg;
}

std::string schedule_name(const StrictConfig &c) {
  switch (c.schedule) {
    case 1: return "reverse";
    case 2: return strprintf("random:%llu", (unsigned long long)c.seed);
    default: return "forward";
  }
}

// Threads run warp by warp (a scheduler pass visits a warp's lanes one after
// another, which keeps their stacks hot); the schedule permutes the order of
// the warps and of the lanes inside each warp. forward = linear order;
// reverse = last warp first, last lane first; random = a permutation drawn
// from (seed, block index).
void schedule_block(Worker &w, uint64_t b) {
  const unsigned n = w.nthreads, nwarps = unsigned(w.warps.size());
  const int mode = w.strict ? w.launch_schedule : 0;
  if (mode != 2 && w.order.size() == n) return;  // the same for every block
  w.order.resize(n);
  w.rank.resize(n);
  w.warp_pos.resize(nwarps);
  std::vector<unsigned> warps(nwarps);
  for (unsigned i = 0; i < nwarps; ++i) warps[i] = mode == 1 ? nwarps - 1 - i : i;
  uint64_t s = w.launch_seed ^ (b * 0xD1B54A32D192ED03ull);
  if (mode == 2)
    for (unsigned i = nwarps; i > 1; --i) std::swap(warps[i - 1], warps[splitmix(s) % i]);
  unsigned k = 0;
  for (unsigned wi : warps) {
    const unsigned base = wi * 32, lanes = n - base < 32 ? n - base : 32;
    w.warp_pos[wi] = k;
    unsigned lane_order[32];
    for (unsigned l = 0; l < lanes; ++l) lane_order[l] = mode == 1 ? lanes - 1 - l : l;
    if (mode == 2)
      for (unsigned l = lanes; l > 1; --l) std::swap(lane_order[l - 1], lane_order[splitmix(s) % l]);
    for (unsigned l = 0; l < lanes; ++l) {
      w.order[k] = base + lane_order[l];
      w.rank[base + lane_order[l]] = k;
      ++k;
    }
  }
}

}  // namespace ftn_emu::detail

extern "C" int ftn_emu_set_strict(int on) {
  using namespace ftn_emu::detail;
  std::lock_guard<std::mutex> lock(g_mu);
  load_locked();
  const int prev = g_cfg.strict;
  g_cfg.strict = on != 0;
  return prev;
}

extern "C" int ftn_emu_set_schedule(const char *spec) {
  using namespace ftn_emu::detail;
  std::lock_guard<std::mutex> lock(g_mu);
  load_locked();
  StrictConfig c = g_cfg;
  if (!spec || !parse_schedule(spec, c)) return 1;
  g_cfg = c;
  return 0;
}

extern "C" size_t ftn_emu_schedule(char *buf, size_t len) {
  using namespace ftn_emu::detail;
  const std::string s = schedule_name(strict_config());
  if (buf && len) {
    const size_t n = s.size() < len - 1 ? s.size() : len - 1;
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return s.size();
}

extern "C" int ftn_emu_racecheck_compiled(void) {
  return ftn_emu::detail::racecheck_compiled() ? 1 : 0;
}
