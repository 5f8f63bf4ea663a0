//! Tied embeddings: the word embedding on the first pipeline stage and the
//! output projection on the last share one weight, so after a batch each
//! of the two ranks holds one part of its gradient and both need the sum
//! (Megatron's `finalize_model_grads` → `_allreduce_word_embedding_grads`
//! over its embedding group).
//!
//! [`TiedEmbeddingGroup::new`] builds that group once — a sub-communicator
//! of the pipeline communicator's first and last rank (every pipeline rank
//! takes part in building it, as in every split) — and
//! [`TiedEmbeddingGroup::allreduce`] sums a gradient buffer in place on
//! those two ranks; on the middle ranks, and when `pp = 1` (where the
//! embedding and the output projection are on the same rank and the
//! stage adds its two gradients itself), it does nothing.

use std::time::Duration;

use crate::backend::{DeviceBuffer, DeviceWrite, Stream};
use crate::comm::{CommElement, Communicator, ReduceOp, DEFAULT_TIMEOUT};
use crate::core::{Error, Result};

/// The first and last rank of a pipeline communicator, for the tied
/// embedding's gradient.
pub struct TiedEmbeddingGroup {
    /// `Some` on the first and the last rank when `pp >= 2`.
    group: Option<Communicator>,
    rank: usize,
    pp: usize,
}

impl std::fmt::Debug for TiedEmbeddingGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TiedEmbeddingGroup(pipeline rank {} of {}, member: {})",
            self.rank,
            self.pp,
            self.group.is_some()
        )
    }
}

impl TiedEmbeddingGroup {
    /// Every rank of the pipeline communicator `pipeline` must call it
    /// (from its own thread or process), in the same order relative to its
    /// other splits.
    pub fn new(pipeline: &Communicator) -> Result<Self> {
        let (rank, pp) = (pipeline.rank(), pipeline.size());
        let group = if pp < 2 {
            None
        } else {
            let member = rank == 0 || rank == pp - 1;
            let g = pipeline.split(member.then_some(0), rank)?;
            match (member, g) {
                (true, Some(g)) => Some(g),
                (false, None) => None,
                (true, None) | (false, Some(_)) => {
                    return Err(Error::Backend {
                        backend: "pipeline executor",
                        message: format!(
                            "pipeline rank {rank}: the tied-embedding split returned an \
                             unexpected group membership"
                        ),
                    })
                }
            }
        };
        Ok(TiedEmbeddingGroup { group, rank, pp })
    }

    /// Whether this rank holds a tied weight (first or last rank, pp ≥ 2).
    pub fn is_member(&self) -> bool {
        self.group.is_some()
    }

    /// Sums `grad` between the first and the last pipeline rank, in place,
    /// on `stream`, and waits for it (failing after `timeout` if the other
    /// rank does not take part); a no-op elsewhere. Both ranks' `grad` must
    /// have the same length (a mismatch is an error on both, not a hang).
    pub fn allreduce<T: CommElement>(
        &self,
        stream: &Stream,
        grad: &mut dyn DeviceWrite<T>,
        timeout: Duration,
    ) -> Result<()> {
        let Some(g) = &self.group else {
            return Ok(());
        };
        let (rank, pp, len) = (self.rank, self.pp, grad.len());
        let h = g
            .all_reduce_in_place(stream, grad, ReduceOp::Sum)
            .map_err(|e| fail(rank, pp, len, e))?;
        g.wait(&h, timeout).map_err(|e| fail(rank, pp, len, e))?;
        stream.synchronize().map_err(|e| fail(rank, pp, len, e))
    }
}

fn fail(rank: usize, pp: usize, len: usize, e: Error) -> Error {
    Error::Backend {
        backend: "pipeline executor",
        message: format!(
            "pipeline rank {rank}: all-reducing the tied embedding gradient ({len} elements) \
             between ranks 0 and {}: {e}",
            pp - 1
        ),
    }
}

/// One-off [`TiedEmbeddingGroup::new`] + [`TiedEmbeddingGroup::allreduce`]
/// with [`DEFAULT_TIMEOUT`]: every rank of `pipeline` must call it. Keep a
/// [`TiedEmbeddingGroup`] instead when this runs every step (a split is a
/// collective of its own).
pub fn allreduce_tied_grads<T: CommElement>(
    pipeline: &Communicator,
    stream: &Stream,
    grad: &mut DeviceBuffer<T>,
) -> Result<()> {
    TiedEmbeddingGroup::new(pipeline)?.allreduce(stream, grad, DEFAULT_TIMEOUT)
}
