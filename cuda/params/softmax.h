/* Parameters of cuda/softmax.cu (included by ferrotron_kernels.h). */
#ifndef FTN_KERNELS_SOFTMAX_H
#define FTN_KERNELS_SOFTMAX_H

#include <stdint.h>

/* Mask modes (the `mask_mode` field). */
#define FTN_SOFTMAX_MASK_NONE 0u
#define FTN_SOFTMAX_MASK_PADDING 1u /* uint8 [b or 1, 1, sq, sk], 1 = masked -> -10000 */
#define FTN_SOFTMAX_MASK_CAUSAL 2u  /* sq == sk: row i keeps columns <= i */

/* y[r, :] = softmax(mask(scale * x[r, :])) over rows r of length sk, fp32
 * arithmetic. Logits [b, np, sq, sk] give rows = b*np*sq; row r is row
 * i = r % sq of its [sq, sk] matrix and belongs to batch r / rows_per_batch.
 * Padding: a masked logit is replaced by -10000.0 after scaling; a row whose
 * every column is masked is written as zeros. Causal: columns > i are written
 * as exact zeros. y may alias x (in place).
 * Kernels ftn_softmax_fwd_{warp1,warp2,warp4,warp8,warp16,warp32,block,long}_
 * {f32,f16,bf16}: warpN holds N values per lane (sk <= 32*N, 128 threads =
 * 4 rows per block), block holds 32 values per thread (sk <= 32*blockDim.x,
 * blockDim.x <= 512), long (<= 1024 threads) streams the row twice. */
typedef struct FtnSoftmaxFwdParams {
  void *y;               /* [rows, sk] */
  const void *x;         /* [rows, sk] */
  const uint8_t *mask;   /* padding mask, or NULL for the other modes */
  int64_t rows;          /* b * np * sq */
  int64_t sk;            /* >= 1 */
  int64_t sq;            /* >= 1 */
  int64_t rows_per_batch;    /* np * sq (>= 1) */
  int64_t mask_batch_stride; /* sq * sk, or 0 when the mask broadcasts over b */
  float scale;
  uint32_t mask_mode; /* FTN_SOFTMAX_MASK_* */
  uint32_t vec;       /* elements per 128-bit access, or 1 for the scalar path */
} FtnSoftmaxFwdParams;

/* dx[r, c] = scale * (dy[r, c] * y[r, c] - y[r, c] * sum_j dy[r, j] * y[r, j])
 * with y the forward output; dx may alias dy (in place).
 * Kernels ftn_softmax_bwd_{warp1,...,warp32,block,long}_{f32,f16,bf16}. */
typedef struct FtnSoftmaxBwdParams {
  void *dx;       /* [rows, sk] */
  const void *y;  /* [rows, sk] */
  const void *dy; /* [rows, sk] */
  int64_t rows;
  int64_t sk; /* >= 1 */
  float scale;
  uint32_t vec; /* elements per 128-bit access, or 1 */
} FtnSoftmaxBwdParams;

#endif /* FTN_KERNELS_SOFTMAX_H */
