/* Parameters of cuda/multi_tensor.cu (included by ferrotron_kernels.h). */
#ifndef FTN_KERNELS_MULTI_TENSOR_H
#define FTN_KERNELS_MULTI_TENSOR_H

#include <stdint.h>

#endif /* FTN_KERNELS_MULTI_TENSOR_H */
