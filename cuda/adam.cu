// Fused multi-tensor AdamW (the Apex / Transformer Engine fused Adam update)
// with the gradient unscale, the overflow skip and the low-precision model
// copy in the same pass.
//
// Algorithm. The list machinery is the multi-tensor one (multi_tensor.cu):
// a tensor table (FtnAdamTensorDesc: p, m, v, g, model, numel, per-tensor
// weight decay, dtypes) and a chunk table (FtnChunkDesc) uploaded by the
// host; blocks of FTN_MT_THREADS walk the chunks with a grid-stride loop and
// thread t of a block owns elements start + t, start + t + THREADS, ... of
// its chunk (coalesced scalar accesses). Per element, all in fp32:
//   g = grad * inv_scale            (L2 mode: g += wd * p)
//   m = b1 * m + (1 - b1) * g
//   v = b2 * v + (1 - b2) * g * g
//   u = (m / bc1) / (sqrt(v / bc2) + eps)   (decoupled: u += wd * p)
//   p = p - lr * u;   model = (half) p
// with bc1 = 1 - b1^t, bc2 = 1 - b2^t computed once per thread in fp64 from
// the device step counter (t = *step + 1). lr, step, inv_scale (or the
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

template <typename TG, typename TM>
FTN_DEVICE void adam_visit(const FtnAdamTensorDesc &d, int64_t start, int64_t end, float lr,
                           float inv, float b1, float b2, float bc1, float bc2, float eps,
                           bool decoupled) {
  const TG *g_ptr = static_cast<const TG *>(d.g);
  const float wd = d.weight_decay;
  for (int64_t i = start + (int64_t)threadIdx.x; i < end; i += FTN_MT_THREADS) {
    float p = d.p[i];
    float g = ftn_to_float(g_ptr[i]) * inv;
    if (!decoupled) g = g + wd * p;
    const float m = b1 * d.m[i] + (1.0f - b1) * g;
    const float v = b2 * d.v[i] + (1.0f - b2) * g * g;
    float u = (m / bc1) / (sqrtf(v / bc2) + eps);
    if (decoupled) u = u + wd * p;
    p = p - lr * u;
    d.p[i] = p;
    d.m[i] = m;
    d.v[i] = v;
    if constexpr (AdamHasModel<TM>::value) {
      static_cast<TM *>(d.model)[i] = ftn_from_float<TM>(p);
    }
  }
}

template <typename TG>
FTN_DEVICE void adam_visit_g(const FtnAdamTensorDesc &d, int64_t start, int64_t end, float lr,
                             float inv, float b1, float b2, float bc1, float bc2, float eps,
                             bool decoupled) {
  if (d.model == nullptr) {
    adam_visit<TG, AdamNoModel>(d, start, end, lr, inv, b1, b2, bc1, bc2, eps, decoupled);
  } else if (d.model_dtype == FTN_MT_BF16) {
    adam_visit<TG, __nv_bfloat16>(d, start, end, lr, inv, b1, b2, bc1, bc2, eps, decoupled);
  } else if (d.model_dtype == FTN_MT_F16) {
    adam_visit<TG, __half>(d, start, end, lr, inv, b1, b2, bc1, bc2, eps, decoupled);
  } else {
    adam_visit<TG, float>(d, start, end, lr, inv, b1, b2, bc1, bc2, eps, decoupled);
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
  const bool decoupled = p.mode == FTN_ADAM_DECOUPLED;
  for (int64_t c = blockIdx.x; c < p.num_chunks; c += gridDim.x) {
    const FtnChunkDesc ch = p.chunks[c];
    const FtnAdamTensorDesc d = p.tensors[ch.tensor];
    const int64_t start = (int64_t)ch.chunk * p.chunk_size;
    const int64_t end = start + p.chunk_size < d.numel ? start + p.chunk_size : d.numel;
    if (d.g_dtype == FTN_MT_F16) {
      adam_visit_g<__half>(d, start, end, lr, inv, p.beta1, p.beta2, bc1, bc2, p.eps, decoupled);
    } else if (d.g_dtype == FTN_MT_BF16) {
      adam_visit_g<__nv_bfloat16>(d, start, end, lr, inv, p.beta1, p.beta2, bc1, bc2, p.eps,
                                  decoupled);
    } else {
      adam_visit_g<float>(d, start, end, lr, inv, p.beta1, p.beta2, bc1, bc2, p.eps, decoupled);
    }
  }
}

FTN_KERNEL_BOUNDED(ftn_adam_step_advance, FtnAdamStepAdvanceParams, p, 32) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (p.found_inf != nullptr && *p.found_inf > 0.0f) return;
  *p.step += 1;
}
