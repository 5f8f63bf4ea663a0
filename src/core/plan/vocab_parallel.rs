//! Launch plans of the vocab-parallel embedding and cross-entropy kernels
//! (`cuda/vocab_parallel.cu`): elementwise work grid-strides over at most
//! [`MAX_BLOCKS`] blocks; per-row work (a token's logits, a vocab row's
//! gradient) takes one block of [`THREADS`] per row; the embedding
//! backward's bitonic sort of its keys is [`sort_steps`].

use crate::core::LaunchConfig;
use alloc::vec::Vec;

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

/// Longest row the cross-entropy statistics give one warp
/// (`ftn_vocab_ce_stats_warp_*`) instead of a block
/// (`ftn_vocab_ce_stats_*`): a short vocabulary shard would leave most of a
/// block's threads idle and pay two block reductions per row.
pub const CE_STATS_WARP_MAX_COLS: usize = 1024;

/// Which kernel computes the cross-entropy statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CeStatsKernel {
    /// `ftn_vocab_ce_stats_warp_*`: a warp per row, [`THREADS`]` / 32` rows
    /// per block, warp reductions only.
    WarpPerRow,
    /// `ftn_vocab_ce_stats_*`: a block of [`THREADS`] per row.
    BlockPerRow,
}

impl CeStatsKernel {
    /// The kernel's name without its dtype suffix (`_f32`, `_f16`, `_bf16`).
    pub const fn name_stem(self) -> &'static str {
        match self {
            CeStatsKernel::WarpPerRow => "ftn_vocab_ce_stats_warp",
            CeStatsKernel::BlockPerRow => "ftn_vocab_ce_stats",
        }
    }
}

/// The cross-entropy statistics launch: the kernel and its grid, chosen
/// together so that they cannot disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CeStatsPlan {
    pub kernel: CeStatsKernel,
    pub cfg: LaunchConfig,
}

/// The cross-entropy statistics over `tokens` rows of `cols` columns: a
/// warp per row up to [`CE_STATS_WARP_MAX_COLS`], else a block per row
/// ([`per_row`]). The caller checked `tokens <= MAX_GRID_X`.
pub fn ce_stats(tokens: usize, cols: usize) -> CeStatsPlan {
    if cols <= CE_STATS_WARP_MAX_COLS {
        let rows_per_block = THREADS as usize / 32;
        CeStatsPlan {
            kernel: CeStatsKernel::WarpPerRow,
            cfg: LaunchConfig::linear(tokens.div_ceil(rows_per_block) as u32, THREADS),
        }
    } else {
        CeStatsPlan {
            kernel: CeStatsKernel::BlockPerRow,
            cfg: per_row(tokens),
        }
    }
}

/// Keys one block of the embedding backward's sort holds in shared memory
/// (`VP_SORT_TILE` of `cuda/vocab_parallel.cu`).
pub const SORT_TILE: usize = 2048;

/// Keys the embedding backward sorts for `tokens` ids: the next power of two
/// (at least 1). `None` on overflow.
pub fn sort_len(tokens: usize) -> Option<usize> {
    tokens.max(1).checked_next_power_of_two()
}

/// One launch of the bitonic sort over `n` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortStep {
    /// `ftn_vocab_embed_sort_tile`: `k == 0` every stage up to the tile,
    /// else stage `k`'s strides below the tile; one block per tile.
    Tile { k: usize, cfg: LaunchConfig },
    /// `ftn_vocab_embed_sort_step`: stage `k`, stride `j >= SORT_TILE`.
    Global {
        k: usize,
        j: usize,
        cfg: LaunchConfig,
    },
}

/// The launches that sort `n` keys (`n` a power of two): the tiles, then for
/// each longer stage its global strides and one tile pass. 1 launch up to
/// [`SORT_TILE`] keys; O(log^2 (n / tile)) launches beyond.
pub fn sort_steps(n: usize) -> Vec<SortStep> {
    debug_assert!(n.is_power_of_two());
    let tile = n.min(SORT_TILE);
    let tiles = LaunchConfig::linear((n / tile) as u32, THREADS);
    let mut steps = alloc::vec![SortStep::Tile { k: 0, cfg: tiles }];
    let mut k = 2 * tile;
    while k <= n {
        let mut j = k / 2;
        while j >= tile {
            steps.push(SortStep::Global {
                k,
                j,
                cfg: grid_stride(n / 2),
            });
            j /= 2;
        }
        steps.push(SortStep::Tile { k, cfg: tiles });
        k *= 2;
    }
    steps
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
        // Warp per row up to 1024 columns (8 rows a block), then a block.
        let warp = ce_stats(17, 31);
        assert_eq!(warp.kernel, CeStatsKernel::WarpPerRow);
        assert_eq!((warp.cfg.grid[0], warp.cfg.block[0]), (3, THREADS));
        let at_max = ce_stats(16, CE_STATS_WARP_MAX_COLS);
        assert_eq!(
            (at_max.kernel, at_max.cfg.grid[0]),
            (CeStatsKernel::WarpPerRow, 2)
        );
        let over = ce_stats(17, CE_STATS_WARP_MAX_COLS + 1);
        assert_eq!(
            (over.kernel, over.cfg.grid[0]),
            (CeStatsKernel::BlockPerRow, 17)
        );
        assert_eq!(over.kernel.name_stem(), "ftn_vocab_ce_stats");
    }

    #[test]
    fn sort_plan() {
        assert_eq!(sort_len(0), Some(1));
        assert_eq!(sort_len(37), Some(64));
        assert_eq!(sort_len(usize::MAX), None);
        assert_eq!(sort_steps(64).len(), 1);
        // 8192 keys = 4 tiles: stage 4096 (1 global stride + tile), stage
        // 8192 (2 global strides + tile).
        let s = sort_steps(8192);
        assert_eq!(s.len(), 1 + 2 + 3);
        assert!(matches!(
            s[3],
            SortStep::Global {
                k: 8192,
                j: 4096,
                ..
            }
        ));
        assert!(matches!(s[5], SortStep::Tile { k: 8192, .. }));
    }
}
