// Fused multi-tensor AdamW (the Apex / Transformer Engine fused Adam update)
// with the gradient unscale, the overflow skip and the low-precision model
// copy in the same pass.
//
// Algorithm. The list machinery is the multi-tensor one (multi_tensor.cu):
// a tensor table (FtnAdamTensorDesc: p, m, v, g, model, numel, per-tensor
// weight decay, dtypes) and a chunk table (FtnChunkDesc) uploaded by the
// host; blocks of FTN_MT_THREADS walk the chunks with a grid-stride loop.
// Vector path (p, m, v, g and the model copy 4-element aligned, which
// allocations and chunk starts are): thread t owns the 4 consecutive
// elements start + 4t .. 4t + 3, start + 4(t + THREADS) .., one 128-bit
// access of p, m, v (and a 64/128-bit one of g and the copy) each: 4
// independent elements and 3-5 loads in flight per thread; the last
// (numel % 4) elements and unaligned tensors take the scalar loop
// (elements start + t, start + t + THREADS, ...). Per element, all in fp32:
//   g = grad * inv_scale            (L2 mode: g += wd * p)
//   m = b1 * m + (1 - b1) * g
//   v = b2 * v + (1 - b2) * g * g
//   u = (m * rbc1) / (sqrt(v * rbc2) + eps)   (decoupled: u += wd * p)
//   p = p - lr * u;   model = (half) p
// with bc1 = 1 - b1^t, bc2 = 1 - b2^t computed once per thread in fp64 from
// the device step counter (t = *step + 1), and rbc1 = 1 / bc1, rbc2 = 1 / bc2
// rounded once to fp32 (Apex divides by bc1 and bc2 per element; the
// products differ from those quotients by at most an ulp or two). The
// square root and the division by the denominator are IEEE, as Apex's. lr, step, inv_scale (or the
// DeviceGradScaler state) and found_inf are read from device memory: when
// *found_inf > 0 (the predicate of ftn_grad_scaler_update) every thread
// returns before writing anything, and ftn_adam_step_advance leaves the step
// counter alone, so an overflowing step is skipped with no host sync.
//
// HBM floor (per element, fp32 master weights): reads p, m, v (12 B) and g
// (4 B fp32 / 2 B half), writes p, m, v (12 B) and the model copy (0 / 2 B):
//   fp32 grads, no copy: 28 B; half grads + half copy: 28 B; fp32 grads +
//   half copy: 30 B (+ 64 B per tensor and 8 B per chunk of tables).
// A skipped step reads 4 B per block. FLOPs: ~15 per element plus one sqrt
// and one division: memory bound on every GPU.
#include "ftn_kernel.cuh"
#include "ftn_dtype.cuh"

// No model copy.
struct AdamNoModel {};
template <typename TM> struct AdamHasModel {
  static constexpr bool value = true;
};
template <> struct AdamHasModel<AdamNoModel> {
  static constexpr bool value = false;
};

// The per-step constants of one launch.
struct AdamConsts {
  float lr, inv, b1, b2, omb1, omb2, rbc1, rbc2, eps;
  bool decoupled;
};

// One element's update (p, m, v in place).
FTN_DEVICE void adam_elem(const AdamConsts &k, float wd, float graw, float &p, float &m, float &v) {
  float g = graw * k.inv;
  if (!k.decoupled) g = fmaf(wd, p, g);
  m = fmaf(k.b1, m, k.omb1 * g);
  v = fmaf(k.b2, v, k.omb2 * g * g);
  float u = (m * k.rbc1) / (sqrtf(v * k.rbc2) + k.eps);
  if (k.decoupled) u = fmaf(wd, p, u);
  p = fmaf(-k.lr, u, p);
}

// 4 consecutive elements of T at q (aligned to 4 * sizeof(T)): one 128-bit
// (fp32) or 64-bit (half) access.
template <int Bytes> struct AdamRaw;
template <> struct AdamRaw<16> {
  using type = uint4;
};
template <> struct AdamRaw<8> {
  using type = uint2;
};
template <typename T> struct Adam4 {
  union {
    typename AdamRaw<4 * sizeof(T)>::type raw;
    T v[4];
  } u;
};
template <typename T> FTN_DEVICE void adam_load4(const T *q, float (&out)[4]) {
  FTN_ASSERT_ALIGNED(q, 4 * sizeof(T));
  Adam4<T> a;
  a.u.raw = *reinterpret_cast<const decltype(a.u.raw) *>(q);
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = ftn_to_float(a.u.v[k]);
}
template <typename T> FTN_DEVICE void adam_store4(T *q, const float (&in)[4]) {
  FTN_ASSERT_ALIGNED(q, 4 * sizeof(T));
  Adam4<T> a;
#pragma unroll
  for (int k = 0; k < 4; ++k) a.u.v[k] = ftn_from_float<T>(in[k]);
  *reinterpret_cast<decltype(a.u.raw) *>(q) = a.u.raw;
}

FTN_DEVICE bool adam_aligned(const void *q, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(q) & (bytes - 1)) == 0;
}

template <typename TG, typename TM>
FTN_DEVICE void adam_visit(const FtnAdamTensorDesc &d, int64_t start, int64_t end,
                           const AdamConsts &k) {
  const TG *g_ptr = static_cast<const TG *>(d.g);
  TM *model = static_cast<TM *>(d.model);
  constexpr bool has_model = AdamHasModel<TM>::value;
  const float wd = d.weight_decay;
  int64_t tail = start;
  // Uniform over the block: every thread sees the same tensor and chunk.
  const bool vec = (start & 3) == 0 && adam_aligned(d.p, 16) && adam_aligned(d.m, 16) &&
                   adam_aligned(d.v, 16) && adam_aligned(d.g, 4 * sizeof(TG)) &&
                   (!has_model || adam_aligned(d.model, 4 * sizeof(TM)));
  if (vec) {
    const int64_t end4 = start + ((end - start) & ~(int64_t)3);
    for (int64_t i = start + 4 * (int64_t)threadIdx.x; i < end4; i += 4 * FTN_MT_THREADS) {
      float p[4], m[4], v[4], g[4];
      adam_load4<float>(d.p + i, p);
      adam_load4<float>(d.m + i, m);
      adam_load4<float>(d.v + i, v);
      adam_load4<TG>(g_ptr + i, g);
#pragma unroll
      for (int e = 0; e < 4; ++e) adam_elem(k, wd, g[e], p[e], m[e], v[e]);
      adam_store4<float>(d.p + i, p);
      adam_store4<float>(d.m + i, m);
      adam_store4<float>(d.v + i, v);
      if constexpr (has_model) adam_store4<TM>(model + i, p);
    }
    tail = end4;
  }
  for (int64_t i = tail + (int64_t)threadIdx.x; i < end; i += FTN_MT_THREADS) {
    float p = d.p[i];
    float m = d.m[i];
    float v = d.v[i];
    adam_elem(k, wd, ftn_to_float(g_ptr[i]), p, m, v);
    d.p[i] = p;
    d.m[i] = m;
    d.v[i] = v;
    if constexpr (has_model) model[i] = ftn_from_float<TM>(p);
  }
}

template <typename TG>
FTN_DEVICE void adam_visit_g(const FtnAdamTensorDesc &d, int64_t start, int64_t end,
                             const AdamConsts &k) {
  if (d.model == nullptr) {
    adam_visit<TG, AdamNoModel>(d, start, end, k);
  } else if (d.model_dtype == FTN_MT_BF16) {
    adam_visit<TG, __nv_bfloat16>(d, start, end, k);
  } else if (d.model_dtype == FTN_MT_F16) {
    adam_visit<TG, __half>(d, start, end, k);
  } else {
    adam_visit<TG, float>(d, start, end, k);
  }
}

FTN_KERNEL_BOUNDED(ftn_adam, FtnAdamParams, p, FTN_MT_THREADS) {
  FTN_ASSERT(blockDim.x == FTN_MT_THREADS);
  // The same for every thread of the grid; no barriers follow.
  if (p.found_inf != nullptr && *p.found_inf > 0.0f) return;
  const float lr = *p.lr;
  const double t = (double)*p.step + 1.0;
  const float bc1 = (float)(1.0 - pow((double)p.beta1, t));
  const float bc2 = (float)(1.0 - pow((double)p.beta2, t));
  float inv = 1.0f;
  if (p.scaler != nullptr) {
    inv = (float)(1.0 / (double)p.scaler->scale);
  } else if (p.inv_scale != nullptr) {
    inv = *p.inv_scale;
  }
  AdamConsts k;
  k.lr = lr;
  k.inv = inv;
  k.b1 = p.beta1;
  k.b2 = p.beta2;
  k.omb1 = 1.0f - p.beta1;
  k.omb2 = 1.0f - p.beta2;
  k.rbc1 = 1.0f / bc1;
  k.rbc2 = 1.0f / bc2;
  k.eps = p.eps;
  k.decoupled = p.mode == FTN_ADAM_DECOUPLED;
  for (int64_t c = blockIdx.x; c < p.num_chunks; c += gridDim.x) {
    const FtnChunkDesc ch = p.chunks[c];
    const FtnAdamTensorDesc d = p.tensors[ch.tensor];
    const int64_t start = (int64_t)ch.chunk * p.chunk_size;
    const int64_t end = start + p.chunk_size < d.numel ? start + p.chunk_size : d.numel;
    if (d.g_dtype == FTN_MT_F16) {
      adam_visit_g<__half>(d, start, end, k);
    } else if (d.g_dtype == FTN_MT_BF16) {
      adam_visit_g<__nv_bfloat16>(d, start, end, k);
    } else {
      adam_visit_g<float>(d, start, end, k);
    }
  }
}

FTN_KERNEL_BOUNDED(ftn_adam_step_advance, FtnAdamStepAdvanceParams, p, 32) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (p.found_inf != nullptr && *p.found_inf > 0.0f) return;
  *p.step += 1;
}
