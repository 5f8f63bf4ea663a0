// Multi-tensor kernels (Megatron / Apex multi_tensor_apply) and the device
// step of DynamicGradScaler.
//
// Every multi-tensor kernel covers a whole list of tensors (fp32, fp16 and
// bf16 mixed) in ONE launch: the host uploads a tensor table (FtnTensorDesc:
// address, numel, dtype, alignment) and a chunk table (FtnChunkDesc: tensor,
// chunk index); blocks of FTN_MT_THREADS walk the chunks with a grid-stride
// loop. Within a chunk, thread t owns the groups g = t, t + THREADS, ... of
// G = 16 / sizeof(T) adjacent elements; a full group of a 16-byte-aligned
// tensor moves as one 128-bit access, anything else element by element, in
// the same element order either way (so reductions do not depend on the
// alignment). Arithmetic is fp32.
//
// ftn_multi_tensor_unscale   x <- x * inv_scale, found_inf <- 1 on any
//   non-finite input or stored result (one __syncthreads_or per block, one
//   store per block that saw one).
//   HBM floor: reads + writes every element: 2 * sum(numel * sizeof(T)) bytes
//   (+ 24 B per tensor and 8 B per chunk of tables).
// ftn_multi_tensor_l2norm_partial   partial[chunk] = fp32 sum of x^2 (per
//   thread in element order, then a fixed shuffle tree): no float atomics.
//   HBM floor: reads sum(numel * sizeof(T)) bytes, writes 4 B per chunk.
// ftn_multi_tensor_l2norm_final   one block sums the partials in fp64 in a
//   fixed order and writes sqrt: bitwise reproducible for a given list.
//   HBM floor: reads 4 B per chunk, writes 4 B.
// ftn_multi_tensor_clip   coeff = max_norm / (norm + eps) in fp64 from the
//   device norm; when coeff < 1, x <- x * (float)coeff. No host sync.
//   HBM floor: 2 * sum(numel * sizeof(T)) bytes when clipping, ~0 otherwise
//   (every block reads the norm and exits).
// ftn_grad_scaler_update   one thread: Megatron's DynamicGradScaler.update on
//   a device-resident state, driven by the device found_inf flag.
//   HBM floor: 16 B state read + written, 4 B flag read (+ written if reset).
#include "reduce.cuh"
#include "vec.cuh"

// True unless x is +-inf or NaN (exponent bits all ones). Bit test: immune
// to fast-math assumptions.
FTN_DEVICE bool mt_finite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

// Calls op.apply<T>(v) on every element of [start, end) owned by this thread,
// in the canonical order, storing the result back when WRITE.
template <typename T, bool WRITE, typename Op>
FTN_DEVICE void mt_visit(const FtnTensorDesc &d, int64_t start, int64_t end, Op &op) {
  constexpr int G = FtnVec<T>::N;
  T *data = static_cast<T *>(d.data);
  for (int64_t base = start + (int64_t)threadIdx.x * G; base < end;
       base += (int64_t)FTN_MT_THREADS * G) {
    if (d.vec != 0 && base + G <= end) {
      float v[G];
      ftn_load_vec<T>(data + base, v);
#pragma unroll
      for (int k = 0; k < G; ++k) op.template apply<T>(v[k]);
      if constexpr (WRITE) ftn_store_vec<T>(data + base, v);
    } else {
      const int n = end - base < G ? (int)(end - base) : G;
      for (int k = 0; k < n; ++k) {
        float v = ftn_to_float(data[base + k]);
        op.template apply<T>(v);
        if constexpr (WRITE) data[base + k] = ftn_from_float<T>(v);
      }
    }
  }
}

// Runs op over chunk c of the list, dispatching on the tensor's dtype (the
// same for the whole block).
template <bool WRITE, typename Op>
FTN_DEVICE void mt_chunk(const FtnTensorDesc *tensors, const FtnChunkDesc *chunks, int64_t c,
                         int64_t chunk_size, Op &op) {
  const FtnChunkDesc ch = chunks[c];
  const FtnTensorDesc d = tensors[ch.tensor];
  const int64_t start = (int64_t)ch.chunk * chunk_size;
  const int64_t end = start + chunk_size < d.numel ? start + chunk_size : d.numel;
  if (d.dtype == FTN_MT_F16) {
    mt_visit<__half, WRITE>(d, start, end, op);
  } else if (d.dtype == FTN_MT_BF16) {
    mt_visit<__nv_bfloat16, WRITE>(d, start, end, op);
  } else {
    mt_visit<float, WRITE>(d, start, end, op);
  }
}

struct MtUnscaleOp {
  float inv;
  bool bad;
  template <typename T> FTN_DEVICE void apply(float &v) {
    // The value as it will be stored (exact round trip for T).
    const float y = ftn_to_float(ftn_from_float<T>(v * inv));
    bad = bad | !(mt_finite(v) & mt_finite(y));
    v = y;
  }
};

struct MtScaleOp {
  float coeff;
  template <typename T> FTN_DEVICE void apply(float &v) { v *= coeff; }
};

struct MtSumSqOp {
  float acc;
  template <typename T> FTN_DEVICE void apply(float &v) { acc += v * v; }
};

FTN_KERNEL_BOUNDED(ftn_multi_tensor_unscale, FtnMultiTensorUnscaleParams, p, FTN_MT_THREADS) {
  FTN_ASSERT(blockDim.x == FTN_MT_THREADS);
  MtUnscaleOp op{p.inv_scale, false};
  if (p.scaler != nullptr) op.inv = (float)(1.0 / (double)p.scaler->scale);
  for (int64_t c = blockIdx.x; c < p.num_chunks; c += gridDim.x) {
    mt_chunk<true>(p.tensors, p.chunks, c, p.chunk_size, op);
  }
  // Atomic: several blocks may find an inf, and plain stores of one word by
  // two blocks are a data race (the emulator's strict mode reports them).
  if (__syncthreads_or(op.bad) && threadIdx.x == 0) atomicExch(p.found_inf, 1.0f);
}

FTN_KERNEL_BOUNDED(ftn_multi_tensor_l2norm_partial, FtnMultiTensorL2NormParams, p,
                   FTN_MT_THREADS) {
  FTN_ASSERT(blockDim.x == FTN_MT_THREADS);
  FTN_SHARED(float, red, [FTN_MT_THREADS / 32]);
  for (int64_t c = blockIdx.x; c < p.num_chunks; c += gridDim.x) {
    MtSumSqOp op{0.0f};
    mt_chunk<false>(p.tensors, p.chunks, c, p.chunk_size, op);
    const float s = ftn_block_allreduce<FtnSumOp>(op.acc, red);
    if (threadIdx.x == 0) p.partial[c] = s;
  }
}

FTN_KERNEL_BOUNDED(ftn_multi_tensor_l2norm_final, FtnMultiTensorL2NormFinalParams, p,
                   FTN_MT_THREADS) {
  FTN_ASSERT(blockDim.x == FTN_MT_THREADS && gridDim.x == 1);
  FTN_SHARED(double, sums, [FTN_MT_THREADS]);
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < p.num_partials; i += FTN_MT_THREADS) acc += p.partial[i];
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int off = FTN_MT_THREADS / 2; off > 0; off >>= 1) {
    if ((int)threadIdx.x < off) sums[threadIdx.x] += sums[threadIdx.x + off];
    __syncthreads();
  }
  if (threadIdx.x == 0) *p.norm = (float)sqrt(sums[0]);
}

FTN_KERNEL_BOUNDED(ftn_multi_tensor_clip, FtnMultiTensorClipParams, p, FTN_MT_THREADS) {
  FTN_ASSERT(blockDim.x == FTN_MT_THREADS);
  const double coeff = p.max_norm / ((double)*p.norm + p.eps);
  if (!(coeff < 1.0)) return;  // the same for every thread of the grid; no barriers follow
  MtScaleOp op{(float)coeff};
  for (int64_t c = blockIdx.x; c < p.num_chunks; c += gridDim.x) {
    mt_chunk<true>(p.tensors, p.chunks, c, p.chunk_size, op);
  }
}

FTN_KERNEL_BOUNDED(ftn_grad_scaler_update, FtnGradScalerUpdateParams, p, 32) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  FtnGradScalerState s = *p.state;
  if (*p.found_inf > 0.0f) {
    s.growth_tracker = 0;
    if (s.hysteresis_tracker > (-2147483647 - 1)) s.hysteresis_tracker -= 1;
    if (s.hysteresis_tracker <= 0) s.scale = fmaxf(s.scale * p.backoff_factor, p.min_scale);
  } else {
    s.growth_tracker += 1;
    if (s.growth_tracker == p.growth_interval) {
      s.growth_tracker = 0;
      s.hysteresis_tracker = p.hysteresis;
      s.scale = s.scale * p.growth_factor;
    }
  }
  *p.state = s;
  if (p.reset_found_inf != 0) *p.found_inf = 0.0f;
}
