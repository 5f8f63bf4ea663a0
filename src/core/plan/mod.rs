//! Launch plans: grid, block and variant for each op, computed from shapes and
//! alignment only (never from the device), so both backends run the same plan
//! and results are reproducible across machines.

use core::sync::atomic::{AtomicU64, Ordering};

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

/// The largest grids the plans ask for. [`GridCaps::REAL`] is what every
/// launch uses; [`set_grid_caps_for_tests`] lowers the caps so that the
/// paths only huge shapes reach on a GPU — grid-stride loops wrapping,
/// LayerNorm rows spilling into grid y, the GEMM's batch loop past grid z —
/// run with small inputs on the emulator (`tests/large_shape_paths.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridCaps {
    /// Blocks of a grid-stride launch (elementwise, softmax, LayerNorm warp
    /// path, multi-tensor, copy, vocab-parallel).
    pub grid_stride_blocks: u64,
    /// Grid x of LayerNorm's block-per-row launches (rows spill into y).
    pub row_grid_x: u64,
    /// Grid z of the batched GEMM (blocks loop over the rest of the batch).
    pub grid_z: u64,
    /// Blocks the LayerNorm block-path forward aims at before it gives a
    /// block a run of several rows.
    pub ln_fwd_target_blocks: u64,
}

impl GridCaps {
    pub const REAL: GridCaps = GridCaps {
        grid_stride_blocks: MAX_GRID_STRIDE_BLOCKS,
        row_grid_x: 1 << 16,
        grid_z: 65535,
        ln_fwd_target_blocks: layernorm::FWD_TARGET_BLOCKS,
    };
}

static GRID_STRIDE_BLOCKS: AtomicU64 = AtomicU64::new(GridCaps::REAL.grid_stride_blocks);
static ROW_GRID_X: AtomicU64 = AtomicU64::new(GridCaps::REAL.row_grid_x);
static GRID_Z: AtomicU64 = AtomicU64::new(GridCaps::REAL.grid_z);
static LN_FWD_TARGET_BLOCKS: AtomicU64 = AtomicU64::new(GridCaps::REAL.ln_fwd_target_blocks);

/// The caps in force ([`GridCaps::REAL`] unless a test lowered them).
pub fn grid_caps() -> GridCaps {
    GridCaps {
        grid_stride_blocks: GRID_STRIDE_BLOCKS.load(Ordering::Relaxed),
        row_grid_x: ROW_GRID_X.load(Ordering::Relaxed),
        grid_z: GRID_Z.load(Ordering::Relaxed),
        ln_fwd_target_blocks: LN_FWD_TARGET_BLOCKS.load(Ordering::Relaxed),
    }
}

/// Lowers (or restores) the grid caps for the whole process: for tests that
/// drive the large-shape paths with small inputs. Each cap is clamped to
/// `1..=` its real value, so no setting can produce an illegal launch.
#[doc(hidden)]
pub fn set_grid_caps_for_tests(caps: GridCaps) {
    let real = GridCaps::REAL;
    GRID_STRIDE_BLOCKS.store(
        caps.grid_stride_blocks.clamp(1, real.grid_stride_blocks),
        Ordering::Relaxed,
    );
    ROW_GRID_X.store(caps.row_grid_x.clamp(1, real.row_grid_x), Ordering::Relaxed);
    GRID_Z.store(caps.grid_z.clamp(1, real.grid_z), Ordering::Relaxed);
    LN_FWD_TARGET_BLOCKS.store(
        caps.ln_fwd_target_blocks
            .clamp(1, real.ln_fwd_target_blocks),
        Ordering::Relaxed,
    );
}

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
