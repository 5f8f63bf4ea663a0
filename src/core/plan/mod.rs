//! Launch plans: grid, block and variant for each op, computed from shapes and
//! alignment only (never from the device), so both backends run the same plan
//! and results are reproducible across machines.

pub mod bias_gelu;
pub mod copy;
pub mod gemm;
pub mod layernorm;
pub mod multi_tensor;
pub mod softmax;
pub mod vocab_parallel;

/// Threads per block of the elementwise kernels.
pub const ELEMENTWISE_THREADS: u32 = 256;
/// Upper bound on the blocks of a grid-stride launch.
pub const MAX_GRID_STRIDE_BLOCKS: u64 = 1 << 16;

/// `ceil(a / b)` for `b > 0`.
pub const fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// Elements moved by one 128-bit access, or 1 when the data is not aligned
/// for it (the scalar path).
pub const fn vector_width(elem_size: usize, aligned16: bool) -> u32 {
    if aligned16 && elem_size > 0 && elem_size <= 16 && 16 % elem_size == 0 {
        (16 / elem_size) as u32
    } else {
        1
    }
}

/// Splits `rows` into chunks of at least `min_rows` rows, about `target`
/// chunks in all: `(rows_per_chunk, chunks)`. Depends on `rows` only, so the
/// per-chunk partial sums of a deterministic two-stage reduction (bias and
/// norm-parameter gradients) add up in the same order for a given shape.
pub const fn row_chunks(rows: u64, min_rows: u64, target: u64) -> (u64, u64) {
    let mut per = div_ceil(rows, target);
    if per < min_rows {
        per = min_rows;
    }
    let chunks = div_ceil(rows, per);
    (per, if chunks == 0 { 1 } else { chunks })
}
