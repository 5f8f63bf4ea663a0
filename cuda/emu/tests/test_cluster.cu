// Self-tests of thread block clusters (cuda/cluster.cuh, cuda/emu/cluster.cpp):
// a cluster's blocks run at once and exchange values through distributed
// shared memory across many barrier.cluster rounds and several clusters;
// the planted misuses must fail with the right message.
#include <string>
#include <utility>
#include <vector>

#include "../../cluster.cuh"
#include "../../sm90.cuh"
#include "selftest.h"

namespace {
struct ClusterParams {
  const float *in;  // one value per thread
  float *out;       // per thread and round: the cluster's sum for its lane
  unsigned *rank;   // per block
  int rounds;
  int bad;  // planted misuse (0: none)
};

int launch_cluster(const char *name, ftn_emu_entry_fn entry, const ClusterParams &p,
                   unsigned blocks, unsigned threads, unsigned cluster, std::string *err) {
  ftn_emu_launch_desc d{};
  d.kernel_name = name;
  d.entry = entry;
  d.params = &p;
  d.grid[0] = blocks;
  d.grid[1] = d.grid[2] = 1;
  d.block[0] = threads;
  d.block[1] = d.block[2] = 1;
  d.num_workers = 2;
  d.cluster_x = cluster;
  char buf[2048];
  const int rc = ftn_emu_launch(&d, buf, sizeof buf);
  *err = buf;
  return rc;
}
}  // namespace

// Round r: every thread puts in[t] + r in its slot of parity r & 1, a
// barrier.cluster, then adds slot t of every rank in rank order.
FTN_KERNEL_CLUSTER(st_cluster_exchange, ClusterParams, p, 64, 4) {
  FTN_SHARED(float2, slot, [2][64]);
  const unsigned t = threadIdx.x, rank = ftn_cluster_rank();
  if (t == 0) p.rank[blockIdx.x] = rank;
  const float mine = p.in[blockIdx.x * blockDim.x + t];
  for (int r = 0; r < p.rounds; ++r) {
    float2 *s = slot[r & 1];
    s[t] = make_float2(mine + float(r), float(rank));
    if (p.bad == 1 && rank == 1 && r == 1) return;  // exits mid-exchange
    if (p.bad == 3 && t == 5) {
      __syncthreads();  // mixed with barrier.cluster in the same block
    } else {
      ftn_cluster_sync();
    }
    float sum = 0.0f;
    for (unsigned k = 0; k < 4; ++k) sum += ftn_cluster_ld_f32x2(s + t, k).x;
    p.out[(blockIdx.x * blockDim.x + t) * p.rounds + r] = sum;
  }
  if (p.bad == 2) {
    float local = 1.0f;
    (void)ftn_cluster_ld_f32x2(reinterpret_cast<const float2 *>(&local), 0);
  }
  ftn_cluster_sync();
}

namespace {
// What the exchange self-tests expect in out[(b * threads + t) * rounds + r]:
// the sum, in rank order over the 4 blocks of b's cluster, of each block's
// value plus r -- thread t's own value (per_thread) or its block's thread
// 0's.
void check_cluster_sums(const std::vector<float> &in, const std::vector<float> &out,
                        unsigned blocks, unsigned threads, unsigned rounds, bool per_thread) {
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t)
      for (unsigned r = 0; r < rounds; ++r) {
        float want = 0.0f;
        for (unsigned k = 0; k < 4; ++k)
          want += in[((b / 4) * 4 + k) * threads + (per_thread ? t : 0)] + float(r);
        const float got = out[(b * threads + t) * rounds + r];
        CHECK(got == want, "block %u thread %u round %u: %g, want %g", b, t, r, got, want);
      }
}
}  // namespace

void test_cluster_exchange() {
  const unsigned blocks = 12, threads = 64, rounds = 5;
  std::vector<float> in(blocks * threads);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 977) * 0.25f;
  std::vector<float> out(in.size() * rounds, -1.0f);
  std::vector<unsigned> rank(blocks, 99);
  ClusterParams p{in.data(), out.data(), rank.data(), int(rounds), 0};
  std::string err;
  const int rc =
      launch_cluster("st_cluster_exchange", FTN_ENTRY(st_cluster_exchange), p, blocks, threads,
                     4, &err);
  CHECK(rc == 0, "launch failed: %s", err.c_str());
  for (unsigned b = 0; b < blocks; ++b) CHECK(rank[b] == b % 4, "block %u has rank %u", b, rank[b]);
  check_cluster_sums(in, out, blocks, threads, rounds, true);
}

void test_cluster_misuse() {
  const unsigned blocks = 8, threads = 64;
  std::vector<float> in(blocks * threads, 1.0f), out(in.size() * 3);
  std::vector<unsigned> rank(blocks);
  ClusterParams p{in.data(), out.data(), rank.data(), 3, 0};
  auto expect = [&](int bad, unsigned grid, unsigned cluster, const char *needle) {
    p.bad = bad;
    std::string err;
    const int rc = launch_cluster("st_cluster_exchange", FTN_ENTRY(st_cluster_exchange), p, grid,
                                  threads, cluster, &err);
    CHECK(rc != 0, "planted misuse %d: the launch succeeded", bad);
    CHECK(err.find(needle) != std::string::npos && err.find("st_cluster_exchange") != std::string::npos,
          "planted misuse %d: message '%s' lacks '%s'", bad, err.c_str(), needle);
  };
  expect(1, blocks, 4, "exited without reaching it");
  expect(2, blocks, 4, "not an address in the block's shared memory");
  expect(3, blocks, 4, "thread(s) of the block wait at");
  expect(0, blocks, 2, "declared for clusters of 4");
  expect(0, 6, 4, "not a multiple of the cluster size 4");
  expect(0, blocks, 16, "exceeds the portable limit of 8");
  // The emulator still works after each failure.
  p.bad = 0;
  std::string err;
  CHECK(launch_cluster("st_cluster_exchange", FTN_ENTRY(st_cluster_exchange), p, blocks, threads,
                       4, &err) == 0,
        "a good launch after the failures: %s", err.c_str());
}

// Round r: threads k < 4 push (in[block's thread 0] + r, rank) into slot
// [r & 1][rank] of block k by st.async, completing 8 bytes on its mbarrier
// [r & 1]; thread 0 expects 32 bytes on its own; everyone waits for the
// phase, then adds the four slots. The __syncthreads at a round's start
// keeps a slot from being overwritten (two rounds later) before every
// thread read it. bad 4: rank 1 leaves early (its peers' st.async into it
// must fail); bad 5: the wrong phase parity (a deadlock, reported).
FTN_KERNEL_CLUSTER(st_cluster_st_async, ClusterParams, p, 64, 4) {
  FTN_SHARED(float2, slot, [2][4]);
  FTN_SHARED(uint64_t, bar, [2]);
  const unsigned t = threadIdx.x, rank = ftn_cluster_rank();
  if (t == 0) {
    ftn_mbar_init(&bar[0], 1);
    ftn_mbar_init(&bar[1], 1);
    ftn_cluster_fence_mbar_init();
  }
  ftn_cluster_sync();
  if (p.bad == 4 && rank == 1) return;
  const float mine = p.in[blockIdx.x * blockDim.x];
  for (int r = 0; r < p.rounds; ++r) {
    __syncthreads();
    const int par = r & 1;
    if (t == 0) ftn_mbar_arrive_expect_tx(&bar[par], 4 * sizeof(float2));
    if (t < 4) ftn_cluster_st_async_f32x2(&slot[par][rank], t, make_float2(mine + float(r), float(rank)), &bar[par]);
    ftn_mbar_wait(&bar[par], uint32_t(p.bad == 5 ? (r & 1) : ((r >> 1) & 1)));
    float sum = 0.0f;
    for (int k = 0; k < 4; ++k) sum += slot[par][k].x;
    p.out[(blockIdx.x * blockDim.x + t) * p.rounds + r] = sum;
  }
  ftn_cluster_sync();
}

void test_cluster_st_async() {
  const unsigned blocks = 8, threads = 64, rounds = 6;
  std::vector<float> in(blocks * threads);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 89) * 0.5f;
  std::vector<float> out(in.size() * rounds, -1.0f);
  std::vector<unsigned> rank(blocks);
  ClusterParams p{in.data(), out.data(), rank.data(), int(rounds), 0};
  std::string err;
  int rc = launch_cluster("st_cluster_st_async", FTN_ENTRY(st_cluster_st_async), p, blocks,
                          threads, 4, &err);
  CHECK(rc == 0, "launch failed: %s", err.c_str());
  check_cluster_sums(in, out, blocks, threads, rounds, false);
  // The wrong parity shows as whichever check sees it first: strict mode's
  // parity check, a second arrival in one phase (a wait that passed on an
  // old phase), or the cluster stuck.
  for (auto [bad, needles] :
       {std::pair<int, std::vector<const char *>>{4, {"exited"}},
        {5, {"deadlock", "phase/parity mismatch", "arrive count overflow"}}}) {
    p.bad = bad;
    rc = launch_cluster("st_cluster_st_async", FTN_ENTRY(st_cluster_st_async), p, blocks, threads,
                        4, &err);
    CHECK(rc != 0, "planted misuse %d: the launch succeeded", bad);
    bool named = false;
    for (const char *n : needles) named |= err.find(n) != std::string::npos;
    CHECK(named && err.find("st_cluster_st_async") != std::string::npos,
          "planted misuse %d: message '%s' lacks '%s'", bad, err.c_str(), needles[0]);
  }
  // The emulator still works after each failure.
  p.bad = 0;
  CHECK(launch_cluster("st_cluster_st_async", FTN_ENTRY(st_cluster_st_async), p, blocks, threads,
                       4, &err) == 0,
        "a good launch after the failures: %s", err.c_str());
}
