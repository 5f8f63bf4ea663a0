/* Adversarial C ABI suite: fixtures and the fork-per-case runner shared by
 * the generated cases (ffi/tests/adversarial.rs writes cases.c from
 * include/ferrotron.h). See docs/testing.md, "Adversarial C ABI suite". */
#ifndef FTN_ADV_HARNESS_H
#define FTN_ADV_HARNESS_H

#include "ferrotron.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* One fixture per opaque handle type of the header (the generator names
 * them FX_<handle type>; a new handle type without a fixture here does not
 * compile). */
enum {
  FX_ftnContext_t,
  FX_ftnStream_t,
  FX_ftnEvent_t,
  FX_ftnComm_t,
  FX_ftnGradScaler_t,
  FX_ftnColumnParallelLinear_t,
  FX_ftnRowParallelLinear_t,
  FX_ftnTpMlp_t,
  FX_ftnTpAttention_t,
  FX_ftnCrossEntropySaved_t,
  FX_ftnAdam_t,
  FX_ftnParamRegistry_t,
  FX_ftnDdp_t,
  FX_ftnDistOpt_t,
  FX_COUNT
};

/* How a case changes the baseline call. */
enum {
  M_BASELINE = 0, /* every argument valid (as far as the generator can tell) */
  M_NULL = 1,     /* argument `param` NULL */
  M_ZERO = 2,     /* every argument NULL / 0 */
  M_SCALAR = 3,   /* integer argument `param` = value */
  M_FIELD = 4,    /* bytes [off, off+width) of struct argument `param` = value, then `tail` bytes 0xAB after the struct */
  M_HANDLE = 5    /* handle argument `param` = a stale (1), wrong-kind (2) or never-issued (3) handle */
};

typedef struct {
  int fn;       /* index of the export in the generated dispatcher */
  int kind;     /* M_* */
  int param;    /* argument index */
  int width;    /* M_FIELD: 1, 2, 4 or 8 bytes */
  size_t off;   /* M_FIELD: byte offset in the struct */
  size_t tail;  /* M_FIELD: garbage bytes written after sizeof(struct) */
  uint64_t value;
} adv_case;

/* A live fixture handle of `kind` (created on first use in this child). */
void *fx(int kind);
/* A bad handle for an argument of `kind`: 1 stale (created and destroyed),
 * 2 a live handle of another kind, 3 a value never issued as a handle. */
void *fx_bad(int kind, uint64_t how);
/* Fresh zeroed host memory (device memory on the emulator), 64 KiB, 256-byte aligned. */
void *adv_buf(void);
/* 64 KiB from ftn_malloc on the fixture context. */
void *adv_malloc(void);
/* A valid DLManagedTensorVersioned on the CPU (2 x 2 float32, strides {2, 1}). */
void *adv_dlpack(void);
/* Marks every parameter of the DDP fixture ready on the stream fixture
 * (a whole backward), then with `finish` synchronises the gradients:
 * the state ftn_ddp_finish_grad_sync / ftn_dist_opt_step expect. */
void adv_ddp_grads_ready(int finish);
/* Applies an M_FIELD mutation to a struct at `base` of `size` bytes. */
void adv_field(void *base, size_t size, const adv_case *c);

/* Generated (cases.c). */
extern const adv_case ADV_CASES[];
extern const size_t ADV_NCASES;
ftnResult_t adv_dispatch(const adv_case *c);

#endif
