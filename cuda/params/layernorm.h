/* Parameters of cuda/layernorm.cu (included by ferrotron_kernels.h).
 *
 * LayerNorm and RMSNorm over the last dimension of a row-major [rows, cols]
 * matrix, fp32 statistics and arithmetic for every storage dtype. */
#ifndef FTN_KERNELS_LAYERNORM_H
#define FTN_KERNELS_LAYERNORM_H

#include <stdint.h>

/* Which normalisation (the `kind` field). */
#define FTN_NORM_LAYER 0u /* (x - mean) * rstd * g + beta, rstd = rsqrt(var + eps) */
#define FTN_NORM_RMS 1u   /* x * rstd * g, rstd = rsqrt(mean(x^2) + eps) */

/* Forward. g = gamma (+1 when zero_centered_gamma), or 1 when gamma is NULL;
 * beta NULL means 0 (RMSNorm ignores beta). Writes y, and for every row
 * mean[row] (LayerNorm; may be NULL) and rstd[row] (may be NULL).
 * Kernels ftn_layernorm_fwd_{warp,block,global}_{f32,f16,bf16}. */
typedef struct FtnLayerNormFwdParams {
  void *y;           /* [rows, cols] */
  const void *x;     /* [rows, cols] */
  const void *gamma; /* [cols] or NULL */
  const void *beta;  /* [cols] or NULL */
  float *mean;       /* [rows] or NULL */
  float *rstd;       /* [rows] or NULL */
  int64_t rows;
  int64_t cols;
  float eps;
  uint32_t kind;                /* FTN_NORM_* */
  uint32_t zero_centered_gamma; /* 0 or 1 */
  uint32_t vec;                 /* elements per 128-bit access, or 1 */
} FtnLayerNormFwdParams;

/* Backward, input gradient: with xhat = (x - mean) * rstd (RMSNorm: x * rstd)
 * and dxhat = dy * g,
 *   LayerNorm dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),
 *   RMSNorm   dx = rstd * (dxhat - xhat * mean(dxhat * xhat)).
 * dx may alias dy. Kernels ftn_layernorm_bwd_{warp,block,global}_{dtype}
 * (dx only: the partial_* and rows_per_chunk fields are ignored).
 * Fused, ftn_layernorm_bwd_fused_{warp,block}_{dtype}: dx and, for every
 * chunk k of rows_per_chunk rows (one block each, grid x * y >= chunks),
 *   partial_gamma[k, c] = sum over the chunk of dy[r, c] * xhat[r, c],
 *   partial_beta[k, c]  = sum over the chunk of dy[r, c]   (if not NULL),
 * in a fixed order (deterministic); the block path takes 8 * cols bytes of
 * dynamic shared memory. */
typedef struct FtnLayerNormBwdParams {
  void *dx;          /* [rows, cols] */
  const void *dy;    /* [rows, cols] */
  const void *x;     /* [rows, cols] input of the forward */
  const void *gamma; /* [cols] or NULL */
  const float *mean; /* [rows] (LayerNorm) or NULL (RMSNorm) */
  const float *rstd; /* [rows] */
  int64_t rows;
  int64_t cols;
  uint32_t kind;                /* FTN_NORM_* */
  uint32_t zero_centered_gamma; /* 0 or 1 */
  uint32_t vec;                 /* elements per 128-bit access, or 1 */
  uint32_t reserved;            /* 0 */
  float *partial_gamma;         /* [chunks, cols] fp32 (fused kernels) */
  float *partial_beta;          /* [chunks, cols] fp32 or NULL (fused kernels) */
  int64_t rows_per_chunk;       /* >= 1 (fused kernels) */
} FtnLayerNormBwdParams;

/* Backward, stage one of the parameter gradients: for every chunk k of
 * rows_per_chunk rows, in row order (deterministic),
 *   partial_gamma[k, c] = sum over the chunk of dy[r, c] * xhat[r, c],
 *   partial_beta[k, c]  = sum over the chunk of dy[r, c]   (if not NULL).
 * Kernels ftn_layernorm_param_grad_{dtype}; grid (column tiles, chunks). */
typedef struct FtnLayerNormParamGradParams {
  float *partial_gamma; /* [chunks, cols] fp32 */
  float *partial_beta;  /* [chunks, cols] fp32, or NULL */
  const void *dy;       /* [rows, cols] */
  const void *x;        /* [rows, cols] */
  const float *mean;    /* [rows] (LayerNorm) or NULL (RMSNorm) */
  const float *rstd;    /* [rows] */
  int64_t rows;
  int64_t cols;
  int64_t rows_per_chunk; /* >= 1 */
  uint32_t kind;          /* FTN_NORM_* */
  uint32_t vec;           /* elements per 128-bit access, or 1 */
} FtnLayerNormParamGradParams;

/* Backward, stage two: dgamma[c] = sum over k of partial_gamma[k, c] and
 * dbeta[c] likewise, in a fixed order (deterministic), fp32 accumulation.
 * blockIdx.y = 0 sums gamma, 1 sums beta; a NULL output is skipped.
 * Block (32, R) with 1 <= R <= 32 (R threads split the chunks).
 * Kernels ftn_layernorm_column_sum_{dtype} (output dtype). */
typedef struct FtnLayerNormColumnSumParams {
  void *dgamma;               /* [cols] or NULL */
  void *dbeta;                /* [cols] or NULL (then gridDim.y = 1) */
  const float *partial_gamma; /* [chunks, cols] */
  const float *partial_beta;  /* [chunks, cols] or NULL */
  int64_t chunks;
  int64_t cols;
} FtnLayerNormColumnSumParams;

#endif /* FTN_KERNELS_LAYERNORM_H */
