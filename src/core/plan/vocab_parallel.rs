//! Launch plans of the vocab-parallel embedding and cross-entropy kernels
//! (`cuda/vocab_parallel.cu`): elementwise work grid-strides over at most
//! [`MAX_BLOCKS`] blocks; per-row work (a token's logits, a vocab row's
//! gradient) takes one block of [`THREADS`] per row.

use crate::core::LaunchConfig;

/// Threads per block.
pub const THREADS: u32 = 256;
/// Cap on grid-stride launches.
pub const MAX_BLOCKS: usize = 4096;
/// Largest grid.x: the most rows a per-row launch can cover.
pub const MAX_GRID_X: usize = (1 << 31) - 1;

/// A grid-stride launch over `n` elements.
pub fn grid_stride(n: usize) -> LaunchConfig {
    let cap = (super::grid_caps().grid_stride_blocks as usize).min(MAX_BLOCKS);
    let blocks = n.div_ceil(THREADS as usize).clamp(1, cap);
    LaunchConfig::linear(blocks as u32, THREADS)
}

/// One block per row; the caller checked `rows <= MAX_GRID_X`.
pub fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig::linear(rows.min(MAX_GRID_X) as u32, THREADS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids() {
        assert_eq!(grid_stride(0).grid[0], 1);
        assert_eq!(grid_stride(257).grid[0], 2);
        assert_eq!(grid_stride(usize::MAX / 2).grid[0] as usize, MAX_BLOCKS);
        assert_eq!(per_row(7).grid[0], 7);
    }
}
