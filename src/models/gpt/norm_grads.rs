//! The sequence-parallel LayerNorm gradients' tensor-parallel all-reduce,
//! coalesced: with sequence parallelism each rank's LayerNorm weight and
//! bias gradients sum over its own rows only, so they are summed over the
//! tensor-parallel group before the data-parallel reduction. One
//! collective for all of a chunk's (4 per layer, 2 for the final
//! LayerNorm) instead of one each: they are copied into one flat fp32
//! buffer, reduced, and copied back (as Megatron flattens them). The sums
//! are the same element by element; only the collective count changes.

use crate::backend::{DeviceBuffer, DeviceRead, DeviceWrite, Stream};
use crate::comm::{Communicator, ReduceOp};
use crate::core::Result;
use crate::parallel::ddp::{ParamAndGradBuffers, ParamId};

/// The coalesced all-reduce with its flat buffer kept between steps
/// (grown to the largest chunk's total, never shrunk). Used on one stream,
/// the trainer's compute stream, so each use is ordered after the last.
#[derive(Default)]
pub(crate) struct NormGradReducer {
    flat: Option<DeviceBuffer<f32>>,
}

impl NormGradReducer {
    /// `grad(id) = Σ over tp ranks of grad(id)` for every `id`, as one
    /// all-reduce on `stream` (nothing for an empty list).
    pub(crate) fn all_reduce(
        &mut self,
        tp: &Communicator,
        stream: &Stream,
        grads: &ParamAndGradBuffers,
        ids: &[ParamId],
    ) -> Result<()> {
        let mut views = ids
            .iter()
            .map(|&id| grads.grad::<f32>(id))
            .collect::<Result<Vec<_>>>()?;
        let total: usize = views.iter().map(|v| v.len()).sum();
        if total == 0 {
            return Ok(());
        }
        if self.flat.as_ref().is_none_or(|f| f.len() < total) {
            if let Some(old) = self.flat.take() {
                old.free_on(stream)?;
            }
            self.flat = Some(tp.device().alloc_zeros::<f32>(total)?);
        }
        let Some(buf) = self.flat.as_mut() else {
            return Ok(());
        };
        let (mut flat, _) = buf.view_mut().split_at_mut(total)?;
        let mut rest = flat.view_mut();
        for v in &views {
            let (mut head, tail) = rest.split_at_mut(v.len())?;
            stream.copy_device(v, &mut head)?;
            rest = tail;
        }
        tp.all_reduce_in_place(stream, &mut flat, ReduceOp::Sum)?;
        let mut rest = flat.view();
        for v in &mut views {
            let (head, tail) = rest.split_at(v.len())?;
            stream.copy_device(&head, v)?;
            rest = tail;
        }
        Ok(())
    }
}
