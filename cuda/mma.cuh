// Tensor-core building blocks (sm_80+): mma.sync m16n8k16 with fp32
// accumulation, ldmatrix, and cp.async with commit/wait groups.
//
// Under nvcc these are inline PTX. Under the CPU emulator, mma and ldmatrix
// are warp collectives (cuda/emu/mma_emu.cpp) that follow the PTX ISA
// fragment layouts exactly, so a kernel that feeds them wrong fragments gets
// wrong answers on the CPU too; cp.async copies at once, or in the
// emulator's strict mode lands at the wait_group that covers it (its
// destination reads as poison until then).
//
//   ftn_mma_m16n8k16<T>(d[4], a[4], b[2], c[4])  T = __half or __nv_bfloat16;
//       d = a(16x16, row) * b(16x8, col) + c, fp32; d may alias c
//   ftn_mma_tile_m16n8k16<T>(acc[MI][NI][4], a[MI][4], b[NI][2])  a warp's
//       tile: acc[i][j] += a[i] * b[j] for all i, j (i outer), the same
//       mma.sync ops as that loop; on the emulator, one recorded op in a batch
//   ftn_ldmatrix_x{1,2,4}[_trans](r, row)        row: this lane's row address
//       in shared memory (16-byte aligned; lanes 8i..8i+7 -> matrix i)
//   ftn_ldmatrix_x4_seq<N, TRANS>(r, row0, step)  N x4 loads: the i-th from
//       row0 + i * step (elements of row0's type) into r[4i .. 4i + 4); on
//       the emulator one recorded op in a batch
//   ftn_cp_async_16(smem, gmem, src_bytes)       copies src_bytes in [0, 16]
//       and zero-fills the rest of the 16 bytes; both addresses 16-aligned
//   ftn_cp_async_commit(), ftn_cp_async_wait<N>() (at most N groups pending)
//   ftn_mma_batch_begin(), ftn_mma_batch_end()  no-ops on a GPU; on the
//       emulator, mma/ldmatrix between them are recorded and run for the
//       whole warp at the next __syncthreads / full-warp op / batch end
//       (one rendezvous instead of one per op); their results read as NaN
//       until then, so a kernel must not read them inside the batch before
//       such a point, and the variables they write must stay in scope until
//       it (cuda/emu/README.md, "mma batches")
#ifndef FTN_MMA_CUH
#define FTN_MMA_CUH

#include "ftn_kernel.cuh"

#if defined(__CUDACC__)

FTN_DEVICE uint32_t ftn_smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <typename T> struct FtnMmaType;
template <> struct FtnMmaType<__half> {
  FTN_DEVICE static void mma(float *d, const uint32_t *a, const uint32_t *b, const float *c) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
};
template <> struct FtnMmaType<__nv_bfloat16> {
  FTN_DEVICE static void mma(float *d, const uint32_t *a, const uint32_t *b, const float *c) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
};
template <typename T>
FTN_DEVICE void ftn_mma_m16n8k16(float *d, const uint32_t *a, const uint32_t *b, const float *c) {
  FtnMmaType<T>::mma(d, a, b, c);
}

template <typename T, int MI, int NI>
FTN_DEVICE void ftn_mma_tile_m16n8k16(float (&acc)[MI][NI][4], const uint32_t (&a)[MI][4],
                                      const uint32_t (&b)[NI][2]) {
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) FtnMmaType<T>::mma(acc[i][j], a[i], b[j], acc[i][j]);
}

FTN_DEVICE void ftn_ldmatrix_x4(uint32_t *r, const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(ftn_smem_addr(row)));
}
FTN_DEVICE void ftn_ldmatrix_x4_trans(uint32_t *r, const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(ftn_smem_addr(row)));
}
FTN_DEVICE void ftn_ldmatrix_x2(uint32_t *r, const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(ftn_smem_addr(row)));
}
FTN_DEVICE void ftn_ldmatrix_x2_trans(uint32_t *r, const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(ftn_smem_addr(row)));
}
FTN_DEVICE void ftn_ldmatrix_x1(uint32_t *r, const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(ftn_smem_addr(row)));
}
FTN_DEVICE void ftn_ldmatrix_x1_trans(uint32_t *r, const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(ftn_smem_addr(row)));
}

template <int N, bool TRANS, typename T>
FTN_DEVICE void ftn_ldmatrix_x4_seq(uint32_t *r, const T *row0, ptrdiff_t step) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (TRANS)
      ftn_ldmatrix_x4_trans(r + 4 * i, row0 + i * step);
    else
      ftn_ldmatrix_x4(r + 4 * i, row0 + i * step);
  }
}

FTN_DEVICE void ftn_cp_async_16(void *smem, const void *gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ftn_smem_addr(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
}
FTN_DEVICE void ftn_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
FTN_DEVICE void ftn_mma_batch_begin() {}
FTN_DEVICE void ftn_mma_batch_end() {}
template <int N>
FTN_DEVICE void ftn_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#else  // the CPU emulator

template <typename T> struct FtnMmaIsBf16;
template <> struct FtnMmaIsBf16<__half> { static constexpr bool value = false; };
template <> struct FtnMmaIsBf16<__nv_bfloat16> { static constexpr bool value = true; };

template <typename T>
FTN_DEVICE void ftn_mma_m16n8k16(float *d, const uint32_t *a, const uint32_t *b, const float *c
                                 FTN_CALLER_LOC) {
  ::ftn_emu::mma_m16n8k16(FtnMmaIsBf16<T>::value, d, a, b, c, ftn_loc.file_name(),
                          ftn_loc.line());
}
template <typename T, int MI, int NI>
FTN_DEVICE void ftn_mma_tile_m16n8k16(float (&acc)[MI][NI][4], const uint32_t (&a)[MI][4],
                                      const uint32_t (&b)[NI][2] FTN_CALLER_LOC) {
  ::ftn_emu::mma_tile_m16n8k16(FtnMmaIsBf16<T>::value, MI, NI, &acc[0][0][0], &a[0][0], &b[0][0],
                               ftn_loc.file_name(), ftn_loc.line());
}
template <int N, bool TRANS, typename T>
FTN_DEVICE void ftn_ldmatrix_x4_seq(uint32_t *r, const T *row0, ptrdiff_t step FTN_CALLER_LOC) {
  ::ftn_emu::ldmatrix_x4_seq(N, TRANS, r, row0, step * ptrdiff_t(sizeof(T)), ftn_loc.file_name(),
                             ftn_loc.line());
}
FTN_DEVICE void ftn_ldmatrix_x4(uint32_t *r, const void *row FTN_CALLER_LOC) {
  ::ftn_emu::ldmatrix(4, false, r, row, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_ldmatrix_x4_trans(uint32_t *r, const void *row FTN_CALLER_LOC) {
  ::ftn_emu::ldmatrix(4, true, r, row, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_ldmatrix_x2(uint32_t *r, const void *row FTN_CALLER_LOC) {
  ::ftn_emu::ldmatrix(2, false, r, row, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_ldmatrix_x2_trans(uint32_t *r, const void *row FTN_CALLER_LOC) {
  ::ftn_emu::ldmatrix(2, true, r, row, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_ldmatrix_x1(uint32_t *r, const void *row FTN_CALLER_LOC) {
  ::ftn_emu::ldmatrix(1, false, r, row, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_ldmatrix_x1_trans(uint32_t *r, const void *row FTN_CALLER_LOC) {
  ::ftn_emu::ldmatrix(1, true, r, row, ftn_loc.file_name(), ftn_loc.line());
}

// Checks (cuda/emu/runtime.cpp): smem 16-aligned and in shared memory; gmem
// (when src_bytes > 0) 16-aligned and not in shared memory.
FTN_DEVICE void ftn_cp_async_16(void *smem, const void *gmem, int src_bytes FTN_CALLER_LOC) {
  ::ftn_emu::cp_async(smem, gmem, 16, src_bytes, ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_cp_async_commit() { ::ftn_emu::cp_async_commit(); }
FTN_DEVICE void ftn_mma_batch_begin(std::source_location ftn_loc = std::source_location::current()) {
  ::ftn_emu::mma_batch_begin(ftn_loc.file_name(), ftn_loc.line());
}
FTN_DEVICE void ftn_mma_batch_end(std::source_location ftn_loc = std::source_location::current()) {
  ::ftn_emu::mma_batch_end(ftn_loc.file_name(), ftn_loc.line());
}
template <int N>
FTN_DEVICE void ftn_cp_async_wait(std::source_location ftn_loc = std::source_location::current()) {
  ::ftn_emu::cp_async_wait(N, ftn_loc.file_name(), ftn_loc.line());
}

#endif

#endif  // FTN_MMA_CUH
