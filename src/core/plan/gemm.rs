//! Plans for the tensor-core GEMMs: `cuda/gemm.cu` (mma.sync; which block
//! tile, the grid, and the pipeline's dynamic shared memory, from the shape
//! alone) and `cuda/gemm_sm90.cu` (wgmma + TMA; a persistent grid of at most
//! one block per SM over 128x128 tiles, [`plan_sm90`]).

use super::div_ceil;
use crate::core::launch::LaunchConfig;

/// K slice per pipeline step (`kGemmBK` in the kernel).
pub const BK: u64 = 32;
/// Pipeline depth (`kGemmStages`).
pub const STAGES: u64 = 3;
/// Row padding of the shared tiles, in elements (`kGemmPad`).
pub const PAD: u64 = 8;
/// Most blocks along grid z; blocks loop over the rest of the batch.
pub const MAX_GRID_Z: u64 = 65535;
/// Below this many 128x128 blocks the 64x64 tile is used (more blocks to
/// fill the machine; the plan never asks the device how many SMs it has).
pub const SMALL_TILE_BELOW_BLOCKS: u64 = 256;

/// Block tiles the kernels are stamped for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmTile {
    /// 128x128, 8 warps of 64x32.
    T128x128,
    /// 64x64, 4 warps of 32x32.
    T64x64,
}

impl GemmTile {
    /// `(BM, BN)`.
    pub const fn dims(self) -> (u64, u64) {
        match self {
            GemmTile::T128x128 => (128, 128),
            GemmTile::T64x64 => (64, 64),
        }
    }

    pub const fn threads(self) -> u32 {
        match self {
            GemmTile::T128x128 => 256,
            GemmTile::T64x64 => 128,
        }
    }

    /// Dynamic shared memory: `STAGES` x (A + B slices), each operand sized
    /// for the larger of its two layouts (`[rows][BK+PAD]`, `[BK][rows+PAD]`).
    pub const fn smem_bytes(self) -> u32 {
        let (bm, bn) = self.dims();
        let a = max(bm * (BK + PAD), BK * (bm + PAD));
        let b = max(bn * (BK + PAD), BK * (bn + PAD));
        (STAGES * (a + b) * 2) as u32
    }
}

const fn max(a: u64, b: u64) -> u64 {
    if a > b {
        a
    } else {
        b
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmPlan {
    pub tile: GemmTile,
    pub cfg: LaunchConfig,
    /// Blocks along x: m-tiles * n-tiles.
    pub tiles: u64,
}

/// The plan for `batch` GEMMs of `[m, k] x [k, n]` (all >= 1), or `None` when
/// the tile count does not fit a grid's x dimension. `force` overrides the
/// tile choice (tests and benches).
pub fn plan(m: u64, n: u64, batch: u64, force: Option<GemmTile>) -> Option<GemmPlan> {
    let big = div_ceil(m, 128) * div_ceil(n, 128) * batch;
    let tile = force.unwrap_or(if big < SMALL_TILE_BELOW_BLOCKS {
        GemmTile::T64x64
    } else {
        GemmTile::T128x128
    });
    let (bm, bn) = tile.dims();
    let tiles = div_ceil(m, bm).checked_mul(div_ceil(n, bn))?;
    if tiles == 0 || tiles > i32::MAX as u64 {
        return None;
    }
    Some(GemmPlan {
        tile,
        cfg: LaunchConfig {
            grid: [
                tiles as u32,
                1,
                batch.clamp(1, super::grid_caps().grid_z) as u32,
            ],
            block: [tile.threads(), 1, 1],
            dynamic_smem_bytes: tile.smem_bytes(),
        },
        tiles,
    })
}

/// Output tile of the Hopper kernel (`FTN_GEMM_SM90_BM` x `_BN`).
pub const SM90_TILE: (u64, u64) = (
    crate::kernel_params::FTN_GEMM_SM90_BM as u64,
    crate::kernel_params::FTN_GEMM_SM90_BN as u64,
);
/// Rasterisation: m-tiles per group (blocks running at once share A and B
/// slices through L2).
pub const SM90_GROUP_M: u64 = 8;

/// The Hopper kernel's launch: `grid.x` persistent blocks walking
/// `tiles_m * tiles_n * batch` tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sm90Plan {
    pub cfg: LaunchConfig,
    pub tiles_m: u64,
    pub tiles_n: u64,
    pub group_m: u64,
}

/// The plan for `batch` GEMMs with `[m, n]` outputs (all >= 1) on a device
/// with `sms` multiprocessors, or `None` when the tile count reaches 2^31
/// (the kernel's scheduler counts tiles in 32 bits).
pub fn plan_sm90(m: u64, n: u64, batch: u64, sms: u32) -> Option<Sm90Plan> {
    let (bm, bn) = SM90_TILE;
    let (tiles_m, tiles_n) = (div_ceil(m, bm), div_ceil(n, bn));
    let tiles = tiles_m.checked_mul(tiles_n)?.checked_mul(batch)?;
    if tiles == 0 || tiles > i32::MAX as u64 {
        return None;
    }
    Some(Sm90Plan {
        cfg: LaunchConfig {
            grid: [tiles.min(sms.max(1) as u64) as u32, 1, 1],
            block: [crate::kernel_params::FTN_GEMM_SM90_THREADS, 1, 1],
            dynamic_smem_bytes: crate::kernel_params::FTN_GEMM_SM90_SMEM_BYTES,
        },
        tiles_m,
        tiles_n,
        group_m: SM90_GROUP_M.min(tiles_m),
    })
}

/// Rows per chunk and chunk count of the two-stage column sum (bias
/// gradient): about 512 chunks of at least 64 rows, from `rows` alone, so the
/// result is bitwise reproducible for a shape.
pub fn column_sum_chunks(rows: u64) -> (u64, u64) {
    let per = div_ceil(rows, 512).max(64);
    (per, div_ceil(rows, per).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::launch::DeviceLimits;

    #[test]
    fn shared_memory_matches_the_kernel_layout() {
        // 3 stages x (128*40 + 128*40) halves; 3 x (64*40 + 64*40) halves.
        assert_eq!(GemmTile::T128x128.smem_bytes(), 61_440);
        assert_eq!(GemmTile::T64x64.smem_bytes(), 30_720);
    }

    #[test]
    fn tiles_cover_the_output() {
        for &(m, n, b) in &[
            (1u64, 1u64, 1u64),
            (127, 129, 3),
            (4096, 16384, 1),
            (1, 1 << 20, 1),
            (300, 7, 100_000),
        ] {
            let p = plan(m, n, b, None).unwrap();
            let (bm, bn) = p.tile.dims();
            assert_eq!(p.tiles, div_ceil(m, bm) * div_ceil(n, bn));
            assert_eq!(p.cfg.grid[0] as u64, p.tiles);
            assert!(p.cfg.grid[2] as u64 <= b.min(MAX_GRID_Z));
            assert!(DeviceLimits::SM90.check("k", &p.cfg).is_ok(), "{m}x{n}x{b}");
        }
    }

    #[test]
    fn tile_choice() {
        assert_eq!(plan(64, 64, 1, None).unwrap().tile, GemmTile::T64x64);
        assert_eq!(plan(4096, 4096, 1, None).unwrap().tile, GemmTile::T128x128);
        assert_eq!(
            plan(4096, 4096, 1, Some(GemmTile::T64x64)).unwrap().tile,
            GemmTile::T64x64
        );
        // Too many tiles for grid.x.
        assert!(plan(u32::MAX as u64 * 64, u32::MAX as u64 * 64, 1, None).is_none());
    }

    #[test]
    fn sm90_plan() {
        // 4 stages x 32 KiB + alignment slack + barriers; fits 227 KiB.
        let p = plan_sm90(1000, 300, 3, 132).unwrap();
        assert_eq!(p.cfg.dynamic_smem_bytes, 4 * 32768 + 1024 + 256);
        assert_eq!((p.tiles_m, p.tiles_n, p.group_m), (8, 3, 8));
        assert_eq!(p.cfg.grid, [72, 1, 1]);
        assert!(DeviceLimits::SM90.check("k", &p.cfg).is_ok());
        let p = plan_sm90(8192, 8192, 1, 132).unwrap();
        assert_eq!((p.cfg.grid[0], p.group_m), (132, 8));
        assert_eq!(plan_sm90(17, 1, 1, 132).unwrap().group_m, 1);
        assert!(plan_sm90(1 << 20, 1 << 20, 1 << 10, 132).is_none());
    }

    #[test]
    fn column_chunks_cover_rows() {
        for rows in [1u64, 63, 64, 65, 1000, 1 << 20] {
            let (per, chunks) = column_sum_chunks(rows);
            assert!(per * chunks >= rows && (chunks - 1) * per < rows);
            assert!(chunks <= 512 + 1);
        }
    }
}
