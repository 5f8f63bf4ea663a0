/* Parameters of cuda/softmax.cu (included by ferrotron_kernels.h). */
#ifndef FTN_KERNELS_SOFTMAX_H
#define FTN_KERNELS_SOFTMAX_H

#include <stdint.h>

#endif /* FTN_KERNELS_SOFTMAX_H */
