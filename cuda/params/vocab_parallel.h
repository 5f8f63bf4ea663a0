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

/* dweight[v, h] (+)= sum over tokens t with ids[t] == vocab_start + v of
 * dy[t, h], fp32, in token order (deterministic, no float atomics). One block
 * of 256 threads per shard row. Kernels ftn_vocab_embed_bwd_{f32,f16,bf16}
 * (dy dtype). */
typedef struct FtnVocabEmbedBwdParams {
  float *dweight; /* [shard_rows, hidden] fp32 */
  const void *dy; /* [tokens, hidden] */
  const void *ids;
  int64_t tokens;
  int64_t hidden;
  int64_t vocab_start;
  int64_t shard_rows;
  uint32_t ids_i64;
  uint32_t accumulate; /* 1: add to dweight; 0: overwrite */
} FtnVocabEmbedBwdParams;

/* row_max[t] = max over c of logits[t, c] (fp32). One block per token.
 * Kernels ftn_vocab_ce_max_{f32,f16,bf16}. */
typedef struct FtnVocabCeMaxParams {
  float *row_max;     /* [tokens] */
  const void *logits; /* [tokens, cols] */
  int64_t tokens;
  int64_t cols;
} FtnVocabCeMaxParams;

/* With m = row_max[t] (already reduced over ranks):
 *   sums[0*tokens + t] = sum_c exp(logits[t, c] - m)
 *   sums[1*tokens + t] = logits[t, labels[t] - vocab_start] if on this shard, else 0
 *   sums[2*tokens + t] = sum_c logits[t, c]        (only if with_logit_sum)
 * One block per token. Kernels ftn_vocab_ce_stats_{f32,f16,bf16}. */
typedef struct FtnVocabCeStatsParams {
  float *sums;           /* [2 or 3, tokens] */
  const float *row_max;  /* [tokens] */
  const void *logits;    /* [tokens, cols] */
  const void *labels;    /* [tokens] int32 or int64 */
  int64_t tokens;
  int64_t cols;
  int64_t vocab_start;
  uint32_t ids_i64;
  uint32_t with_logit_sum;
} FtnVocabCeStatsParams;

/* loss[t] = m + log(sumexp) - (1 - eps) * target - eps * inv_vocab * sumlogits
 * (the sums reduced over ranks; eps = 0 ignores the third row), or exactly 0
 * when has_ignore_index and labels[t] == ignore_index (PyTorch's
 * ignore_index; the label is compared as int64).
 * Kernel ftn_vocab_ce_loss. */
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
 * labels[t] == ignore_index. grad may alias logits. Grid-stride elementwise.
 * Kernels ftn_vocab_ce_bwd_{f32,f16,bf16}. */
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
