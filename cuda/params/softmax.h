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
 * 4 warps per block; short rows on the vector path: two vectors per lane,
 * 16*N/vec lanes per row, several rows per warp), block holds 32 values per
 * thread (sk <= 32*blockDim.x, blockDim.x <= 512), long (<= 1024 threads)
 * streams the row twice.
 * Attention dropout: when y_dropped is not NULL, y_dropped[r, c] =
 * keep(i) * drop_scale * y[r, c] is written too (y keeps the undropped
 * probabilities), with i = r * sk + c the row-major element index and keep(i)
 * the rule of dropout.h: random value offset + i of the Philox stream `seed`
 * >= drop_threshold. drop_threshold = 0, drop_scale = 1 copies y. y_dropped
 * must not alias x or y. */
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
  void *y_dropped;    /* [rows, sk], or NULL: no dropout output */
  uint64_t seed;      /* Philox stream of the dropout mask */
  uint64_t offset;    /* first random value of the stream this call uses */
  uint32_t drop_threshold; /* keep iff the element's random word >= this */
  float drop_scale;        /* multiplier of kept elements, 1/(1-p) */
} FtnSoftmaxFwdParams;

/* dx[r, c] = scale * (g[r, c] * y[r, c] - y[r, c] * sum_j g[r, j] * y[r, j])
 * with y the forward output (undropped) and g = dy when drop_threshold = 0,
 * else g[r, c] = keep(i) * drop_scale * dy[r, c] with the forward's dropout
 * mask regenerated from (seed, offset) (dy: the gradient of the dropped
 * probabilities); dx may alias dy (in place). With drop_threshold != 0 the
 * rows of the warp path go to ftn_softmax_bwd_dropout_warp_{f32,f16,bf16}
 * (a warp per row, 128 threads, the row streamed twice) and those of the
 * block path to the long kernel; the warp and block kernels require
 * drop_threshold = 0.
 * Kernels ftn_softmax_bwd_{warp1,...,warp32,block,long}_{f32,f16,bf16}. */
typedef struct FtnSoftmaxBwdParams {
  void *dx;       /* [rows, sk] */
  const void *y;  /* [rows, sk] */
  const void *dy; /* [rows, sk] */
  int64_t rows;
  int64_t sk; /* >= 1 */
  float scale;
  uint32_t vec; /* elements per 128-bit access, or 1 */
  uint64_t seed;
  uint64_t offset;
  uint32_t drop_threshold; /* 0: no dropout (drop_scale ignored) */
  float drop_scale;
} FtnSoftmaxBwdParams;

#endif /* FTN_KERNELS_SOFTMAX_H */
