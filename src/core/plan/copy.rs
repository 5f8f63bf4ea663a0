//! Launch plan of the strided 2-D byte copy (`cuda/copy.cu`): grid-stride
//! over 16-byte units when every address, row length and pitch is 16-byte
//! aligned, else over single bytes.

#[cfg(test)]
use super::MAX_GRID_STRIDE_BLOCKS;
use super::{div_ceil, grid_caps, ELEMENTWISE_THREADS};
use crate::core::LaunchConfig;

/// Bytes moved per thread per step and the launch for `rows` rows of
/// `row_bytes` bytes; `aligned16` says whether 16-byte units are legal.
pub fn plan(rows: u64, row_bytes: u64, aligned16: bool) -> (u32, LaunchConfig) {
    let vec: u32 = if aligned16 { 16 } else { 1 };
    let units = rows * row_bytes / vec as u64;
    let blocks =
        div_ceil(units, ELEMENTWISE_THREADS as u64).clamp(1, grid_caps().grid_stride_blocks);
    (
        vec,
        LaunchConfig::linear(blocks as u32, ELEMENTWISE_THREADS),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_units_and_capped_grid() {
        let (vec, cfg) = plan(4, 64, true);
        assert_eq!((vec, cfg.grid[0]), (16, 1));
        let (vec, cfg) = plan(1 << 20, 1 << 12, false);
        assert_eq!(vec, 1);
        assert_eq!(cfg.grid[0] as u64, MAX_GRID_STRIDE_BLOCKS);
    }
}
