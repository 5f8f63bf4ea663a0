/* ferrotron kernel parameter structs: the kernel ABI (docs/architecture.md).
 *
 * Every kernel takes exactly one of these structs by value. The same header is
 * compiled by nvcc, by the host C++ compiler for the CPU emulator, and turned
 * into Rust by bindgen (src/kernel_params.rs, committed and drift-checked by
 * `cargo run -p xtask -- bindgen --check`).
 *
 * Rules: plain C, fixed-width fields, sizes and indices 64-bit, raw device
 * addresses as pointers. The typed Rust layer validates every shape, length
 * and alignment before it fills a struct; kernels assume valid input.
 *
 * These headers live beside the kernels (cuda/params/, one per kernel file,
 * reached as "params/ferrotron_kernels.h" under -I cuda); include/ holds only
 * the public C header ferrotron.h. */
#ifndef FERROTRON_KERNELS_H
#define FERROTRON_KERNELS_H

#include <stdint.h>

#include "bias_gelu.h"
#include "softmax.h"
#include "layernorm.h"
#include "multi_tensor.h"
#include "adam.h"
#include "gemm.h"
#include "gemm_sm90.h"
#include "copy.h"
#include "vocab_parallel.h"
#include "dropout.h"

#endif /* FERROTRON_KERNELS_H */
