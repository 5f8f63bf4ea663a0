// Self-tests: every misuse the emulator must report -- a barrier exited
// threads never reach, a deadlock, warp masks naming exited or missing lanes,
// mismatched warp ops, launches over the device limits, shared memory over
// the limits, launch bounds, a failed FTN_ASSERT -- fails the launch with a
// message naming the kernel, and the next launch still works.
#include <atomic>

#include "selftest.h"

namespace {
struct MisuseParams {
  int n;
  int *out;
};
}  // namespace

FTN_KERNEL(st_bad_barrier_exited, MisuseParams, p) {
  if (threadIdx.x >= 32) return;
  __syncthreads();
  p.out[threadIdx.x] = 1;
}

FTN_KERNEL(st_bad_barrier_exited_first, MisuseParams, p) {
  if (threadIdx.x < 32) return;
  __syncthreads();
  p.out[threadIdx.x] = 1;
}

void test_misuse_barrier_exited() {
  int out[64];
  MisuseParams p{0, out};
  LAUNCH_FAILS(st_bad_barrier_exited, p, dim3(4), dim3(64), 0, "__syncthreads");
  std::string e = LAUNCH_FAILS(st_bad_barrier_exited_first, p, dim3(4), dim3(64), 0,
                               "can never complete");
  CHECK(e.find("test_misuse.cu") != std::string::npos, "no file:line in: %s", e.c_str());
}

FTN_KERNEL(st_bad_deadlock, MisuseParams, p) {
  // Even threads wait at the block barrier, odd ones at a full-warp shuffle
  // that needs the even lanes: nobody can proceed.
  int v = int(threadIdx.x);
  if (threadIdx.x % 2 == 0)
    __syncthreads();
  else
    v = __shfl_xor_sync(0xFFFFFFFFu, v, 1);
  p.out[threadIdx.x] = v;
}

void test_misuse_deadlock() {
  int out[64];
  MisuseParams p{0, out};
  std::string e = LAUNCH_FAILS(st_bad_deadlock, p, dim3(3), dim3(64), 0, "deadlock");
  CHECK(e.find("__syncthreads") != std::string::npos && e.find("__shfl_xor_sync") != std::string::npos,
        "deadlock report does not say who waits where: %s", e.c_str());
}

FTN_KERNEL(st_bad_mask_exited, MisuseParams, p) {
  if (threadIdx.x >= 16) return;  // lanes 16..31 leave, 0..15 still name them
  p.out[threadIdx.x] = __shfl_down_sync(0xFFFFFFFFu, int(threadIdx.x), 1);
}

FTN_KERNEL(st_bad_mask_exited_first, MisuseParams, p) {
  if (threadIdx.x < 16) return;
  p.out[threadIdx.x] = __shfl_down_sync(0xFFFFFFFFu, int(threadIdx.x), 1);
}

void test_misuse_mask_exited() {
  int out[32];
  MisuseParams p{0, out};
  LAUNCH_FAILS(st_bad_mask_exited, p, dim3(2), dim3(32), 0, "exited");
  // Which message comes depends on whether lanes 0..15 exit before the others
  // reach the shuffle: in linear order, they do.
  ftn_emu_test::ScheduleGuard forward("forward");
  LAUNCH_FAILS(st_bad_mask_exited_first, p, dim3(2), dim3(32), 0, "already exited");
}

FTN_KERNEL(st_bad_mask_missing, MisuseParams, p) {
  p.out[threadIdx.x] = int(__ballot_sync(0xFFFFFFFFu, 1));
}

FTN_KERNEL(st_bad_lane_not_in_mask, MisuseParams, p) {
  p.out[threadIdx.x] = __shfl_sync(0x0000FFFFu, 1, 0);
}

void test_misuse_mask_nonexistent() {
  int out[32];
  MisuseParams p{0, out};
  LAUNCH_FAILS(st_bad_mask_missing, p, dim3(1), dim3(16), 0, "do not exist");
  LAUNCH_FAILS(st_bad_lane_not_in_mask, p, dim3(1), dim3(32), 0, "not in mask");
}

FTN_KERNEL(st_bad_mixed_ops, MisuseParams, p) {
  if (threadIdx.x % 2)
    p.out[threadIdx.x] = __shfl_sync(0xFFFFFFFFu, 1, 0);
  else
    p.out[threadIdx.x] = int(__ballot_sync(0xFFFFFFFFu, 1));
}

FTN_KERNEL(st_bad_mixed_masks, MisuseParams, p) {
  // Lanes 0..15 name the whole warp, lanes 16..31 only the upper half.
  unsigned mask = threadIdx.x < 16 ? 0xFFFFFFFFu : 0xFFFF0000u;
  p.out[threadIdx.x] = __shfl_sync(mask, 1, 16);
}

void test_misuse_mismatched_warp_ops() {
  int out[32];
  MisuseParams p{0, out};
  LAUNCH_FAILS(st_bad_mixed_ops, p, dim3(1), dim3(32), 0, "same op with the same mask");
  // With lanes 16..31 first, they complete their own shuffle and exit, and
  // lanes 0..15 then name exited lanes (also an error): pin the order.
  ftn_emu_test::ScheduleGuard forward("forward");
  LAUNCH_FAILS(st_bad_mixed_masks, p, dim3(1), dim3(32), 0, "same op with the same mask");
}

FTN_KERNEL(st_trivial, MisuseParams, p) {
  if (p.out) p.out[0] = 1;
}

void test_misuse_launch_limits() {
  MisuseParams p{0, nullptr};
  LAUNCH_FAILS(st_trivial, p, dim3(1), dim3(1025), 0, "1025 threads");
  LAUNCH_FAILS(st_trivial, p, dim3(1), dim3(32, 33), 0, "1056 threads");
  LAUNCH_FAILS(st_trivial, p, dim3(1), dim3(1, 1, 65), 0, "per-dimension limits");
  LAUNCH_FAILS(st_trivial, p, dim3(1), dim3(2048), 0, "over the limit of 1024");
  LAUNCH_FAILS(st_trivial, p, dim3(0), dim3(32), 0, "zero launch dimension");
  LAUNCH_FAILS(st_trivial, p, dim3(1), dim3(32, 0), 0, "zero launch dimension");
  LAUNCH_FAILS(st_trivial, p, dim3(1, 65536), dim3(32), 0, "grid");
  LAUNCH_FAILS(st_trivial, p, dim3(1, 1, 65536), dim3(32), 0, "grid");
  LAUNCH_FAILS(st_trivial, p, dim3(0x80000000u), dim3(32), 0, "grid");
}

FTN_KERNEL(st_big_static_smem, MisuseParams, p) {
  FTN_SHARED(char, big, [50000]);
  big[threadIdx.x] = 1;
  if (p.out) p.out[0] = big[0];
}

FTN_KERNEL(st_mid_static_smem, MisuseParams, p) {
  FTN_SHARED(float, mid, [10000]);  // 40000 bytes: fine alone
  mid[threadIdx.x] = 1;
  if (p.out && threadIdx.x == 0) p.out[0] = int(mid[0]);
}

void test_misuse_shared_limits() {
  int out[1];
  MisuseParams p{0, out};
  LAUNCH_FAILS(st_big_static_smem, p, dim3(2), dim3(32), 0, "static shared memory");
  LAUNCH_FAILS(st_trivial, p, dim3(1), dim3(32), FTN_EMU_MAX_SMEM_PER_BLOCK + 1,
               "dynamic shared memory");
  LAUNCH_OK(st_mid_static_smem, p, dim3(1), dim3(32), 100000, 1);
  LAUNCH_FAILS(st_mid_static_smem, p, dim3(1), dim3(32), 200000, "exceeds");
}

FTN_KERNEL_BOUNDED(st_bounded, MisuseParams, p, 128) {
  if (p.out) p.out[threadIdx.x] = 1;
}

void test_misuse_launch_bounds() {
  int out[256];
  MisuseParams p{0, out};
  LAUNCH_OK(st_bounded, p, dim3(1), dim3(128), 0, 1);
  LAUNCH_FAILS(st_bounded, p, dim3(1), dim3(256), 0, "__launch_bounds__(128)");
}

namespace {
struct AssertParams {
  int n;
  unsigned *blocks_run;
};
}  // namespace

FTN_KERNEL(st_assert, AssertParams, p) {
  if (threadIdx.x == 0) atomicAdd(p.blocks_run, 1u);
  FTN_ASSERT(p.n > 100 || blockIdx.x != 5);
}

void test_misuse_assert() {
  unsigned blocks_run = 0;
  AssertParams p{7, &blocks_run};
  const unsigned blocks = 200000;
  std::string e = LAUNCH_FAILS(st_assert, p, dim3(blocks), dim3(64), 0, "p.n > 100");
  CHECK(e.find("test_misuse.cu:") != std::string::npos, "no file:line in: %s", e.c_str());
  CHECK(e.find("block (5,0,0)") != std::string::npos, "no block in: %s", e.c_str());
  CHECK(blocks_run < blocks / 2, "launch not stopped promptly: %u blocks ran", blocks_run);
  blocks_run = 0;
  p.n = 1000;
  LAUNCH_OK(st_assert, p, dim3(300), dim3(64), 0, 2);
  CHECK(blocks_run == 300, "blocks_run %u", blocks_run);
}
