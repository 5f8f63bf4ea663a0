// Local parts of the vocab-parallel embedding and cross-entropy (Megatron's
// VocabParallelEmbedding and vocab_parallel_cross_entropy). Communication
// (the all-reduces) is done by the Rust layer between these kernels.
//
// Embedding forward: a grid-stride loop over [tokens, hidden]; a token whose
//   id is outside [vocab_start, vocab_start + shard_rows) gets a zero row.
//   Floor: reads tokens*(idsize + hidden*sizeof(T)), writes tokens*hidden*sizeof(T).
// Embedding backward, deterministic, O(T log^2 T + V_shard log T + bytes):
//   1. embed_sort_keys: key[i] = (row << 32) | i for token i, row = its shard
//      row or shard_rows when off the shard; INT64_MAX pads to a power of two.
//   2. a bitonic sort of the keys (embed_sort_tile in shared memory for the
//      steps within a tile of VP_SORT_TILE keys, embed_sort_step over global
//      memory for the longer strides). The keys are unique, so the sorted
//      order is unique: tokens grouped by row, in token order within a row.
//   3. embed_bwd, one block per shard row v: two binary searches find v's
//      segment of the sorted keys; each thread sums dy[t, h..h+W) over the
//      segment's tokens in token order into fp32 registers (starting from
//      dweight when accumulating, else 0) and stores the row once (W = 16
//      bytes of dy: 128-bit loads and stores when aligned). One writer per
//      element and a fixed order: bitwise deterministic, no float atomics,
//      bitwise the result of the former one-scan-per-row kernel. A row with
//      no token is zeroed (overwrite) or left untouched (accumulate).
//   Floor: reads dy rows of this shard's tokens once and the ids, writes
//   dweight once (+ reads it when accumulating, only the rows with tokens);
//   the keys (8 bytes per token) are L2-resident.
// Cross-entropy (fp32 math, one block of 256 threads per token row; ce_stats
// gives rows of up to 1024 columns a warp each, 8 rows per block):
//   ce_stats  one pass over the row (online softmax): local row max m_l,
//             sum exp(x - m_l), target logit, sum x      (then all-reduce MAX
//             of the max, ce_rescale: sum *= exp(m_l - m), all-reduce SUM;
//             with one rank m = m_l and neither runs)
//   ce_loss   loss = m + log(sumexp) - (1-eps)*target - eps*mean(x)
//   ce_bwd    grad = dloss * (softmax - (1-eps)*onehot - eps/V), may alias
//             logits; per row one IEEE division (dloss / sumexp), per element
//             a hardware exponential and two FMAs.
//   Both row kernels take two 128-bit vectors per thread and step (both loads
//   first) when the row is 16-byte aligned (cols a multiple of 16 / sizeof(T)
//   and an aligned base), else four scalar loads. The exponentials are
//   __expf (ex2.approx: relative error ~2^-21 for the arguments x - max <= 0).
//   ignore_index (optional): a row whose label equals it gets loss 0 and a
//   zero gradient row (written as exact zeros, not scaled: a row of inf
//   logits still gives 0, not NaN).
//   Floor: forward reads the logits once, backward reads once and writes once.
#include "ftn_dtype.cuh"
#include "reduce.cuh"
#include "vec.cuh"

FTN_DEVICE int64_t vp_load_id(const void *ids, uint32_t i64, int64_t t) {
  return i64 ? static_cast<const int64_t *>(ids)[t] : (int64_t) static_cast<const int32_t *>(ids)[t];
}

// 16-byte alignment of a pointer (the vector paths' condition, with the row
// length a multiple of the vector).
FTN_DEVICE bool vp_aligned16(const void *ptr) {
  return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0;
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

// ---------------------------------------------------------------- embedding backward

constexpr int VP_BWD_THREADS = 256;
constexpr int VP_SORT_TILE = 2048;
constexpr int64_t VP_KEY_PAD = 0x7fffffffffffffffll;

FTN_DEVICE void vocab_embed_sort_keys(const FtnVocabEmbedSortKeysParams &p) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    int64_t key = VP_KEY_PAD;
    if (i < p.tokens) {
      const int64_t r = vp_load_id(p.ids, p.ids_i64, i) - p.vocab_start;
      const int64_t row = (r >= 0 && r < p.shard_rows) ? r : p.shard_rows;
      key = (row << 32) | i;
    }
    p.keys[i] = key;
  }
}

// One compare-exchange of the bitonic network: i < l = i ^ j, ascending
// where (i & k) == 0.
FTN_DEVICE void vp_bitonic_pair(int64_t *a, int64_t *b, bool up) {
  const int64_t x = *a;
  const int64_t y = *b;
  if ((x > y) == up) {
    *a = y;
    *b = x;
  }
}

// The steps with stride j < tile of one tile of keys in shared memory: all
// of k = 2 .. tile when p.k == 0, else the j < tile steps of stage p.k.
FTN_DEVICE void vocab_embed_sort_tile(const FtnVocabEmbedSortStepParams &p) {
  if (blockDim.x != VP_BWD_THREADS) {
    FTN_ASSERT(false);
    return;
  }
  FTN_SHARED(int64_t, s, [VP_SORT_TILE]);
  const int64_t tile = p.n < VP_SORT_TILE ? p.n : VP_SORT_TILE;
  const int64_t base = (int64_t)blockIdx.x * tile;
  for (int64_t i = threadIdx.x; i < tile; i += VP_BWD_THREADS) s[i] = p.keys[base + i];
  __syncthreads();
  const int64_t k0 = p.k == 0 ? 2 : p.k;
  const int64_t k1 = p.k == 0 ? tile : p.k;
  for (int64_t k = k0; k <= k1; k <<= 1) {
    for (int64_t j = (k < tile ? k : tile) >> 1; j > 0; j >>= 1) {
      // tile / 2 pairs: pair q has its lower index i with bit j clear.
      for (int64_t q = threadIdx.x; q < tile / 2; q += VP_BWD_THREADS) {
        const int64_t i = ((q & ~(j - 1)) << 1) | (q & (j - 1));
        vp_bitonic_pair(&s[i], &s[i | j], ((base + i) & k) == 0);
      }
      __syncthreads();
    }
  }
  for (int64_t i = threadIdx.x; i < tile; i += VP_BWD_THREADS) p.keys[base + i] = s[i];
}

// One step (stage k, stride j >= tile) over global memory: n / 2 pairs.
FTN_DEVICE void vocab_embed_sort_step(const FtnVocabEmbedSortStepParams &p) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t j = p.j;
  for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < p.n / 2; q += stride) {
    const int64_t i = ((q & ~(j - 1)) << 1) | (q & (j - 1));
    vp_bitonic_pair(&p.keys[i], &p.keys[i | j], (i & p.k) == 0);
  }
}

// First index of the sorted keys[0, n) that is >= key.
FTN_DEVICE int64_t vp_lower_bound(const int64_t *keys, int64_t n, int64_t key) {
  int64_t lo = 0;
  int64_t hi = n;
  while (lo < hi) {
    const int64_t mid = lo + ((hi - lo) >> 1);
    if (keys[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// One thread's U column groups of W columns (the 16-byte vector of T, or 1),
// VP_BWD_THREADS * W apart (each warp access contiguous): acc = dweight (when
// accumulating) or 0, plus dy over the segment's tokens in token order, stored
// once. W fp32 = W / 4 float4 of dweight per group.
template <typename T, int W, int U>
FTN_DEVICE void vp_embed_bwd_cols(const FtnVocabEmbedBwdParams &p, float *dw, int64_t h,
                                  int64_t lo, int64_t hi) {
  const T *dy = static_cast<const T *>(p.dy);
  constexpr int F = W == 1 ? 1 : 4;  // fp32 elements per dweight access
  constexpr int64_t S = (int64_t)VP_BWD_THREADS * W;
  float acc[U][W];
  if (p.accumulate) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int f = 0; f < W; f += F) ftn_load<float, F>(dw + h + u * S + f, acc[u] + f);
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < W; ++k) acc[u][k] = 0.0f;
  }
  for (int64_t s = lo; s < hi; ++s) {
    const T *row = dy + (p.sorted[s] & 0xffffffffll) * p.hidden + h;
    float d[U][W];
#pragma unroll
    for (int u = 0; u < U; ++u) ftn_load<T, W>(row + u * S, d[u]);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < W; ++k) acc[u][k] += d[u][k];
  }
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int f = 0; f < W; f += F) ftn_store<float, F>(dw + h + u * S + f, acc[u] + f);
}

// Row v of dweight: two column groups per thread while both fit (hidden 4096
// bf16: the whole row in one step of 256 threads), then one.
template <typename T, int W>
FTN_DEVICE void vp_embed_bwd_row(const FtnVocabEmbedBwdParams &p, int64_t v, int64_t lo,
                                 int64_t hi) {
  float *dw = p.dweight + v * p.hidden;
  constexpr int64_t S = (int64_t)VP_BWD_THREADS * W;
  int64_t h = (int64_t)threadIdx.x * W;
  for (; h + S < p.hidden; h += 2 * S) vp_embed_bwd_cols<T, W, 2>(p, dw, h, lo, hi);
  for (; h < p.hidden; h += S) vp_embed_bwd_cols<T, W, 1>(p, dw, h, lo, hi);
}

template <typename T>
FTN_DEVICE void vocab_embed_bwd(const FtnVocabEmbedBwdParams &p) {
  if (blockDim.x != VP_BWD_THREADS) {
    FTN_ASSERT(false);
    return;
  }
  const int64_t v = blockIdx.x;
  // The same loads in every thread (broadcast): no barrier needed.
  const int64_t lo = vp_lower_bound(p.sorted, p.tokens, v << 32);
  const int64_t hi = vp_lower_bound(p.sorted, p.tokens, (v + 1) << 32);
  if (lo == hi && p.accumulate) return;  // nothing to add: the row stays
  constexpr int V = FtnVec<T>::N;
  const bool vec = p.hidden % V == 0 && vp_aligned16(p.dy) && vp_aligned16(p.dweight);
  if (vec) {
    vp_embed_bwd_row<T, V>(p, v, lo, hi);
  } else {
    vp_embed_bwd_row<T, 1>(p, v, lo, hi);
  }
}

// ---------------------------------------------------------------- cross-entropy

// Per-thread online-softmax state over the values it has seen.
struct VpSoftmaxState {
  float m;   // max
  float s;   // sum of exp(x - m)
  float sx;  // sum of x
};

// Folds U*V values into the state: one rescale per step (m rises rarely).
template <int U, int V, bool SUMX>
FTN_DEVICE void vp_fold(VpSoftmaxState &st, const float (&x)[U][V]) {
  float mx = st.m;
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int k = 0; k < V; ++k) mx = fmaxf(mx, x[u][k]);
  }
  // exp(-inf) = 0 when the old max was -inf; equal maxima (also -inf): no rescale.
  if (mx != st.m) st.s *= __expf(st.m - mx);
  st.m = mx;
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      st.s += __expf(x[u][k] - mx);
      if (SUMX) st.sx += x[u][k];
    }
  }
}

// The state of thread `tid` of the THREADS that share the row: vectors
// tid, tid + THREADS, ... of it.
template <typename T, int V, bool SUMX, int THREADS>
FTN_DEVICE VpSoftmaxState vp_row_stats(const T *x, int64_t cols, int tid) {
  constexpr int U = 4;  // 4 x 16 bytes in flight per thread (the pass has no stores)
  VpSoftmaxState st = {FTN_NEG_INF, 0.0f, 0.0f};
  const int64_t nv = cols / V;
  const int64_t b = THREADS;
  int64_t i = tid;
  for (; i + (U - 1) * b < nv; i += U * b) {
    float v[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) ftn_load<T, V>(x + (i + u * b) * V, v[u]);
    vp_fold<U, V, SUMX>(st, v);
  }
  for (; i < nv; i += b) {
    float v[1][V];
    ftn_load<T, V>(x + i * V, v[0]);
    vp_fold<1, V, SUMX>(st, v);
  }
  return st;
}

// Row t's statistics. WARP = false: a block per row, its 256 threads
// striding it, block reductions. WARP = true: a warp per row
// (VP_BWD_THREADS / 32 rows per block), the kernel the plan picks for short
// rows (core::plan::vocab_parallel::ce_stats, up to 1024 columns): the
// lanes stride the row, warp reductions (no barrier, no shared memory), and
// 8 rows per block instead of one short row on 256 threads of which most
// hold nothing; its own kernel, so that the block kernel's registers stay
// its own. A warp past the last row returns whole.
template <typename T, bool SUMX, bool WARP>
FTN_DEVICE void vocab_ce_stats_rows(const FtnVocabCeStatsParams &p) {
  constexpr int THREADS = WARP ? 32 : VP_BWD_THREADS;  // threads of a row
  const int64_t t =
      WARP ? (int64_t)blockIdx.x * (VP_BWD_THREADS / 32) + (threadIdx.x >> 5) : blockIdx.x;
  if (WARP && t >= p.tokens) return;
  const T *x = static_cast<const T *>(p.logits) + t * p.cols;
  constexpr int V = FtnVec<T>::N;
  const int tid = (int)(WARP ? threadIdx.x & 31u : threadIdx.x);
  const bool vec = p.cols % V == 0 && vp_aligned16(p.logits);
  VpSoftmaxState st = vec ? vp_row_stats<T, V, SUMX, THREADS>(x, p.cols, tid)
                          : vp_row_stats<T, 1, SUMX, THREADS>(x, p.cols, tid);
  // The row's max, then {sum of exp(x - max), sum of x}: this thread's sum
  // rescaled to the row's max (no rescale where it already holds it).
  const auto at_max = [&](float m, float (&a)[2]) {
    a[0] = st.m == m ? st.s : st.s * __expf(st.m - m);
    a[1] = st.sx;
  };
  float m;
  float a[2];
  if constexpr (WARP) {
    m = ftn_warp_allreduce<FtnMaxOp>(st.m);
    at_max(m, a);
    ftn_group_allreduce_n<FtnSumOp, 32, 2>(a);
  } else {
    FTN_SHARED(float, red, [64]);
    m = ftn_block_allreduce<FtnMaxOp>(st.m, red);
    at_max(m, a);
    ftn_block_allreduce_n<FtnSumOp, 2>(a, red);
  }
  if (tid == 0) {
    const int64_t c = vp_load_id(p.labels, p.ids_i64, t) - p.vocab_start;
    p.row_max[t] = m;
    if (p.local_max != nullptr) p.local_max[t] = m;
    p.sums[t] = a[0];
    p.sums[p.tokens + t] = (c >= 0 && c < p.cols) ? ftn_to_float(x[c]) : 0.0f;
    if (SUMX) p.sums[2 * p.tokens + t] = a[1];
  }
}

template <typename T, bool WARP>
FTN_DEVICE void vocab_ce_stats(const FtnVocabCeStatsParams &p) {
  if (blockDim.x != VP_BWD_THREADS) {
    FTN_ASSERT(false);
    return;
  }
  if (p.with_logit_sum) {
    vocab_ce_stats_rows<T, true, WARP>(p);
  } else {
    vocab_ce_stats_rows<T, false, WARP>(p);
  }
}

// sums[0, t] *= exp(local_max[t] - row_max[t]) after the MAX all-reduce.
FTN_DEVICE void vocab_ce_rescale(const FtnVocabCeRescaleParams &p) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < p.tokens; t += stride) {
    const float lm = p.local_max[t];
    const float m = p.row_max[t];
    if (lm != m) p.sums[t] *= expf(lm - m);
  }
}

FTN_DEVICE bool vp_ignored(const void *labels, uint32_t i64, int64_t t, uint32_t has_ignore,
                           int64_t ignore_index) {
  return has_ignore && vp_load_id(labels, i64, t) == ignore_index;
}

// Grid-stride over the tokens (the launch is capped: grid_stride(tokens)).
FTN_DEVICE void vocab_ce_loss(const FtnVocabCeLossParams &p) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < p.tokens; t += stride) {
    if (vp_ignored(p.labels, p.ids_i64, t, p.has_ignore_index, p.ignore_index)) {
      p.loss[t] = 0.0f;
      continue;
    }
    float l = p.row_max[t] + logf(p.sums[t]) - (1.0f - p.smoothing) * p.sums[p.tokens + t];
    if (p.smoothing != 0.0f) l -= p.smoothing * p.inv_vocab * p.sums[2 * p.tokens + t];
    p.loss[t] = l;
  }
}

// U*V gradient values from the logits they replace (the label column, if
// among them, also loses `hit`).
template <int U, int V>
FTN_DEVICE void vp_ce_grad(float (&v)[U][V], int64_t c0, int64_t stride, int64_t label, float m,
                           float scale, float off, float hit) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int k = 0; k < V; ++k) v[u][k] = fmaf(__expf(v[u][k] - m), scale, -off);
    const int64_t c = c0 + u * stride;
    if ((uint64_t)(label - c) < (uint64_t)V) {
#pragma unroll
      for (int k = 0; k < V; ++k) v[u][k] -= c + k == label ? hit : 0.0f;
    }
  }
}

// One row's gradient, U vectors of V per thread and step (all loads first).
template <typename T, int V>
FTN_DEVICE void vp_ce_bwd_row(const T *x, T *g, int64_t cols, int64_t label, float m, float scale,
                              float off, float hit) {
  constexpr int U = V == 1 ? 4 : 2;
  const int64_t nv = cols / V;
  const int64_t b = VP_BWD_THREADS;
  int64_t i = threadIdx.x;
  for (; i + (U - 1) * b < nv; i += U * b) {
    float v[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) ftn_load<T, V>(x + (i + u * b) * V, v[u]);
    vp_ce_grad<U, V>(v, i * V, b * V, label, m, scale, off, hit);
#pragma unroll
    for (int u = 0; u < U; ++u) ftn_store<T, V>(g + (i + u * b) * V, v[u]);
  }
  for (; i < nv; i += b) {
    float v[1][V];
    ftn_load<T, V>(x + i * V, v[0]);
    vp_ce_grad<1, V>(v, i * V, b * V, label, m, scale, off, hit);
    ftn_store<T, V>(g + i * V, v[0]);
  }
}

template <typename T>
FTN_DEVICE void vocab_ce_bwd(const FtnVocabCeBwdParams &p) {
  if (blockDim.x != VP_BWD_THREADS) {
    FTN_ASSERT(false);
    return;
  }
  const int64_t t = blockIdx.x;
  const T *x = static_cast<const T *>(p.logits) + t * p.cols;
  T *g = static_cast<T *>(p.grad) + t * p.cols;
  constexpr int V = FtnVec<T>::N;
  const bool vec = p.cols % V == 0 && vp_aligned16(p.logits) && vp_aligned16(p.grad);
  const int64_t id = vp_load_id(p.labels, p.ids_i64, t);
  if (p.has_ignore_index && id == p.ignore_index) {
    float z[V];
#pragma unroll
    for (int k = 0; k < V; ++k) z[k] = 0.0f;
    if (vec) {
      for (int64_t i = threadIdx.x; i < p.cols / V; i += VP_BWD_THREADS) ftn_store<T, V>(g + i * V, z);
    } else {
      for (int64_t c = threadIdx.x; c < p.cols; c += VP_BWD_THREADS) g[c] = ftn_from_float<T>(0.0f);
    }
    return;
  }
  const float dl = p.dloss[t];
  const float scale = dl / p.sums[t];
  const float off = dl * (p.smoothing * p.inv_vocab);
  const float hit = dl * (1.0f - p.smoothing);
  const int64_t label = id - p.vocab_start;
  if (vec) {
    vp_ce_bwd_row<T, V>(x, g, p.cols, label, p.row_max[t], scale, off, hit);
  } else {
    vp_ce_bwd_row<T, 1>(x, g, p.cols, label, p.row_max[t], scale, off, hit);
  }
}

FTN_KERNEL_BOUNDED(ftn_vocab_ce_loss, FtnVocabCeLossParams, p, 256) { vocab_ce_loss(p); }
FTN_KERNEL_BOUNDED(ftn_vocab_ce_rescale, FtnVocabCeRescaleParams, p, 256) { vocab_ce_rescale(p); }
FTN_KERNEL_BOUNDED(ftn_vocab_embed_sort_keys, FtnVocabEmbedSortKeysParams, p, 256) {
  vocab_embed_sort_keys(p);
}
FTN_KERNEL_BOUNDED(ftn_vocab_embed_sort_tile, FtnVocabEmbedSortStepParams, p, 256) {
  vocab_embed_sort_tile(p);
}
FTN_KERNEL_BOUNDED(ftn_vocab_embed_sort_step, FtnVocabEmbedSortStepParams, p, 256) {
  vocab_embed_sort_step(p);
}

// The embedding backward's launch bounds: 256 threads and 4 blocks per SM
// (<= 64 registers). Without the minimum, ptxas picked 48 registers for the
// release bf16 build and spilled 8 bytes. The emulator takes the thread
// count alone.
#if defined(__CUDACC__)
#define VP_EMBED_BWD_BOUNDS 256, 4
#else
#define VP_EMBED_BWD_BOUNDS 256
#endif

#define FTN_STAMP_VOCAB_PARALLEL(suffix, T)                                                  \
  FTN_KERNEL_BOUNDED(ftn_vocab_embed_fwd_##suffix, FtnVocabEmbedFwdParams, p, 256) {         \
    vocab_embed_fwd<T>(p);                                                                   \
  }                                                                                          \
  FTN_KERNEL_BOUNDED(ftn_vocab_embed_bwd_##suffix, FtnVocabEmbedBwdParams, p,                \
                     VP_EMBED_BWD_BOUNDS) {                                                   \
    vocab_embed_bwd<T>(p);                                                                   \
  }                                                                                          \
  FTN_KERNEL_BOUNDED(ftn_vocab_ce_stats_##suffix, FtnVocabCeStatsParams, p, 256) {           \
    vocab_ce_stats<T, false>(p);                                                             \
  }                                                                                          \
  FTN_KERNEL_BOUNDED(ftn_vocab_ce_stats_warp_##suffix, FtnVocabCeStatsParams, p, 256) {      \
    vocab_ce_stats<T, true>(p);                                                              \
  }                                                                                          \
  FTN_KERNEL_BOUNDED(ftn_vocab_ce_bwd_##suffix, FtnVocabCeBwdParams, p, 256) {               \
    vocab_ce_bwd<T>(p);                                                                      \
  }

FTN_STAMP_VOCAB_PARALLEL(f32, float)
FTN_STAMP_VOCAB_PARALLEL(f16, __half)
FTN_STAMP_VOCAB_PARALLEL(bf16, __nv_bfloat16)
