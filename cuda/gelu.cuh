// GeLU and its derivative in fp32: Megatron's tanh approximation (with its
// constants) and the exact erf form (docs/semantics.md, "Bias + GeLU").
//
// Evaluated without cancellation: with u = 0.79788456*x*(1 + 0.044715*x^2),
//   0.5*(1 + tanh(u)) = sigmoid(2u)  and  1 - tanh(u)^2 = 4*sigmoid(2u)*sigmoid(-2u),
// and 1 + erf(z) = erfc(-z). The textbook forms compute 1 + tanh(u) and
// 1 + erf(z) for very negative x as a difference of nearly equal numbers and
// lose every significant digit in fp32 (x = -5: relative error ~1e-1); these
// are the same functions, accurate to a few ulp everywhere.
#ifndef FTN_GELU_CUH
#define FTN_GELU_CUH

#include "ftn_kernel.cuh"

#define FTN_GELU_K0 0.79788456f     // sqrt(2/pi), as Megatron writes it
#define FTN_GELU_K1 0.044715f
#define FTN_GELU_K2 0.1070322243f   // 3 * 0.044715 * sqrt(2/pi)
#define FTN_INV_SQRT2 0.70710678118654752f
#define FTN_INV_SQRT_2PI 0.39894228040143268f

// x^2 is capped at 1e12 where it multiplies a factor that is exactly 0 for
// |x| > 1e6: an uncapped x^2 = inf (|x| > 1.8e19, reachable in bf16) would
// turn 0 * inf into NaN.
FTN_DEVICE float ftn_gelu_x2(float x) { return fminf(x * x, 1e12f); }

template <unsigned KIND> FTN_DEVICE float ftn_gelu(float x);
template <unsigned KIND> FTN_DEVICE float ftn_gelu_grad(float x);

template <> FTN_DEVICE float ftn_gelu<FTN_GELU_TANH>(float x) {
  const float u = FTN_GELU_K0 * x * (1.0f + FTN_GELU_K1 * ftn_gelu_x2(x));
  return x / (1.0f + expf(-2.0f * u));  // x * sigmoid(2u)
}

// 0.5*x*(1 - t^2)*(K0 + K2*x^2) + 0.5*(1 + t), t = tanh(u)
template <> FTN_DEVICE float ftn_gelu_grad<FTN_GELU_TANH>(float x) {
  const float x2 = ftn_gelu_x2(x);
  const float u = FTN_GELU_K0 * x * (1.0f + FTN_GELU_K1 * x2);
  const float s = 1.0f / (1.0f + expf(-2.0f * u));  // sigmoid(2u) = (1 + t)/2
  const float sn = 1.0f / (1.0f + expf(2.0f * u));  // sigmoid(-2u) = (1 - t)/2
  return 2.0f * x * s * sn * (FTN_GELU_K0 + FTN_GELU_K2 * x2) + s;
}

// The tanh form for the bandwidth kernel (bias_gelu.cu) on the hardware
// exponential and reciprocal (__expf: ex2.approx after a multiply by
// log2(e); __fdividef: rcp.approx and a multiply): relative error at most
// ~6e-6 (the rounding of the argument, |2u| * 2^-24 * ln 2 with |2u| < 88,
// plus a few ulp; results below ~1e-36 come out as 0), ~10 SASS
// instructions instead of ~35 for expf and an IEEE division. The
// derivative shares one exponential: sigmoid(2u) = 1/(1+e) and
// sigmoid(-2u) = e/(1+e), e = exp(-2u). (The GEMM epilogues keep the
// accurate forms above: the fast ones cost the 64x64 tiles registers and
// spills on sm_90a.)
//
// x * sigmoid(2u). e = inf (x < ~-10): rcp(inf) = 0, so x * 0 = -0.
FTN_DEVICE float ftn_gelu_tanh_fast(float x) {
  const float u = FTN_GELU_K0 * x * (1.0f + FTN_GELU_K1 * ftn_gelu_x2(x));
  return __fdividef(x, 1.0f + __expf(-2.0f * u));
}

// e = inf: s = 0 and e * s = NaN, which fminf turns into the limit
// sigmoid(-2u) = 1.
FTN_DEVICE float ftn_gelu_tanh_grad_fast(float x) {
  const float x2 = ftn_gelu_x2(x);
  const float u = FTN_GELU_K0 * x * (1.0f + FTN_GELU_K1 * x2);
  const float e = __expf(-2.0f * u);
  const float s = __fdividef(1.0f, 1.0f + e);  // sigmoid(2u) = (1 + t)/2
  const float sn = fminf(e * s, 1.0f);         // sigmoid(-2u) = (1 - t)/2
  return 2.0f * x * s * sn * (FTN_GELU_K0 + FTN_GELU_K2 * x2) + s;
}

template <> FTN_DEVICE float ftn_gelu<FTN_GELU_ERF>(float x) {
  return 0.5f * x * erfcf(-x * FTN_INV_SQRT2);
}

// d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
template <> FTN_DEVICE float ftn_gelu_grad<FTN_GELU_ERF>(float x) {
  const float cdf = 0.5f * erfcf(-x * FTN_INV_SQRT2);
  const float pdf = FTN_INV_SQRT_2PI * expf(-0.5f * ftn_gelu_x2(x));
  return cdf + x * pdf;
}

// KIND's GeLU as bias_gelu.cu evaluates it: the fast tanh form, the
// accurate erf form.
template <unsigned KIND> FTN_DEVICE float ftn_gelu_bw(float x) {
  if constexpr (KIND == FTN_GELU_TANH) {
    return ftn_gelu_tanh_fast(x);
  } else {
    return ftn_gelu<KIND>(x);
  }
}

template <unsigned KIND> FTN_DEVICE float ftn_gelu_grad_bw(float x) {
  if constexpr (KIND == FTN_GELU_TANH) {
    return ftn_gelu_tanh_grad_fast(x);
  } else {
    return ftn_gelu_grad<KIND>(x);
  }
}

#endif  // FTN_GELU_CUH
