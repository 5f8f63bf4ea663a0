//! Plans for the multi-tensor kernels (`cuda/multi_tensor.cu`): the chunk
//! table that lets one launch cover a whole list of tensors, and the grid.

use alloc::vec::Vec;

use super::div_ceil;
#[cfg(test)]
use super::MAX_GRID_STRIDE_BLOCKS;
use crate::core::error::{Error, Result};
use crate::core::launch::LaunchConfig;

/// Threads per block (`FTN_MT_THREADS` in the header).
pub const THREADS: u32 = 256;

/// Elements per chunk: 64 per thread; a multiple of `THREADS * 8` so every
/// chunk of an aligned tensor starts 16-byte aligned for every dtype.
pub const CHUNK_SIZE: u64 = 16384;

/// One entry of the chunk table (`FtnChunkDesc`): chunk `chunk` of tensor
/// `tensor`, elements `[chunk * CHUNK_SIZE, min((chunk + 1) * CHUNK_SIZE, numel))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub tensor: u32,
    pub chunk: u32,
}

/// A launch over a list of tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub chunks: Vec<Chunk>,
    pub chunk_size: u64,
    /// Grid-stride launch over the chunks (`None` when there are none).
    pub cfg: Option<LaunchConfig>,
}

/// The chunk table and grid for tensors of `numels` elements, in list order
/// (tensor by tensor, chunks ascending). It depends on the sizes alone, so a
/// reduction over the same list is bitwise reproducible.
pub fn plan(op: &'static str, numels: &[u64]) -> Result<Plan> {
    if numels.len() > u32::MAX as usize {
        return Err(Error::invalid(
            op,
            "tensors",
            "at most u32::MAX tensors",
            numels.len(),
        ));
    }
    let mut total: u64 = 0;
    for (i, &n) in numels.iter().enumerate() {
        if n > i64::MAX as u64 || div_ceil(n, CHUNK_SIZE) > u32::MAX as u64 {
            return Err(Error::invalid(
                op,
                "tensors",
                "tensors of at most u32::MAX chunks of 16384 elements",
                alloc::format!("tensor {i} of {n} elements"),
            ));
        }
        total = total.saturating_add(div_ceil(n, CHUNK_SIZE));
    }
    // The table itself must fit in memory (8 bytes a chunk).
    if total > (isize::MAX as u64) / 8 {
        return Err(Error::invalid(
            op,
            "tensors",
            "a chunk table that fits in memory",
            alloc::format!("{total} chunks"),
        ));
    }
    let mut chunks = Vec::with_capacity(total as usize);
    for (t, &n) in numels.iter().enumerate() {
        for c in 0..div_ceil(n, CHUNK_SIZE) {
            chunks.push(Chunk {
                tensor: t as u32,
                chunk: c as u32,
            });
        }
    }
    let cfg = (!chunks.is_empty()).then(|| {
        LaunchConfig::linear(
            (chunks.len() as u64).min(super::grid_caps().grid_stride_blocks) as u32,
            THREADS,
        )
    });
    Ok(Plan {
        chunks,
        chunk_size: CHUNK_SIZE,
        cfg,
    })
}

/// The launch of the final norm reduction: one block.
pub const fn final_reduce() -> LaunchConfig {
    LaunchConfig::linear(1, THREADS)
}

/// The launch of the one-thread scaler update.
pub const fn scaler_update() -> LaunchConfig {
    LaunchConfig::linear(1, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::launch::DeviceLimits;

    #[test]
    fn chunks_cover_every_element_once_in_order() {
        let numels = [0u64, 1, 16383, 16384, 16385, 0, 100_000, 7];
        let p = plan("op", &numels).unwrap();
        let mut covered = [0u64; 8];
        let mut last: Option<Chunk> = None;
        for ch in &p.chunks {
            let n = numels[ch.tensor as usize];
            let start = ch.chunk as u64 * p.chunk_size;
            assert!(start < n, "{ch:?}");
            covered[ch.tensor as usize] += (n - start).min(p.chunk_size);
            if let Some(l) = last {
                assert!((l.tensor, l.chunk) < (ch.tensor, ch.chunk));
            }
            last = Some(*ch);
        }
        assert_eq!(covered, numels);
        assert_eq!(p.chunks.len(), 1 + 1 + 1 + 2 + 7 + 1);
        let cfg = p.cfg.unwrap();
        assert_eq!(cfg.grid[0] as usize, p.chunks.len());
        assert!(DeviceLimits::SM90.check("k", &cfg).is_ok());
        assert_eq!(CHUNK_SIZE % (THREADS as u64 * 8), 0);
    }

    #[test]
    fn empty_lists_launch_nothing() {
        assert_eq!(plan("op", &[]).unwrap().cfg, None);
        assert_eq!(plan("op", &[0, 0]).unwrap().cfg, None);
    }

    #[test]
    fn grid_is_capped_and_sizes_are_checked() {
        let p = plan("op", &[CHUNK_SIZE * 100_000]).unwrap();
        assert_eq!(p.cfg.unwrap().grid[0] as u64, MAX_GRID_STRIDE_BLOCKS);
        let e = plan("op", &[u64::MAX]).unwrap_err();
        assert!(alloc::format!("{e}").contains("tensor 0"), "{e}");
    }
}
