/* Parameters of cuda/gemm_sm90.cu, the Hopper (sm_90a) GEMM (included by
 * ferrotron_kernels.h). It computes exactly what FtnGemmParams describes
 * (gemm.h); A and B are read through two TMA tensor maps the host encodes
 * (cuTensorMapEncodeTiled on a GPU, ftn_emu_tensor_map_encode_tiled on the
 * emulator), so the struct is passed as a __grid_constant__ kernel argument. */
#ifndef FTN_KERNELS_GEMM_SM90_H
#define FTN_KERNELS_GEMM_SM90_H

#include <stdint.h>

#include "gemm.h"

#ifdef __cplusplus
#define FTN_ALIGN64 alignas(64)
#else
#define FTN_ALIGN64 _Alignas(64)
#endif

/* An opaque CUtensorMap: 128 bytes, 64-byte aligned. */
typedef struct FtnTensorMap {
  FTN_ALIGN64 uint64_t opaque[16];
} FtnTensorMap;

/* Block tile 128 x 128, k-slice 64, pipeline depth (kSm90Stages in the kernel). */
#define FTN_GEMM_SM90_BM 128
#define FTN_GEMM_SM90_BN 128
#define FTN_GEMM_SM90_BK 64
#define FTN_GEMM_SM90_STAGES 4
/* Threads: one producer warpgroup + two consumer warpgroups. */
#define FTN_GEMM_SM90_THREADS 384
/* Dynamic shared memory: STAGES x (A + B tiles) + 1024 alignment slack + barriers. */
#define FTN_GEMM_SM90_SMEM_BYTES                                                    \
  (FTN_GEMM_SM90_STAGES * (FTN_GEMM_SM90_BM + FTN_GEMM_SM90_BN) * FTN_GEMM_SM90_BK * 2 + \
   1024 + 256)

/* Kernels ftn_gemm_wgmma_{f16,bf16}_{out}; grid.x = number of persistent blocks
 * (at most the SM count), which walk the tiles_m * tiles_n * batch output
 * tiles in a grouped (rasterised) order.
 * tmap_a: A as a rank-3 tensor {stored cols, stored rows, batch}, box
 *   {64, 128, 1} when A is K-contiguous (trans_a = 0), {64, 64, 1} when
 *   M-contiguous (trans_a = 1); tmap_b likewise for B (K-contiguous when
 *   trans_b = 1). 128-byte swizzle, zero fill out of bounds. */
typedef struct FtnGemmSm90Params {
  FtnTensorMap tmap_a;
  FtnTensorMap tmap_b;
  FtnGemmParams g; /* g.a / g.b are the tensors the maps describe */
  int64_t tiles_m, tiles_n;
  int64_t group_m; /* rasterisation: m-tiles per group walked column by column */
} FtnGemmSm90Params;

#endif /* FTN_KERNELS_GEMM_SM90_H */
