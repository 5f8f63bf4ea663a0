/* Parameters of cuda/copy.cu (included by ferrotron_kernels.h). */
#ifndef FTN_KERNELS_COPY_H
#define FTN_KERNELS_COPY_H

#include <stdint.h>

/* dst[r * dst_pitch + b] = src[r * src_pitch + b] for r < rows, b < row_bytes
 * (all in bytes). Kernel ftn_copy_2d_bytes; `vec` = 16 when every pointer,
 * pitch and row_bytes is a multiple of 16 (128-bit path), else 1. */
typedef struct FtnCopy2dParams {
  void *dst;
  const void *src;
  int64_t rows;
  int64_t row_bytes;
  int64_t dst_pitch;
  int64_t src_pitch;
  uint32_t vec;
  uint32_t reserved;
} FtnCopy2dParams;

#endif /* FTN_KERNELS_COPY_H */
