/* Parameters of cuda/adam.cu (included by ferrotron_kernels.h).
 *
 * Fused multi-tensor AdamW. The list machinery is the multi-tensor one
 * (multi_tensor.h): the host uploads one FtnAdamTensorDesc per tensor and one
 * FtnChunkDesc per chunk of `chunk_size` elements (core::plan::multi_tensor);
 * blocks of FTN_MT_THREADS walk the chunks with a grid-stride loop.
 *
 * Capturable: lr, the step counter, the gradient unscale factor and the
 * found_inf flag are read from DEVICE memory, so a step can be enqueued (or
 * captured in a graph) without the host knowing any of them. */
#ifndef FTN_KERNELS_ADAM_H
#define FTN_KERNELS_ADAM_H

#include <stdint.h>

#include "multi_tensor.h"

/* Weight decay modes (the `mode` field of FtnAdamParams). */
#define FTN_ADAM_DECOUPLED 0u /* AdamW: p -= lr * (update + wd * p) */
#define FTN_ADAM_L2 1u        /* Adam + L2: g += wd * p before the moments */

/* One parameter tensor of the list: 64 bytes. p, m, v are fp32 with numel
 * elements; g has numel elements of g_dtype; model, when not NULL, receives
 * (model_dtype) p_new. */
typedef struct FtnAdamTensorDesc {
  float *p;
  float *m;
  float *v;
  const void *g;
  void *model; /* or NULL */
  int64_t numel;
  float weight_decay;
  uint32_t g_dtype;     /* FTN_MT_* */
  uint32_t model_dtype; /* FTN_MT_*, ignored when model is NULL */
  uint32_t reserved;    /* 0 */
} FtnAdamTensorDesc;

/* One AdamW step over every element of every tensor, all arithmetic fp32:
 *   skip everything (write nothing) when found_inf != NULL && *found_inf > 0
 *   t   = *step + 1;  bc1 = 1 - beta1^t;  bc2 = 1 - beta2^t  (fp64, then fp32)
 *   inv = scaler ? (float)(1.0 / (double)scaler->scale)
 *                : inv_scale ? *inv_scale : 1
 *   g = g * inv;  L2: g += wd * p
 *   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
 *   u = (m * rbc1) / (sqrtf(v * rbc2) + eps);  decoupled: u += wd * p
 *       (rbc1 = 1 / bc1, rbc2 = 1 / bc2 in fp32; IEEE sqrt and division)
 *   p = p - *lr * u;  model = (model_dtype) p
 * The step counter is not written here (ftn_adam_step_advance).
 * Kernel ftn_adam. */
typedef struct FtnAdamParams {
  const FtnAdamTensorDesc *tensors;
  const FtnChunkDesc *chunks;
  const float *lr;                  /* [1] */
  const int32_t *step;              /* [1] steps taken so far */
  const float *found_inf;           /* [1] or NULL */
  const float *inv_scale;           /* [1] or NULL */
  const FtnGradScalerState *scaler; /* or NULL; wins over inv_scale */
  float beta1;                      /* [0, 1) */
  float beta2;                      /* [0, 1) */
  float eps;                        /* > 0 */
  uint32_t mode;                    /* FTN_ADAM_* */
  int64_t num_chunks;
  int64_t chunk_size;
} FtnAdamParams;

/* *step += 1 unless found_inf != NULL && *found_inf > 0 (one thread; enqueue
 * after ftn_adam on the same stream). Kernel ftn_adam_step_advance. */
typedef struct FtnAdamStepAdvanceParams {
  int32_t *step;          /* [1] */
  const float *found_inf; /* [1] or NULL */
} FtnAdamStepAdvanceParams;

#endif /* FTN_KERNELS_ADAM_H */
