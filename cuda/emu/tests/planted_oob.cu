// A deliberately broken kernel for run_asan.sh: one thread writes one element
// past the end of a heap buffer, which AddressSanitizer must report at the
// marked line. Only compiled with -DFTN_EMU_SELFTEST_DRIVER (empty in the
// self-test library).
#ifdef FTN_EMU_SELFTEST_DRIVER
#include <cstdlib>

#include "emu/cuda_emu.h"

namespace {
struct OobParams {
  float *out;
  unsigned n;
};
}  // namespace

FTN_KERNEL(ftn_emu_planted_oob_kernel, OobParams, p) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  __syncthreads();
  if (i <= p.n) p.out[i] = 1.0f;  // PLANTED-OOB: i == n is one past the end
}

extern "C" int ftn_emu_planted_oob(void) {
  const unsigned n = 100;
  float *out = static_cast<float *>(std::malloc(n * sizeof(float)));
  OobParams p{out, n};
  ftn_emu_launch_desc d{};
  d.kernel_name = "ftn_emu_planted_oob_kernel";
  d.entry = &ftn_emu_entry_ftn_emu_planted_oob_kernel;
  d.params = &p;
  d.grid[0] = 2;
  d.grid[1] = d.grid[2] = 1;
  d.block[0] = 64;
  d.block[1] = d.block[2] = 1;
  d.num_workers = 1;
  char err[512];
  int rc = ftn_emu_launch(&d, err, sizeof err);
  std::free(out);
  return rc == 0 ? 0 : 2;  // reaching here means ASan missed the write
}
#endif
