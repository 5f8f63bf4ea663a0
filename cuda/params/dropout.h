/* Parameters of cuda/dropout.cu (included by ferrotron_kernels.h).
 *
 * Random value number j = offset + i (i: the row-major element index) of the
 * Philox stream `seed` is u = word (j % 4) of philox4x32_10(counter
 * {lo32(j/4), hi32(j/4), 0, 0}, key {lo32(seed), hi32(seed)}); element i is
 * kept iff u >= drop_threshold (drop_threshold = round(p * 2^32), so the drop
 * probability is drop_threshold / 2^32). Kept elements are multiplied by
 * `scale` (1/(1-p) in fp32), dropped ones are 0. Eval mode is
 * drop_threshold = 0, scale = 1. */
#ifndef FTN_KERNELS_DROPOUT_H
#define FTN_KERNELS_DROPOUT_H

#include <stdint.h>

/* out[r, c] = residual[r, c] + keep(i) * scale * (x[r, c] + bias[c])
 * (bias may be NULL). out may alias x or residual.
 * Kernels ftn_bias_dropout_add_fwd_{f32,f16,bf16}. */
typedef struct FtnBiasDropoutAddFwdParams {
  void *out;            /* [rows, cols] */
  const void *x;        /* [rows, cols] */
  const void *bias;     /* [cols] or NULL */
  const void *residual; /* [rows, cols] */
  int64_t rows;
  int64_t cols;
  uint64_t seed;
  uint64_t offset;         /* first random value of the stream this call uses */
  uint32_t drop_threshold; /* keep iff the element's random word >= this */
  float scale;             /* multiplier of kept elements */
  uint32_t vec;            /* elements per 128-bit access, or 1 */
} FtnBiasDropoutAddFwdParams;

/* dx[r, c] = keep(i) * scale * dy[r, c] (the forward's mask, regenerated
 * from seed and offset); d_residual[r, c] = dy[r, c] if d_residual is not
 * NULL. dx may alias dy. If dbias_partial is not NULL, writes, for every
 * chunk k of rows_per_chunk rows, dbias_partial[k, c] = sum over the chunk's
 * rows of dx[r, c] in fp32, in row order (stage two:
 * ftn_column_sum_partials_*). Kernels ftn_bias_dropout_add_bwd_{f32,f16,bf16};
 * grid (column tiles, chunks). */
typedef struct FtnBiasDropoutAddBwdParams {
  void *dx;             /* [rows, cols] */
  void *d_residual;     /* [rows, cols] or NULL */
  const void *dy;       /* [rows, cols] */
  float *dbias_partial; /* [chunks, cols] fp32, or NULL */
  int64_t rows;
  int64_t cols;
  int64_t rows_per_chunk; /* >= 1 */
  uint64_t seed;
  uint64_t offset;
  uint32_t drop_threshold;
  float scale;
  uint32_t vec;
} FtnBiasDropoutAddBwdParams;

/* out[i] = random value number offset + i of stream `seed`, as raw bits
 * (the emulator / GPU twin of core::philox, for tests).
 * Kernel ftn_philox_fill_i32. */
typedef struct FtnPhiloxFillParams {
  int32_t *out;
  int64_t n;
  uint64_t seed;
  uint64_t offset;
} FtnPhiloxFillParams;

#endif /* FTN_KERNELS_DROPOUT_H */
