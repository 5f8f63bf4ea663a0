// Strided 2-D copy of bytes: the data movement of the tensor-parallel
// mappings (split / gather along the last dimension) and of any sub-matrix
// copy. A grid-stride loop over rows x row_bytes in 16-byte units when every
// pointer, pitch and row length is 16-byte aligned, else byte by byte.
// Floor: reads and writes rows*row_bytes bytes once; no arithmetic.
#include "ftn_kernel.cuh"

template <typename U>
FTN_DEVICE void copy_2d(const FtnCopy2dParams &p) {
  const int64_t units_per_row = p.row_bytes / (int64_t)sizeof(U);
  const int64_t total = p.rows * units_per_row;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / units_per_row;
    const int64_t u = i - r * units_per_row;
    const U *src = reinterpret_cast<const U *>(static_cast<const unsigned char *>(p.src) + r * p.src_pitch);
    U *dst = reinterpret_cast<U *>(static_cast<unsigned char *>(p.dst) + r * p.dst_pitch);
    if constexpr (sizeof(U) > 1) {  // a GPU faults on a misaligned vector access
      FTN_ASSERT_ALIGNED(&src[u], sizeof(U));
      FTN_ASSERT_ALIGNED(&dst[u], sizeof(U));
    }
    dst[u] = src[u];
  }
}

FTN_KERNEL_BOUNDED(ftn_copy_2d_bytes, FtnCopy2dParams, p, 256) {
  if (p.vec == 16) {
    copy_2d<uint4>(p);
  } else {
    FTN_ASSERT(p.vec == 1);
    copy_2d<unsigned char>(p);
  }
}
