// A command-line driver for the self-tests, used by run_asan.sh and for
// local runs. Only compiled with -DFTN_EMU_SELFTEST_DRIVER (the file is empty
// inside libftn_emu_selftest.a, so the library defines no main).
//   driver                 run every self-test, exit 1 if any fails
//   driver NAME...         run the named self-tests
//   driver --bench R C W   time ftn_emu_bench_row_reduce(R, C, W)
//   driver --gemm M N K W  time ftn_emu_bench_gemm(M, N, K, W) (bf16)
//   driver --oob           run the planted out-of-bounds kernel (ASan only)
#ifdef FTN_EMU_SELFTEST_DRIVER
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

extern "C" int ftn_emu_selftest_count(void);
extern "C" const char *ftn_emu_selftest_name(int i);
extern "C" int ftn_emu_selftest_run(int i, char *err, size_t err_len);
extern "C" double ftn_emu_bench_row_reduce(uint32_t rows, uint32_t cols, uint32_t workers);
extern "C" double ftn_emu_bench_gemm(uint32_t m, uint32_t n, uint32_t k, uint32_t workers);
extern "C" int ftn_emu_planted_oob(void);

int main(int argc, char **argv) {
  if (argc == 5 && !std::strcmp(argv[1], "--bench")) {
    uint32_t r = uint32_t(std::atoi(argv[2])), c = uint32_t(std::atoi(argv[3])),
             w = uint32_t(std::atoi(argv[4]));
    ftn_emu_bench_row_reduce(r, c, w);  // warm-up: inputs, stacks
    double best = 1e30, sum = 0;
    for (int i = 0; i < 5; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      sum = ftn_emu_bench_row_reduce(r, c, w);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s < best) best = s;
    }
    std::printf("row_reduce %ux%u workers=%u: best %.4f s, checksum %.6f\n", r, c, w, best, sum);
    return sum == sum ? 0 : 1;
  }
  if (argc == 6 && !std::strcmp(argv[1], "--gemm")) {
    uint32_t m = uint32_t(std::atoi(argv[2])), n = uint32_t(std::atoi(argv[3])),
             k = uint32_t(std::atoi(argv[4])), w = uint32_t(std::atoi(argv[5]));
    double best = 1e30, best_cpu = 1e30, sum = 0;
    for (int i = 0; i < 3; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      const std::clock_t c0 = std::clock();  // process CPU time: steadier on a busy machine
      sum = ftn_emu_bench_gemm(m, n, k, w);
      const double cpu = double(std::clock() - c0) / CLOCKS_PER_SEC;
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s < best) best = s;
      if (cpu < best_cpu) best_cpu = cpu;
    }
    std::printf("gemm bf16 %ux%ux%u workers=%u: best %.4f s wall (%.3f GFLOP/s), %.4f s CPU "
                "(%.3f GFLOP/s per CPU-second), checksum %.6f\n",
                m, n, k, w, best, 2e-9 * m * n * k / best, best_cpu,
                2e-9 * m * n * k / best_cpu, sum);
    return sum == sum ? 0 : 1;
  }
  if (argc == 2 && !std::strcmp(argv[1], "--oob")) return ftn_emu_planted_oob();
  int failed = 0, ran = 0, skipped = 0;
  char err[4096];
  for (int i = 0; i < ftn_emu_selftest_count(); ++i) {
    const char *name = ftn_emu_selftest_name(i);
    bool wanted = argc == 1;
    for (int a = 1; a < argc; ++a) wanted |= !std::strcmp(argv[a], name);
    if (!wanted) continue;
    ++ran;
    auto t0 = std::chrono::steady_clock::now();
    int rc = ftn_emu_selftest_run(i, err, sizeof err);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-32s %s (%.3f s)%s%s\n", name, rc == 2 ? "SKIPPED" : rc ? "FAIL" : "ok", s,
                rc ? ": " : "", rc ? err : "");
    failed += rc == 1;
    skipped += rc == 2;
  }
  std::printf("%d of %d self-tests passed, %d skipped\n", ran - failed - skipped, ran, skipped);
  return failed || !ran ? 1 : 0;
}
#endif
