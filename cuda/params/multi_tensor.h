/* Parameters of cuda/multi_tensor.cu (included by ferrotron_kernels.h).
 *
 * Multi-tensor kernels work on a list of tensors of mixed dtypes in ONE
 * launch. The host uploads two tables: one FtnTensorDesc per tensor and one
 * FtnChunkDesc per chunk of `chunk_size` elements (a tensor of n elements has
 * ceil(n / chunk_size) chunks; empty tensors have none). Blocks walk the chunk
 * table with a grid-stride loop. chunk_size is a multiple of 2048. */
#ifndef FTN_KERNELS_MULTI_TENSOR_H
#define FTN_KERNELS_MULTI_TENSOR_H

#include <stdint.h>

/* Element types of a tensor (the `dtype` field of FtnTensorDesc). */
#define FTN_MT_F32 0u
#define FTN_MT_F16 1u
#define FTN_MT_BF16 2u

/* Threads per block of every multi-tensor kernel (the reductions assume it). */
#define FTN_MT_THREADS 256

/* One tensor: 24 bytes. */
typedef struct FtnTensorDesc {
  void *data;     /* numel elements of `dtype` */
  int64_t numel;  /* >= 1 when the tensor has chunks */
  uint32_t dtype; /* FTN_MT_* */
  uint32_t vec;   /* 1: data is 16-byte aligned (128-bit accesses); 0: scalar */
} FtnTensorDesc;

/* One chunk: elements [chunk * chunk_size, min((chunk + 1) * chunk_size, numel))
 * of tensor `tensor`. 8 bytes. */
typedef struct FtnChunkDesc {
  uint32_t tensor;
  uint32_t chunk;
} FtnChunkDesc;

/* Device-resident state of DynamicGradScaler (src/core/loss_scaler.rs keeps the
 * same fields on the host; both update bit-for-bit alike). 16 bytes. */
typedef struct FtnGradScalerState {
  float scale;
  int32_t growth_tracker;
  int32_t hysteresis_tracker;
  int32_t reserved; /* 0 */
} FtnGradScalerState;

/* x <- x * inv_scale in place for every element of every tensor, and
 * *found_inf = 1.0f if any x or any stored result is not finite (found_inf is
 * only ever set, never cleared). inv_scale is `inv_scale`, or, when `scaler`
 * is not NULL, (float)(1.0 / (double)scaler->scale) read on the device.
 * Kernels ftn_multi_tensor_unscale (one for all dtypes). */
typedef struct FtnMultiTensorUnscaleParams {
  const FtnTensorDesc *tensors;
  const FtnChunkDesc *chunks;
  float *found_inf;                 /* [1] */
  const FtnGradScalerState *scaler; /* or NULL */
  float inv_scale;                  /* used when scaler is NULL */
  uint32_t reserved;
  int64_t num_chunks;
  int64_t chunk_size;
} FtnMultiTensorUnscaleParams;

/* partial[c] = sum of x^2 over chunk c, fp32, in a fixed order (independent of
 * alignment and of the grid size). Kernel ftn_multi_tensor_l2norm_partial. */
typedef struct FtnMultiTensorL2NormParams {
  const FtnTensorDesc *tensors;
  const FtnChunkDesc *chunks;
  float *partial; /* [num_chunks] */
  int64_t num_chunks;
  int64_t chunk_size;
} FtnMultiTensorL2NormParams;

/* *norm = sqrt(sum of partial[0..n)), the sum taken in fp64 in a fixed order
 * by one block of FTN_MT_THREADS threads; 0 when n == 0.
 * Kernel ftn_multi_tensor_l2norm_final. */
typedef struct FtnMultiTensorL2NormFinalParams {
  float *norm;          /* [1] */
  const float *partial; /* [num_partials] */
  int64_t num_partials;
} FtnMultiTensorL2NormFinalParams;

/* coeff = max_norm / ((double)*norm + eps) computed in fp64 on the device (as
 * Megatron computes it on the host from the norm), then cast to fp32; when
 * coeff < 1, x <- x * coeff for every element of every tensor; else nothing is
 * written (a NaN norm gives no clipping). Kernel ftn_multi_tensor_clip. */
typedef struct FtnMultiTensorClipParams {
  const FtnTensorDesc *tensors;
  const FtnChunkDesc *chunks;
  const float *norm; /* [1] */
  double max_norm;
  double eps;
  int64_t num_chunks;
  int64_t chunk_size;
} FtnMultiTensorClipParams;

/* One step of DynamicGradScaler on the device (one thread):
 *   found = *found_inf > 0
 *   found:  growth_tracker = 0; hysteresis_tracker -= 1 (saturating at
 *           INT32_MIN); if hysteresis_tracker <= 0:
 *           scale = fmaxf(scale * backoff_factor, min_scale)
 *   clean:  growth_tracker += 1; if growth_tracker == growth_interval:
 *           growth_tracker = 0, hysteresis_tracker = hysteresis,
 *           scale = scale * growth_factor
 * then *found_inf = 0 when reset_found_inf != 0.
 * Kernel ftn_grad_scaler_update; launch with one block of one thread. */
typedef struct FtnGradScalerUpdateParams {
  FtnGradScalerState *state;
  float *found_inf; /* [1] */
  float min_scale;
  float growth_factor;
  float backoff_factor;
  int32_t growth_interval; /* >= 1 */
  int32_t hysteresis;      /* >= 1 */
  uint32_t reset_found_inf;
} FtnGradScalerUpdateParams;

#endif /* FTN_KERNELS_MULTI_TENSOR_H */
