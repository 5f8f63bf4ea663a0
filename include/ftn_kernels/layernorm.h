/* Parameters of cuda/layernorm.cu (included by ferrotron_kernels.h). */
#ifndef FTN_KERNELS_LAYERNORM_H
#define FTN_KERNELS_LAYERNORM_H

#include <stdint.h>

#endif /* FTN_KERNELS_LAYERNORM_H */
