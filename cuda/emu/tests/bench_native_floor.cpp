// The native floor of the emulator's training-op benchmarks: the same
// functions as the bf16 softmax, LayerNorm and bias+GeLU kernels, written as
// plain row-serial C++ loops that g++ vectorises (no threads, no fibers, no
// SIMT), built with the kernels' flags and using the kernels' own GeLU and
// exponential (cuda/gelu.cuh, ftn_emu::ex2_f32). Whatever executes a CUDA
// kernel on this CPU cannot beat these loops by much: they are the yardstick
// for the emulator's speed (benches/emulator.rs, group `native_floor`, which
// also checks that each computes what the kernel computes).
//
// Also here: the softmax and LayerNorm warp kernels, forward and backward,
// hand-lowered to "lockstep" form (ftn_lockstep_*): what a
// barrier-splitting compiler pass would make of them, as an estimate of what
// such an emulator model could reach.
//
// bf16 is passed as its bits (uint16_t); rows x cols, row-major.
// Floor per op: one pass over its operands (2n or 3n bf16), 5-40 FLOP per
// element; at 1024 x 1024 the operands fit in L2/L3.
#include <cmath>
#include <cstdint>
#include <vector>

#include "emu/cuda_emu.h"
#include "gelu.cuh"
#include "reduce.cuh"

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

// ---------------------------------------------------------------- lockstep
// The softmax warp kernels (cuda/softmax.cu, sm_fwd_warp_impl and
// sm_bwd_rows with LANES = 32, V = 8, no mask, no dropout) lowered by hand
// the way a barrier-splitting pass would lower them for a CPU: each stretch
// of a lane's code between two warp collectives becomes a loop over the 32
// lanes, what a lane keeps across a collective becomes an array indexed by
// lane, and the collective runs between two loops (the emulator's own
// ftn_emu_butterfly). Per lane the code and its order of operations are the
// kernel's (lane l holds columns (c*32 + l)*8 + k; serial dot product;
// ftn_thread_max/ftn_thread_sum), so the outputs are the kernel's; what it
// leaves out is the emulator's checks (bounds, alignment, races). An
// estimate for issue 15: the time an emulator that runs a warp's lanes in
// lockstep, instead of one fiber per lane, could reach on these kernels.
// Rows of exactly 1024 columns (the kernels' warp32 instances, 4 chunks a
// lane; callers check).
namespace {
constexpr int kLanes = 32, kV = 8, kChunks = 4;
}

extern "C" void ftn_lockstep_softmax_fwd_bf16(const uint16_t *x, uint16_t *y, uint64_t rows,
                                              uint64_t cols, float scale) {
  for (uint64_t r = 0; r < rows; ++r) {
    const uint16_t *xr = x + r * cols;
    uint16_t *yr = y + r * cols;
    float v[kLanes][kChunks][kV];
    float red[kLanes];
    for (int l = 0; l < kLanes; ++l) {  // up to the max all-reduce
      for (int c = 0; c < kChunks; ++c)
        for (int k = 0; k < kV; ++k) v[l][c][k] = bf16_to_f32(xr[(c * kLanes + l) * kV + k]) * scale;
      red[l] = ftn_thread_max(v[l]);
    }
    ftn_emu_butterfly<FtnMaxOp>(red, kLanes);
    for (int l = 0; l < kLanes; ++l) {  // up to the sum all-reduce
      const float mx = red[l];
      for (int c = 0; c < kChunks; ++c)
        for (int k = 0; k < kV; ++k) v[l][c][k] = __expf(v[l][c][k] - mx);
      red[l] = ftn_thread_sum(v[l]);
    }
    ftn_emu_butterfly<FtnSumOp>(red, kLanes);
    for (int l = 0; l < kLanes; ++l) {  // to the end
      const float inv = 1.0f / red[l];
      for (int c = 0; c < kChunks; ++c)
        for (int k = 0; k < kV; ++k)
          yr[(c * kLanes + l) * kV + k] = f32_to_bf16(v[l][c][k] * inv);
    }
  }
}

extern "C" void ftn_lockstep_softmax_bwd_bf16(const uint16_t *y, const uint16_t *dy,
                                              uint16_t *dx, uint64_t rows, uint64_t cols,
                                              float scale) {
  for (uint64_t r = 0; r < rows; ++r) {
    const uint16_t *yr = y + r * cols, *gr = dy + r * cols;
    uint16_t *dr = dx + r * cols;
    float dot[kLanes];
    for (int l = 0; l < kLanes; ++l) {  // up to the dot product's all-reduce
      float d = 0.0f;
      for (int c = 0; c < kChunks; ++c)
        for (int k = 0; k < kV; ++k) {
          const int i = (c * kLanes + l) * kV + k;
          d += bf16_to_f32(yr[i]) * bf16_to_f32(gr[i]);
        }
      dot[l] = d;
    }
    ftn_emu_butterfly<FtnSumOp>(dot, kLanes);
    for (int l = 0; l < kLanes; ++l) {  // to the end (the rows reread, as
      const float d = dot[l];           // the kernel re-widens its words)
      for (int c = 0; c < kChunks; ++c)
        for (int k = 0; k < kV; ++k) {
          const int i = (c * kLanes + l) * kV + k;
          const float yv = bf16_to_f32(yr[i]), gv = bf16_to_f32(gr[i]);
          dr[i] = f32_to_bf16(scale * (gv * yv - yv * d));
        }
    }
  }
}

// The backward again, lowered as a vectorising pass would do it: the lanes
// are the inner, SIMD dimension (a row widened once into [chunk][k][lane]
// arrays, lanes contiguous), each lane's dot product still summed in the
// kernel's order, so the outputs are bitwise those of the loop above.
extern "C" void ftn_lockstep_simd_softmax_bwd_bf16(const uint16_t *y, const uint16_t *dy,
                                                   uint16_t *dx, uint64_t rows, uint64_t cols,
                                                   float scale) {
  for (uint64_t r = 0; r < rows; ++r) {
    const uint16_t *yr = y + r * cols, *gr = dy + r * cols;
    uint16_t *dr = dx + r * cols;
    alignas(32) float yv[kChunks][kV][kLanes], gv[kChunks][kV][kLanes];
    for (int c = 0; c < kChunks; ++c)
      for (int l = 0; l < kLanes; ++l)
        for (int k = 0; k < kV; ++k) {
          const int i = (c * kLanes + l) * kV + k;
          yv[c][k][l] = bf16_to_f32(yr[i]);
          gv[c][k][l] = bf16_to_f32(gr[i]);
        }
    alignas(32) float dot[kLanes] = {};
    for (int c = 0; c < kChunks; ++c)
      for (int k = 0; k < kV; ++k)
        for (int l = 0; l < kLanes; ++l) dot[l] += yv[c][k][l] * gv[c][k][l];
    ftn_emu_butterfly<FtnSumOp>(dot, kLanes);
    for (int c = 0; c < kChunks; ++c)
      for (int l = 0; l < kLanes; ++l)
        for (int k = 0; k < kV; ++k) {
          const float a = yv[c][k][l], g = gv[c][k][l];
          dr[(c * kLanes + l) * kV + k] = f32_to_bf16(scale * (g * a - a * dot[l]));
        }
  }
}

// The LayerNorm forward's warp path (cuda/layernorm.cu, fwd_row_cached with
// WARP, V = 8, 4 chunks a lane; bf16 with gamma and beta, not RMSNorm, no
// zero-centred gamma), lowered the same way: the row's sum of x - pivot
// (each chunk summed pairwise), its all-reduce, the sum of squared
// deviations, its all-reduce, then the output pass; lane 0 writes the
// row's mean and rstd.
extern "C" void ftn_lockstep_layernorm_fwd_bf16(const uint16_t *x, const uint16_t *gamma,
                                                const uint16_t *beta, uint16_t *y, float *mean,
                                                float *rstd, uint64_t rows, uint64_t cols,
                                                float eps) {
  const float inv_n = 1.0f / float(cols);
  for (uint64_t r = 0; r < rows; ++r) {
    const uint16_t *xr = x + r * cols;
    uint16_t *yr = y + r * cols;
    const float pivot = bf16_to_f32(xr[0]);
    float red[kLanes];
    for (int l = 0; l < kLanes; ++l) {  // up to the first all-reduce
      float s = 0.0f;
      for (int c = 0; c < kChunks; ++c) {
        float v[kV];
        for (int k = 0; k < kV; ++k) v[k] = bf16_to_f32(xr[(c * kLanes + l) * kV + k]);
        for (int w = kV / 2; w > 0; w /= 2)
          for (int k = 0; k < w; ++k) v[k] += v[k + w];
        s += v[0] - float(kV) * pivot;
      }
      red[l] = s;
    }
    ftn_emu_butterfly<FtnSumOp>(red, kLanes);
    float shift[kLanes];
    for (int l = 0; l < kLanes; ++l) {  // up to the second all-reduce
      shift[l] = red[l] * inv_n;
      const float mu = pivot + shift[l];
      float q = 0.0f;
      for (int c = 0; c < kChunks; ++c)
        for (int k = 0; k < kV; ++k) {
          const float d = bf16_to_f32(xr[(c * kLanes + l) * kV + k]) - mu;
          q = fmaf(d, d, q);
        }
      red[l] = q;
    }
    ftn_emu_butterfly<FtnSumOp>(red, kLanes);
    for (int l = 0; l < kLanes; ++l) {  // to the end
      const float rs = rsqrtf(red[l] * inv_n + eps);
      const float neg_shift_rstd = -shift[l] * rs;
      if (l == 0) {
        mean[r] = pivot + shift[l];
        rstd[r] = rs;
      }
      for (int c = 0; c < kChunks; ++c)
        for (int k = 0; k < kV; ++k) {
          const int i = (c * kLanes + l) * kV + k;
          const float u = fmaf(bf16_to_f32(xr[i]) - pivot, rs, neg_shift_rstd);
          yr[i] = f32_to_bf16(fmaf(u, bf16_to_f32(gamma[i]), bf16_to_f32(beta[i])));
        }
    }
  }
}

// The LayerNorm backward's fused warp path (cuda/layernorm.cu,
// bwd_fused_warp with bwd_row_cached, WARP and ACC, V = 8, 4 chunks a lane;
// bf16, gamma, dgamma and dbeta, not RMSNorm, no zero-centred gamma) and its
// stage two (column_sum), lowered the same way. Per chunk of
// rows_per_chunk rows, each of the block's four warps walks rows w, w + 4,
// ... adding dy * xhat and dy into its own accumulators; per row the lanes'
// sums of dy * g and g * dy * xhat, their two butterflies, then dx. A
// chunk's partials are its warps' accumulators added in warp order; stage
// two sums chunks ty, ty + split, ... of a column in order (split: the
// plan's reduce split), then the split's sums in order.
namespace {
constexpr int kWarpRows = 4;
constexpr int kRowCols = kLanes * kChunks * kV;  // 1024

// Stage two: per column, chunks ty, ty + split, ... summed in order for
// each ty < split, then those sums in order (column_sum's block rows).
void ln_bwd_stage_two(const float *part_g, const float *part_b, uint64_t chunks, uint64_t cols,
                      uint64_t split, uint16_t *dgamma, uint16_t *dbeta) {
  for (uint64_t col = 0; col < cols; ++col) {
    for (int which = 0; which < 2; ++which) {
      const float *part = which == 0 ? part_g : part_b;
      float t = 0.0f;
      for (uint64_t ty = 0; ty < split; ++ty) {
        float s = 0.0f;
        for (uint64_t k = ty; k < chunks; k += split) s += part[k * cols + col];
        t += s;
      }
      (which == 0 ? dgamma : dbeta)[col] = f32_to_bf16(t);
    }
  }
}
}  // namespace

extern "C" void ftn_lockstep_layernorm_bwd_bf16(const uint16_t *dy, const uint16_t *x,
                                                const float *mean, const float *rstd,
                                                const uint16_t *gamma, uint16_t *dx,
                                                uint16_t *dgamma, uint16_t *dbeta, uint64_t rows,
                                                uint64_t cols, uint64_t rows_per_chunk,
                                                uint64_t split) {
  const uint64_t chunks = rows == 0 ? 1 : (rows + rows_per_chunk - 1) / rows_per_chunk;
  std::vector<float> part_g(chunks * cols), part_b(chunks * cols);
  std::vector<float> acc(kWarpRows * 2 * kRowCols);
  const float inv_n = 1.0f / float(cols);
  for (uint64_t chunk = 0; chunk < chunks; ++chunk) {
    const uint64_t r0 = chunk * rows_per_chunk;
    const uint64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    for (float &a : acc) a = 0.0f;
    for (int w = 0; w < kWarpRows; ++w) {
      float *ag = acc.data() + 2 * w * kRowCols, *ab = ag + kRowCols;
      for (uint64_t row = r0 + w; row < r1; row += kWarpRows) {
        const uint16_t *xr = x + row * cols, *gr = dy + row * cols;
        uint16_t *dr = dx + row * cols;
        const float mu = mean[row], rs = rstd[row];
        float s1[kLanes], s2[kLanes];
        for (int l = 0; l < kLanes; ++l) {  // up to the row sums' all-reduce
          for (int c = 0; c < kChunks; ++c)
            for (int k = 0; k < kV; ++k) {
              const int i = (c * kLanes + l) * kV + k;
              const float xv = bf16_to_f32(xr[i]), dv = bf16_to_f32(gr[i]);
              ag[i] += dv * ((xv - mu) * rs);
              ab[i] += dv;
            }
          float a = 0.0f, b = 0.0f;
          for (int c = 0; c < kChunks; ++c)
            for (int k = 0; k < kV; ++k) {
              const int i = (c * kLanes + l) * kV + k;
              const float xv = bf16_to_f32(xr[i]), dv = bf16_to_f32(gr[i]);
              const float g = bf16_to_f32(gamma[i]);
              a = fmaf(dv, g, a);
              b = fmaf(g, dv * ((xv - mu) * rs), b);
            }
          s1[l] = a;
          s2[l] = b;
        }
        ftn_emu_butterfly<FtnSumOp>(s1, kLanes);
        ftn_emu_butterfly<FtnSumOp>(s2, kLanes);
        for (int l = 0; l < kLanes; ++l) {  // to the end: dx
          const float c0 = -rs * (s1[l] * inv_n);
          const float c2 = -(rs * rs) * (s2[l] * inv_n);
          for (int c = 0; c < kChunks; ++c)
            for (int k = 0; k < kV; ++k) {
              const int i = (c * kLanes + l) * kV + k;
              const float xv = bf16_to_f32(xr[i]), dv = bf16_to_f32(gr[i]);
              const float g = bf16_to_f32(gamma[i]);
              dr[i] = f32_to_bf16(fmaf(dv * g, rs, fmaf(xv - mu, c2, c0)));
            }
        }
      }
    }
    for (int col = 0; col < kRowCols; ++col) {  // the chunk's partials
      float g = acc[col], b = acc[kRowCols + col];
      for (int w = 1; w < kWarpRows; ++w) {
        g += acc[2 * w * kRowCols + col];
        b += acc[(2 * w + 1) * kRowCols + col];
      }
      part_g[chunk * cols + col] = g;
      part_b[chunk * cols + col] = b;
    }
  }
  ln_bwd_stage_two(part_g.data(), part_b.data(), chunks, cols, split, dgamma, dbeta);
}

// The backward above again with the lanes as the SIMD dimension (as the
// softmax backward's second lowering): each row widened once into
// [chunk][k][lane] arrays, the accumulators kept in that layout and put
// back in column order when a chunk's partials are written; each lane's
// sums still in the kernel's order, so the outputs are bitwise the same.
extern "C" void ftn_lockstep_simd_layernorm_bwd_bf16(const uint16_t *dy, const uint16_t *x,
                                                     const float *mean, const float *rstd,
                                                     const uint16_t *gamma, uint16_t *dx,
                                                     uint16_t *dgamma, uint16_t *dbeta,
                                                     uint64_t rows, uint64_t cols,
                                                     uint64_t rows_per_chunk, uint64_t split) {
  const uint64_t chunks = rows == 0 ? 1 : (rows + rows_per_chunk - 1) / rows_per_chunk;
  std::vector<float> part_g(chunks * cols), part_b(chunks * cols);
  using Lanes = float[kChunks][kV][kLanes];
  std::vector<float> acc_store(kWarpRows * 2 * kRowCols);
  auto acc = reinterpret_cast<Lanes *>(acc_store.data());  // [warp][gamma, beta]
  alignas(32) Lanes g;
  for (int c = 0; c < kChunks; ++c)
    for (int l = 0; l < kLanes; ++l)
      for (int k = 0; k < kV; ++k) g[c][k][l] = bf16_to_f32(gamma[(c * kLanes + l) * kV + k]);
  const float inv_n = 1.0f / float(cols);
  for (uint64_t chunk = 0; chunk < chunks; ++chunk) {
    const uint64_t r0 = chunk * rows_per_chunk;
    const uint64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    for (float &a : acc_store) a = 0.0f;
    for (int w = 0; w < kWarpRows; ++w) {
      Lanes &ag = acc[2 * w], &ab = acc[2 * w + 1];
      for (uint64_t row = r0 + w; row < r1; row += kWarpRows) {
        const uint16_t *xr = x + row * cols, *gr = dy + row * cols;
        uint16_t *dr = dx + row * cols;
        const float mu = mean[row], rs = rstd[row];
        alignas(32) Lanes xv, dv;
        for (int c = 0; c < kChunks; ++c)
          for (int l = 0; l < kLanes; ++l)
            for (int k = 0; k < kV; ++k) {
              const int i = (c * kLanes + l) * kV + k;
              xv[c][k][l] = bf16_to_f32(xr[i]);
              dv[c][k][l] = bf16_to_f32(gr[i]);
            }
        alignas(32) float s1[kLanes] = {}, s2[kLanes] = {};
        for (int c = 0; c < kChunks; ++c)
          for (int k = 0; k < kV; ++k)
            for (int l = 0; l < kLanes; ++l) {
              const float d = dv[c][k][l], pg = d * ((xv[c][k][l] - mu) * rs);
              ag[c][k][l] += pg;
              ab[c][k][l] += d;
              s1[l] = fmaf(d, g[c][k][l], s1[l]);
              s2[l] = fmaf(g[c][k][l], pg, s2[l]);
            }
        ftn_emu_butterfly<FtnSumOp>(s1, kLanes);
        ftn_emu_butterfly<FtnSumOp>(s2, kLanes);
        alignas(32) float c0[kLanes], c2[kLanes];
        for (int l = 0; l < kLanes; ++l) {
          c0[l] = -rs * (s1[l] * inv_n);
          c2[l] = -(rs * rs) * (s2[l] * inv_n);
        }
        for (int c = 0; c < kChunks; ++c)
          for (int k = 0; k < kV; ++k)
            for (int l = 0; l < kLanes; ++l)
              xv[c][k][l] =
                  fmaf(dv[c][k][l] * g[c][k][l], rs, fmaf(xv[c][k][l] - mu, c2[l], c0[l]));
        for (int c = 0; c < kChunks; ++c)
          for (int l = 0; l < kLanes; ++l)
            for (int k = 0; k < kV; ++k) dr[(c * kLanes + l) * kV + k] = f32_to_bf16(xv[c][k][l]);
      }
    }
    for (int c = 0; c < kChunks; ++c)  // the chunk's partials, in column order
      for (int l = 0; l < kLanes; ++l)
        for (int k = 0; k < kV; ++k) {
          float gs = acc[0][c][k][l], bs = acc[1][c][k][l];
          for (int w = 1; w < kWarpRows; ++w) {
            gs += acc[2 * w][c][k][l];
            bs += acc[2 * w + 1][c][k][l];
          }
          const uint64_t col = (c * kLanes + l) * kV + k;
          part_g[chunk * cols + col] = gs;
          part_b[chunk * cols + col] = bs;
        }
  }
  ln_bwd_stage_two(part_g.data(), part_b.data(), chunks, cols, split, dgamma, dbeta);
}
