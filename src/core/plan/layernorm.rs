//! Plans for the LayerNorm / RMSNorm kernels (`cuda/layernorm.cu`).
//!
//! The row path depends on the hidden size alone (the register budget per
//! thread is the same fp32 count for every storage dtype); the access width
//! depends on the dtype and on alignment; the chunking of the parameter
//! gradients on the row count alone, so dgamma/dbeta are bitwise
//! reproducible for a shape.

use super::{div_ceil, row_chunks, vector_width};
use crate::core::launch::{DeviceLimits, LaunchConfig};

/// How one row is normalised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowPath {
    /// One warp per row, the row in registers (`hidden <= WARP_MAX_HIDDEN`).
    Warp,
    /// One block per row, the row in registers (`hidden <= BLOCK_MAX_HIDDEN`).
    Block,
    /// One block per row, nothing cached: passes over global memory.
    Global,
}

/// fp32 values per lane in the warp path (`kWarpItems` in the kernel).
pub const WARP_ITEMS: u64 = 32;
/// Rows (warps) per block in the warp path (`kWarpRows`).
pub const WARP_ROWS: u32 = 4;
/// fp32 values per thread in the block path (`kBlockItems`).
pub const BLOCK_ITEMS: u64 = 24;
/// Most threads of a block-path block (`kBlockThreads`, its launch bound).
pub const BLOCK_THREADS: u32 = 512;
/// Threads of a global-path block.
pub const GLOBAL_THREADS: u32 = 1024;
/// Widest row of the warp path.
pub const WARP_MAX_HIDDEN: u64 = 32 * WARP_ITEMS;
/// Widest row of the block path.
pub const BLOCK_MAX_HIDDEN: u64 = BLOCK_THREADS as u64 * BLOCK_ITEMS;
/// Blocks of a grid-stride warp-path launch.
pub const MAX_WARP_BLOCKS: u64 = 1 << 16;
/// Columns of the grid in x for block-per-row launches (rows spill into y).
pub const ROW_GRID_X: u64 = 1 << 16;
/// Most rows a block-per-row launch can cover (`ROW_GRID_X * 65535`).
pub const MAX_BLOCK_ROWS: u64 = ROW_GRID_X * 65535;

/// Forward and input-gradient launch of one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowPlan {
    pub path: RowPath,
    pub cfg: LaunchConfig,
    /// Elements per 128-bit access (1 = scalar path).
    pub vec: u32,
}

/// The row path for a hidden size.
pub const fn path(hidden: u64) -> RowPath {
    if hidden <= WARP_MAX_HIDDEN {
        RowPath::Warp
    } else if hidden <= BLOCK_MAX_HIDDEN {
        RowPath::Block
    } else {
        RowPath::Global
    }
}

/// Access width: 128-bit when every pointer is 16-byte aligned and rows
/// start on a vector boundary (`hidden % vec == 0`).
pub fn vec_width(hidden: u64, elem_size: usize, aligned16: bool) -> u32 {
    let v = vector_width(elem_size, aligned16);
    if hidden % v as u64 == 0 {
        v
    } else {
        1
    }
}

/// Threads of a block-path block: the fewest whole warps that hold `hidden`
/// at [`BLOCK_ITEMS`] values per thread (the kernel's register tile). The
/// kernel's registers are sized for the full tile whatever the launch, so
/// fewer threads per row means more resident blocks per SM and up to
/// `BLOCK_ITEMS / vec` 128-bit loads in flight per thread (hidden 4096,
/// bf16: 192 threads, 3 blocks and ~24 KiB in flight per SM on sm_90,
/// against 512 threads and 1 block at ~8 values per thread).
pub fn block_threads(hidden: u64) -> u64 {
    (div_ceil(div_ceil(hidden, BLOCK_ITEMS), 32) * 32).clamp(32, BLOCK_THREADS as u64)
}

/// Grid covering `rows` rows one block each (x fastest).
fn row_grid(rows: u64) -> [u32; 3] {
    let rows = rows.max(1);
    let x = rows.min(super::grid_caps().row_grid_x);
    let y = div_ceil(rows, x).min(u32::MAX as u64);
    [x as u32, y as u32, 1]
}

/// Plan of the forward and of the input gradient (same shape of launch).
/// `rows` above [`MAX_BLOCK_ROWS`] on the block/global paths give a grid
/// the launch check rejects.
pub fn rows(rows: u64, hidden: u64, elem_size: usize, aligned16: bool) -> RowPlan {
    let vec = vec_width(hidden, elem_size, aligned16);
    let path = path(hidden);
    let cfg = match path {
        RowPath::Warp => LaunchConfig::linear(
            div_ceil(rows.max(1), WARP_ROWS as u64)
                .min(MAX_WARP_BLOCKS.min(super::grid_caps().grid_stride_blocks)) as u32,
            32 * WARP_ROWS,
        ),
        RowPath::Block => {
            let threads = block_threads(hidden);
            LaunchConfig {
                grid: row_grid(rows),
                block: [threads as u32, 1, 1],
                dynamic_smem_bytes: 0,
            }
        }
        RowPath::Global => LaunchConfig {
            grid: row_grid(rows),
            block: [GLOBAL_THREADS, 1, 1],
            dynamic_smem_bytes: 0,
        },
    };
    RowPlan { path, cfg, vec }
}

/// Most consecutive rows one block-path forward block normalises (gamma
/// and beta loaded once per block and reused across its rows).
pub const FWD_BLOCK_MAX_ROWS: u64 = 8;
/// Blocks the block-path forward aims at before it gives a block more than
/// one row: several waves of the resident blocks of a 132-SM GPU, so short
/// inputs keep every SM busy.
pub const FWD_TARGET_BLOCKS: u64 = 2048;
/// Values per thread of the block forward's 16-bit 128-bit-vector builds
/// (`kFwdHeldItems`): gamma and beta staged in shared memory, the row alone
/// in registers (packed), 64 registers at 32 values on sm_90a.
pub const FWD_HELD_ITEMS: u64 = 32;

/// Rows per block of the block-path forward: `rows / FWD_TARGET_BLOCKS`
/// (the grid cap in force, `GridCaps::ln_fwd_target_blocks`), clamped to
/// `1..=FWD_BLOCK_MAX_ROWS` (the kernel derives it back from the grid as
/// `ceil(rows / blocks)`).
pub fn fwd_rows_per_block(rows: u64) -> u64 {
    (rows / super::grid_caps().ln_fwd_target_blocks).clamp(1, FWD_BLOCK_MAX_ROWS)
}

/// Whether the block forward stages gamma and beta in shared memory: the
/// 16-bit builds with 128-bit vectors.
pub fn fwd_stages_params(elem_size: usize, vec: u32) -> bool {
    elem_size == 2 && vec > 1
}

/// Widest row of the block forward's staged builds ([`fwd_stages_params`]):
/// [`BLOCK_THREADS`] threads of [`FWD_HELD_ITEMS`] values (16384). Those
/// rows between [`BLOCK_MAX_HIDDEN`] and this take the block path forward
/// although their backward takes the global one: the global forward reads
/// the row twice and measured 0.40 of copy at 16384 on an H200 (2026-12-04).
pub const FWD_STAGED_MAX_HIDDEN: u64 = BLOCK_THREADS as u64 * FWD_HELD_ITEMS;

/// The forward's row path: [`path`], except that rows of the staged builds
/// up to [`FWD_STAGED_MAX_HIDDEN`] stay on the block path.
pub fn forward_path(hidden: u64, elem_size: usize, vec: u32) -> RowPath {
    match path(hidden) {
        RowPath::Global if fwd_stages_params(elem_size, vec) && hidden <= FWD_STAGED_MAX_HIDDEN => {
            RowPath::Block
        }
        p => p,
    }
}

/// Plan of the forward: [`rows`], except on the block path
/// ([`forward_path`]): a run of [`fwd_rows_per_block`] consecutive rows per
/// block, and, where the kernel stages gamma and beta
/// ([`fwd_stages_params`]), [`FWD_HELD_ITEMS`] values per thread (the
/// fewest whole warps that hold the row) and `2 * hidden * elem_size` bytes
/// of dynamic shared memory for them.
pub fn forward(rows_: u64, hidden: u64, elem_size: usize, aligned16: bool) -> RowPlan {
    let mut p = rows(rows_, hidden, elem_size, aligned16);
    if forward_path(hidden, elem_size, p.vec) == RowPath::Block {
        p.path = RowPath::Block;
        p.cfg.grid = row_grid(div_ceil(rows_.max(1), fwd_rows_per_block(rows_)));
        if fwd_stages_params(elem_size, p.vec) {
            let threads = (div_ceil(div_ceil(hidden, FWD_HELD_ITEMS), 32) * 32)
                .clamp(32, BLOCK_THREADS as u64);
            p.cfg.block = [threads as u32, 1, 1];
            p.cfg.dynamic_smem_bytes = (2 * hidden * elem_size as u64) as u32;
        }
    }
    p
}

/// The parameter-gradient reduction: stage one tiles (column groups) x
/// (row chunks); stage two sums the chunks per column in a fixed order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamGradPlan {
    pub cfg: LaunchConfig,
    pub vec: u32,
    pub rows_per_chunk: u64,
    pub chunks: u64,
    /// Stage two, `gridDim.y` = 1 (gamma only) or 2 (gamma and beta).
    pub reduce_cfg: LaunchConfig,
}

/// The fused backward: the row kernel also sums dy * xhat and dy over a
/// chunk of rows per block and writes the chunk's partials (3n bytes
/// instead of the 5n of [`param_grads`] + [`rows`]); stage two as in
/// [`ParamGradPlan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedBwdPlan {
    pub path: RowPath,
    /// The pipelined kernel (16-bit storage, 128-bit access): accumulators
    /// in registers, rows copied into shared memory [`FUSED_PIPE_STAGES`]
    /// deep; on the block path `ftn_layernorm_bwd_fused_pipe_*`, on the
    /// global path up to [`FUSED_PIPE_WIDE_MAX_HIDDEN`] the wide build
    /// `ftn_layernorm_bwd_fused_pipe_wide_*` (32 values per thread, gamma
    /// read from global memory).
    pub pipelined: bool,
    /// Blocks per thread block cluster (1: none). Global-path rows past
    /// [`FUSED_PIPE_WIDE_MAX_HIDDEN`] (16-bit, 128-bit access, sm_90) take
    /// `ftn_layernorm_bwd_fused_cluster<C>_*`: the row's columns split over
    /// the C blocks of a cluster (each a wide pipelined block over its
    /// slice of [`cluster_slice`] columns), which add their row sums through
    /// distributed shared memory; the grid is `chunks * C` blocks along x.
    pub cluster: u32,
    /// One block per chunk (grid x * y >= chunks; the block path also asks
    /// for dynamic shared memory: `8 * hidden` bytes of accumulators, or,
    /// pipelined, [`fused_pipe_smem`] bytes).
    pub cfg: LaunchConfig,
    pub vec: u32,
    pub rows_per_chunk: u64,
    pub chunks: u64,
    pub reduce_cfg: LaunchConfig,
}

/// Minimum rows per chunk of the fused backward, and the chunk count aimed
/// at: at most `8 * hidden` bytes of fp32 partials per 32 rows (at bf16,
/// 4 % of the 6 bytes per element the backward moves per 64 rows), and
/// enough chunks to fill the GPU a few times over.
pub const FUSED_MIN_ROWS_PER_CHUNK: u64 = 32;
pub const FUSED_TARGET_CHUNKS: u64 = 1024;
/// Most threads of a fused block-path block (`kFusedBlockThreads`: the row
/// loop keeps more registers live than the one-row kernel, 156 on sm_90a).
pub const FUSED_BLOCK_THREADS: u32 = 384;
/// Widest row of the fused block path's shared-memory-accumulator kernel
/// (fp32 storage and scalar access); wider rows take [`param_grads`]. The
/// pipelined kernel (16-bit storage, 128-bit access) covers the whole block
/// path.
pub const FUSED_BLOCK_MAX_HIDDEN: u64 = FUSED_BLOCK_THREADS as u64 * BLOCK_ITEMS;
/// Rows in shared memory at once in the pipelined fused backward
/// (`kLnPipeStages`): the one computed and the next two in flight.
pub const FUSED_PIPE_STAGES: u64 = 3;

/// Values per thread of the wide pipelined build (`kLnPipeWideItems`).
pub const FUSED_PIPE_WIDE_ITEMS: u64 = 32;
/// Widest row of the wide pipelined build (global-path rows up to it are
/// fused: 16384, e.g. a 405B-class model's hidden size).
pub const FUSED_PIPE_WIDE_MAX_HIDDEN: u64 = BLOCK_THREADS as u64 * FUSED_PIPE_WIDE_ITEMS;

/// Dynamic shared memory of the pipelined fused backward:
/// [`FUSED_PIPE_STAGES`] stages of x and dy (16-bit), and on the block path
/// gamma as fp32 (the wide build reads it from global memory).
pub const fn fused_pipe_smem(hidden: u64) -> u64 {
    if hidden <= BLOCK_MAX_HIDDEN {
        (4 + 4 * FUSED_PIPE_STAGES) * hidden
    } else {
        4 * FUSED_PIPE_STAGES * hidden
    }
}

/// Threads of a wide pipelined block: the fewest whole warps that hold the
/// row at [`FUSED_PIPE_WIDE_ITEMS`] values per thread.
fn pipe_wide_threads(hidden: u64) -> u64 {
    (div_ceil(div_ceil(hidden, FUSED_PIPE_WIDE_ITEMS), 32) * 32).min(BLOCK_THREADS as u64)
}
/// Its static shared memory (the reduction's 16 float4), and what the
/// cluster builds add at most (row-sum slots `[2][8]` float2, two mbarriers).
pub const FUSED_PIPE_STATIC_SMEM: u64 = 256;
pub const FUSED_CLUSTER_STATIC_SMEM: u64 = 2 * 8 * 8 + 16;

/// Cluster sizes the fused backward is built for (`ftn_layernorm_bwd_fused_
/// cluster<C>_*`): rows up to `8 * FUSED_PIPE_WIDE_MAX_HIDDEN` = 131072.
pub const FUSED_CLUSTER_SIZES: [u32; 3] = [2, 4, 8];

/// Columns of one block of a `cluster`-block cluster: the row's 8-column
/// vectors split evenly, the last block taking what is left. The kernel
/// (`bwd_fused_pipe` in `cuda/layernorm.cu`) computes the same split; keep
/// them in step (the oracle tests at 32776 columns, a short last slice,
/// fail if they drift).
pub const fn cluster_slice(hidden: u64, cluster: u32) -> u64 {
    div_ceil(div_ceil(hidden, 8), cluster as u64) * 8
}

/// Stage two over `chunks` partial rows of `hidden` columns.
fn column_sum_cfg(hidden: u64, chunks: u64, with_beta: bool) -> LaunchConfig {
    LaunchConfig {
        grid: [div_ceil(hidden.max(1), 32) as u32, 1 + with_beta as u32, 1],
        block: [32, reduce_split(chunks) as u32, 1],
        dynamic_smem_bytes: 0,
    }
}

/// The fused backward of a shape on an sm_90 device, or `None` when its row
/// path has none: fp32 or scalar-access rows wider than
/// [`FUSED_BLOCK_MAX_HIDDEN`], and rows wider than 8 *
/// [`FUSED_PIPE_WIDE_MAX_HIDDEN`] (131072). The
/// chunking depends on the row count alone, so the partials (and dgamma,
/// dbeta) are bitwise reproducible for a shape.
pub fn fused_backward(
    rows: u64,
    hidden: u64,
    elem_size: usize,
    aligned16: bool,
    with_beta: bool,
) -> Option<FusedBwdPlan> {
    fused_backward_within(
        rows,
        hidden,
        elem_size,
        aligned16,
        with_beta,
        DeviceLimits::SM90,
    )
}

/// [`fused_backward`] on a device with these limits: a pipelined row that
/// does not fit its shared memory per block (an sm_80 part, 163 KiB:
/// block-path rows wider than 10416, global-path rows wider than 13888)
/// takes the unfused kernels, and so do rows that need a cluster larger
/// than it takes (none before sm_90).
pub fn fused_backward_within(
    rows: u64,
    hidden: u64,
    elem_size: usize,
    aligned16: bool,
    with_beta: bool,
    limits: DeviceLimits,
) -> Option<FusedBwdPlan> {
    let path = path(hidden);
    let vec = vec_width(hidden, elem_size, aligned16);
    let pipelined = elem_size == 2 && vec > 1 && path != RowPath::Warp;
    // Past the wide build: the row split over the blocks of a cluster.
    let cluster = if path == RowPath::Global && hidden > FUSED_PIPE_WIDE_MAX_HIDDEN {
        *FUSED_CLUSTER_SIZES
            .iter()
            .find(|&&c| c as u64 * FUSED_PIPE_WIDE_MAX_HIDDEN >= hidden)?
    } else {
        1
    };
    if cluster > limits.max_cluster_size {
        return None;
    }
    let slice = cluster_slice(hidden, cluster);
    let pipe_smem = if cluster > 1 {
        4 * FUSED_PIPE_STAGES * slice // the wide build's stages
    } else {
        fused_pipe_smem(hidden)
    };
    let static_smem = FUSED_PIPE_STATIC_SMEM
        + if cluster > 1 {
            FUSED_CLUSTER_STATIC_SMEM
        } else {
            0
        };
    if pipelined && pipe_smem + static_smem > limits.max_smem_per_block as u64 {
        return None;
    }
    let block = match path {
        RowPath::Warp => [32 * WARP_ROWS, 1, 1],
        RowPath::Block if pipelined || hidden <= FUSED_BLOCK_MAX_HIDDEN => {
            [block_threads(hidden) as u32, 1, 1]
        }
        RowPath::Global if pipelined => [pipe_wide_threads(slice) as u32, 1, 1],
        _ => return None,
    };
    let smem = match path {
        _ if pipelined => pipe_smem,
        // The fp32 accumulators.
        RowPath::Block => 8 * hidden,
        _ => 0,
    };
    let (rows_per_chunk, chunks) = row_chunks(rows, FUSED_MIN_ROWS_PER_CHUNK, FUSED_TARGET_CHUNKS);
    let grid = if cluster > 1 {
        [(chunks * cluster as u64) as u32, 1, 1]
    } else {
        row_grid(chunks)
    };
    Some(FusedBwdPlan {
        path,
        pipelined,
        cluster,
        cfg: LaunchConfig {
            grid,
            block,
            dynamic_smem_bytes: smem as u32,
        },
        vec,
        rows_per_chunk,
        chunks,
        reduce_cfg: column_sum_cfg(hidden, chunks, with_beta),
    })
}

/// Minimum rows per chunk, and the chunk count aimed at.
pub const MIN_ROWS_PER_CHUNK: u64 = 16;
pub const TARGET_CHUNKS: u64 = 256;
/// Threads that split the chunks of one column in stage two, at most.
pub const REDUCE_SPLIT: u64 = 32;
/// Chunks per stage-two thread before the column is split further: one
/// batch of loads in flight (`ftn_column_chunk_sum` in `cuda/reduce.cuh`).
pub const REDUCE_CHUNKS_PER_THREAD: u64 = 8;

/// Threads that split a column's `chunks` in stage two: enough for one
/// batch of loads each, at most [`REDUCE_SPLIT`]. (A thread per chunk would
/// cost the same one load latency on a GPU, and on the emulator a thread,
/// a fiber and a barrier wait per chunk.)
pub fn reduce_split(chunks: u64) -> u64 {
    div_ceil(chunks, REDUCE_CHUNKS_PER_THREAD).clamp(1, REDUCE_SPLIT)
}
/// Threads of a stage-one block at most.
pub const PARAM_GRAD_THREADS: u64 = 256;

/// `with_beta`: also reduce dbeta (LayerNorm with a beta gradient).
pub fn param_grads(
    rows: u64,
    hidden: u64,
    elem_size: usize,
    aligned16: bool,
    with_beta: bool,
) -> ParamGradPlan {
    let vec = vec_width(hidden, elem_size, aligned16);
    let col_units = div_ceil(hidden, vec as u64).max(1);
    let threads = (div_ceil(col_units, 32) * 32).min(PARAM_GRAD_THREADS);
    let col_blocks = div_ceil(col_units, threads);
    let (rows_per_chunk, chunks) = row_chunks(rows, MIN_ROWS_PER_CHUNK, TARGET_CHUNKS);
    ParamGradPlan {
        cfg: LaunchConfig {
            grid: [col_blocks as u32, chunks as u32, 1],
            block: [threads as u32, 1, 1],
            dynamic_smem_bytes: 0,
        },
        vec,
        rows_per_chunk,
        chunks,
        reduce_cfg: column_sum_cfg(hidden, chunks, with_beta),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::launch::DeviceLimits;

    const HIDDEN: &[u64] = &[
        1,
        2,
        7,
        31,
        33,
        127,
        1000,
        1024,
        1025,
        4096,
        4097,
        8192,
        12288,
        12289,
        12296,
        16384,
        16392,
        65536,
        1 << 20,
    ];

    #[test]
    fn stage_two_splits_columns_into_batches_of_eight_chunks() {
        for (chunks, threads) in [
            (1, 1),
            (8, 1),
            (9, 2),
            (32, 4),
            (255, 32),
            (256, 32),
            (9999, 32),
        ] {
            assert_eq!(reduce_split(chunks), threads, "{chunks} chunks");
        }
    }

    #[test]
    fn path_depends_on_hidden_only() {
        assert_eq!(path(1), RowPath::Warp);
        assert_eq!(path(1024), RowPath::Warp);
        assert_eq!(path(1025), RowPath::Block);
        assert_eq!(path(12288), RowPath::Block);
        assert_eq!(path(12289), RowPath::Global);
        assert_eq!(path(65536), RowPath::Global);
        for &h in HIDDEN {
            for es in [2, 4] {
                let a = rows(5, h, es, true);
                let b = rows(5, h, es, false);
                assert_eq!(a.path, b.path);
                assert_eq!(a.cfg, b.cfg);
                assert_eq!(b.vec, 1);
            }
        }
    }

    #[test]
    fn vector_width_needs_alignment_and_whole_vectors() {
        assert_eq!(vec_width(1024, 4, true), 4);
        assert_eq!(vec_width(1024, 2, true), 8);
        assert_eq!(vec_width(1028, 2, true), 1);
        assert_eq!(vec_width(1028, 4, true), 4);
        assert_eq!(vec_width(7, 4, true), 1);
        assert_eq!(vec_width(1024, 2, false), 1);
    }

    #[test]
    fn row_plans_fit_the_kernels_and_the_device() {
        for &h in HIDDEN {
            for &r in &[1u64, 3, 4, 5, 1000, 70_000, 1 << 26] {
                for es in [2usize, 4] {
                    let p = rows(r, h, es, true);
                    assert!(DeviceLimits::SM90.check("k", &p.cfg).is_ok(), "{r}x{h}");
                    let threads = p.cfg.threads_per_block();
                    match p.path {
                        RowPath::Warp => {
                            assert_eq!(threads, 128);
                            assert!(h <= 32 * WARP_ITEMS);
                        }
                        RowPath::Block => {
                            assert!(threads % 32 == 0 && threads <= BLOCK_THREADS as u64);
                            assert!(threads * BLOCK_ITEMS >= h, "{h}: {threads}");
                            // The fewest warps that hold the row.
                            assert!(threads == 32 || (threads - 32) * BLOCK_ITEMS < h);
                            // The kernel's chunks hold whole vectors.
                            assert_eq!(BLOCK_ITEMS % p.vec as u64, 0);
                        }
                        RowPath::Global => assert_eq!(threads, 1024),
                    }
                    if p.path != RowPath::Warp {
                        let covered = p.cfg.grid[0] as u64 * p.cfg.grid[1] as u64;
                        assert!(covered >= r && covered - r < p.cfg.grid[0] as u64);
                    }
                }
            }
        }
        // Too many rows for one launch: the launch check reports it.
        let p = rows(MAX_BLOCK_ROWS + 1, 5000, 2, true);
        assert!(DeviceLimits::SM90.check("k", &p.cfg).is_err());
    }

    #[test]
    fn forward_block_grids_give_every_row_to_one_block() {
        // The kernel's split: block b takes rows [b * per, min(b * per + per, rows))
        // with per = ceil(rows / blocks).
        for &r in &[
            1u64,
            7,
            2047,
            2048,
            4095,
            4096,
            10_922,
            16_384,
            32_768,
            70_001,
            1 << 26,
        ] {
            let p = forward(r, 4096, 2, true);
            assert_eq!(p.path, RowPath::Block);
            assert!(DeviceLimits::SM90.check("k", &p.cfg).is_ok(), "{r}");
            let blocks = p.cfg.grid[0] as u64 * p.cfg.grid[1] as u64;
            let per = r.div_ceil(blocks);
            assert!(per <= FWD_BLOCK_MAX_ROWS, "{r}: {per}");
            assert!(blocks * per >= r, "{r}: rows left over");
            // No block without a row but for the grid's rounding in y.
            assert!(blocks < r.div_ceil(per) + p.cfg.grid[0] as u64, "{r}");
            if r >= FWD_TARGET_BLOCKS * FWD_BLOCK_MAX_ROWS {
                assert_eq!(per, FWD_BLOCK_MAX_ROWS);
            }
            if r <= FWD_TARGET_BLOCKS {
                assert_eq!(per, 1);
            }
        }
        // Staged gamma/beta: 32 values per thread, their bytes in shared
        // memory; fp32 and unaligned rows keep the 24-value tile.
        for &h in &[1032u64, 4096, 8192, 12_288, BLOCK_MAX_HIDDEN] {
            let p = forward(100, h, 2, true);
            assert_eq!(p.path, RowPath::Block);
            let threads = p.cfg.threads_per_block();
            assert!(threads % 32 == 0 && threads * FWD_HELD_ITEMS >= h, "{h}");
            assert!(threads == 32 || (threads - 32) * FWD_HELD_ITEMS < h, "{h}");
            assert_eq!(p.cfg.dynamic_smem_bytes as u64, 4 * h);
            assert!(DeviceLimits::SM90.check("k", &p.cfg).is_ok(), "{h}");
            for q in [forward(100, h, 4, true), forward(100, h, 2, false)] {
                assert_eq!(q.cfg.block, [block_threads(h) as u32, 1, 1]);
                assert_eq!(q.cfg.dynamic_smem_bytes, 0);
            }
        }
        // Staged rows past the block path's backward limit: still the block
        // forward, up to 512 threads of 32 values and 64 KiB of parameters.
        for &h in &[BLOCK_MAX_HIDDEN + 8, 16_000, FWD_STAGED_MAX_HIDDEN] {
            let p = forward(100, h, 2, true);
            assert_eq!(p.path, RowPath::Block, "{h}");
            assert_eq!(rows(100, h, 2, true).path, RowPath::Global, "{h}");
            let threads = p.cfg.threads_per_block();
            assert!(
                threads <= BLOCK_THREADS as u64 && threads * FWD_HELD_ITEMS >= h,
                "{h}"
            );
            assert_eq!(p.cfg.dynamic_smem_bytes as u64, 4 * h);
            assert!(DeviceLimits::SM90.check("k", &p.cfg).is_ok(), "{h}");
            // Unstaged builds of the same width cannot hold the row.
            assert_eq!(forward(100, h, 4, true).path, RowPath::Global, "{h}");
            assert_eq!(forward(100, h, 2, false).path, RowPath::Global, "{h}");
        }
        // Other paths: the same plan as the input gradient.
        assert_eq!(forward(1000, 512, 2, true), rows(1000, 512, 2, true));
        assert_eq!(
            forward(1000, FWD_STAGED_MAX_HIDDEN + 8, 2, true),
            rows(1000, FWD_STAGED_MAX_HIDDEN + 8, 2, true)
        );
        assert_eq!(forward(1000, 50_000, 2, true), rows(1000, 50_000, 2, true));
    }

    #[test]
    fn param_grad_plans_cover_every_row_and_column() {
        for &h in HIDDEN {
            for &r in &[1u64, 15, 16, 17, 1000, 4097, 100_000] {
                let p = param_grads(r, h, 2, true, true);
                assert!(p.chunks * p.rows_per_chunk >= r);
                assert!((p.chunks - 1) * p.rows_per_chunk < r.max(1));
                let covered = p.cfg.grid[0] as u64 * p.cfg.block[0] as u64 * p.vec as u64;
                assert!(covered >= h);
                assert_eq!(h % p.vec as u64, 0);
                assert!(DeviceLimits::SM90.check("k", &p.cfg).is_ok());
                assert!(DeviceLimits::SM90.check("k", &p.reduce_cfg).is_ok());
                assert!(p.reduce_cfg.grid[0] as u64 * 32 >= h);
                assert_eq!(p.reduce_cfg.grid[1], 2);
                assert_eq!(p.reduce_cfg.block[1] as u64, reduce_split(p.chunks));
            }
        }
        assert_eq!(param_grads(9, 9, 4, true, false).reduce_cfg.grid[1], 1);
    }

    #[test]
    fn fused_backward_plans_cover_every_chunk() {
        for &h in HIDDEN {
            for &r in &[1u64, 31, 32, 33, 1000, 70_000, 1 << 26] {
                for es in [2usize, 4] {
                    let Some(f) = fused_backward(r, h, es, true, true) else {
                        assert!(
                            h > 8 * FUSED_PIPE_WIDE_MAX_HIDDEN
                                || (h > FUSED_BLOCK_MAX_HIDDEN && (es == 4 || h % 8 != 0))
                        );
                        continue;
                    };
                    assert_eq!(f.path, path(h));
                    assert!(DeviceLimits::SM90.check("k", &f.cfg).is_ok(), "{r}x{h}");
                    assert!(DeviceLimits::SM90.check("k", &f.reduce_cfg).is_ok());
                    assert!(f.chunks * f.rows_per_chunk >= r);
                    assert!((f.chunks - 1) * f.rows_per_chunk < r);
                    assert!(f.rows_per_chunk >= FUSED_MIN_ROWS_PER_CHUNK);
                    assert!(f.chunks <= FUSED_TARGET_CHUNKS);
                    if f.cluster > 1 {
                        // One cluster per chunk, along x.
                        assert_eq!(f.cfg.grid, [(f.chunks * f.cluster as u64) as u32, 1, 1]);
                    } else {
                        let covered = f.cfg.grid[0] as u64 * f.cfg.grid[1] as u64;
                        assert!(covered >= f.chunks && covered - f.chunks < f.cfg.grid[0] as u64);
                    }
                    assert_eq!(f.vec, rows(r, h, es, true).vec);
                    match f.path {
                        RowPath::Warp => {
                            assert_eq!(f.cfg.block, [128, 1, 1]);
                            assert_eq!(f.cfg.dynamic_smem_bytes, 0);
                        }
                        RowPath::Block => {
                            let t = f.cfg.block[0];
                            assert_eq!(t as u64, block_threads(h));
                            assert_eq!(f.pipelined, f.vec > 1 && es == 2);
                            if f.pipelined {
                                // gamma (fp32) and three stages of x, dy.
                                assert!(t <= BLOCK_THREADS && t as u64 * BLOCK_ITEMS >= h);
                                assert_eq!(f.cfg.dynamic_smem_bytes as u64, 16 * h);
                            } else {
                                // The fp32 accumulators.
                                assert!(t <= FUSED_BLOCK_THREADS && t as u64 * BLOCK_ITEMS >= h);
                                assert_eq!(f.cfg.dynamic_smem_bytes as u64, 8 * h);
                            }
                        }
                        RowPath::Global => {
                            // The wide pipelined build: three stages, gamma
                            // from global memory; past 16384 columns over
                            // the blocks of the smallest cluster that holds
                            // the row.
                            let t = f.cfg.block[0] as u64;
                            let c = f.cluster as u64;
                            let slice = cluster_slice(h, f.cluster);
                            assert!(f.pipelined && es == 2);
                            assert!(
                                t <= BLOCK_THREADS as u64 && t * FUSED_PIPE_WIDE_ITEMS >= slice
                            );
                            assert!(slice * c >= h && slice * (c - 1) < h && slice % 8 == 0);
                            assert_eq!(c == 1, h <= FUSED_PIPE_WIDE_MAX_HIDDEN);
                            assert!(c == 1 || (c / 2) * FUSED_PIPE_WIDE_MAX_HIDDEN < h);
                            assert_eq!(f.cfg.dynamic_smem_bytes as u64, 12 * slice);
                            let limits = DeviceLimits::SM90;
                            assert!(limits.check_cluster("k", f.cluster, &f.cfg).is_ok());
                        }
                    }
                    assert_eq!(f.reduce_cfg.block[1] as u64, reduce_split(f.chunks));
                }
            }
        }
        assert!(fused_backward(10, FUSED_BLOCK_MAX_HIDDEN + 1, 2, true, true).is_none());
        assert!(fused_backward(10, FUSED_BLOCK_MAX_HIDDEN + 8, 4, true, true).is_none());
        assert!(fused_backward(10, FUSED_BLOCK_MAX_HIDDEN, 4, true, true).is_some());
        // 16-bit 128-bit rows: the pipelined kernel, to the block path's end.
        let pipe = fused_backward(10, BLOCK_MAX_HIDDEN, 2, true, true).unwrap();
        assert!(pipe.pipelined && pipe.cfg.block[0] == BLOCK_THREADS);
        // On an sm_80 part (163 KiB per block) the widest rows are unfused.
        let a100 = DeviceLimits::SM80;
        assert!(fused_backward_within(10, 10_368, 2, true, true, a100).is_some());
        assert!(fused_backward_within(10, 10_416, 2, true, true, a100).is_some());
        assert!(fused_backward_within(10, 10_424, 2, true, true, a100).is_none());
        assert!(fused_backward_within(10, 12_288, 4, true, false, a100).is_none());
        assert!(fused_backward_within(10, 8192, 4, true, false, a100).is_some());
        assert!(fused_backward_within(10, 13_888, 2, true, true, a100).is_some());
        assert!(fused_backward_within(10, 13_896, 2, true, true, a100).is_none());
        assert!(fused_backward(10, BLOCK_MAX_HIDDEN, 2, false, true).is_none());
        let wide = fused_backward(10, FUSED_PIPE_WIDE_MAX_HIDDEN, 2, true, true).unwrap();
        assert!(wide.pipelined && wide.path == RowPath::Global && wide.cfg.block[0] == 512);
        assert_eq!(wide.cluster, 1);
        assert!(fused_backward(10, FUSED_PIPE_WIDE_MAX_HIDDEN, 4, true, true).is_none());
        // Wider 16-bit rows: clusters of 2, 4, 8 blocks, on sm_90 only.
        for (h, c, slice) in [(16_392, 2, 8200), (32_768, 2, 16_384), (32_776, 4, 8200)] {
            let f = fused_backward(70, h, 2, true, true).unwrap();
            assert_eq!((f.cluster, cluster_slice(h, c)), (c, slice), "{h}");
            assert!(fused_backward_within(70, h, 2, true, true, a100).is_none());
        }
        let f = fused_backward(2048, 65_536, 2, true, true).unwrap();
        assert_eq!((f.cluster, f.cfg.block[0], f.chunks), (4, 512, 64));
        assert_eq!(f.cfg.grid, [256, 1, 1]);
        assert_eq!(f.cfg.dynamic_smem_bytes, 3 * 2 * 2 * 16_384);
        assert_eq!(
            fused_backward(10, 131_072, 2, true, true).unwrap().cluster,
            8
        );
        assert!(fused_backward(10, 131_080, 2, true, true).is_none());
        assert!(fused_backward(10, 65_536, 4, true, true).is_none());
        assert!(fused_backward(10, 65_536, 2, false, true).is_none());
        let four = DeviceLimits {
            max_cluster_size: 4,
            ..DeviceLimits::SM90
        };
        assert!(fused_backward_within(10, 65_536, 2, true, true, four).is_some());
        assert!(fused_backward_within(10, 65_544, 2, true, true, four).is_none());
        // The chunking depends on the rows only.
        let a = fused_backward(100_000, 1024, 2, true, true).unwrap();
        let b = fused_backward(100_000, 4096, 4, false, false).unwrap();
        assert_eq!((a.rows_per_chunk, a.chunks), (b.rows_per_chunk, b.chunks));
        assert_eq!(b.reduce_cfg.grid[1], 1);
    }

    #[test]
    fn chunking_depends_on_rows_only() {
        let a = param_grads(10_000, 512, 2, true, true);
        let b = param_grads(10_000, 512, 4, false, false);
        assert_eq!(a.rows_per_chunk, b.rows_per_chunk);
        assert_eq!(a.chunks, b.chunks);
        assert_ne!(a.vec, b.vec);
    }
}
