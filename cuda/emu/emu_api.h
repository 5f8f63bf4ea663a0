/* ferrotron CUDA-on-CPU emulator: the C entry points the Rust backend calls.
 *
 * A kernel declared with FTN_KERNEL(name, Params, p) in a .cu file compiles,
 * under the emulator, to two extern "C" symbols:
 *   void   ftn_emu_entry_<name>(const void *params);   -- runs ONE thread
 *   size_t ftn_emu_params_size_<name>(void);           -- sizeof(Params)
 * ftn_emu_launch runs a whole grid of such threads and reports misuse as an
 * error string that names the kernel; it never aborts the process. */
#ifndef FTN_EMU_API_H
#define FTN_EMU_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Runs the body of one kernel thread; threadIdx/blockIdx come from the
 * emulator's per-fiber state. */
typedef void (*ftn_emu_entry_fn)(const void *params);

typedef struct ftn_emu_launch_desc {
  const char *kernel_name;  /* for error messages */
  ftn_emu_entry_fn entry;
  const void *params;       /* pointer to the kernel's parameter struct */
  uint32_t grid[3];         /* gridDim.x, .y, .z  (each >= 1) */
  uint32_t block[3];        /* blockDim.x, .y, .z (each >= 1) */
  size_t dynamic_smem_bytes;
  uint32_t num_workers;     /* OS threads to spread blocks over; 0 = default
                               (env FTN_EMU_THREADS, else hardware threads) */
  uint32_t cluster_x;       /* thread block cluster size along x (0 or 1: none;
                               2..8, dividing grid[0]: its blocks run at once,
                               one OS thread each; cuda/emu/README.md) */
} ftn_emu_launch_desc;

/* Runs the grid to completion. Returns 0 on success; otherwise non-zero and
 * writes a NUL-terminated message naming the kernel into err[0..err_len). */
int ftn_emu_launch(const ftn_emu_launch_desc *desc, char *err, size_t err_len);

/* Strict mode (cuda/emu/README.md): the shared-memory race check (when the
 * kernels were compiled with it), deferred cp.async, a perturbed thread
 * order. Default from FTN_EMU_STRICT / FTN_EMU_SCHEDULE; these change it for
 * later launches of the process. */
int ftn_emu_set_strict(int on);        /* returns the previous setting */
int ftn_emu_racecheck_compiled(void);  /* 1 if kernels carry the race check */
/* "forward", "reverse", "random" (fresh seed) or "random:SEED"; returns 0,
 * or 1 (and changes nothing) for any other text. */
int ftn_emu_set_schedule(const char *spec);
/* Writes the schedule's name (as ftn_emu_set_schedule takes it) into
 * buf[0..len) and returns its length. */
size_t ftn_emu_schedule(char *buf, size_t len);

/* Device limits the emulator enforces (those of an sm_90 part). */
#define FTN_EMU_MAX_THREADS_PER_BLOCK 1024u
#define FTN_EMU_MAX_BLOCK_X 1024u
#define FTN_EMU_MAX_BLOCK_Y 1024u
#define FTN_EMU_MAX_BLOCK_Z 64u
#define FTN_EMU_MAX_GRID_X 2147483647u
#define FTN_EMU_MAX_GRID_YZ 65535u
#define FTN_EMU_MAX_STATIC_SMEM 49152u      /* 48 KiB of __shared__ */
#define FTN_EMU_MAX_SMEM_PER_BLOCK 232448u  /* 227 KiB, static + dynamic */
#define FTN_EMU_MAX_CLUSTER 8u              /* portable cluster size */

/* TMA descriptors: the emulator's cuTensorMapEncodeTiled (same arguments,
 * checks and enum values as the CUDA driver's; cuda/emu/README.md, "Hopper
 * asynchronous instructions"). Writes a 128-byte, 64-byte-aligned opaque
 * map that the emulator's cp.async.bulk.tensor reads. Returns 0
 * (CUDA_SUCCESS) or 1 (CUDA_ERROR_INVALID_VALUE) with a message naming the
 * argument in err[0..err_len) (may be NULL). */
#ifdef __cplusplus
#define FTN_EMU_ALIGN64 alignas(64)
#else
#define FTN_EMU_ALIGN64 _Alignas(64)
#endif
typedef struct ftn_emu_tensor_map {
  FTN_EMU_ALIGN64 uint64_t opaque[16];
} ftn_emu_tensor_map;
enum {
  FTN_TMAP_UINT8 = 0, FTN_TMAP_UINT16 = 1, FTN_TMAP_UINT32 = 2, FTN_TMAP_INT32 = 3,
  FTN_TMAP_UINT64 = 4, FTN_TMAP_INT64 = 5, FTN_TMAP_FLOAT16 = 6, FTN_TMAP_FLOAT32 = 7,
  FTN_TMAP_FLOAT64 = 8, FTN_TMAP_BFLOAT16 = 9, FTN_TMAP_FLOAT32_FTZ = 10,
  FTN_TMAP_TFLOAT32 = 11, FTN_TMAP_TFLOAT32_FTZ = 12
};
enum { FTN_TMAP_INTERLEAVE_NONE = 0, FTN_TMAP_INTERLEAVE_16B = 1, FTN_TMAP_INTERLEAVE_32B = 2 };
enum {
  FTN_TMAP_SWIZZLE_NONE = 0, FTN_TMAP_SWIZZLE_32B = 1, FTN_TMAP_SWIZZLE_64B = 2,
  FTN_TMAP_SWIZZLE_128B = 3
};
enum { FTN_TMAP_OOB_FILL_NONE = 0, FTN_TMAP_OOB_FILL_NAN_REQUEST_ZERO_FMA = 1 };
int ftn_emu_tensor_map_encode_tiled(ftn_emu_tensor_map *map, int dtype, uint32_t rank,
                                    void *global_address, const uint64_t *global_dim,
                                    const uint64_t *global_strides, const uint32_t *box_dim,
                                    const uint32_t *element_strides, int interleave,
                                    int swizzle, int l2_promotion, int oob_fill, char *err,
                                    size_t err_len);

/* Bit-exact scalar conversions (round to nearest even, as the CUDA headers),
 * exported so tests can compare them with the `half` crate. */
uint16_t ftn_emu_f32_to_f16_bits(float x);
float ftn_emu_f16_bits_to_f32(uint16_t h);
uint16_t ftn_emu_f32_to_bf16_bits(float x);
float ftn_emu_bf16_bits_to_f32(uint16_t b);

#ifdef __cplusplus
}
#endif

#endif /* FTN_EMU_API_H */
