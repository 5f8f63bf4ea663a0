// ferrotron kernel prelude: include first in every cuda/*.cu file.
//
// The same kernel source compiles two ways:
//   * nvcc (__CUDACC__): real __global__ kernels, embedded as fatbins;
//   * the host C++ compiler against cuda/emu/: the CUDA-on-CPU emulator.
// Kernels use only what this prelude and cuda_emu.h agree on:
//
//   FTN_KERNEL(name, Params, p) { ... }            one-argument kernel; the
//       argument is `const Params p` (a struct from cuda/params/ferrotron_kernels.h)
//   FTN_KERNEL_BOUNDED(name, Params, p, MAX) { }   same, with __launch_bounds__
//       (MAX); the emulator fails a launch with more threads than MAX
//   FTN_KERNEL_GRID_CONSTANT(name, Params, p, MAX) { }  same, with the argument
//       __grid_constant__ (its address is the parameter space's, as TMA
//       tensor maps in it need; cuda/gemm_sm90.cu)
//   FTN_KERNEL_CLUSTER(name, Params, p, MAX, C) { }   same as BOUNDED, launched
//       in thread block clusters of C blocks along x (__cluster_dims__(C,1,1)
//       on sm_90 and later; an sm_80 build has no clusters and is never
//       launched); cuda/cluster.cuh
//   FTN_SHARED(T, name, [N][M]...)                 static shared array
//   FTN_DYNAMIC_SHARED(T, name)                    `T *name` = dynamic shared
//   FTN_ASSERT(cond)                               device assert: fails the
//       launch with the kernel name and condition, never aborts the host
//   FTN_ASSERT_ALIGNED(ptr, bytes)                 the emulator fails the launch
//       unless ptr is bytes-aligned (a GPU faults); no-op under nvcc
//   FTN_CALLER_LOC / FTN_CALLER_FWD / FTN_ASSERT_ALIGNED_CALLER(ptr, bytes, what)
//       the same for a helper, reporting its caller's file:line (vec.cuh)
//   FTN_DEVICE                                     __device__ __forceinline__
#ifndef FTN_KERNEL_CUH
#define FTN_KERNEL_CUH

#include "params/ferrotron_kernels.h"

#if defined(FTN_KERNEL_SCAN)
// build.rs preprocesses each .cu with FTN_KERNEL_SCAN to list its kernels:
// every declaration becomes the token line `ftn_kernel_decl <name> <Params> ;`.
#define FTN_DEVICE
#define FTN_KERNEL(name, Params, p) \
  ftn_kernel_decl name Params;      \
  void ftn_scan_##name(const Params p)
#define FTN_KERNEL_BOUNDED(name, Params, p, max_threads) FTN_KERNEL(name, Params, p)
#define FTN_KERNEL_GRID_CONSTANT(name, Params, p, max_threads) FTN_KERNEL(name, Params, p)
#define FTN_KERNEL_CLUSTER(name, Params, p, max_threads, cluster) \
  ftn_kernel_decl name Params ftn_cluster cluster;                  \
  void ftn_scan_##name(const Params p)
#define FTN_SHARED(T, name, dims) T name dims
#define FTN_DYNAMIC_SHARED(T, name) T *name
#define FTN_ASSERT(cond)
#define FTN_ASSERT_ALIGNED(ptr, bytes)
#define FTN_CALLER_LOC
#define FTN_CALLER_FWD
#define FTN_ASSERT_ALIGNED_CALLER(ptr, bytes, what)

#elif defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <assert.h>
#include <stdint.h>

#define FTN_DEVICE __device__ __forceinline__
#define FTN_KERNEL(name, Params, p) extern "C" __global__ void name(const Params p)
#define FTN_KERNEL_BOUNDED(name, Params, p, max_threads) \
  extern "C" __global__ void __launch_bounds__(max_threads) name(const Params p)
#define FTN_KERNEL_GRID_CONSTANT(name, Params, p, max_threads) \
  extern "C" __global__ void __launch_bounds__(max_threads, 1) name(const __grid_constant__ Params p)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FTN_CLUSTER_DIMS(cluster)  // no clusters before sm_90
#else
#define FTN_CLUSTER_DIMS(cluster) __cluster_dims__(cluster, 1, 1)
#endif
#define FTN_KERNEL_CLUSTER(name, Params, p, max_threads, cluster)                 \
  extern "C" __global__ void FTN_CLUSTER_DIMS(cluster) __launch_bounds__(max_threads) \
      name(const Params p)
#define FTN_SHARED(T, name, dims) __shared__ T name dims
#define FTN_DYNAMIC_SHARED(T, name)                             \
  extern __shared__ __align__(16) unsigned char ftn_dyn_smem_raw[]; \
  T *name = reinterpret_cast<T *>(ftn_dyn_smem_raw)
// Debug fatbins only: release ones are built with -DNDEBUG, since a trapped
// device assert is sticky and fails every later launch in the process.
#define FTN_ASSERT(cond) assert(cond)
// Alignment is checked by the hardware (misaligned address fault).
#define FTN_ASSERT_ALIGNED(ptr, bytes) ((void)0)
#define FTN_CALLER_LOC
#define FTN_CALLER_FWD
#define FTN_ASSERT_ALIGNED_CALLER(ptr, bytes, what) ((void)0)

#else  // the CPU emulator

#include "emu/cuda_emu.h"
// The emulator's argument is already a reference to the launch's copy.
#define FTN_KERNEL_GRID_CONSTANT(name, Params, p, max_threads) \
  FTN_KERNEL_BOUNDED(name, Params, p, max_threads)

#endif

#endif  // FTN_KERNEL_CUH
