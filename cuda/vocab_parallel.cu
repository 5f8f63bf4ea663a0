// Local parts of the vocab-parallel embedding and cross-entropy (Megatron's
// VocabParallelEmbedding and vocab_parallel_cross_entropy). Communication
// (the all-reduces) is done by the Rust layer between these kernels.
//
// Embedding forward: a grid-stride loop over [tokens, hidden]; a token whose
//   id is outside [vocab_start, vocab_start + shard_rows) gets a zero row.
//   Floor: reads tokens*(idsize + hidden*sizeof(T)), writes tokens*hidden*sizeof(T).
// Embedding backward: one block of 256 threads per shard row v. The block
//   scans the ids in chunks of 256, compacts the tokens equal to v (in token
//   order: warp ballots + a prefix over the 8 warp counts), and each thread
//   adds dy[t, h] for its columns h into the fp32 row dweight[v, :]. Every
//   element has one writer and a fixed summation order: deterministic, no
//   float atomics. Cost: shard_rows*tokens id reads (L2-resident) plus one
//   read of each dy row that hits this shard and one write of dweight.
// Cross-entropy (fp32 math, one block per token for the row reductions):
//   ce_max   row max of the local shard          (then all-reduce MAX)
//   ce_stats sum exp(x - m), target logit, sum x (then all-reduce SUM)
//   ce_loss  loss = m + log(sumexp) - (1-eps)*target - eps*mean(x)
//   ce_bwd   grad = dloss * (softmax - (1-eps)*onehot - eps/V), may alias logits.
//   ignore_index (optional): a row whose label equals it gets loss 0 and a
//   zero gradient row (written as exact zeros, not scaled: a row of inf
//   logits still gives 0, not NaN).
//   Floor: forward reads the logits twice, backward reads once and writes once.
#include "ftn_dtype.cuh"
#include "reduce.cuh"

FTN_DEVICE int64_t vp_load_id(const void *ids, uint32_t i64, int64_t t) {
  return i64 ? static_cast<const int64_t *>(ids)[t] : (int64_t) static_cast<const int32_t *>(ids)[t];
}


template <typename T>
FTN_DEVICE void vocab_embed_fwd(const FtnVocabEmbedFwdParams &p) {
  const T *w = static_cast<const T *>(p.weight);
  T *out = static_cast<T *>(p.out);
  const int64_t n = p.tokens * p.hidden;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t t = i / p.hidden;
    const int64_t h = i - t * p.hidden;
    const int64_t row = vp_load_id(p.ids, p.ids_i64, t) - p.vocab_start;
    out[i] = (row >= 0 && row < p.shard_rows) ? w[row * p.hidden + h] : ftn_from_float<T>(0.0f);
  }
}

constexpr int VP_BWD_THREADS = 256;

template <typename T>
FTN_DEVICE void vocab_embed_bwd(const FtnVocabEmbedBwdParams &p) {
  // Uniform over the block (before any barrier); asserts without the
  // register spill an unconditional assert call costs here.
  if (blockDim.x != VP_BWD_THREADS) {
    FTN_ASSERT(false);
    return;
  }
  FTN_SHARED(int64_t, match, [VP_BWD_THREADS]);
  FTN_SHARED(int, warp_count, [VP_BWD_THREADS / 32]);
  const T *dy = static_cast<const T *>(p.dy);
  const int64_t v = blockIdx.x;
  const int64_t id = p.vocab_start + v;
  float *dw = p.dweight + v * p.hidden;
  if (!p.accumulate) {
    for (int64_t h = threadIdx.x; h < p.hidden; h += VP_BWD_THREADS) dw[h] = 0.0f;
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int64_t t0 = 0; t0 < p.tokens; t0 += VP_BWD_THREADS) {
    const int64_t t = t0 + threadIdx.x;
    const bool hit = t < p.tokens && vp_load_id(p.ids, p.ids_i64, t) == id;
    const unsigned ballot = __ballot_sync(0xffffffffu, hit ? 1 : 0);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0;
    int total = 0;
#pragma unroll
    for (int w = 0; w < VP_BWD_THREADS / 32; ++w) {
      const int c = warp_count[w];
      before += w < warp ? c : 0;
      total += c;
    }
    if (hit) match[before + __popc(ballot & ((1u << lane) - 1u))] = t;
    __syncthreads();
    for (int k = 0; k < total; ++k) {
      const T *row = dy + match[k] * p.hidden;
      for (int64_t h = threadIdx.x; h < p.hidden; h += VP_BWD_THREADS) dw[h] += ftn_to_float(row[h]);
    }
    __syncthreads();  // match / warp_count are rewritten by the next chunk
  }
}

template <typename T>
FTN_DEVICE void vocab_ce_max(const FtnVocabCeMaxParams &p) {
  FTN_ASSERT(blockDim.x % 32 == 0);
  FTN_SHARED(float, red, [32]);
  const T *x = static_cast<const T *>(p.logits) + (int64_t)blockIdx.x * p.cols;
  float m = FTN_NEG_INF;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) m = fmaxf(m, ftn_to_float(x[c]));
  m = ftn_block_allreduce<FtnMaxOp>(m, red);
  if (threadIdx.x == 0) p.row_max[blockIdx.x] = m;
}

template <typename T>
FTN_DEVICE void vocab_ce_stats(const FtnVocabCeStatsParams &p) {
  FTN_ASSERT(blockDim.x % 32 == 0);
  FTN_SHARED(float, red, [32]);
  const int64_t t = blockIdx.x;
  const T *x = static_cast<const T *>(p.logits) + t * p.cols;
  const float m = p.row_max[t];
  float se = 0.0f;
  float sx = 0.0f;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
    const float v = ftn_to_float(x[c]);
    se += expf(v - m);
    sx += v;
  }
  se = ftn_block_allreduce<FtnSumOp>(se, red);
  if (p.with_logit_sum) sx = ftn_block_allreduce<FtnSumOp>(sx, red);
  if (threadIdx.x == 0) {
    const int64_t c = vp_load_id(p.labels, p.ids_i64, t) - p.vocab_start;
    p.sums[t] = se;
    p.sums[p.tokens + t] = (c >= 0 && c < p.cols) ? ftn_to_float(x[c]) : 0.0f;
    if (p.with_logit_sum) p.sums[2 * p.tokens + t] = sx;
  }
}

FTN_DEVICE bool vp_ignored(const void *labels, uint32_t i64, int64_t t, uint32_t has_ignore,
                           int64_t ignore_index) {
  return has_ignore && vp_load_id(labels, i64, t) == ignore_index;
}

FTN_DEVICE void vocab_ce_loss(const FtnVocabCeLossParams &p) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= p.tokens) return;
  if (vp_ignored(p.labels, p.ids_i64, t, p.has_ignore_index, p.ignore_index)) {
    p.loss[t] = 0.0f;
    return;
  }
  float l = p.row_max[t] + logf(p.sums[t]) - (1.0f - p.smoothing) * p.sums[p.tokens + t];
  if (p.smoothing != 0.0f) l -= p.smoothing * p.inv_vocab * p.sums[2 * p.tokens + t];
  p.loss[t] = l;
}

template <typename T>
FTN_DEVICE void vocab_ce_bwd(const FtnVocabCeBwdParams &p) {
  const T *x = static_cast<const T *>(p.logits);
  T *g = static_cast<T *>(p.grad);
  const int64_t n = p.tokens * p.cols;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const float hit = 1.0f - p.smoothing;
  const float uniform = p.smoothing * p.inv_vocab;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t t = i / p.cols;
    const int64_t c = i - t * p.cols;
    const int64_t id = vp_load_id(p.labels, p.ids_i64, t);
    if (p.has_ignore_index && id == p.ignore_index) {
      g[i] = ftn_from_float<T>(0.0f);
      continue;
    }
    const int64_t label = id - p.vocab_start;
    float v = expf(ftn_to_float(x[i]) - p.row_max[t]) / p.sums[t] - uniform;
    if (c == label) v -= hit;
    g[i] = ftn_from_float<T>(v * p.dloss[t]);
  }
}

FTN_KERNEL_BOUNDED(ftn_vocab_ce_loss, FtnVocabCeLossParams, p, 256) { vocab_ce_loss(p); }

#define FTN_STAMP_VOCAB_PARALLEL(suffix, T)                                                  \
  FTN_KERNEL_BOUNDED(ftn_vocab_embed_fwd_##suffix, FtnVocabEmbedFwdParams, p, 256) {         \
    vocab_embed_fwd<T>(p);                                                                   \
  }                                                                                          \
  FTN_KERNEL_BOUNDED(ftn_vocab_embed_bwd_##suffix, FtnVocabEmbedBwdParams, p, 256) {         \
    vocab_embed_bwd<T>(p);                                                                   \
  }                                                                                          \
  FTN_KERNEL_BOUNDED(ftn_vocab_ce_max_##suffix, FtnVocabCeMaxParams, p, 256) {               \
    vocab_ce_max<T>(p);                                                                      \
  }                                                                                          \
  FTN_KERNEL_BOUNDED(ftn_vocab_ce_stats_##suffix, FtnVocabCeStatsParams, p, 256) {           \
    vocab_ce_stats<T>(p);                                                                    \
  }                                                                                          \
  FTN_KERNEL_BOUNDED(ftn_vocab_ce_bwd_##suffix, FtnVocabCeBwdParams, p, 256) {               \
    vocab_ce_bwd<T>(p);                                                                      \
  }

FTN_STAMP_VOCAB_PARALLEL(f32, float)
FTN_STAMP_VOCAB_PARALLEL(f16, __half)
FTN_STAMP_VOCAB_PARALLEL(bf16, __nv_bfloat16)
