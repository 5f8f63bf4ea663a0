/* Parameters of cuda/vocab_parallel.cu (included by ferrotron_kernels.h):
 * the local parts of the vocab-parallel embedding and cross-entropy. Rank r
 * owns vocab rows [vocab_start, vocab_start + shard_rows). Token ids / labels
 * are int32 or int64 (`ids_i64`). */
#ifndef FTN_KERNELS_VOCAB_PARALLEL_H
#define FTN_KERNELS_VOCAB_PARALLEL_H

#include <stdint.h>

/* out[t, h] = weight[ids[t] - vocab_start, h] if the id is in this rank's
 * range, else 0. Kernels ftn_vocab_embed_fwd_{f32,f16,bf16}. */
typedef struct FtnVocabEmbedFwdParams {
  void *out;          /* [tokens, hidden] */
  const void *weight; /* [shard_rows, hidden] */
  const void *ids;    /* [tokens] int32 or int64 */
  int64_t tokens;
  int64_t hidden;
  int64_t vocab_start;
  int64_t shard_rows;
  uint32_t ids_i64;
  uint32_t pad_;
} FtnVocabEmbedFwdParams;

/* Embedding backward, step 1: keys[i] = (row << 32) | i for i < tokens
 * (row = ids[i] - vocab_start if in [0, shard_rows), else shard_rows) and
 * INT64_MAX for i in [tokens, n). tokens < 2^32. Kernel
 * ftn_vocab_embed_sort_keys (grid-stride). */
typedef struct FtnVocabEmbedSortKeysParams {
  int64_t *keys;   /* [n] */
  const void *ids; /* [tokens] int32 or int64 */
  int64_t tokens;
  int64_t n; /* a power of two >= tokens */
  int64_t vocab_start;
  int64_t shard_rows;
  uint32_t ids_i64;
  uint32_t pad_;
} FtnVocabEmbedSortKeysParams;

/* Embedding backward, step 2: the bitonic sort of keys[0, n) (n a power of
 * two), ascending. ftn_vocab_embed_sort_tile (one block of 256 threads per
 * tile of min(n, 2048) keys, in shared memory): k == 0 runs every stage
 * k = 2 .. tile, else the steps j < tile of stage k. ftn_vocab_embed_sort_step
 * (grid-stride over n / 2 pairs): the step (k, j) for j >= tile. */
typedef struct FtnVocabEmbedSortStepParams {
  int64_t *keys; /* [n] */
  int64_t n;
  int64_t k;
  int64_t j;
} FtnVocabEmbedSortStepParams;

/* Embedding backward, step 3: dweight[v, h] (+)= sum over tokens t with
 * ids[t] == vocab_start + v of dy[t, h], fp32, in token order
 * (deterministic, no float atomics), from the sorted keys of steps 1-2. One
 * block of 256 threads per shard row; with accumulate a row without tokens
 * is not touched, without it is zeroed. Kernels
 * ftn_vocab_embed_bwd_{f32,f16,bf16} (dy dtype). */
typedef struct FtnVocabEmbedBwdParams {
  float *dweight;        /* [shard_rows, hidden] fp32 */
  const void *dy;        /* [tokens, hidden] */
  const int64_t *sorted; /* [tokens] the sorted keys (first tokens of n) */
  int64_t tokens;
  int64_t hidden;
  int64_t shard_rows;
  uint32_t accumulate; /* 1: add to dweight; 0: overwrite */
  uint32_t pad_;
} FtnVocabEmbedBwdParams;

/* One pass over each row (online softmax), with m = this shard's row max:
 *   row_max[t] = m (and local_max[t] = m when local_max != NULL)
 *   sums[0*tokens + t] = sum_c exp(logits[t, c] - m)
 *   sums[1*tokens + t] = logits[t, labels[t] - vocab_start] if on this shard, else 0
 *   sums[2*tokens + t] = sum_c logits[t, c]        (only if with_logit_sum)
 * With several ranks: all-reduce MAX row_max, ftn_vocab_ce_rescale, then
 * all-reduce SUM the sums. Blocks of 256 threads. Kernels
 * ftn_vocab_ce_stats_{f32,f16,bf16} (a block per token) and
 * ftn_vocab_ce_stats_warp_{f32,f16,bf16} (a warp per token). */
typedef struct FtnVocabCeStatsParams {
  float *sums;        /* [2 or 3, tokens] */
  float *row_max;     /* [tokens] */
  float *local_max;   /* [tokens] or NULL */
  const void *logits; /* [tokens, cols] */
  const void *labels; /* [tokens] int32 or int64 */
  int64_t tokens;
  int64_t cols;
  int64_t vocab_start;
  uint32_t ids_i64;
  uint32_t with_logit_sum;
} FtnVocabCeStatsParams;

/* sums[t] *= exp(local_max[t] - row_max[t]) (row_max reduced over the ranks;
 * no change where they are equal). Grid-stride. Kernel ftn_vocab_ce_rescale. */
typedef struct FtnVocabCeRescaleParams {
  float *sums;            /* [tokens]: row 0 of the stats */
  const float *row_max;   /* [tokens] */
  const float *local_max; /* [tokens] */
  int64_t tokens;
} FtnVocabCeRescaleParams;

/* loss[t] = m + log(sumexp) - (1 - eps) * target - eps * inv_vocab * sumlogits
 * (the sums reduced over ranks; eps = 0 ignores the third row), or exactly 0
 * when has_ignore_index and labels[t] == ignore_index (PyTorch's
 * ignore_index; the label is compared as int64).
 * Grid-stride over the tokens. Kernel ftn_vocab_ce_loss. */
typedef struct FtnVocabCeLossParams {
  float *loss;          /* [tokens] */
  const float *row_max; /* [tokens] */
  const float *sums;    /* [2 or 3, tokens] */
  const void *labels;   /* [tokens] int32 or int64 */
  int64_t tokens;
  int64_t ignore_index;
  float smoothing;
  float inv_vocab; /* 1 / (full padded vocab) */
  uint32_t ids_i64;
  uint32_t has_ignore_index;
} FtnVocabCeLossParams;

/* grad[t, c] = dloss[t] * (exp(logits[t, c] - m) / sumexp
 *              - (1 - eps) * [c == labels[t] - vocab_start] - eps * inv_vocab),
 * or exactly 0 for the whole row when has_ignore_index and
 * labels[t] == ignore_index. grad may alias logits. One block of 256
 * threads per token. Kernels ftn_vocab_ce_bwd_{f32,f16,bf16}. */
typedef struct FtnVocabCeBwdParams {
  void *grad;           /* [tokens, cols] */
  const void *logits;   /* [tokens, cols] */
  const void *labels;   /* [tokens] */
  const float *row_max; /* [tokens] */
  const float *sums;    /* [>= 1, tokens]: row 0 = sum of exp */
  const float *dloss;   /* [tokens] */
  int64_t tokens;
  int64_t cols;
  int64_t vocab_start;
  int64_t ignore_index;
  float smoothing;
  float inv_vocab;
  uint32_t ids_i64;
  uint32_t has_ignore_index;
} FtnVocabCeBwdParams;

#endif /* FTN_KERNELS_VOCAB_PARALLEL_H */
