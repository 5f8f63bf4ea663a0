// Helpers shared by the emulator self-tests: launching a kernel by name,
// expecting success or a specific failure, and a CHECK that throws a
// message (caught per test by ftn_emu_selftest_run).
#ifndef FTN_EMU_SELFTEST_H
#define FTN_EMU_SELFTEST_H

#include <string>

#include "emu/cuda_emu.h"

namespace ftn_emu_test {

struct Failure {
  std::string msg;
};
// A test that cannot run in this build (reported as skipped, not passed).
struct Skip {
  std::string why;
};
std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));

// Runs a launch; returns ftn_emu_launch's status and its message in *err.
int launch(const char *name, ftn_emu_entry_fn entry, const void *params, dim3 grid, dim3 block,
           size_t dyn_smem, unsigned workers, std::string *err);
// Throws Failure unless the launch succeeds.
void launch_ok(const char *name, ftn_emu_entry_fn entry, const void *params, dim3 grid,
               dim3 block, size_t dyn_smem = 0, unsigned workers = 1);
// Throws Failure unless the launch fails with a message that names the
// kernel and contains `needle`; then checks that a good launch still works.
std::string launch_fails(const char *name, ftn_emu_entry_fn entry, const void *params,
                         dim3 grid, dim3 block, size_t dyn_smem, unsigned workers,
                         const char *needle);

// Runs the scope under another strict-mode schedule ("forward", "reverse",
// "random:SEED") and restores the previous one.
class ScheduleGuard {
 public:
  explicit ScheduleGuard(const char *spec);
  ~ScheduleGuard();
  ScheduleGuard(const ScheduleGuard &) = delete;
  ScheduleGuard &operator=(const ScheduleGuard &) = delete;

 private:
  std::string prev_;
};

// Strict mode on for the scope (some checks are strict-mode only; builds
// without the race check, e.g. ASan's, default to it off).
struct StrictOn {
  int prev = ftn_emu_set_strict(1);
  ~StrictOn() { ftn_emu_set_strict(prev); }
  StrictOn() = default;
  StrictOn(const StrictOn &) = delete;
  StrictOn &operator=(const StrictOn &) = delete;
};

}  // namespace ftn_emu_test

#define CHECK(cond, ...)                                                                   \
  do {                                                                                     \
    if (!(cond))                                                                           \
      throw ::ftn_emu_test::Failure{::ftn_emu_test::fmt("%s:%d: `%s` failed: ", __FILE__, \
                                                        __LINE__, #cond) +                 \
                                    ::ftn_emu_test::fmt(__VA_ARGS__)};                     \
  } while (0)

// LAUNCH_OK(kernel, params, grid, block[, dyn, workers]) for FTN_KERNEL(kernel, ...)
#define FTN_ENTRY(k) (&ftn_emu_entry_##k)
#define LAUNCH_OK(k, params, ...) ::ftn_emu_test::launch_ok(#k, FTN_ENTRY(k), &(params), __VA_ARGS__)
#define LAUNCH_FAILS(k, params, grid, block, dyn, needle) \
  ::ftn_emu_test::launch_fails(#k, FTN_ENTRY(k), &(params), grid, block, dyn, 2, needle)

#endif  // FTN_EMU_SELFTEST_H
