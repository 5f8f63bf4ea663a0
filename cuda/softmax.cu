// Fused scale + mask + softmax, forward and backward (Megatron/Apex
// scaled_masked_softmax and scaled_upper_triang_masked_softmax, any row length).
//
// Rows are independent: row r of [rows, sk] (rows = b*np*sq) is one softmax.
// Logit v = scale * x in fp32; a padding-masked logit is replaced by -10000.0;
// a causal-masked one (column > r % sq) is -inf and comes out as exact 0. A row
// whose columns are all padding-masked is written as zeros (Apex/TE fused
// behaviour; PyTorch's unfused path would give uniform 1/sk).
//
// Three paths, chosen by src/core/plan/softmax.rs from sk:
//   warpN  (sk <= 32*N, N in 1..32): a warp, or for short rows on the vector
//          path a group of 16*N/vec lanes (two 128-bit vectors per lane,
//          several rows per warp), per row; each lane keeps its values in
//          registers (N is a template argument, so the arrays are registers,
//          never local memory). Reductions are (group) shuffles. Several rows
//          per block, grid-stride over rows.
//   block  (chosen for sk <= 8192; runs sk <= 32*blockDim.x <= 16384,
//          blockDim.x <= 512): one block per row, 32 values per thread in
//          registers (backward: y and dy kept packed in their storage type
//          and widened twice), reductions through 32 floats of shared memory.
// On the vector paths a thread issues every load of its row before using
// any (packed, vec.cuh's ftn_load_packed): with a use between two guarded
// loads, in-order issue makes the second wait for the first (one DRAM round
// trip per vector instead of one per row). The scalar paths, the dropout
// copies of the forwards and fp32 on the block path load as they go (loading
// first, they spilled). Those that load first also prefetch each vector's
// padding-mask line into L1 with its data (sm_prefetch_l1); the mask bytes
// are read at use.
//   long   (any sk; chosen past 8192): one block per row, two streaming
//          passes. Forward pass 1 keeps an online (max, sum of exp) per
//          thread, SM_LONG_UNROLL vectors per step, merged across the block;
//          pass 2 re-reads x and writes y. Backward pass 1 forms sum(dy*y),
//          pass 2 re-reads and writes dx. In place is safe: each element is
//          read and then written by the same thread in pass 2. The second
//          read of a row (<= 256 KiB per block for sk = 65536 fp32) is
//          normally an L2 hit.
// The exponential is the hardware one (sm_exp: ex2.approx.ftz of
// (v - max) * log2(e)); the warp and block forwards are compiled with and
// without dropout (the plain copy has no Philox code).
// With 16-byte-aligned pointers and sk % vec == 0 every access is one 128-bit
// load/store of vec = 16/sizeof(T) elements (mask: vec bytes); else scalar.
//
// HBM byte floors (n = rows*sk elements of T, |T| bytes each):
//   forward:  read x + write y = 2n|T|   (+ the mask, rows_mask*sk bytes,
//             read once per use; a broadcast mask is mostly served by L2).
//   backward: read y, dy + write dx = 3n|T|.
//   The long path reads the row twice: 3n|T| forward / 5n|T| backward from
//   HBM in the worst case (L2 misses), 2n|T| / 3n|T| when the re-read hits L2.
// FLOPs: ~5 per element plus one exp2 -> far below the FP32 rate: HBM-bound.
//
// Attention dropout (Megatron: probs_d = dropout(softmax(...), p)), the same
// kernels with p.y_dropped / p.drop_threshold set:
//   forward  writes y (undropped, what backward needs) and, at the same
//            store, y_dropped = keep(i) * y / (1-p) (from the fp32 value);
//   backward g = keep(i) * dy / (1-p) as dy is loaded (dy: the gradient of
//            the dropped probabilities), then the softmax backward on g. Rows
//            are streamed twice, never held (the row plus the Philox state in
//            registers would spill): warp-path rows by ftn_softmax_bwd_dropout_
//            warp_* (a warp per row), the others by the long kernel (the plain
//            warp / block backward kernels have no dropout code).
//   keep(i) is dropout.cu's rule (philox.cuh: random value offset + i of
//   stream `seed`, i = r*sk + c the row-major element index), a pure function
//   of (seed, offset, i): the backward regenerates the mask, nothing stores it.
//   Floors: forward 3n|T| (read x, write y and y_dropped; the block path
//   re-reads y, an L1/L2 hit; the long path +n|T| for the re-read of x),
//   backward 3n|T| (5n|T| if the second read of y, dy misses L2); plus ~1/4 Philox call
//   (~40 integer ops) per element (one per element on the scalar path), which
//   stays under the HBM time on A100/H100.
#include "philox.cuh"
#include "reduce.cuh"
#include "vec.cuh"

#define SM_MASKED_VALUE (-10000.0f)
#define SM_WARPS_PER_BLOCK 4
#define SM_BLOCK_ITEMS 32
#define SM_LONG_UNROLL 3

// The mask of one row: `pad` = its padding-mask row (or null); columns
// >= `limit` are causal-masked.
struct SmRowMask {
  const uint8_t *pad;
  int64_t limit;
};

FTN_DEVICE SmRowMask sm_row_mask(const FtnSoftmaxFwdParams &p, int64_t r) {
  SmRowMask m;
  m.pad = nullptr;
  m.limit = p.sk;
  if (p.mask_mode == FTN_SOFTMAX_MASK_PADDING) {
    m.pad = p.mask + (r / p.rows_per_batch) * p.mask_batch_stride + (r % p.sq) * p.sk;
  } else if (p.mask_mode == FTN_SOFTMAX_MASK_CAUSAL) {
    const int64_t keep = r % p.sq + 1;
    m.limit = keep < p.sk ? keep : p.sk;
  }
  return m;
}

// Asks for the line holding a padding-mask vector in L1 (no register, no
// wait; a no-op emulated). The forwards issue it with the row's loads: the
// mask itself is loaded at use, after the row's data is in, and without
// this each of those loads was an L2 round trip in the row's critical path
// (one per vector). Loading the mask bytes early instead took the block
// kernel from 70 to 128 registers.
FTN_DEVICE void sm_prefetch_l1(const void *p) {
#if defined(__CUDACC__)
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// Loads the V logits at columns [col0, col0+V) of row `xr` (col0 < sk) and
// applies scale and mask. `any` is set when a column is not padding-masked.
// LIMIT = false: the caller knows col0 + V <= m.limit (no causal test).
// sm_logits_packed: the same from the V values already loaded packed
// (ftn_load_packed) from xr + col0, col0 < m.limit.
template <typename T, int V, bool LIMIT = true>
FTN_DEVICE void sm_logits_packed(const FtnSoftmaxFwdParams &p, const uint32_t *xw,
                                 const SmRowMask &m, int64_t col0, float (&v)[V], bool &any) {
  ftn_unpack<T, V>(xw, v);
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] *= p.scale;
  if (m.pad != nullptr) {
    uint8_t mk[V];
    ftn_load_bytes<V>(m.pad + col0, mk);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (mk[k] != 0) {
        v[k] = SM_MASKED_VALUE;
      } else {
        any = true;
      }
    }
  }
  if (LIMIT && col0 + V > m.limit) {  // the vector holding the causal limit
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (col0 + k >= m.limit) v[k] = FTN_NEG_INF;
    }
  }
}

template <typename T, int V, bool LIMIT = true>
FTN_DEVICE void sm_logits(const FtnSoftmaxFwdParams &p, const T *xr, const SmRowMask &m,
                          int64_t col0, float (&v)[V], bool &any) {
  if (LIMIT && col0 >= m.limit) {
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = FTN_NEG_INF;
    return;
  }
  uint32_t xw[FtnPacked<T, V>::W];
  ftn_load_packed<T, V>(xr + col0, xw);
  sm_logits_packed<T, V, LIMIT>(p, xw, m, col0, v, any);
}

// The U vectors of a long-path step at col0, col0 + step, ...: with FAST
// (every vector before the causal limit) all U loads are issued before any
// is used (in flight at once); otherwise one checked vector at a time.
template <typename T, int V, int U, bool FAST>
FTN_DEVICE void sm_logits_step(const FtnSoftmaxFwdParams &p, const T *xr, const SmRowMask &m,
                               int64_t col0, int64_t step, float (&v)[U][V], bool &any) {
  if constexpr (FAST) {
    uint32_t xw[U][FtnPacked<T, V>::W];
#pragma unroll
    for (int u = 0; u < U; ++u) ftn_load_packed<T, V>(xr + col0 + u * step, xw[u]);
    if (m.pad != nullptr) {
#pragma unroll
      for (int u = 0; u < U; ++u) sm_prefetch_l1(m.pad + col0 + u * step);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) sm_logits_packed<T, V, false>(p, xw[u], m, col0 + u * step, v[u], any);
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u) sm_logits<T, V>(p, xr, m, col0 + u * step, v[u], any);
  }
}

// Attention dropout of the V probabilities v of elements i0 .. i0+V-1:
// writes keep * drop_scale * y to yd, y = v rounded to T (the stored
// probability, so every path gives the same y_dropped for the same y).
template <typename T, int V>
FTN_DEVICE void sm_store_dropped(const FtnSoftmaxFwdParams &p, T *yd, int64_t i0,
                                 const float (&v)[V]) {
  const uint32_t keep = ftn_dropout_keep_bits<V>(p.seed, p.offset + (uint64_t)i0, p.drop_threshold);
  float o[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float y = ftn_to_float(ftn_from_float<T>(v[k]));
    o[k] = ((keep >> k) & 1u) != 0u ? y * p.drop_scale : 0.0f;
  }
  ftn_store<T, V>(yd, o);
}

// Backward: the incoming gradient of the dropped probabilities of elements
// i0 .. i0+V-1 becomes the gradient of the undropped ones (mask regenerated).
template <int V>
FTN_DEVICE void sm_undrop_grad(const FtnSoftmaxBwdParams &p, int64_t i0, float (&g)[V]) {
  if (p.drop_threshold == 0u) return;
  const uint32_t keep = ftn_dropout_keep_bits<V>(p.seed, p.offset + (uint64_t)i0, p.drop_threshold);
#pragma unroll
  for (int k = 0; k < V; ++k) g[k] = ((keep >> k) & 1u) != 0u ? g[k] * p.drop_scale : 0.0f;
}

// ---------------------------------------------------------------- forward

// Stores inv * v, the probabilities of elements i0 .. i0+V-1, at yr; DROP
// with yd set: their dropped copy at yd + i0 too (the block kernel passes no
// yd and makes it from the stored row). The warp and block kernels are
// compiled with and without dropout, so the plain copy carries no Philox
// code (the scaling line of each branch is its own, which lets the static
// model find the plain copy).
template <typename T, int V, bool DROP>
FTN_DEVICE void sm_store_probs(const FtnSoftmaxFwdParams &p, T *yr, T *yd, int64_t i0,
                               const float (&v)[V], float inv) {
  float o[V];
  if constexpr (DROP) {
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = v[k] * inv;
    ftn_store<T, V>(yr, o);
    if (yd != nullptr) sm_store_dropped<T, V>(p, yd + i0, i0, o);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = v[k] * inv;  // y alone
    ftn_store<T, V>(yr, o);
  }
}

// True on every lane of the group when `pred` holds on one of them; every
// lane of the warp must call it.
template <int LANES> FTN_DEVICE bool sm_group_any(bool pred) {
  const uint32_t bits = __ballot_sync(0xffffffffu, pred ? 1 : 0);
  if constexpr (LANES == 32) {
    return bits != 0u;
  } else {
    const int shift = (int)(threadIdx.x & 31) & ~(LANES - 1);
    return ((bits >> shift) & ((1u << LANES) - 1u)) != 0u;
  }
}

// The exponential of the forward: ex2.approx after one multiply by log2(e)
// (ex2.approx.ftz, what __expf is without its subnormal fix-up), on
// d = v - max <= 0 (the subtraction is exact near the max, so folding
// log2(e) into the scale instead would cost accuracy at large logits).
// Relative error ~2 ulp of fp32 plus the product's rounding (|d| * 2^-24);
// results below fp32's normal range flush to 0, exp(-inf) = 0. (The
// emulator's __expf is the same product and ex2, within 1 ulp, but keeps
// subnormal results.)
FTN_DEVICE float sm_exp(float d) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d * 1.4426950408889634f));
  return r;
#else
  return __expf(d);
#endif
}

// Warp path: a group of LANES lanes holds one row (32 / LANES rows per warp;
// LANES < 32 for short rows, which keep their 128-bit accesses). Lane l of its group holds columns (c*LANES + l)*V + k,
// c < CHUNKS, k < V. Columns fit in 32 bits (sk <= 1024); chunk offsets are
// compile-time. The warp walks its rows together (the shuffles need every
// lane), a group past the last row computes on nothing and stores nothing.
template <typename T, int CHUNKS, int V, int LANES, bool DROP>
FTN_DEVICE void sm_fwd_warp_impl(const FtnSoftmaxFwdParams &p) {
  static_assert(LANES >= 1 && LANES <= 32 && (LANES & (LANES - 1)) == 0, "group size");
  constexpr int RPW = 32 / LANES;  // rows per warp
  FTN_ASSERT(blockDim.x % 32 == 0 && p.sk <= (int64_t)CHUNKS * V * LANES);
  const T *x = static_cast<const T *>(p.x);
  T *y = static_cast<T *>(p.y);
  T *yd = static_cast<T *>(p.y_dropped);
  const int sk = (int)p.sk;
  const int lane = (int)(threadIdx.x & 31);
  const int first = (lane % LANES) * V;
  const int64_t warps = blockDim.x >> 5;
  const bool padded = p.mask_mode == FTN_SOFTMAX_MASK_PADDING;
  for (int64_t rw = ((int64_t)blockIdx.x * warps + (threadIdx.x >> 5)) * RPW; rw < p.rows;
       rw += (int64_t)gridDim.x * warps * RPW) {
    const int64_t r = rw + lane / LANES;
    const bool live = r < p.rows;
    SmRowMask m;
    if (live) {
      m = sm_row_mask(p, r);
    } else {
      m.pad = nullptr;
      m.limit = 0;
    }
    const int limit = (int)m.limit;
    const T *xr = x + r * p.sk + first;
    const uint8_t *pad = m.pad == nullptr ? nullptr : m.pad + first;
    // Vector rows without dropout: every load of the row before any use of
    // one (all in flight at once; a use between two guarded loads makes the
    // second wait for the first). Scalar rows and the dropout copy load as
    // they go: all first, they spilled.
    constexpr bool kLoadsFirst = V > 1 && !DROP;
    uint32_t xw[CHUNKS][FtnPacked<T, V>::W] = {};  // read only where loaded
    if constexpr (kLoadsFirst) {
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        if (first + c * LANES * V < limit) {
          ftn_load_packed<T, V>(xr + c * LANES * V, xw[c]);
          if (pad != nullptr) sm_prefetch_l1(pad + c * LANES * V);
        }
      }
    }
    float v[CHUNKS][V];
    bool any = pad == nullptr;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int col0 = first + c * LANES * V;
      if (col0 < limit) {
        if constexpr (!kLoadsFirst) ftn_load_packed<T, V>(xr + c * LANES * V, xw[c]);
        ftn_unpack<T, V>(xw[c], v[c]);
        // Two copies of the scaling (the pointer is uniform): without a
        // mask no per-element select, and the emulator's g++ vectorises it
        // (the select on bytes next to floats it left scalar).
        if (pad != nullptr) {
          uint8_t mk[V];
          ftn_load_bytes<V>(pad + c * LANES * V, mk);
#pragma unroll
          for (int k = 0; k < V; ++k) {
            v[c][k] *= p.scale;
            if (mk[k] != 0) v[c][k] = SM_MASKED_VALUE;
            any |= mk[k] == 0;
          }
        } else {
#pragma unroll
          for (int k = 0; k < V; ++k) v[c][k] *= p.scale;
        }
        if (col0 + V > limit) {  // the vector holding the causal limit
#pragma unroll
          for (int k = 0; k < V; ++k) {
            if (col0 + k >= limit) v[c][k] = FTN_NEG_INF;
          }
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) v[c][k] = FTN_NEG_INF;
      }
    }
    const float mx = ftn_group_allreduce<FtnMaxOp, LANES>(ftn_thread_max(v));
    if (padded) any = sm_group_any<LANES>(any);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
#pragma unroll
      for (int k = 0; k < V; ++k) v[c][k] = sm_exp(v[c][k] - mx);
    }
    const float sum = ftn_group_allreduce<FtnSumOp, LANES>(ftn_thread_sum(v));
    const float inv = any ? 1.0f / sum : 0.0f;
    if (live) {
      T *yr = y + r * p.sk + first;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        if (first + c * LANES * V < sk) {
          sm_store_probs<T, V, DROP>(p, yr + c * LANES * V, yd, r * p.sk + first + c * LANES * V,
                                     v[c], inv);
        }
      }
    }
  }
}

// Block path: thread t holds columns (c*blockDim.x + t)*V + k. Columns fit
// in 32 bits here (sk <= 16384), which keeps the address math in registers.
template <typename T, int CHUNKS, int V, bool DROP>
FTN_DEVICE void sm_fwd_block_impl(const FtnSoftmaxFwdParams &p) {
  FTN_ASSERT(blockDim.x % 32 == 0 && p.sk <= (int64_t)CHUNKS * V * blockDim.x);
  FTN_SHARED(float, red, [32]);
  const T *x = static_cast<const T *>(p.x);
  T *y = static_cast<T *>(p.y);
  T *yd = static_cast<T *>(p.y_dropped);
  const int sk = (int)p.sk;
  const int stride = (int)blockDim.x * V;
  const int first = (int)threadIdx.x * V;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const SmRowMask m = sm_row_mask(p, r);
    const int limit = (int)m.limit;
    const T *xr = x + r * p.sk;
    T *yr = y + r * p.sk;
    // 16-bit vector rows without dropout: every load of the row before any
    // use of one, as in the warp path (fp32 and the dropout copy spilled).
    constexpr bool kLoadsFirst = V > 1 && !DROP && sizeof(T) == 2;
    uint32_t xw[CHUNKS][FtnPacked<T, V>::W];
    if constexpr (kLoadsFirst) {
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        if (first + c * stride < limit) {
          ftn_load_packed<T, V>(xr + first + c * stride, xw[c]);
          if (m.pad != nullptr) sm_prefetch_l1(m.pad + first + c * stride);
        }
      }
    }
    float v[CHUNKS][V];
    bool any = m.pad == nullptr;
    // Serial max and sum here: ftn_thread_max/sum (as in the warp path)
    // cost this path 48 registers on sm_90 (7 -> 4 resident blocks).
    float mx = FTN_NEG_INF;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int col0 = first + c * stride;
      if (col0 < limit) {
        if constexpr (!kLoadsFirst) ftn_load_packed<T, V>(xr + col0, xw[c]);
        ftn_unpack<T, V>(xw[c], v[c]);
        uint8_t mk[V];
        if (m.pad != nullptr) {
          ftn_load_bytes<V>(m.pad + col0, mk);
        } else {
#pragma unroll
          for (int k = 0; k < V; ++k) mk[k] = 0;
        }
#pragma unroll
        for (int k = 0; k < V; ++k) {
          v[c][k] *= p.scale;
          if (mk[k] != 0) v[c][k] = SM_MASKED_VALUE;
          any |= mk[k] == 0;
        }
        if (col0 + V > limit) {  // the vector holding the causal limit
#pragma unroll
          for (int k = 0; k < V; ++k) {
            if (col0 + k >= limit) v[c][k] = FTN_NEG_INF;
          }
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) v[c][k] = FTN_NEG_INF;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) mx = fmaxf(mx, v[c][k]);
    }
    mx = ftn_block_allreduce<FtnMaxOp>(mx, red);
    const bool any_row = __syncthreads_or(any ? 1 : 0) != 0;
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[c][k] = sm_exp(v[c][k] - mx);
        sum += v[c][k];
      }
    }
    sum = ftn_block_allreduce<FtnSumOp>(sum, red);
    const float inv = any_row ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int col0 = first + c * stride;
      // y only: DROP makes y_dropped below, from the stored row.
      if (col0 < sk) sm_store_probs<T, V, DROP>(p, yr + col0, nullptr, 0, v[c], inv);
    }
    // Dropout from the stored row (re-read by the thread that wrote it): the
    // 32 values are dead by now, which leaves registers for Philox.
    // Not unrolled: unrolled, the Philox calls of all chunks are interleaved
    // and spill.
    if constexpr (DROP) {
#pragma unroll 1
      for (int c = 0; c < CHUNKS; ++c) {
        const int col0 = first + c * stride;
        if (col0 < sk) {
          float w[V];
          ftn_load<T, V>(yr + col0, w);
          sm_store_dropped<T, V>(p, yd + r * p.sk + col0, r * p.sk + col0, w);
        }
      }
    }
  }
}

// Long path: two streaming passes with an online max/sum. Each thread takes
// SM_LONG_UNROLL vectors per step, all loaded before any is used (that many
// 128-bit loads in flight per thread), then the tail one vector at a time.
// With dropout, pass 2 runs one vector per step (the Philox state of several
// would spill); the plain pass-2 loop has no dropout code.
template <typename T, int V> FTN_DEVICE void sm_fwd_long_impl(const FtnSoftmaxFwdParams &p) {
  constexpr int U = SM_LONG_UNROLL;
  // Unchecked steps (every vector ends by the causal limit: no per-vector
  // test) for 16-bit T; fp32 keeps the checked loads (unchecked, it spills
  // 20 bytes on sm_80 at the 64-register cap).
  constexpr bool FAST = sizeof(T) < 4;
  constexpr int END = FAST ? V : 1;  // a step runs while its last vector's END-th column fits
  FTN_ASSERT(blockDim.x % 32 == 0);
  FTN_SHARED(float, red, [32]);
  const T *x = static_cast<const T *>(p.x);
  T *y = static_cast<T *>(p.y);
  T *yd = static_cast<T *>(p.y_dropped);
  const int64_t step = (int64_t)blockDim.x * V;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const SmRowMask m = sm_row_mask(p, r);
    const T *xr = x + r * p.sk;
    T *yr = y + r * p.sk;
    bool any = m.pad == nullptr;
    float tm = FTN_NEG_INF;  // running max of this thread
    float ts = 0.0f;        // running sum of exp(v - tm)
    int64_t col0 = (int64_t)threadIdx.x * V;
    for (; col0 + (U - 1) * step + END <= m.limit; col0 += U * step) {
      float v[U][V];
      sm_logits_step<T, V, U, FAST>(p, xr, m, col0, step, v, any);
      float cm = FTN_NEG_INF;
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int k = 0; k < V; ++k) cm = fmaxf(cm, v[u][k]);
      }
      if (cm > tm) {
        ts *= sm_exp(tm - cm);  // tm = -inf: ts is 0 and stays 0
        tm = cm;
      }
      // cm > -inf here: the first of the U vectors starts before the limit.
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int k = 0; k < V; ++k) ts += sm_exp(v[u][k] - tm);
      }
    }
    for (; col0 < m.limit; col0 += step) {
      float v[V];
      sm_logits<T, V>(p, xr, m, col0, v, any);
      float cm = FTN_NEG_INF;
#pragma unroll
      for (int k = 0; k < V; ++k) cm = fmaxf(cm, v[k]);
      if (cm == FTN_NEG_INF) continue;  // every column causal-masked
      if (cm > tm) {
        ts *= sm_exp(tm - cm);
        tm = cm;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) ts += sm_exp(v[k] - tm);
    }
    const float mx = ftn_block_allreduce<FtnMaxOp>(tm, red);
    ts = tm == FTN_NEG_INF ? 0.0f : ts * sm_exp(tm - mx);
    const float sum = ftn_block_allreduce<FtnSumOp>(ts, red);
    const bool any_row = __syncthreads_or(any ? 1 : 0) != 0;
    const float inv = any_row ? 1.0f / sum : 0.0f;
    bool unused = false;
    col0 = (int64_t)threadIdx.x * V;
    if (yd == nullptr) {
      // fp32: up to sk, the columns past the limit masked to -inf (y = 0).
      const int64_t end = FAST ? m.limit : p.sk;
      for (; col0 + (U - 1) * step + END <= end; col0 += U * step) {
        float v[U][V];
        sm_logits_step<T, V, U, FAST>(p, xr, m, col0, step, v, unused);
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int k = 0; k < V; ++k) v[u][k] = sm_exp(v[u][k] - mx) * inv;
          ftn_store<T, V>(yr + col0 + u * step, v[u]);
        }
      }
    }
    for (; col0 < p.sk; col0 += step) {
      float v[V];
      sm_logits<T, V>(p, xr, m, col0, v, unused);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = sm_exp(v[k] - mx) * inv;
      ftn_store<T, V>(yr + col0, v);
      if (yd != nullptr) sm_store_dropped<T, V>(p, yd + r * p.sk + col0, r * p.sk + col0, v);
    }
  }
}

// ---------------------------------------------------------------- backward

// Rows held in registers: thread `first` column, chunk c at first + c*stride.
// Shared by the warp path (LANES lanes per row, 32 / LANES rows per warp,
// stride LANES*V; the warp walks its rows together, as in the forward) and
// the block path (BLOCK: stride blockDim.x*V, one row per block); columns
// fit in 32 bits.
template <typename T, int CHUNKS, int V, bool BLOCK, int LANES = 32>
FTN_DEVICE void sm_bwd_rows(const FtnSoftmaxBwdParams &p, float *red) {
  constexpr int RPW = BLOCK ? 1 : 32 / LANES;
  const T *y = static_cast<const T *>(p.y);
  const T *dy = static_cast<const T *>(p.dy);
  T *dx = static_cast<T *>(p.dx);
  const int sk = (int)p.sk;
  const int lanes = BLOCK ? (int)blockDim.x : LANES;
  const int stride = lanes * V;
  const int lane = (int)(threadIdx.x & 31);
  const int first = (int)(BLOCK ? threadIdx.x : (uint32_t)(lane % LANES)) * V;
  const int64_t row0 =
      BLOCK ? (int64_t)blockIdx.x
            : ((int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * RPW;
  const int64_t row_step =
      BLOCK ? (int64_t)gridDim.x : (int64_t)gridDim.x * (blockDim.x >> 5) * RPW;
  for (int64_t rw = row0; rw < p.rows; rw += row_step) {
    const int64_t r = rw + (BLOCK ? 0 : lane / LANES);
    const int cols = r < p.rows ? sk : 0;  // a group past the last row: nothing
    const int64_t off = r * p.sk + first;
    // Both rows' loads before any use of one (all in flight at once: a use
    // between two guarded loads makes the second wait for the first). The
    // rows stay packed in their storage type across the reduction and are
    // widened again for dx (half the registers of fp32 for 16-bit types).
    // fp32 block rows load as they go (all first, they spilled on sm_90a).
    constexpr bool kLoadsFirst = !(BLOCK && sizeof(T) == 4);
    constexpr int W = FtnPacked<T, V>::W;
    uint32_t yw[CHUNKS][W] = {}, gw[CHUNKS][W] = {};  // read only where loaded
    if constexpr (kLoadsFirst) {
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        if (first + c * stride < cols) {
          ftn_load_packed<T, V>(y + off + c * stride, yw[c]);
          ftn_load_packed<T, V>(dy + off + c * stride, gw[c]);
        }
      }
    }
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      float yv[V], gv[V];
      if (first + c * stride < cols) {
        if constexpr (!kLoadsFirst) {
          ftn_load_packed<T, V>(y + off + c * stride, yw[c]);
          ftn_load_packed<T, V>(dy + off + c * stride, gw[c]);
        }
        ftn_unpack<T, V>(yw[c], yv);
        ftn_unpack<T, V>(gw[c], gv);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) yv[k] = gv[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) dot += yv[k] * gv[k];
    }
    if constexpr (BLOCK) {
      dot = ftn_block_allreduce<FtnSumOp>(dot, red);
    } else {
      dot = ftn_group_allreduce<FtnSumOp, LANES>(dot);
    }
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      if (first + c * stride < cols) {
        float yv[V], gv[V];
        ftn_unpack<T, V>(yw[c], yv);
        ftn_unpack<T, V>(gw[c], gv);
#pragma unroll
        for (int k = 0; k < V; ++k) gv[k] = p.scale * (gv[k] * yv[k] - yv[k] * dot);
        ftn_store<T, V>(dx + off + c * stride, gv);
      }
    }
  }
}

// Backward with attention dropout, rows of the warp path: a warp per row
// streams it twice (as the long path does with a block) instead of holding
// it: pass 1 forms sum(g*y), pass 2 re-reads (normally an L1/L2 hit) and
// writes dx, regenerating the mask in both. (Holding the row plus the Philox
// state spills on sm_80; the block path's rows go to the long kernel.)
template <typename T, int V>
FTN_DEVICE void sm_bwd_rows_dropout(const FtnSoftmaxBwdParams &p) {
  const T *y = static_cast<const T *>(p.y);
  const T *dy = static_cast<const T *>(p.dy);
  T *dx = static_cast<T *>(p.dx);
  const int64_t stride = 32 * V;
  const int64_t first = (int64_t)(threadIdx.x & 31) * V;
  const int64_t warps = blockDim.x >> 5;
  for (int64_t r = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5); r < p.rows;
       r += (int64_t)gridDim.x * warps) {
    const int64_t off = r * p.sk;
    float dot = 0.0f;
#pragma unroll 1
    for (int64_t col0 = first; col0 < p.sk; col0 += stride) {
      float yv[V], gv[V];
      ftn_load<T, V>(y + off + col0, yv);
      ftn_load<T, V>(dy + off + col0, gv);
      sm_undrop_grad<V>(p, off + col0, gv);
#pragma unroll
      for (int k = 0; k < V; ++k) dot += yv[k] * gv[k];
    }
    dot = ftn_warp_allreduce<FtnSumOp>(dot);
#pragma unroll 1
    for (int64_t col0 = first; col0 < p.sk; col0 += stride) {
      float yv[V], gv[V];
      ftn_load<T, V>(y + off + col0, yv);
      ftn_load<T, V>(dy + off + col0, gv);
      sm_undrop_grad<V>(p, off + col0, gv);
#pragma unroll
      for (int k = 0; k < V; ++k) gv[k] = p.scale * (gv[k] * yv[k] - yv[k] * dot);
      ftn_store<T, V>(dx + off + col0, gv);
    }
  }
}

template <typename T, int CHUNKS, int V, int LANES>
FTN_DEVICE void sm_bwd_warp_impl(const FtnSoftmaxBwdParams &p) {
  FTN_ASSERT(blockDim.x % 32 == 0 && p.sk <= (int64_t)CHUNKS * V * LANES);
  FTN_ASSERT(p.drop_threshold == 0u);
  sm_bwd_rows<T, CHUNKS, V, false, LANES>(p, nullptr);
}

template <typename T, int CHUNKS, int V>
FTN_DEVICE void sm_bwd_block_impl(const FtnSoftmaxBwdParams &p) {
  FTN_ASSERT(blockDim.x % 32 == 0 && p.sk <= (int64_t)CHUNKS * V * blockDim.x);
  FTN_ASSERT(p.drop_threshold == 0u);
  FTN_SHARED(float, red, [32]);
  sm_bwd_rows<T, CHUNKS, V, true>(p, red);
}

template <typename T, int V> FTN_DEVICE void sm_bwd_long_impl(const FtnSoftmaxBwdParams &p) {
  FTN_ASSERT(blockDim.x % 32 == 0);
  FTN_SHARED(float, red, [32]);
  const T *y = static_cast<const T *>(p.y);
  const T *dy = static_cast<const T *>(p.dy);
  T *dx = static_cast<T *>(p.dx);
  const int64_t step = (int64_t)blockDim.x * V;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const int64_t off = r * p.sk;
    float dot = 0.0f;
    for (int64_t col0 = (int64_t)threadIdx.x * V; col0 < p.sk; col0 += step) {
      float yv[V], gv[V];
      ftn_load<T, V>(y + off + col0, yv);
      ftn_load<T, V>(dy + off + col0, gv);
      sm_undrop_grad<V>(p, off + col0, gv);
#pragma unroll
      for (int k = 0; k < V; ++k) dot += yv[k] * gv[k];
    }
    dot = ftn_block_allreduce<FtnSumOp>(dot, red);
    for (int64_t col0 = (int64_t)threadIdx.x * V; col0 < p.sk; col0 += step) {
      float yv[V], gv[V];
      ftn_load<T, V>(y + off + col0, yv);
      ftn_load<T, V>(dy + off + col0, gv);
      sm_undrop_grad<V>(p, off + col0, gv);
#pragma unroll
      for (int k = 0; k < V; ++k) gv[k] = p.scale * (gv[k] * yv[k] - yv[k] * dot);
      ftn_store<T, V>(dx + off + col0, gv);
    }
  }
}

// ---------------------------------------------------------------- dispatch
// p.vec is FtnVec<T>::N (vector path) or 1 (scalar path); the plan sets the
// vector width only where the path's per-thread count N is a multiple of it.

// The warp and block forwards are compiled with and without dropout: WITH
// runs when y_dropped is set.
template <void (*WITH)(const FtnSoftmaxFwdParams &), void (*WITHOUT)(const FtnSoftmaxFwdParams &)>
FTN_DEVICE void sm_fwd_drop(const FtnSoftmaxFwdParams &p) {
  if (p.y_dropped != nullptr) {
    WITH(p);
  } else {
    WITHOUT(p);
  }
}

// Warp path with N values per lane: N >= 2V: 32 lanes per row, N / V
// vectors each; N < 2V (short rows): two vectors per lane, 16 * N / V lanes
// per row (several rows per warp: both loads in flight and the per-row work
// of reductions and bookkeeping shared by 2V values per lane).
template <typename T, int N> FTN_DEVICE void sm_fwd_warp(const FtnSoftmaxFwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  if (p.vec == (uint32_t)V) {
    if constexpr (N >= 2 * V) {
      sm_fwd_drop<sm_fwd_warp_impl<T, N / V, V, 32, true>,
                  sm_fwd_warp_impl<T, N / V, V, 32, false>>(p);
    } else {
      sm_fwd_drop<sm_fwd_warp_impl<T, 2, V, 16 * N / V, true>,
                  sm_fwd_warp_impl<T, 2, V, 16 * N / V, false>>(p);
    }
    return;
  }
  FTN_ASSERT(p.vec == 1u);
  sm_fwd_drop<sm_fwd_warp_impl<T, N, 1, 32, true>, sm_fwd_warp_impl<T, N, 1, 32, false>>(p);
}

template <typename T, int N> FTN_DEVICE void sm_bwd_warp(const FtnSoftmaxBwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  if (p.vec == (uint32_t)V) {
    if constexpr (N >= 2 * V) {
      sm_bwd_warp_impl<T, N / V, V, 32>(p);
    } else {
      sm_bwd_warp_impl<T, 2, V, 16 * N / V>(p);
    }
    return;
  }
  FTN_ASSERT(p.vec == 1u);
  sm_bwd_warp_impl<T, N, 1, 32>(p);
}

template <typename T> FTN_DEVICE void sm_bwd_dropout_warp(const FtnSoftmaxBwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  FTN_ASSERT(blockDim.x % 32 == 0);
  if (p.vec == (uint32_t)V) {
    sm_bwd_rows_dropout<T, V>(p);
  } else {
    FTN_ASSERT(p.vec == 1u);
    sm_bwd_rows_dropout<T, 1>(p);
  }
}

template <typename T> FTN_DEVICE void sm_fwd_block(const FtnSoftmaxFwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  if (p.vec == (uint32_t)V) {
    sm_fwd_drop<sm_fwd_block_impl<T, SM_BLOCK_ITEMS / V, V, true>,
                sm_fwd_block_impl<T, SM_BLOCK_ITEMS / V, V, false>>(p);
  } else {
    FTN_ASSERT(p.vec == 1u);
    sm_fwd_drop<sm_fwd_block_impl<T, SM_BLOCK_ITEMS, 1, true>,
                sm_fwd_block_impl<T, SM_BLOCK_ITEMS, 1, false>>(p);
  }
}

// The block path's common case, vector rows without dropout, is its own
// kernel: a kernel's register count is that of its largest path, and the
// scalar and dropout paths need ~100 where this one needs ~74 (6 blocks of
// 128 threads per SM at sk = 4096 instead of 4).
template <typename T> FTN_DEVICE void sm_fwd_block_vec(const FtnSoftmaxFwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  FTN_ASSERT(p.vec == (uint32_t)V && p.y_dropped == nullptr);
  sm_fwd_block_impl<T, SM_BLOCK_ITEMS / V, V, false>(p);
}

template <typename T> FTN_DEVICE void sm_bwd_block(const FtnSoftmaxBwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  if (p.vec == (uint32_t)V) {
    sm_bwd_block_impl<T, SM_BLOCK_ITEMS / V, V>(p);
  } else {
    FTN_ASSERT(p.vec == 1u);
    sm_bwd_block_impl<T, SM_BLOCK_ITEMS, 1>(p);
  }
}

template <typename T> FTN_DEVICE void sm_fwd_long(const FtnSoftmaxFwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  if (p.vec == (uint32_t)V) {
    sm_fwd_long_impl<T, V>(p);
  } else {
    FTN_ASSERT(p.vec == 1u);
    sm_fwd_long_impl<T, 1>(p);
  }
}

template <typename T> FTN_DEVICE void sm_bwd_long(const FtnSoftmaxBwdParams &p) {
  constexpr int V = FtnVec<T>::N;
  if (p.vec == (uint32_t)V) {
    sm_bwd_long_impl<T, V>(p);
  } else {
    FTN_ASSERT(p.vec == 1u);
    sm_bwd_long_impl<T, 1>(p);
  }
}

// Launch bounds of the warp kernels: 128 threads; for rows of <= 128 values
// (N <= 4) also 8 resident blocks (<= 64 registers), which short rows need
// for enough bytes in flight. The emulator takes the thread count alone.
#if defined(__CUDACC__)
#define SM_WARP_BOUNDS(N) 128, ((N) <= 4 ? 8 : 1)
#else
#define SM_WARP_BOUNDS(N) 128
#endif

#define FTN_STAMP_SOFTMAX_WARP(suffix, T, N)                                                  \
  FTN_KERNEL_BOUNDED(ftn_softmax_fwd_warp##N##_##suffix, FtnSoftmaxFwdParams, p,              \
                     SM_WARP_BOUNDS(N)) {                                                     \
    sm_fwd_warp<T, N>(p);                                                                 \
  }                                                                                       \
  FTN_KERNEL_BOUNDED(ftn_softmax_bwd_warp##N##_##suffix, FtnSoftmaxBwdParams, p, 128) {   \
    sm_bwd_warp<T, N>(p);                                                                 \
  }

#define FTN_STAMP_SOFTMAX(suffix, T)                                                  \
  FTN_STAMP_SOFTMAX_WARP(suffix, T, 1)                                                \
  FTN_STAMP_SOFTMAX_WARP(suffix, T, 2)                                                \
  FTN_STAMP_SOFTMAX_WARP(suffix, T, 4)                                                \
  FTN_STAMP_SOFTMAX_WARP(suffix, T, 8)                                                \
  FTN_STAMP_SOFTMAX_WARP(suffix, T, 16)                                               \
  FTN_STAMP_SOFTMAX_WARP(suffix, T, 32)                                               \
  FTN_KERNEL_BOUNDED(ftn_softmax_fwd_block_##suffix, FtnSoftmaxFwdParams, p, 512) {   \
    sm_fwd_block<T>(p);                                                               \
  }                                                                                   \
  FTN_KERNEL_BOUNDED(ftn_softmax_fwd_block_vec_##suffix, FtnSoftmaxFwdParams, p, 512) { \
    sm_fwd_block_vec<T>(p);                                                           \
  }                                                                                   \
  FTN_KERNEL_BOUNDED(ftn_softmax_bwd_block_##suffix, FtnSoftmaxBwdParams, p, 512) {   \
    sm_bwd_block<T>(p);                                                               \
  }                                                                                   \
  FTN_KERNEL_BOUNDED(ftn_softmax_fwd_long_##suffix, FtnSoftmaxFwdParams, p, 1024) {   \
    sm_fwd_long<T>(p);                                                                \
  }                                                                                   \
  FTN_KERNEL_BOUNDED(ftn_softmax_bwd_long_##suffix, FtnSoftmaxBwdParams, p, 1024) {   \
    sm_bwd_long<T>(p);                                                                \
  }                                                                                   \
  FTN_KERNEL_BOUNDED(ftn_softmax_bwd_dropout_warp_##suffix, FtnSoftmaxBwdParams, p, 128) { \
    sm_bwd_dropout_warp<T>(p);                                                        \
  }

FTN_STAMP_SOFTMAX(f32, float)
FTN_STAMP_SOFTMAX(f16, __half)
FTN_STAMP_SOFTMAX(bf16, __nv_bfloat16)
