// The GEMM epilogue of one output element, shared by cuda/gemm.cu (mma.sync)
// and cuda/gemm_sm90.cu (wgmma): from the fp32 accumulator of D[row, col]
// (this batch entry's D, C, aux; bias is [n]) it forms v = alpha*acc
// (+ beta*C), applies the epilogue (gemm.h: + bias, GeLU saving the
// pre-activation, or * GeLU'(saved pre-activation)) and stores D once.
#ifndef FTN_GEMM_EPILOGUE_CUH
#define FTN_GEMM_EPILOGUE_CUH

#include "ftn_dtype.cuh"
#include "gelu.cuh"

template <typename T, typename O>
FTN_DEVICE void gemm_store(const FtnGemmParams &p, float acc, O *D, const O *C, O *aux,
                           const T *bias, int64_t row, int64_t col) {
  float v = p.alpha * acc;
  if (p.beta != 0.0f) v += p.beta * ftn_to_float(C[row * p.ldc + col]);
  if (p.epilogue == FTN_GEMM_EPI_DGELU) {
    const float x = ftn_to_float(aux[row * p.ld_aux + col]);
    v *= p.gelu == FTN_GELU_ERF ? ftn_gelu_grad<FTN_GELU_ERF>(x) : ftn_gelu_grad<FTN_GELU_TANH>(x);
  } else if (p.epilogue == FTN_GEMM_EPI_BIAS || p.epilogue == FTN_GEMM_EPI_BIAS_GELU) {
    if (bias != nullptr) v += ftn_to_float(bias[col]);
    if (p.epilogue == FTN_GEMM_EPI_BIAS_GELU) {
      if (aux != nullptr) aux[row * p.ld_aux + col] = ftn_from_float<O>(v);
      v = p.gelu == FTN_GELU_ERF ? ftn_gelu<FTN_GELU_ERF>(v) : ftn_gelu<FTN_GELU_TANH>(v);
    }
  }
  D[row * p.ldd + col] = ftn_from_float<O>(v);
}

#endif  // FTN_GEMM_EPILOGUE_CUH
