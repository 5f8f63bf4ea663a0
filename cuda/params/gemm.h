/* Parameters of cuda/gemm.cu (included by ferrotron_kernels.h). */
#ifndef FTN_KERNELS_GEMM_H
#define FTN_KERNELS_GEMM_H

#include <stdint.h>

/* Epilogues (the `epilogue` field), applied to v = alpha*op(A)op(B) [+ beta*C]: */
#define FTN_GEMM_EPI_NONE 0u      /* D = v */
#define FTN_GEMM_EPI_BIAS 1u      /* D = v + bias[n] */
#define FTN_GEMM_EPI_BIAS_GELU 2u /* pre = v + bias[n] (bias may be NULL); aux = pre
                                     if aux != NULL; D = gelu(pre) */
#define FTN_GEMM_EPI_DGELU 3u     /* D = v * gelu'(aux[m, n]) (aux: saved pre-activation) */

/* Batched D[b] = epilogue(alpha * op(A[b]) * op(B[b]) + beta * C[b]), row-major.
 * op(A) is [m, k]: A is stored [m, k] (trans_a = 0) or [k, m] (trans_a = 1);
 * op(B) is [k, n]: B is stored [k, n] (trans_b = 0) or [n, k] (trans_b = 1).
 * A, B: fp16 or bf16 (kernel's input type); C, D, aux: the output type; bias:
 * the input type. fp32 accumulation. beta == 0 never reads C; C may equal D.
 * Leading dimensions and batch strides are in elements.
 * Kernels ftn_gemm_{128x128,64x64}_{f16,bf16}_{out}; grid.x = m-tiles * n-tiles,
 * grid.z = min(batch, 65535) (blocks loop over the rest of the batch). */
typedef struct FtnGemmParams {
  void *d;
  const void *a;
  const void *b;
  const void *c;    /* NULL when beta == 0 */
  const void *bias; /* [n] or NULL */
  void *aux;        /* pre-activation [m, n] per batch (see epilogues) or NULL */
  int64_t m, n, k, batch;
  int64_t lda, ldb, ldc, ldd, ld_aux;
  int64_t stride_a, stride_b, stride_c, stride_d, stride_aux;
  float alpha, beta;
  uint32_t trans_a, trans_b;
  uint32_t epilogue; /* FTN_GEMM_EPI_* */
  uint32_t gelu;     /* FTN_GELU_* (bias_gelu.h) */
  uint32_t aligned;  /* 1: A and B (addresses, ld, strides) allow 16-byte cp.async */
} FtnGemmParams;

/* partial[k, c] = sum over rows [k*rows_per_chunk, (k+1)*rows_per_chunk) of
 * x[r*ld + c], fp32, in row order: stage one of a deterministic column sum
 * (the bias gradient); ftn_column_sum_partials_* is stage two.
 * Kernels ftn_gemm_column_partials_{f32,f16,bf16}; grid (column blocks, chunks). */
typedef struct FtnColumnPartialsParams {
  float *partial; /* [chunks, cols] */
  const void *x;  /* [rows, ld] */
  int64_t rows, cols, ld, rows_per_chunk;
} FtnColumnPartialsParams;

#endif /* FTN_KERNELS_GEMM_H */
