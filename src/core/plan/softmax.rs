//! Plans for the fused scale + mask + softmax kernels (`cuda/softmax.cu`).
//!
//! The path depends on the row length `sk` alone (the register budget is
//! counted in fp32 values, whatever the storage dtype); the dtype and the
//! alignment of the buffers only decide the vector width.

#[cfg(test)]
use super::MAX_GRID_STRIDE_BLOCKS;
use super::{div_ceil, vector_width};
use crate::core::launch::LaunchConfig;

/// Which kernel family runs a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SoftmaxPath {
    /// One warp per row, the row in registers (`sk <= 1024`).
    Warp,
    /// One block per row, the row in registers (`sk <= 16384`; chosen for
    /// `sk <= 8192`).
    Block,
    /// One block per row, two streaming passes (any `sk`).
    Long,
}

/// Longest row of the warp path: 32 lanes x 32 values.
pub const WARP_MAX_COLS: u64 = 32 * 32;
/// Threads per block of the warp path (4 warps, each 1 to 16 rows); the kernels are
/// declared with `__launch_bounds__(128)`.
pub const WARP_THREADS: u32 = 128;
/// Values each thread of the block path holds (`SM_BLOCK_ITEMS`).
pub const BLOCK_ITEMS: u64 = 32;
/// Most threads of the block path (its `__launch_bounds__`).
pub const BLOCK_MAX_THREADS: u64 = 512;
/// Longest row of the block path.
pub const BLOCK_MAX_COLS: u64 = BLOCK_ITEMS * BLOCK_MAX_THREADS;
/// Threads per block of the long path.
pub const LONG_THREADS: u32 = 512;
/// Vectors each thread of the long forward loads per step, all before any
/// is used (`SM_LONG_UNROLL`).
pub const LONG_UNROLL: u32 = 3;

/// Longest row the block path is chosen for (it can run up to
/// `BLOCK_MAX_COLS` when forced): past it one block holding the row at ~100
/// registers per thread is the only block on its SM (16 KiB of bf16 in
/// flight), while the long path's two passes keep 2 blocks per SM and
/// several 128-bit loads per thread in flight (the second read an L2 hit).
pub const BLOCK_CHOSEN_MAX_COLS: u64 = 8192;

/// The path for rows of `sk` columns.
pub const fn path_for(sk: u64) -> SoftmaxPath {
    if sk <= WARP_MAX_COLS {
        SoftmaxPath::Warp
    } else if sk <= BLOCK_CHOSEN_MAX_COLS {
        SoftmaxPath::Block
    } else {
        SoftmaxPath::Long
    }
}

/// True when `path` can run rows of `sk` columns.
pub const fn path_supports(path: SoftmaxPath, sk: u64) -> bool {
    match path {
        SoftmaxPath::Warp => sk <= WARP_MAX_COLS,
        SoftmaxPath::Block => sk <= BLOCK_MAX_COLS,
        SoftmaxPath::Long => true,
    }
}

/// One launch of forward or backward (both take the same plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub path: SoftmaxPath,
    /// Warp path: values per lane (1, 2, 4, 8, 16 or 32), which names the
    /// kernel `ftn_softmax_*_warp{per_lane}_*`; 0 for the other paths.
    pub per_lane: u32,
    /// Elements per 128-bit access, or 1 for the scalar path.
    pub vec: u32,
    /// Warp path: rows one warp holds at once (`16 * per_lane / vec` lanes
    /// per row when a row is shorter than two vectors per lane, else 1);
    /// 1 for the other paths.
    pub rows_per_warp: u32,
    pub cfg: LaunchConfig,
}

/// Plan for `rows >= 1` rows of `sk >= 1` columns of `elem_size`-byte
/// elements. `aligned16`: every pointer (x, y, mask / y, dy, dx) is 16-byte
/// aligned. `forced`: run this path instead of the natural one (tests and
/// benches); `None` if it cannot hold rows of `sk` columns.
pub fn plan(
    rows: u64,
    sk: u64,
    elem_size: usize,
    aligned16: bool,
    forced: Option<SoftmaxPath>,
) -> Option<Plan> {
    let path = forced.unwrap_or(path_for(sk));
    if rows == 0 || sk == 0 || !path_supports(path, sk) {
        return None;
    }
    let mut vec = vector_width(elem_size, aligned16);
    if sk % vec as u64 != 0 {
        vec = 1;
    }
    let (per_lane, rows_per_warp, threads, blocks) = match path {
        SoftmaxPath::Warp => {
            // Both powers of two: with vectors and per_lane < 2 * vec a row
            // is two vectors on each of 16 * per_lane / vec lanes (the
            // kernel's sub-warp rows).
            let per_lane = div_ceil(sk, 32).next_power_of_two() as u32;
            let rows_per_warp = if vec == 1 || per_lane >= 2 * vec {
                1
            } else {
                2 * vec / per_lane
            };
            let rows_per_block = (WARP_THREADS / 32 * rows_per_warp) as u64;
            (
                per_lane,
                rows_per_warp,
                WARP_THREADS,
                div_ceil(rows, rows_per_block),
            )
        }
        SoftmaxPath::Block => {
            let threads =
                (div_ceil(div_ceil(sk, BLOCK_ITEMS), 32) * 32).clamp(32, BLOCK_MAX_THREADS);
            (0, 1, threads as u32, rows)
        }
        SoftmaxPath::Long => (0, 1, LONG_THREADS, rows),
    };
    Some(Plan {
        path,
        per_lane,
        vec,
        rows_per_warp,
        cfg: LaunchConfig::linear(
            blocks.min(super::grid_caps().grid_stride_blocks) as u32,
            threads,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::launch::DeviceLimits;

    #[test]
    fn path_follows_row_length_only() {
        assert_eq!(path_for(1), SoftmaxPath::Warp);
        assert_eq!(path_for(1024), SoftmaxPath::Warp);
        assert_eq!(path_for(1025), SoftmaxPath::Block);
        assert_eq!(path_for(8192), SoftmaxPath::Block);
        assert_eq!(path_for(8193), SoftmaxPath::Long);
        assert_eq!(path_for(16384), SoftmaxPath::Long);
        assert!(path_supports(SoftmaxPath::Block, 16384));
        assert_eq!(path_for(1 << 40), SoftmaxPath::Long);
        for sk in [1u64, 33, 1000, 4097, 16385, 65536] {
            for es in [2usize, 4] {
                let a = plan(8, sk, es, true, None).unwrap();
                let b = plan(8, sk, es, false, None).unwrap();
                assert_eq!(a.path, b.path);
                assert_eq!(a.per_lane, b.per_lane);
                assert_eq!(a.cfg, b.cfg);
            }
        }
    }

    #[test]
    fn every_row_and_column_is_covered() {
        for &sk in &[
            1u64, 2, 7, 31, 32, 33, 64, 1000, 1024, 1025, 4097, 16384, 16385, 65536,
        ] {
            for &rows in &[1u64, 3, 4, 5, 1 << 24] {
                for &es in &[2usize, 4] {
                    for &al in &[true, false] {
                        let p = plan(rows, sk, es, al, None).unwrap();
                        assert!(DeviceLimits::SM90.check("k", &p.cfg).is_ok());
                        assert_eq!(sk % p.vec as u64, 0);
                        let t = p.cfg.block[0] as u64;
                        assert_eq!(t % 32, 0);
                        match p.path {
                            SoftmaxPath::Warp => {
                                assert!(32 * p.per_lane as u64 >= sk);
                                assert!(p.per_lane.is_power_of_two() && p.per_lane <= 32);
                                // Either whole vectors per lane, or one
                                // vector per lane and several rows per warp.
                                let lanes = 32 / p.rows_per_warp;
                                let held = if p.rows_per_warp > 1 {
                                    2 * p.vec
                                } else {
                                    p.per_lane
                                };
                                assert!(p.per_lane % p.vec == 0 || p.rows_per_warp > 1);
                                assert_eq!(lanes * held, 32 * p.per_lane);
                                assert!((lanes as u64) * (held as u64) >= sk);
                                assert_eq!(t, WARP_THREADS as u64);
                                let rows_per_block = 4 * p.rows_per_warp as u64;
                                assert!(
                                    p.cfg.grid[0] as u64 * rows_per_block >= rows
                                        || p.cfg.grid[0] as u64
                                            == crate::core::plan::grid_caps().grid_stride_blocks
                                );
                            }
                            SoftmaxPath::Block => {
                                assert!(t * BLOCK_ITEMS >= sk && t <= BLOCK_MAX_THREADS);
                                assert_eq!(BLOCK_ITEMS % p.vec as u64, 0);
                            }
                            SoftmaxPath::Long => assert_eq!(t, LONG_THREADS as u64),
                        }
                        // The grid strides over rows, so it may be capped.
                        assert!(p.cfg.grid[0] as u64 <= MAX_GRID_STRIDE_BLOCKS);
                    }
                }
            }
        }
    }

    #[test]
    fn vector_width_needs_alignment_and_divisibility() {
        assert_eq!(plan(4, 256, 2, true, None).unwrap().vec, 8);
        assert_eq!(plan(4, 128, 4, true, None).unwrap().vec, 4);
        assert_eq!(plan(4, 2048, 2, true, None).unwrap().vec, 8);
        assert_eq!(plan(4, 128, 2, false, None).unwrap().vec, 1);
        assert_eq!(plan(4, 4097, 2, true, None).unwrap().vec, 1);
        assert_eq!(plan(4, 65536, 2, true, None).unwrap().vec, 8);
        // Rows shorter than two 8-wide fp16 vectors per lane: two vectors
        // on each of 8 lanes, four rows per warp (8 blocks hold 128 rows).
        let p = plan(128, 128, 2, true, None).unwrap();
        assert_eq!((p.per_lane, p.vec, p.rows_per_warp), (4, 8, 4));
        assert_eq!(p.cfg.grid[0], 8);
        let p = plan(4, 32, 2, true, None).unwrap();
        assert_eq!((p.per_lane, p.vec, p.rows_per_warp), (1, 8, 16));
        let p = plan(4, 64, 4, true, None).unwrap();
        assert_eq!((p.per_lane, p.vec, p.rows_per_warp), (2, 4, 4));
        let p = plan(4, 256, 2, true, None).unwrap();
        assert_eq!((p.per_lane, p.vec, p.rows_per_warp), (8, 8, 2));
        let p = plan(4, 512, 2, true, None).unwrap();
        assert_eq!((p.per_lane, p.vec, p.rows_per_warp), (16, 8, 1));
        // Unaligned or not a multiple of the vector: scalar, a row per warp.
        let p = plan(4, 128, 2, false, None).unwrap();
        assert_eq!((p.per_lane, p.vec, p.rows_per_warp), (4, 1, 1));
        let p = plan(4, 100, 2, true, None).unwrap();
        assert_eq!((p.per_lane, p.vec, p.rows_per_warp), (4, 1, 1));
    }

    #[test]
    fn forced_paths() {
        let p = plan(3, 33, 4, true, Some(SoftmaxPath::Long)).unwrap();
        assert_eq!(p.path, SoftmaxPath::Long);
        let p = plan(3, 33, 4, true, Some(SoftmaxPath::Block)).unwrap();
        assert_eq!((p.path, p.cfg.block[0]), (SoftmaxPath::Block, 32));
        assert!(plan(3, 1025, 4, true, Some(SoftmaxPath::Warp)).is_none());
        assert!(plan(3, 16385, 4, true, Some(SoftmaxPath::Block)).is_none());
        assert!(plan(0, 3, 4, true, None).is_none());
        assert!(plan(3, 0, 4, true, None).is_none());
    }
}
