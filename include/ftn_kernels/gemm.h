/* Parameters of cuda/gemm.cu (included by ferrotron_kernels.h). */
#ifndef FTN_KERNELS_GEMM_H
#define FTN_KERNELS_GEMM_H

#include <stdint.h>

#endif /* FTN_KERNELS_GEMM_H */
