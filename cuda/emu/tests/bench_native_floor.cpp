// The native floor of the emulator's training-op benchmarks: the same
// functions as the bf16 softmax, LayerNorm and bias+GeLU kernels, written as
// plain row-serial C++ loops that g++ vectorises (no threads, no fibers, no
// SIMT), built with the kernels' flags and using the kernels' own GeLU and
// exponential (cuda/gelu.cuh, ftn_emu::ex2_f32). Whatever executes a CUDA
// kernel on this CPU cannot beat these loops by much: they are the yardstick
// for the emulator's speed (benches/emulator.rs, group `native_floor`, which
// also checks that each computes what the kernel computes).
//
// bf16 is passed as its bits (uint16_t); rows x cols, row-major.
// Floor per op: one pass over its operands (2n or 3n bf16), 5-40 FLOP per
// element; at 1024 x 1024 the operands fit in L2/L3.
#include <cmath>
#include <cstdint>
#include <vector>

#include "emu/cuda_emu.h"
#include "gelu.cuh"

namespace {
using ftn_emu::bf16_to_f32;  // the emulator's own conversions (inline)
using ftn_emu::f32_to_bf16;

void load_row(const uint16_t *src, float *dst, uint64_t n) {
  for (uint64_t c = 0; c < n; ++c) dst[c] = bf16_to_f32(src[c]);
}

void store_row(const float *src, uint16_t *dst, uint64_t n) {
  for (uint64_t c = 0; c < n; ++c) dst[c] = f32_to_bf16(src[c]);
}

// sum over c < n of term(c), in 16 interleaved partial sums (as a warp's
// lanes would hold them): without -ffast-math that is what lets g++
// vectorise a reduction; one running sum would be a serial chain of adds.
template <typename Term>
float sum16(uint64_t n, Term term) {
  constexpr uint64_t L = 16;
  float acc[L] = {};
  uint64_t c = 0;
  for (; c + L <= n; c += L)
    for (uint64_t k = 0; k < L; ++k) acc[k] += term(c + k);
  for (; c < n; ++c) acc[c % L] += term(c);
  float s = 0.0f;
  for (uint64_t k = 0; k < L; ++k) s += acc[k];
  return s;
}

// The same for a maximum (of finite values: the compare-and-select form,
// one vmaxps).
inline float max_of(float a, float b) { return b > a ? b : a; }

template <typename Term>
float max16(uint64_t n, Term term) {
  constexpr uint64_t L = 16;
  float acc[L];
  for (uint64_t k = 0; k < L; ++k) acc[k] = -INFINITY;
  uint64_t c = 0;
  for (; c + L <= n; c += L)
    for (uint64_t k = 0; k < L; ++k) acc[k] = max_of(acc[k], term(c + k));
  for (; c < n; ++c) acc[c % L] = max_of(acc[c % L], term(c));
  float m = -INFINITY;
  for (uint64_t k = 0; k < L; ++k) m = max_of(m, acc[k]);
  return m;
}
}  // namespace

// out = gelu_tanh(x + bias), the fast tanh form bias_gelu.cu uses.
extern "C" void ftn_native_bias_gelu_fwd_bf16(const uint16_t *x, const uint16_t *bias,
                                              uint16_t *out, uint64_t rows, uint64_t cols) {
  std::vector<float> b(cols), v(cols);
  load_row(bias, b.data(), cols);
  for (uint64_t r = 0; r < rows; ++r) {
    load_row(x + r * cols, v.data(), cols);
    for (uint64_t c = 0; c < cols; ++c) v[c] = ftn_gelu_bw<FTN_GELU_TANH>(v[c] + b[c]);
    store_row(v.data(), out + r * cols, cols);
  }
}

// dx = dy * gelu_tanh'(x + bias); dbias = sum over rows of dx (fp32).
extern "C" void ftn_native_bias_gelu_bwd_bf16(const uint16_t *dy, const uint16_t *x,
                                              const uint16_t *bias, uint16_t *dx,
                                              uint16_t *dbias, uint64_t rows, uint64_t cols) {
  std::vector<float> b(cols), v(cols), g(cols), acc(cols, 0.0f);
  load_row(bias, b.data(), cols);
  for (uint64_t r = 0; r < rows; ++r) {
    load_row(x + r * cols, v.data(), cols);
    load_row(dy + r * cols, g.data(), cols);
    for (uint64_t c = 0; c < cols; ++c) {
      g[c] *= ftn_gelu_grad_bw<FTN_GELU_TANH>(v[c] + b[c]);
      acc[c] += g[c];
    }
    store_row(g.data(), dx + r * cols, cols);
  }
  store_row(acc.data(), dbias, cols);
}

// y = softmax(scale * x) per row (no mask), exponentials as the kernel's.
extern "C" void ftn_native_softmax_fwd_bf16(const uint16_t *x, uint16_t *y, uint64_t rows,
                                            uint64_t cols, float scale) {
  std::vector<float> v(cols);
  for (uint64_t r = 0; r < rows; ++r) {
    load_row(x + r * cols, v.data(), cols);
    float *vp = v.data();
    for (uint64_t c = 0; c < cols; ++c) vp[c] *= scale;
    const float mx = max16(cols, [&](uint64_t c) { return vp[c]; });
    for (uint64_t c = 0; c < cols; ++c) vp[c] = __expf(vp[c] - mx);
    const float sum = sum16(cols, [&](uint64_t c) { return vp[c]; });
    const float inv = 1.0f / sum;
    for (uint64_t c = 0; c < cols; ++c) v[c] *= inv;
    store_row(v.data(), y + r * cols, cols);
  }
}

// dx = scale * (dy * y - y * sum(dy * y)) per row.
extern "C" void ftn_native_softmax_bwd_bf16(const uint16_t *y, const uint16_t *dy, uint16_t *dx,
                                            uint64_t rows, uint64_t cols, float scale) {
  std::vector<float> yv(cols), g(cols);
  for (uint64_t r = 0; r < rows; ++r) {
    load_row(y + r * cols, yv.data(), cols);
    load_row(dy + r * cols, g.data(), cols);
    const float *yp = yv.data(), *gp = g.data();
    const float dot = sum16(cols, [&](uint64_t c) { return gp[c] * yp[c]; });
    for (uint64_t c = 0; c < cols; ++c) g[c] = scale * (g[c] * yv[c] - yv[c] * dot);
    store_row(g.data(), dx + r * cols, cols);
  }
}

// y = (x - mean) * rstd * gamma + beta; mean and rstd per row (biased
// variance, two passes).
extern "C" void ftn_native_layernorm_fwd_bf16(const uint16_t *x, const uint16_t *gamma,
                                              const uint16_t *beta, uint16_t *y, float *mean,
                                              float *rstd, uint64_t rows, uint64_t cols,
                                              float eps) {
  std::vector<float> g(cols), b(cols), v(cols);
  load_row(gamma, g.data(), cols);
  load_row(beta, b.data(), cols);
  const float inv_n = 1.0f / float(cols);
  for (uint64_t r = 0; r < rows; ++r) {
    load_row(x + r * cols, v.data(), cols);
    const float *vp = v.data();
    const float mu = sum16(cols, [&](uint64_t c) { return vp[c]; }) * inv_n;
    const float q = sum16(cols, [&](uint64_t c) { return (vp[c] - mu) * (vp[c] - mu); });
    const float rs = 1.0f / std::sqrt(q * inv_n + eps);
    for (uint64_t c = 0; c < cols; ++c) v[c] = (v[c] - mu) * rs * g[c] + b[c];
    store_row(v.data(), y + r * cols, cols);
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// dx, dgamma, dbeta of the LayerNorm above, from the saved mean and rstd.
extern "C" void ftn_native_layernorm_bwd_bf16(const uint16_t *dy, const uint16_t *x,
                                              const float *mean, const float *rstd,
                                              const uint16_t *gamma, uint16_t *dx,
                                              uint16_t *dgamma, uint16_t *dbeta, uint64_t rows,
                                              uint64_t cols) {
  std::vector<float> g(cols), v(cols), d(cols), dg(cols, 0.0f), db(cols, 0.0f);
  load_row(gamma, g.data(), cols);
  const float inv_n = 1.0f / float(cols);
  for (uint64_t r = 0; r < rows; ++r) {
    load_row(x + r * cols, v.data(), cols);
    load_row(dy + r * cols, d.data(), cols);
    const float mu = mean[r], rs = rstd[r];
    for (uint64_t c = 0; c < cols; ++c) {
      const float xhat = (v[c] - mu) * rs;
      dg[c] += d[c] * xhat;
      db[c] += d[c];
      v[c] = xhat;
      d[c] *= g[c];
    }
    const float *xh = v.data(), *dyg = d.data();
    const float sum_dg = sum16(cols, [&](uint64_t c) { return dyg[c]; });
    const float sum_dgx = sum16(cols, [&](uint64_t c) { return dyg[c] * xh[c]; });
    const float a = sum_dg * inv_n, bq = sum_dgx * inv_n;
    for (uint64_t c = 0; c < cols; ++c) d[c] = rs * (d[c] - a - v[c] * bq);
    store_row(d.data(), dx + r * cols, cols);
  }
  store_row(dg.data(), dgamma, cols);
  store_row(db.data(), dbeta, cols);
}
