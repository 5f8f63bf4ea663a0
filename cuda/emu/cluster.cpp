// Thread block clusters: a launch with desc->cluster_x = C > 1 runs its
// clusters (C consecutive blocks along x) one after another, each with its
// C blocks at once on C OS threads (Worker rank r runs block c*C + r of
// every cluster c). barrier.cluster is __syncthreads in each block plus a
// meeting of the blocks: the last thread of a block to arrive waits, its
// block's other fibers parked, until every block of the cluster has done
// the same. mapa gives the same arena offset in another rank's Worker.
//
// Checks: a block that exits while the rest of its cluster waits at a
// barrier.cluster fails the launch (a GPU hangs); a block's shared memory
// is poisoned when it exits (a peer reading it later, which a GPU forbids,
// reads 0xFF bytes); mapa of an address outside the block's shared memory
// or of a rank outside the cluster fails; a kernel declared for clusters
// of C blocks fails when launched with another size.
// Not modelled: the race check does not follow accesses to another
// block's shared memory (they count as global-memory reads).
#include <thread>

#include "emu_internal.h"

namespace ftn_emu::detail {

void cluster_barrier_wait(Worker &w, const char *file, unsigned line) {
  ClusterGroup &g = *w.cluster;
  std::unique_lock<std::mutex> lock(g.mu);
  const uint64_t gen = g.gen;
  if (++g.arrived == g.size) {
    g.arrived = 0;
    ++g.gen;
    g.cv.notify_all();
    return;
  }
  g.cv.wait(lock, [&] { return g.gen != gen || g.exited > 0; });
  if (g.gen != gen) return;
  w.aborting = true;
  if (g.aborted) throw Unwind{};  // the peer's own error is already recorded
  const unsigned peer = g.exited_rank;
  lock.unlock();
  fail(strprintf("barrier.cluster at %s:%u can never complete: block rank %u of the cluster "
                 "exited without reaching it",
                 file, line, peer));
}

void cluster_blocks(Worker &w) {
  ClusterGroup &g = *w.cluster;
  Launch &l = *w.launch;
  {
    std::unique_lock<std::mutex> lock(g.mu);
    g.members[w.cluster_rank] = &w;
    g.cv.wait(lock, [&] { return g.start != 0; });
    if (g.start < 0) return;
  }
  const uint64_t clusters = l.nblocks / g.size;
  for (uint64_t c = 0; c < clusters; ++c) {
    run_block(w, c * g.size + w.cluster_rank);
    poison_block_shared(w);
    std::unique_lock<std::mutex> lock(g.mu);
    const uint64_t round = g.round;
    ++g.exited;
    g.exited_rank = w.cluster_rank;
    if (w.aborting || l.failed.load()) g.aborted = true;
    if (g.exited == g.size) {  // the cluster is done: the next one starts
      g.exited = g.arrived = 0;
      g.aborted = false;
      g.gen = 0;
      g.stop = l.failed.load();
      ++g.round;
    } else {
      g.cv.notify_all();  // peers at a barrier.cluster learn of the exit
      g.cv.wait(lock, [&] { return g.round != round; });
    }
    g.cv.notify_all();
    if (g.stop) return;
  }
}

void run_cluster_launch(Launch &l) {
  ClusterGroup g(l.desc->cluster_x);
  std::vector<std::thread> pool;
  bool started = true;
  for (unsigned r = 1; r < g.size; ++r) {
    try {
      pool.emplace_back(worker_main, std::ref(l), &g, r);
    } catch (const std::exception &e) {
      record_error(l, strprintf("kernel '%s': could not start the %u threads of a cluster: %s",
                                l.name, g.size, e.what()));
      started = false;
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(g.mu);
    g.start = started ? 1 : -1;
  }
  g.cv.notify_all();
  if (started) worker_main(l, &g, 0);
  for (std::thread &t : pool) t.join();
}

}  // namespace ftn_emu::detail

namespace ftn_emu {
using namespace detail;

unsigned cluster_ctarank() { return tl_worker->cluster ? tl_worker->cluster_rank : 0; }

unsigned cluster_nctarank() { return tl_worker->cluster ? tl_worker->cluster->size : 1; }

void check_cluster(unsigned declared) {
  const unsigned got = cluster_nctarank();
  if (got != declared)
    fail(strprintf("launched in clusters of %u block(s); the kernel is declared for clusters of "
                   "%u (__cluster_dims__)",
                   got, declared));
}

void cluster_sync(const char *file, unsigned line) {
  block_barrier(kBarCluster, 0, file, line);
}

void *cluster_map_shared(const void *p, unsigned rank, const char *file, unsigned line) {
  Worker &w = *tl_worker;
  if (!in_shared(p, 1))
    fail(strprintf("mapa of %p at %s:%u: not an address in the block's shared memory", p, file,
                   line));
  const unsigned n = cluster_nctarank();
  if (rank >= n)
    fail(strprintf("mapa to rank %u at %s:%u: the cluster has %u block(s)", rank, file, line, n));
  if (!w.cluster) return const_cast<void *>(p);
  const Worker *peer = w.cluster->members[rank];
  if (peer == nullptr)
    fail(strprintf("mapa to rank %u at %s:%u before the cluster's first barrier.cluster (that "
                   "block may not have started)",
                   rank, file, line));
  return peer->arena + (static_cast<const char *>(p) - w.arena);
}

}  // namespace ftn_emu
