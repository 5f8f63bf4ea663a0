/* Parameters of cuda/bias_gelu.cu (included by ferrotron_kernels.h). */
#ifndef FTN_KERNELS_BIAS_GELU_H
#define FTN_KERNELS_BIAS_GELU_H

#include <stdint.h>

/* GeLU flavours (the `gelu` field). */
#define FTN_GELU_TANH 0u /* Megatron's tanh approximation */
#define FTN_GELU_ERF 1u  /* exact: 0.5*x*(1+erf(x/sqrt(2))), PyTorch's F.gelu */

/* out[r, c] = gelu(x[r, c] + bias[c])   (bias may be NULL: plain GeLU).
 * Kernels ftn_bias_gelu_fwd_{f32,f16,bf16}. */
typedef struct FtnBiasGeluFwdParams {
  void *out;        /* [rows, cols] */
  const void *x;    /* [rows, cols] */
  const void *bias; /* [cols] or NULL */
  int64_t rows;
  int64_t cols;
  uint32_t gelu; /* FTN_GELU_* */
  uint32_t vec;  /* elements per 128-bit access, or 1 for the scalar path */
} FtnBiasGeluFwdParams;

/* dx[r, c] = dy[r, c] * gelu'(x[r, c] + bias[c]); dx may alias dy.
 * If dbias_partial is not NULL, also writes, for every chunk k of
 * rows_per_chunk rows, dbias_partial[k, c] = sum over the chunk's rows of
 * dx[r, c] in fp32, in row order (deterministic).
 * Kernels ftn_bias_gelu_bwd_{f32,f16,bf16}; grid (column tiles, chunks). */
typedef struct FtnBiasGeluBwdParams {
  void *dx;               /* [rows, cols] */
  const void *dy;         /* [rows, cols] */
  const void *x;          /* [rows, cols] pre-bias input of the forward */
  const void *bias;       /* [cols] or NULL */
  float *dbias_partial;   /* [chunks, cols] fp32, or NULL */
  int64_t rows;
  int64_t cols;
  int64_t rows_per_chunk; /* >= 1 */
  uint32_t gelu;          /* FTN_GELU_* */
  uint32_t vec;           /* elements per 128-bit access, or 1 */
} FtnBiasGeluBwdParams;

/* out[c] = sum over k in [0, chunks) of partial[k, c], in order k = 0, 1, ...
 * (fp32 accumulation; deterministic). Stage two of a column sum.
 * Kernels ftn_column_sum_partials_{f32,f16,bf16} (out dtype). */
typedef struct FtnColumnSumParams {
  void *out;            /* [cols] */
  const float *partial; /* [chunks, cols] */
  int64_t chunks;
  int64_t cols;
} FtnColumnSumParams;

#endif /* FTN_KERNELS_BIAS_GELU_H */
