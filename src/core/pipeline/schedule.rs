//! Schedules: to be written (see the module docs of `core::pipeline`).

use alloc::vec::Vec;

use super::Op;
use crate::core::Result;

/// Which schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    /// `pp = 1`: forward and backward of every micro-batch in turn
    /// (gradient accumulation).
    NoPipelining,
    /// Megatron's non-interleaved 1F1B.
    OneFOneB,
    /// Megatron's interleaved 1F1B with `vp` virtual stages per rank and
    /// `microbatch_group_size_per_vp_stage` (`None`: `pp`).
    Interleaved { vp: usize, group: Option<usize> },
    /// Zero-bubble ZB-H1: backward split into B and W, W deferred.
    ZeroBubbleH1,
}

/// A pipeline: `pp` ranks, `microbatches` micro-batches, one schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    pub pp: usize,
    pub microbatches: usize,
    pub kind: ScheduleKind,
}

/// The operations of every rank, `result[rank]` in execution order.
pub fn schedule(_cfg: &PipelineConfig) -> Result<Vec<Vec<Op>>> {
    Ok(Vec::new())
}
