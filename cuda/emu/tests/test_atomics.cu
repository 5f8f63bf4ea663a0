// Self-tests: atomics from thousands of blocks spread over several worker
// threads must give exact totals (add/sub/min/max/exch/and/or/xor/inc and a
// CAS spin counter), so they have to be real atomics.
#include <vector>

#include "selftest.h"

namespace {
struct AtomicParams {
  int *i_add;
  unsigned *u_add;
  unsigned long long *ull_add;
  float *f_add;
  double *d_add;
  int *i_max;
  int *i_min;
  unsigned *u_max;
  long long *ll_min;
  unsigned long long *ull_max;
  unsigned *or_bits;
  unsigned *and_bits;
  unsigned *xor_bits;
  int *sub;
  unsigned *inc;
  int *exch_seen;  // per block: atomicExch returned something sane
  unsigned short *cas16;
};
}  // namespace

FTN_KERNEL(st_atomics, AtomicParams, p) {
  const unsigned b = blockIdx.x, t = threadIdx.x;
  const int g = int(b * blockDim.x + t);
  atomicAdd(p.i_add, 1);
  atomicAdd(p.u_add, 2u);
  atomicAdd(p.ull_add, 1ull << 33);
  atomicAdd(p.f_add, 1.0f);
  atomicAdd(p.d_add, 0.5);
  atomicMax(p.i_max, g % 1000 - 500);
  atomicMin(p.i_min, g % 777 - 300);
  atomicMax(p.u_max, unsigned(g) * 3u);
  atomicMin(p.ll_min, -(long long)g * 1000000000LL);
  atomicMax(p.ull_max, (unsigned long long)g << 30);
  atomicOr(p.or_bits, 1u << (b % 32));
  atomicAnd(p.and_bits, ~(1u << (b % 31)));
  atomicXor(p.xor_bits, 1u << (t % 32));
  atomicSub(p.sub, 3);
  atomicInc(p.inc, 99u);
  if (t == 0) {
    int old = atomicExch(&p.exch_seen[0], int(b));
    if (old < -1 || old >= int(gridDim.x)) atomicAdd(&p.exch_seen[1], 1);
    unsigned short o16 = *p.cas16, n16;
    do {
      n16 = (unsigned short)(o16 + 1);
    } while ((o16 = atomicCAS(p.cas16, o16, n16)) != (unsigned short)(n16 - 1));
  }
}

void test_atomics_many_blocks() {
  const unsigned blocks = 4096, threads = 64, n = blocks * threads;
  int i_add = 0, i_max = INT_MIN, i_min = INT_MAX, sub = 0;
  unsigned u_add = 0, u_max = 0, or_bits = 0, and_bits = 0xFFFFFFFFu, xor_bits = 0, inc = 0;
  unsigned long long ull_add = 0, ull_max = 0;
  long long ll_min = 0;
  float f_add = 0;
  double d_add = 0;
  int exch[2] = {-1, 0};
  unsigned short cas16 = 0;
  AtomicParams p{&i_add, &u_add, &ull_add, &f_add, &d_add, &i_max, &i_min, &u_max, &ll_min,
                 &ull_max, &or_bits, &and_bits, &xor_bits, &sub, &inc, exch, &cas16};
  LAUNCH_OK(st_atomics, p, dim3(blocks), dim3(threads), 0, 4);
  CHECK(i_add == int(n), "int add %d", i_add);
  CHECK(u_add == 2u * n, "unsigned add %u", u_add);
  CHECK(ull_add == (unsigned long long)n << 33, "ull add %llu", ull_add);
  CHECK(f_add == float(n), "float add %g", double(f_add));
  CHECK(d_add == 0.5 * n, "double add %g", d_add);
  CHECK(i_max == 499, "int max %d", i_max);
  CHECK(i_min == -300, "int min %d", i_min);
  CHECK(u_max == (n - 1) * 3u, "unsigned max %u", u_max);
  CHECK(ll_min == -(long long)(n - 1) * 1000000000LL, "ll min %lld", ll_min);
  CHECK(ull_max == (unsigned long long)(n - 1) << 30, "ull max %llu", ull_max);
  CHECK(or_bits == 0xFFFFFFFFu, "or 0x%08x", or_bits);
  CHECK(and_bits == 0x80000000u, "and 0x%08x", and_bits);
  CHECK(xor_bits == 0u, "xor 0x%08x", xor_bits);  // each bit flipped 2*4096 times
  CHECK(sub == -3 * int(n), "sub %d", sub);
  CHECK(inc == n % 100, "inc %u", inc);
  CHECK(exch[1] == 0 && exch[0] >= 0, "exch");
  CHECK(cas16 == (unsigned short)blocks, "cas16 %u", unsigned(cas16));
}

namespace {
struct SpinParams {
  unsigned *counter;
  unsigned *tickets;  // each thread's ticket, to check uniqueness
};
}  // namespace

FTN_KERNEL(st_cas_spin, SpinParams, p) {
  unsigned old = *p.counter, seen;
  while ((seen = atomicCAS(p.counter, old, old + 1)) != old) old = seen;
  p.tickets[blockIdx.x * blockDim.x + threadIdx.x] = old;
}

void test_atomic_cas_spin() {
  const unsigned blocks = 2000, threads = 32, n = blocks * threads;
  unsigned counter = 0;
  std::vector<unsigned> tickets(n, ~0u);
  SpinParams p{&counter, tickets.data()};
  LAUNCH_OK(st_cas_spin, p, dim3(blocks), dim3(threads), 0, 3);
  CHECK(counter == n, "counter %u want %u", counter, n);
  std::vector<char> seen(n, 0);
  for (unsigned v : tickets) {
    CHECK(v < n && !seen[v], "ticket %u duplicated or out of range", v);
    seen[v] = 1;
  }
}
