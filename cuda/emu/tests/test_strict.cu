// Self-tests of the emulator's strict checks, each a planted bug a GPU would
// punish: misaligned vector loads/stores through cuda/vec.cuh, ldmatrix from
// global memory, cp.async to global / from shared / misaligned, and
// __activemask() in a diverged warp. Each must fail the launch with the
// kernel, the thread and block, and the file:line of the planted mistake
// (this file, not the helper's); the legal uses next to them must pass.
#include <vector>

#include "../../mma.cuh"
#include "../../vec.cuh"
#include "selftest.h"

namespace {
struct StrictParams {
  int offset;  // elements (or bytes) added to an aligned pointer
  float *f;    // >= 64 floats, 16-byte aligned
  unsigned *out;
};

// The failure names the kernel, a thread and block, and this file.
void check_where(const std::string &e) {
  CHECK(e.find("test_strict.cu:") != std::string::npos, "no caller file:line in: %s", e.c_str());
  CHECK(e.find("of block (") != std::string::npos, "no thread/block in: %s", e.c_str());
}
}  // namespace

FTN_KERNEL(st_strict_vec_load, StrictParams, p) {
  float v[FtnVec<float>::N];
  ftn_load<float, FtnVec<float>::N>(p.f + p.offset + 4 * threadIdx.x, v);  // PLANTED if offset % 4
  p.out[threadIdx.x] = unsigned(v[0]);
}

FTN_KERNEL(st_strict_vec_store, StrictParams, p) {
  float v[FtnVec<__half>::N] = {};
  __half *h = reinterpret_cast<__half *>(p.f);
  ftn_store_vec<__half>(h + p.offset + 8 * threadIdx.x, v);  // PLANTED if offset % 8
}

FTN_KERNEL(st_strict_load_bytes, StrictParams, p) {
  uint8_t m[8];
  ftn_load_bytes<8>(reinterpret_cast<const uint8_t *>(p.f) + p.offset, m);  // PLANTED if % 8
  p.out[threadIdx.x] = m[0];
}

void test_strict_vector_alignment() {
  alignas(16) float f[64] = {};
  unsigned out[32];
  StrictParams p{0, f, out};
  LAUNCH_OK(st_strict_vec_load, p, dim3(1), dim3(8));
  LAUNCH_OK(st_strict_vec_store, p, dim3(1), dim3(4));
  LAUNCH_OK(st_strict_load_bytes, p, dim3(1), dim3(4));
  p.offset = 1;
  check_where(LAUNCH_FAILS(st_strict_vec_load, p, dim3(1), dim3(8), 0,
                           "128-bit (uint4) load = 0x"));
  check_where(LAUNCH_FAILS(st_strict_vec_store, p, dim3(1), dim3(4), 0,
                           "is not 16-byte aligned"));
  p.offset = 4;
  check_where(LAUNCH_FAILS(st_strict_load_bytes, p, dim3(1), dim3(4), 0,
                           "64-bit (uint2) load = 0x"));
  LAUNCH_FAILS(st_strict_load_bytes, p, dim3(1), dim3(4), 0, "is not 8-byte aligned");
}

FTN_KERNEL(st_strict_ldmatrix_global, StrictParams, p) {
  uint32_t r[4];
  ftn_ldmatrix_x1(r, p.f + (threadIdx.x & 7) * 4);  // PLANTED: ldmatrix reads .shared
  p.out[threadIdx.x] = r[0];
}

FTN_KERNEL(st_strict_ldmatrix_x1_unused_lanes, StrictParams, p) {
  FTN_SHARED(uint16_t, tile, [8 * 8]);
  for (unsigned i = threadIdx.x; i < 64; i += 32) tile[i] = uint16_t(i);
  __syncwarp();
  // .x1 reads only lanes 0..7's addresses; the others may hold anything.
  const void *row = threadIdx.x < 8 ? static_cast<const void *>(&tile[threadIdx.x * 8])
                                    : static_cast<const void *>(p.f + 1);
  uint32_t r[4];
  ftn_ldmatrix_x1(r, row);
  p.out[threadIdx.x] = r[0];
}

void test_strict_ldmatrix_shared() {
  alignas(16) float f[64] = {};
  unsigned out[32];
  StrictParams p{0, f, out};
  LAUNCH_OK(st_strict_ldmatrix_x1_unused_lanes, p, dim3(1), dim3(32));
  CHECK(out[5] == (uint32_t(10) | uint32_t(11) << 16), "ldmatrix lane 5: 0x%08x", out[5]);
  check_where(LAUNCH_FAILS(st_strict_ldmatrix_global, p, dim3(1), dim3(32), 0,
                           "is not in the block's shared memory"));
}

FTN_KERNEL(st_strict_cp_async, StrictParams, p) {
  FTN_SHARED(float, buf, [16]);
  float *dst = buf, *src = p.f;
  switch (p.offset) {
    case 1: dst = buf + 2; break;   // PLANTED: destination 8 bytes off
    case 2: dst = p.f + 16; break;  // PLANTED: destination in global memory
    case 3: src = buf + 8; break;   // PLANTED: source in shared memory
    case 4: src = p.f + 1; break;   // PLANTED: source 4 bytes off
    default: break;
  }
  ftn_cp_async_16(dst, src, 16);
  ftn_cp_async_commit();
  ftn_cp_async_wait<0>();
  p.out[0] = unsigned(buf[0]);
}

void test_strict_cp_async() {
  alignas(16) float f[64] = {7.0f};
  unsigned out[32];
  StrictParams p{0, f, out};
  LAUNCH_OK(st_strict_cp_async, p, dim3(1), dim3(1));
  CHECK(out[0] == 7, "cp.async copied %u", out[0]);
  const char *const want[] = {"", "misaligned address: cp.async destination",
                              "destination 0x", "is in the block's shared memory",
                              "misaligned address: cp.async source"};
  for (int planted = 1; planted <= 4; ++planted) {
    p.offset = planted;
    check_where(LAUNCH_FAILS(st_strict_cp_async, p, dim3(1), dim3(1), 0, want[planted]));
  }
  p.offset = 2;
  LAUNCH_FAILS(st_strict_cp_async, p, dim3(1), dim3(1), 0, "is not in the block's shared memory");
}

FTN_KERNEL(st_strict_activemask, StrictParams, p) {
  // Lanes past `offset` exit first; the rest are converged.
  if (threadIdx.x % 32 >= unsigned(p.offset)) return;
  const unsigned m = __activemask();
  if (blockIdx.x == 0 && threadIdx.x < 32) p.out[threadIdx.x] = m;  // one writer per word
}

FTN_KERNEL(st_strict_activemask_diverged, StrictParams, p) {
  unsigned m = 0;
  if (threadIdx.x < 16)
    m = __activemask();  // PLANTED: lanes 16..31 are elsewhere
  else
    __syncwarp();
  p.out[threadIdx.x] = m;
}

FTN_KERNEL(st_strict_activemask_two_sites, StrictParams, p) {
  unsigned m = 0;
  if (threadIdx.x & 1)
    m = __activemask();  // PLANTED: two different call sites
  else
    m = __activemask() | 1u;
  p.out[threadIdx.x] = m;
}

void test_strict_activemask() {
  unsigned out[32];
  StrictParams p{32, nullptr, out};
  LAUNCH_OK(st_strict_activemask, p, dim3(2), dim3(32));
  for (int l = 0; l < 32; ++l) CHECK(out[l] == 0xFFFFFFFFu, "lane %d: 0x%08x", l, out[l]);
  p.offset = 20;  // lanes 20..31 exit (before or after the others arrive)
  LAUNCH_OK(st_strict_activemask, p, dim3(2), dim3(32));
  for (int l = 0; l < 20; ++l) CHECK(out[l] == 0x000FFFFFu, "lane %d: 0x%08x", l, out[l]);
  LAUNCH_OK(st_strict_activemask, p, dim3(1), dim3(20));  // a partial warp
  check_where(LAUNCH_FAILS(st_strict_activemask_diverged, p, dim3(1), dim3(32), 0,
                           "__activemask() in a diverged warp"));
  check_where(LAUNCH_FAILS(st_strict_activemask_two_sites, p, dim3(1), dim3(32), 0,
                           "__activemask() in a diverged warp"));
}
