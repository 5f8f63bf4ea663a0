// Launch helpers for the self-tests (see selftest.h), plus the tiny kernel
// launch_fails uses to prove the emulator still works after a failed launch.
#include <cstdarg>
#include <cstdio>

#include "selftest.h"

namespace {
struct SanityParams {
  int *out;
};
}  // namespace

FTN_KERNEL(ftn_emu_selftest_sanity, SanityParams, p) {
  FTN_SHARED(int, s, [64]);
  s[threadIdx.x] = int(threadIdx.x);
  __syncthreads();
  int v = s[63 - threadIdx.x];
  v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
  p.out[blockIdx.x * 64 + threadIdx.x] = v;
}

namespace ftn_emu_test {

std::string fmt(const char *f, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

int launch(const char *name, ftn_emu_entry_fn entry, const void *params, dim3 grid, dim3 block,
           size_t dyn_smem, unsigned workers, std::string *err) {
  ftn_emu_launch_desc d{};
  d.kernel_name = name;
  d.entry = entry;
  d.params = params;
  d.grid[0] = grid.x;
  d.grid[1] = grid.y;
  d.grid[2] = grid.z;
  d.block[0] = block.x;
  d.block[1] = block.y;
  d.block[2] = block.z;
  d.dynamic_smem_bytes = dyn_smem;
  d.num_workers = workers;
  char buf[2048];
  int rc = ftn_emu_launch(&d, buf, sizeof buf);
  if (err) *err = buf;
  return rc;
}

void launch_ok(const char *name, ftn_emu_entry_fn entry, const void *params, dim3 grid,
               dim3 block, size_t dyn_smem, unsigned workers) {
  std::string err;
  int rc = launch(name, entry, params, grid, block, dyn_smem, workers, &err);
  if (rc != 0) throw Failure{fmt("launch of %s failed: %s", name, err.c_str())};
}

static void sanity() {
  int out[128];
  SanityParams p{out};
  launch_ok("ftn_emu_selftest_sanity", &ftn_emu_entry_ftn_emu_selftest_sanity, &p, dim3(2),
            dim3(64), 0, 2);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 64; ++t) {
      int want = (63 - t) + (63 - (t ^ 1));
      if (out[b * 64 + t] != want)
        throw Failure{fmt("sanity launch after a failure: out[%d]=%d, want %d", b * 64 + t,
                          out[b * 64 + t], want)};
    }
}

std::string launch_fails(const char *name, ftn_emu_entry_fn entry, const void *params,
                         dim3 grid, dim3 block, size_t dyn_smem, unsigned workers,
                         const char *needle) {
  std::string err;
  int rc = launch(name, entry, params, grid, block, dyn_smem, workers, &err);
  if (rc == 0) throw Failure{fmt("launch of %s succeeded; expected an error with '%s'", name, needle)};
  if (err.find(name) == std::string::npos)
    throw Failure{fmt("error does not name kernel %s: %s", name, err.c_str())};
  if (err.find(needle) == std::string::npos)
    throw Failure{fmt("error for %s lacks '%s': %s", name, needle, err.c_str())};
  sanity();
  return err;
}

ScheduleGuard::ScheduleGuard(const char *spec) {
  char buf[64];
  ftn_emu_schedule(buf, sizeof buf);
  prev_ = buf;
  if (ftn_emu_set_schedule(spec) != 0) throw Failure{fmt("bad schedule '%s'", spec)};
}

ScheduleGuard::~ScheduleGuard() { ftn_emu_set_schedule(prev_.c_str()); }

}  // namespace ftn_emu_test
