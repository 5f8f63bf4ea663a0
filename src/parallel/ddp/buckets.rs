//! Which gradients of the current backward are ready, per bucket: the host
//! bookkeeping behind [`super::DistributedDataParallel::mark_grad_ready`].

use crate::core::{Error, Result};

use super::buffers::{BucketId, ParamAndGradBuffers, ParamId};

/// Per-parameter ready flags and per-bucket counts of parameters not ready.
#[derive(Clone, Debug)]
pub(crate) struct Readiness {
    ready: Vec<bool>,
    /// Per group, per bucket: parameters still missing.
    missing: Vec<Vec<usize>>,
    /// Per group, per bucket: parameter count.
    sizes: Vec<Vec<usize>>,
    marked: usize,
}

impl Readiness {
    pub fn new(b: &ParamAndGradBuffers) -> Self {
        let sizes: Vec<Vec<usize>> = b
            .groups
            .iter()
            .map(|g| g.layout.buckets.iter().map(|k| k.params.len()).collect())
            .collect();
        Readiness {
            ready: vec![false; b.num_params()],
            missing: sizes.clone(),
            sizes,
            marked: 0,
        }
    }

    /// Marks a checked parameter ready; returns its bucket if that completed
    /// it. Error if it was marked before in this backward.
    pub fn mark(&mut self, b: &ParamAndGradBuffers, p: ParamId) -> Result<Option<BucketId>> {
        if self.ready[p.0] {
            return Err(Error::invalid(
                "DistributedDataParallel::mark_grad_ready",
                "param",
                "a gradient not yet marked ready in this backward",
                format!("'{}' (marked ready twice)", b.name(p.0)),
            ));
        }
        self.ready[p.0] = true;
        self.marked += 1;
        let bucket = b.bucket_of(p)?;
        let left = &mut self.missing[bucket.group][bucket.index];
        *left -= 1;
        Ok((*left == 0).then_some(bucket))
    }

    pub fn any_ready(&self) -> bool {
        self.marked > 0
    }

    pub fn all_ready(&self) -> bool {
        self.marked == self.ready.len()
    }

    /// Names of the parameters not marked ready.
    pub fn not_ready(&self, b: &ParamAndGradBuffers) -> Vec<String> {
        (0..self.ready.len())
            .filter(|&i| !self.ready[i])
            .map(|i| format!("'{}'", b.name(i)))
            .collect()
    }

    pub fn reset(&mut self) {
        self.ready.iter_mut().for_each(|r| *r = false);
        self.missing.clone_from(&self.sizes);
        self.marked = 0;
    }
}
