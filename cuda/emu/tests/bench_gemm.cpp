// ftn_emu_bench_gemm: one bf16 GEMM D = A * B (row-major, no transposes, bf16
// out) through the project's own tensor-core kernel (cuda/gemm.cu, 128x128
// tile, 256 threads: mma.sync + ldmatrix + cp.async), launched directly so
// the bench picks the number of emulator workers. Returns a checksum of D
// (NaN if the launch failed). Used by benches/emulator.rs.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "emu/cuda_emu.h"
#include "params/gemm.h"
#include "selftest.h"

extern "C" void ftn_emu_entry_ftn_gemm_128x128_bf16_bf16(const void *);

namespace {
constexpr unsigned kTile = 128, kThreads = 256;
constexpr size_t kSmemBytes = 61440;  // GemmTile128::SMEM_BYTES

uint16_t bf16_bits(float f) {  // inputs are exact in bf16: truncation is exact
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

void fill(std::vector<uint16_t> &x, uint32_t seed) {
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = bf16_bits(float(((uint32_t(i) + seed) * 2654435761u) >> 27) / 16.0f - 1.0f);
}
}  // namespace

extern "C" double ftn_emu_bench_gemm(uint32_t m, uint32_t n, uint32_t k, uint32_t workers) {
  static std::mutex mu;  // callers may be concurrent test threads
  std::lock_guard<std::mutex> lock(mu);
  std::vector<uint16_t> a(size_t(m) * k), b(size_t(k) * n), d(size_t(m) * n, 0);
  fill(a, 1);
  fill(b, 7);
  FtnGemmParams p{};
  p.d = d.data();
  p.a = a.data();
  p.b = b.data();
  p.m = m;
  p.n = n;
  p.k = k;
  p.batch = 1;
  p.lda = k;
  p.ldb = n;
  p.ldd = n;
  p.alpha = 1.0f;
  p.aligned = (k % 8 == 0 && n % 8 == 0) ? 1 : 0;
  const unsigned blocks = ((m + kTile - 1) / kTile) * ((n + kTile - 1) / kTile);
  std::string err;
  if (ftn_emu_test::launch("ftn_gemm_128x128_bf16_bf16", &ftn_emu_entry_ftn_gemm_128x128_bf16_bf16,
                           &p, dim3(blocks), dim3(kThreads), kSmemBytes, workers, &err) != 0)
    return NAN;
  double sum = 0;
  for (uint16_t v : d) {
    const uint32_t u = uint32_t(v) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    sum += double(f);
  }
  return sum;
}
