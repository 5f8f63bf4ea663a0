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
#include <cstring>
#include <thread>

#include "emu_internal.h"

namespace ftn_emu::detail {

namespace {
// An st.async still queued for block `rank`, which exited before it landed.
std::string mail_to_exited(const ClusterMail &m, unsigned rank) {
  return strprintf("st.async at %s:%u into block rank %u of the cluster, which exited before "
                   "it landed",
                   m.file, m.line, rank);
}

// A block of the current cluster that exited (call with g.mu held and
// g.exited > 0).
unsigned an_exited_rank(const ClusterGroup &g) {
  for (unsigned r = 0; r < g.size; ++r)
    if (g.gone[r]) return r;
  return 0;
}
}  // namespace

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
  g.cv.notify_all();  // a block waiting for mail may now see the cluster stuck
  g.cv.wait(lock, [&] { return g.gen != gen || g.exited > 0; });
  if (g.gen != gen) return;
  w.aborting = true;
  if (g.aborted) throw Unwind{};  // the peer's own error is already recorded
  const unsigned peer = an_exited_rank(g);
  lock.unlock();
  fail(strprintf("barrier.cluster at %s:%u can never complete: block rank %u of the cluster "
                 "exited without reaching it",
                 file, line, peer));
}

void cluster_drain(Worker &w) {
  if (!w.cluster) return;
  ClusterGroup &g = *w.cluster;
  std::vector<ClusterMail> mail;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    mail.swap(g.mail[w.cluster_rank]);
  }
  for (const ClusterMail &m : mail) {
    std::memcpy(w.arena + m.dst, m.data, m.bytes);
    mbar_complete_tx(w, m.bar, m.bytes, m.file, m.line);
  }
}

bool cluster_wait_mail(Worker &w) {
  if (!w.cluster || !has_async_waiters(w)) return false;
  ClusterGroup &g = *w.cluster;
  {
    std::unique_lock<std::mutex> lock(g.mu);
    auto &box = g.mail[w.cluster_rank];
    if (box.empty()) {
      // Stuck when every block of the cluster waits (for mail, at a
      // barrier.cluster) or has exited, and no mail is on its way.
      ++g.mail_waiters;
      auto all_stuck = [&] {
        if (g.mail_waiters + g.arrived + g.exited < g.size) return false;
        for (unsigned r = 0; r < g.size; ++r)  // mail for a block that left never lands
          if (!g.mail[r].empty() && !g.gone[r]) return false;
        return true;
      };
      if (all_stuck()) {
        g.stuck = true;
        g.cv.notify_all();
      }
      g.cv.wait(lock, [&] { return !box.empty() || g.stuck || all_stuck(); });
      --g.mail_waiters;
      if (box.empty()) {
        g.stuck = true;
        g.cv.notify_all();
        for (unsigned r = 0; r < g.size; ++r)
          if (!g.mail[r].empty() && g.gone[r])
            fail("the cluster is stuck: " + mail_to_exited(g.mail[r].front(), r) +
                 " (its own pair never came)");
        return false;
      }
    }
  }
  cluster_drain(w);
  return true;
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
    g.mark_gone(w.cluster_rank);
    if (w.aborting || l.failed.load()) g.aborted = true;
    if (g.exited == g.size) {  // the cluster is done: the next one starts
      for (unsigned r = 0; r < g.size; ++r) {
        if (!g.mail[r].empty() && !l.failed.load())
          record_error(l, strprintf("kernel '%s', cluster %llu: ", l.name,
                                    (unsigned long long)c) +
                              mail_to_exited(g.mail[r].front(), r) +
                              " (never waited on its mbarrier)");
        g.mail[r].clear();
        g.gone[r] = 0;
      }
      g.exited = g.arrived = g.mail_waiters = 0;
      g.aborted = g.stuck = false;
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

void cluster_st_async(void *local_dst, unsigned rank, const void *data, uint32_t bytes,
                      uint64_t *local_bar, const char *file, unsigned line) {
  Worker &w = *tl_worker;
  check_aligned(local_dst, bytes, "st.async destination", file, line);
  if (!in_shared(local_dst, bytes) || !in_shared(local_bar, 8))
    fail(strprintf("st.async at %s:%u: the destination %p or the mbarrier %p is not in the "
                   "block's shared memory",
                   file, line, local_dst, static_cast<void *>(local_bar)));
  const unsigned n = cluster_nctarank();
  if (rank >= n)
    fail(strprintf("st.async to rank %u at %s:%u: the cluster has %u block(s)", rank, file, line,
                   n));
  const uint32_t dst = uint32_t(static_cast<char *>(local_dst) - w.arena);
  const uint32_t bar = uint32_t(reinterpret_cast<char *>(local_bar) - w.arena);
  if (!w.cluster || rank == w.cluster_rank) {
    std::memcpy(w.arena + dst, data, bytes);
    mbar_complete_tx(w, bar, bytes, file, line);
    return;
  }
  ClusterGroup &g = *w.cluster;
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.gone[rank])
    fail(strprintf("st.async at %s:%u into block rank %u of the cluster, which has exited", file,
                   line, rank));
  ClusterMail m{dst, bar, bytes, {}, file, line};
  std::memcpy(m.data, data, bytes);
  g.mail[rank].push_back(m);
  g.cv.notify_all();
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
