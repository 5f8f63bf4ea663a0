//! Plans for the bias+GeLU kernels (`cuda/bias_gelu.cu`).

#[cfg(test)]
use super::MAX_GRID_STRIDE_BLOCKS;
use super::{div_ceil, grid_caps, row_chunks, vector_width, ELEMENTWISE_THREADS};
use crate::core::launch::LaunchConfig;

/// Forward: a grid-stride loop over the flattened `[rows, cols]` matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardPlan {
    pub cfg: LaunchConfig,
    /// Elements per 128-bit access (1 = scalar path).
    pub vec: u32,
}

/// Vectors each forward thread moves per step: the kernel loads both before
/// using either, so the grid is sized for two per thread (with one, a
/// thread would have a single 16-byte load in flight below the grid cap).
pub const FORWARD_VECTORS_PER_THREAD: u64 = 2;

/// `aligned16`: every pointer the kernel touches is 16-byte aligned. Rows of
/// 2^31 columns or more take the scalar path (the vector path tracks the
/// bias column in 32 bits).
pub fn forward(rows: u64, cols: u64, elem_size: usize, aligned16: bool) -> ForwardPlan {
    elementwise(rows, cols, elem_size, aligned16, FORWARD_VECTORS_PER_THREAD)
}

/// A grid-stride launch over `[rows, cols]` sized for `vectors_per_thread`
/// vectors per thread (below the grid cap); bias+dropout+add moves one per
/// step and asks for 1.
pub fn elementwise(
    rows: u64,
    cols: u64,
    elem_size: usize,
    aligned16: bool,
    vectors_per_thread: u64,
) -> ForwardPlan {
    let vec = if cols > i32::MAX as u64 {
        1
    } else {
        vector_width(elem_size, aligned16)
    };
    let units = (rows * cols / vec as u64).max(1);
    let threads = div_ceil(units, vectors_per_thread.max(1));
    let blocks =
        div_ceil(threads, ELEMENTWISE_THREADS as u64).clamp(1, grid_caps().grid_stride_blocks);
    ForwardPlan {
        cfg: LaunchConfig::linear(blocks as u32, ELEMENTWISE_THREADS),
        vec,
    }
}

/// Backward: blocks tile (column groups) x (row chunks); each thread owns
/// `vec` adjacent columns and walks the rows of its chunk, so the fp32
/// partial bias sums come out in a fixed order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardPlan {
    pub cfg: LaunchConfig,
    pub vec: u32,
    pub rows_per_chunk: u64,
    pub chunks: u64,
    /// Launch of the second stage that sums the `chunks` partial rows.
    pub reduce_cfg: LaunchConfig,
}

/// Minimum rows a backward chunk holds; the chunk count is capped near 512.
pub const MIN_ROWS_PER_CHUNK: u64 = 64;
pub const TARGET_CHUNKS: u64 = 512;

/// `aligned16`: every pointer is 16-byte aligned. The vector path is taken
/// only when `cols` is also a multiple of the vector width. The chunking
/// depends on `rows` alone, so dbias is bitwise reproducible for a shape.
pub fn backward(rows: u64, cols: u64, elem_size: usize, aligned16: bool) -> BackwardPlan {
    let mut vec = vector_width(elem_size, aligned16);
    if cols % vec as u64 != 0 {
        vec = 1;
    }
    let col_units = div_ceil(cols, vec as u64).max(1);
    let threads = (div_ceil(col_units, 32) * 32).min(ELEMENTWISE_THREADS as u64);
    let col_blocks = div_ceil(col_units, threads);
    let (rows_per_chunk, chunks) = row_chunks(rows, MIN_ROWS_PER_CHUNK, TARGET_CHUNKS);
    BackwardPlan {
        cfg: LaunchConfig {
            grid: [col_blocks as u32, chunks as u32, 1],
            block: [threads as u32, 1, 1],
            dynamic_smem_bytes: 0,
        },
        vec,
        rows_per_chunk,
        chunks,
        reduce_cfg: LaunchConfig::linear(
            div_ceil(cols.max(1), ELEMENTWISE_THREADS as u64) as u32,
            ELEMENTWISE_THREADS,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::launch::DeviceLimits;

    #[test]
    fn forward_vectorises_only_aligned_data() {
        assert_eq!(forward(4, 8, 4, true).vec, 4);
        assert_eq!(forward(4, 8, 2, true).vec, 8);
        assert_eq!(forward(4, 8, 2, false).vec, 1);
        assert_eq!(forward(1, 1 << 31, 2, true).vec, 1);
        assert_eq!(forward(2, (1 << 31) - 8, 2, true).vec, 8);
        let p = forward(1, 1, 4, true);
        assert_eq!(p.cfg.grid[0], 1);
        // Two vectors per thread below the cap: 2^17 bf16 vectors, 256 blocks.
        let mid = forward(1024, 1024, 2, true);
        assert_eq!(mid.cfg.grid[0], 256);
        let big = forward(1 << 20, 1 << 14, 2, true);
        assert_eq!(big.cfg.grid[0] as u64, MAX_GRID_STRIDE_BLOCKS);
        assert!(DeviceLimits::SM90.check("k", &big.cfg).is_ok());
    }

    #[test]
    fn backward_covers_every_row_and_column() {
        for &(rows, cols, es, al) in &[
            (1u64, 1u64, 4usize, true),
            (7, 33, 2, true),
            (1000, 4096, 2, true),
            (65, 4097, 4, true),
            (1 << 20, 3, 2, false),
        ] {
            let p = backward(rows, cols, es, al);
            assert!(p.chunks * p.rows_per_chunk >= rows);
            assert!((p.chunks - 1) * p.rows_per_chunk < rows.max(1));
            let covered = p.cfg.grid[0] as u64 * p.cfg.block[0] as u64 * p.vec as u64;
            assert!(covered >= cols, "{rows}x{cols}");
            assert_eq!(cols % p.vec as u64, 0);
            assert!(DeviceLimits::SM90.check("k", &p.cfg).is_ok());
            assert!(p.reduce_cfg.grid[0] as u64 * 256 >= cols);
        }
    }

    #[test]
    fn backward_chunking_ignores_alignment() {
        let a = backward(10_000, 512, 2, true);
        let b = backward(10_000, 512, 2, false);
        assert_eq!(a.rows_per_chunk, b.rows_per_chunk);
        assert_ne!(a.vec, b.vec);
    }
}
