// The self-test table and the C API of libftn_emu_selftest.a:
// ftn_emu_selftest_count/name/run. Each test throws ftn_emu_test::Failure
// (or any exception) on failure; run() turns that into a message and
// returns 1, or 2 for a test that throws ftn_emu_test::Skip (e.g. the race
// check is not compiled into this build).
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>

#include "selftest.h"

#define FTN_EMU_TESTS(X)            \
  X(barrier_tree_reduction)         \
  X(barrier_multidim_block)         \
  X(barrier_count_and_or)           \
  X(static_shared_poison)           \
  X(dynamic_shared)                 \
  X(shfl_idx)                       \
  X(shfl_up)                        \
  X(shfl_down)                      \
  X(shfl_xor)                       \
  X(shfl_types)                     \
  X(ballot_any_all)                 \
  X(syncwarp)                       \
  X(warp_reduce)                    \
  X(warp_allreduce)                 \
  X(atomics_many_blocks)            \
  X(atomic_cas_spin)                \
  X(half_conversions)               \
  X(fmax_fmin)                     \
  X(ex2)                           \
  X(bf16_vector_access)             \
  X(vector_types)                   \
  X(grid_stride_64bit)              \
  X(workers_identical)              \
  X(misuse_barrier_exited)          \
  X(misuse_deadlock)                \
  X(misuse_mask_exited)             \
  X(misuse_mask_nonexistent)        \
  X(misuse_mismatched_warp_ops)     \
  X(misuse_launch_limits)           \
  X(misuse_shared_limits)           \
  X(misuse_launch_bounds)           \
  X(misuse_assert)                  \
  X(ldmatrix)                       \
  X(ldmatrix_misaligned)            \
  X(mma_m16n8k16)                   \
  X(mma_batch_misuse)               \
  X(mma_tile)                       \
  X(ldmatrix_seq)                   \
  X(cp_async_zero_fill)             \
  X(strict_vector_alignment)        \
  X(strict_ldmatrix_shared)         \
  X(strict_cp_async)                \
  X(strict_activemask)              \
  X(race_shared_memory)             \
  X(race_warp_synchronous)          \
  X(race_false_positives)           \
  X(race_global_memory)             \
  X(cp_async_deferred)              \
  X(schedule_perturbation)          \
  X(wgmma_accumulator_layout)       \
  X(cluster_exchange)               \
  X(cluster_misuse)                 \
  X(cluster_st_async)               \
  X(wgmma_operand_layouts)          \
  X(wgmma_f64_oracle)               \
  X(wgmma_strict)                   \
  X(mbarrier_phases)                \
  X(setmaxnreg)                     \
  X(tma_swizzle_bytes)              \
  X(tma_strict)                     \
  X(hopper_gemm_pipeline)

#define DECLARE(n) void test_##n();
FTN_EMU_TESTS(DECLARE)
#undef DECLARE

namespace {
struct Entry {
  const char *name;
  void (*fn)();
};
#define ENTRY(n) {#n, &test_##n},
const Entry kTests[] = {FTN_EMU_TESTS(ENTRY)};
#undef ENTRY
constexpr int kCount = int(sizeof kTests / sizeof kTests[0]);

void copy_msg(char *err, size_t len, const std::string &m) {
  if (!err || !len) return;
  std::snprintf(err, len, "%s", m.c_str());
}
}  // namespace

extern "C" int ftn_emu_selftest_count(void) { return kCount; }

extern "C" const char *ftn_emu_selftest_name(int i) {
  return i >= 0 && i < kCount ? kTests[i].name : nullptr;
}

extern "C" int ftn_emu_selftest_run(int i, char *err, size_t err_len) {
  if (err && err_len) err[0] = '\0';
  if (i < 0 || i >= kCount) {
    copy_msg(err, err_len, "no such self-test");
    return 1;
  }
  try {
    kTests[i].fn();
    return 0;
  } catch (const ftn_emu_test::Skip &s) {
    copy_msg(err, err_len, s.why);
    return 2;
  } catch (const ftn_emu_test::Failure &f) {
    copy_msg(err, err_len, f.msg);
  } catch (const std::exception &e) {
    copy_msg(err, err_len, std::string("exception: ") + e.what());
  } catch (...) {
    copy_msg(err, err_len, "unknown exception");
  }
  return 1;
}
