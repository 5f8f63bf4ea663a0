// Thread block clusters (sm_90): a kernel declared with
// FTN_KERNEL_CLUSTER(name, Params, p, MAX, C) runs in clusters of C blocks
// along x, which are co-scheduled on one GPC and can read each other's
// shared memory (distributed shared memory).
//
//   ftn_cluster_rank()                    this block's rank in its cluster
//   ftn_cluster_sync()                    barrier.cluster.arrive.release +
//       wait.acquire: every thread of every block of the cluster; writes
//       to shared memory before it are visible to the cluster after it
//       (SASS: MEMBAR.ALL.GPU, UCGABAR_ARV/WAIT, CCTL.IVALL: costly in a
//       loop; st.async below is the per-iteration exchange)
//   ftn_cluster_ld_f32x2(local, rank)     the float2 at `local` (this
//       block's shared memory) as block `rank` of the cluster holds it
//       (mapa + ld.shared::cluster)
//   ftn_cluster_st_async_f32x2(local, rank, v, bar)   stores v into block
//       `rank`'s copy of `local` and completes its 8 bytes on that block's
//       copy of the mbarrier `bar` (st.async...mbarrier::complete_tx): the
//       receiver waits on its own mbarrier (cuda/sm90.cuh), no barrier
//       across the cluster, no memory fence
//   ftn_cluster_fence_mbar_init()         makes this thread's mbarrier.init
//       visible to the cluster (before the barrier.cluster that precedes
//       any peer's st.async to it)
//
// Under nvcc these are inline PTX for sm_90 and later; older targets get a
// trap (the plans launch cluster kernels on sm_90 devices only). Under the
// CPU emulator they call cuda/emu/cluster.cpp, which runs a cluster's
// blocks at once and checks the barrier's use (cuda/emu/README.md, "Thread
// block clusters").
#ifndef FTN_CLUSTER_CUH
#define FTN_CLUSTER_CUH

#include "ftn_kernel.cuh"

#if defined(__CUDACC__)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FTN_CLUSTER_PTX 1
#endif

FTN_DEVICE unsigned ftn_cluster_rank() {
#ifdef FTN_CLUSTER_PTX
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
#else
  __trap();
  return 0;
#endif
}

FTN_DEVICE void ftn_cluster_sync() {
#ifdef FTN_CLUSTER_PTX
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n\t"
      "barrier.cluster.wait.acquire.aligned;" ::
          : "memory");
#else
  __trap();
#endif
}

FTN_DEVICE float2 ftn_cluster_ld_f32x2(const float2 *local, unsigned rank) {
#ifdef FTN_CLUSTER_PTX
  uint32_t remote;
  float2 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
               : "=f"(v.x), "=f"(v.y)
               : "r"(remote)
               : "memory");
  return v;
#else
  (void)local;
  (void)rank;
  __trap();
  return float2{};
#endif
}

FTN_DEVICE void ftn_cluster_st_async_f32x2(float2 *local, unsigned rank, float2 v,
                                           uint64_t *bar) {
#ifdef FTN_CLUSTER_PTX
  uint32_t dst, rbar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(dst)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(rbar)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "r"(rank));
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
          dst),
      "f"(v.x), "f"(v.y), "r"(rbar)
      : "memory");
#else
  (void)local;
  (void)rank;
  (void)v;
  (void)bar;
  __trap();
#endif
}

FTN_DEVICE void ftn_cluster_fence_mbar_init() {
#ifdef FTN_CLUSTER_PTX
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
  __trap();
#endif
}

#else  // the CPU emulator

inline unsigned ftn_cluster_rank() { return ftn_emu::cluster_ctarank(); }

inline void ftn_cluster_sync(std::source_location ftn_loc = std::source_location::current()) {
  ftn_emu::cluster_sync(ftn_loc.file_name(), ftn_loc.line());
}

inline float2 ftn_cluster_ld_f32x2(const float2 *local, unsigned rank FTN_CALLER_LOC) {
  const float2 *remote = static_cast<const float2 *>(
      ftn_emu::cluster_map_shared(local, rank, ftn_loc.file_name(), ftn_loc.line()));
  FTN_ASSERT_ALIGNED_CALLER(remote, 8, "ftn_cluster_ld_f32x2's remote address");
  return *remote;
}

inline void ftn_cluster_st_async_f32x2(float2 *local, unsigned rank, float2 v,
                                       uint64_t *bar FTN_CALLER_LOC) {
  ftn_emu::cluster_st_async(local, rank, &v, sizeof v, bar, ftn_loc.file_name(), ftn_loc.line());
}

inline void ftn_cluster_fence_mbar_init() {}

#endif

#endif  // FTN_CLUSTER_CUH
