//! The ends of the pipeline for a GPT step ([`PipelineData`]): a 1-element
//! placeholder input for the first stage (the embedding reads the tokens
//! itself), and on the last stage the vocab-parallel cross-entropy of the
//! logits against the targets, its per-token losses kept for the report
//! and its gradient scaled by `loss_scale / (tokens · micro-batches)`.

use std::marker::PhantomData;

use crate::backend::{DeviceBuffer, Stream};
use crate::comm::Communicator;
use crate::core::{Error, Result};
use crate::parallel::linear::TpElement;
use crate::parallel::pipeline::PipelineData;
use crate::parallel::vocab::VocabParallelCrossEntropy;

pub(crate) struct LossData<'r, T: TpElement> {
    pub tp: &'r Communicator,
    /// Per micro-batch: `[tokens]` targets.
    pub labels: &'r [DeviceBuffer<i32>],
    pub ce: VocabParallelCrossEntropy,
    /// `[tokens]`, every element `loss_scale / (tokens · micro-batches)`.
    pub dloss: DeviceBuffer<f32>,
    /// Per micro-batch run on this rank: `[tokens]` losses.
    pub losses: Vec<DeviceBuffer<f32>>,
    pub _t: PhantomData<T>,
}

impl<'r, T: TpElement> LossData<'r, T> {
    /// Micro-batch `mb`'s targets.
    fn labels_of(&self, mb: usize) -> Result<&'r DeviceBuffer<i32>> {
        self.labels.get(mb).ok_or_else(|| {
            Error::invalid(
                "GptLoss",
                "microbatch",
                format!("< {}", self.labels.len()),
                mb,
            )
        })
    }
}

impl<T: TpElement> PipelineData<T> for LossData<'_, T> {
    fn input(&mut self, _stream: &Stream, _mb: usize) -> Result<DeviceBuffer<T>> {
        self.tp.device().alloc_zeros(1)
    }

    fn input_len(&self, _mb: usize) -> Option<usize> {
        Some(1)
    }

    fn loss_grad(
        &mut self,
        stream: &Stream,
        mb: usize,
        output: &DeviceBuffer<T>,
    ) -> Result<DeviceBuffer<T>> {
        let labels = self.labels_of(mb)?;
        let dev = self.tp.device();
        let mut loss = dev.alloc_zeros::<f32>(self.ce.tokens)?;
        let saved = self
            .ce
            .forward(self.tp, stream, output, labels, &mut loss)?;
        let mut grad = dev.alloc_zeros::<T>(output.len())?;
        self.ce.backward(
            self.tp,
            stream,
            output,
            labels,
            &saved,
            &self.dloss,
            &mut grad,
        )?;
        self.losses.push(loss);
        Ok(grad)
    }

    fn forward_loss(&mut self, stream: &Stream, mb: usize, output: &DeviceBuffer<T>) -> Result<()> {
        let labels = self.labels_of(mb)?;
        let mut loss = self.tp.device().alloc_zeros::<f32>(self.ce.tokens)?;
        self.ce
            .forward(self.tp, stream, output, labels, &mut loss)?;
        self.losses.push(loss);
        Ok(())
    }
}
