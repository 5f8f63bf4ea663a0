//! The pipeline-parallel executor: runs one rank's share of a schedule from
//! [`crate::core::pipeline::schedule()`] over a [`Communicator`] (the pipeline
//! group, `size == pp`), calling the user's stage code for every operation
//! and moving activations and gradients between ranks.
//!
//! * The user's model is a [`PipelineStage`]: forward, input-gradient
//!   (`backward_input`) and weight-gradient (`backward_weight`) functions of
//!   one chunk (virtual stage) and one micro-batch. [`Pass::Backward`] runs
//!   `backward_input` then `backward_weight`; the zero-bubble schedules call
//!   them separately ([`Pass::BackwardInput`], [`Pass::BackwardWeight`]).
//!   The stage keeps whatever it needs between a micro-batch's forward and
//!   its backward (its input, for instance); the executor keeps received
//!   activations and gradients only until the operation that consumes them,
//!   and the last stage's forward outputs until their backward.
//! * [`PipelineData`] supplies the first stage's input of a micro-batch and,
//!   on the last stage, computes the loss and returns `d loss / d output`.
//! * Messages: an operation's receive is posted on the communicator's
//!   stream *before the previous operation's computation* (so the transfer
//!   overlaps it; Megatron posts the next receive with the current send,
//!   which is later) and waited for by the host (with the timeout) right
//!   before its own computation, which the compute stream orders after it
//!   with an event. At most one receive is ahead: receives stay in
//!   schedule order on that one stream, and the host waits no earlier
//!   than without the look-ahead, so the schedules' deadlock freedom is
//!   kept. Its send goes on a stream of the executor's
//!   own, one per peer, which waits for the computation (an event): sends
//!   to a peer complete in posting order and a send waiting for its
//!   receiver blocks neither receives nor sends to the other peer — the
//!   buffered sends the schedules' simulator checks for deadlocks (with
//!   NCCL's and the in-process backend's rendezvous sends on one stream,
//!   the interleaved schedule at pp = 2 deadlocks). A sent output is
//!   released as soon as its send completed (Megatron's
//!   `deallocate_output_tensor`) into a pool of buffers the executor
//!   reuses (saving an allocation per message; frees are stream-ordered
//!   and never wait, but an allocation still waits for the private
//!   allocation stream). Stage code should not synchronize the whole
//!   device while a send may be in flight (use its stream's
//!   `synchronize`/`copy_to_host`): a peer's matching receive may come
//!   only after this rank's next computation.
//! * Shapes ([`ShapeMode`]): by default every message has `activation_len`
//!   elements. [`PipelineExecutor::with_variable_shapes`]`(max_len)`
//!   precedes every activation and gradient by a one-element `i64` shape
//!   message on the same per-peer stream (the receiver: on the same
//!   communicator stream, right before the data), so shapes and data to
//!   one peer are matched in one order and cannot cross. The first stage's
//!   input sets a micro-batch's length, [`PipelineStage::output_len`] each
//!   stage's output length, the input gradient has the input's length. The
//!   shape receive is the one posted ahead; the data's receive is posted
//!   once the shape is known (when the operation needing it starts).
//!   Lengths outside `1..=max_len`, and a loss or received gradient whose
//!   length differs from its forward output's, are errors naming the
//!   argument (`input`, `output_len`, `shape message`, `loss_grad`,
//!   `received gradient`).
//! * Tied embeddings: [`TiedEmbeddingGroup`] sums the shared embedding's
//!   gradient between the first and the last pipeline rank after a run
//!   (a no-op on the others and at pp = 1).
//! * Errors: every wait is [`Communicator::wait`] with a timeout
//!   ([`PipelineExecutor::with_timeout`], default
//!   [`crate::comm::DEFAULT_TIMEOUT`]; in-process transfers also fail after
//!   the communicator's own timeout), so a failed or diverged peer becomes
//!   an error, not a hang. A stage's error, a data error and a communication
//!   error are returned as [`Error::Backend`] whose message names the
//!   pipeline rank, the pass, the micro-batch and the stage; before it
//!   returns, the executor waits (within the timeout) for the receive
//!   posted ahead and the sends in flight, so no buffer is dropped under a
//!   transfer.
//!
//! * Transfers ([`P2pMode`]): [`P2pMode::Streams`] (above; the default
//!   in-process) assumes buffered sends that progress independently;
//!   [`P2pMode::Grouped`] (the default on NCCL, whose sends are rendezvous
//!   and whose operations on one communicator may run one at a time) runs
//!   one planned group of sends and receives at a time on the
//!   communicator's stream ([`crate::core::pipeline::grouped_transfers`]).
//!
//! Not yet: a multi-GPU NCCL run, and coordination with tensor
//! parallelism (the stages may use their own TP communicator, as
//! `tests/pipeline_executor_tp.rs` does, but nothing here coordinates
//! them). The layer layout of the stages is
//! [`crate::core::pipeline::layout`]; the executor does not use it (the
//! stages build their layers from it).
//!
//! [`Pass::Backward`]: crate::core::pipeline::Pass::Backward
//! [`Pass::BackwardInput`]: crate::core::pipeline::Pass::BackwardInput
//! [`Pass::BackwardWeight`]: crate::core::pipeline::Pass::BackwardWeight
//! [`Communicator`]: crate::comm::Communicator
//! [`Communicator::wait`]: crate::comm::Communicator::wait
//! [`Error::Backend`]: crate::core::Error::Backend

mod executor;
mod grouped;
mod pool;
mod tied;
mod transfer;

pub use executor::{P2pMode, PipelineExecutor, ShapeMode};
pub use tied::{allreduce_tied_grads, TiedEmbeddingGroup};

use crate::backend::{DeviceBuffer, Stream};
use crate::comm::CommElement;
use crate::core::Result;

/// The user's model share on one pipeline rank: its chunks (virtual
/// stages; chunk `c` of rank `r` is global stage `c · pp + r`).
pub trait PipelineStage<T: CommElement> {
    /// `output = stage(input)` for `microbatch`, enqueued on `stream`. Save
    /// what the backward needs. Static shapes: both have `activation_len`
    /// elements; variable shapes ([`PipelineExecutor::with_variable_shapes`]):
    /// `input` has the length its sender announced (the first stage: the
    /// data's input) and `output` the length [`PipelineStage::output_len`]
    /// returned.
    fn forward(
        &mut self,
        stream: &Stream,
        chunk: usize,
        microbatch: usize,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
    ) -> Result<()>;

    /// `grad_input = d loss / d input` from `grad_output = d loss / d output`.
    fn backward_input(
        &mut self,
        stream: &Stream,
        chunk: usize,
        microbatch: usize,
        grad_output: &DeviceBuffer<T>,
        grad_input: &mut DeviceBuffer<T>,
    ) -> Result<()>;

    /// The weight gradients of `microbatch` (accumulated by the stage),
    /// always after that micro-batch's `backward_input` of the same chunk.
    fn backward_weight(&mut self, stream: &Stream, chunk: usize, microbatch: usize) -> Result<()>;

    /// Variable shapes only: the element count of `chunk`'s output for
    /// `microbatch` given its input's `input_len` (the executor allocates
    /// the output and announces it to the next stage). Default: the input's
    /// length (a transformer layer keeps `[seq, mb, hidden]`). In
    /// `backward_input`, `grad_output` has this length and `grad_input` the
    /// input's.
    fn output_len(&self, chunk: usize, microbatch: usize, input_len: usize) -> usize {
        let _ = (chunk, microbatch);
        input_len
    }

    /// Forward-only runs ([`PipelineExecutor::with_forward_only`]): called
    /// right after `forward(chunk, microbatch)`, whose backward will not
    /// come; drop what that forward saved for it. Default: nothing (a stage
    /// that saves nothing, or one that knows it is evaluating).
    fn release(&mut self, chunk: usize, microbatch: usize) -> Result<()> {
        let _ = (chunk, microbatch);
        Ok(())
    }
}

/// The ends of the pipeline: inputs of the first stage, loss of the last.
pub trait PipelineData<T: CommElement> {
    /// The first stage's input of `microbatch`: `activation_len` elements
    /// with static shapes; with variable shapes its length is the
    /// micro-batch's (e.g. `seq · mb · hidden`), `1..=max_len`.
    fn input(&mut self, stream: &Stream, microbatch: usize) -> Result<DeviceBuffer<T>>;

    /// Variable shapes with grouped transfers only: the length `input` will
    /// have for `microbatch`, asked for every micro-batch before the run
    /// (the lengths of every message are agreed on first, so no transfer
    /// waits for a shape). Default: unknown, which that mode refuses.
    fn input_len(&self, microbatch: usize) -> Option<usize> {
        let _ = microbatch;
        None
    }

    /// On the last stage: the loss of `microbatch` from its `output` (the
    /// implementation records it) and `d loss / d output`, as long as
    /// `output` (any other length is an error naming `loss_grad`).
    fn loss_grad(
        &mut self,
        stream: &Stream,
        microbatch: usize,
        output: &DeviceBuffer<T>,
    ) -> Result<DeviceBuffer<T>>;

    /// Forward-only runs, on the last stage: the loss of `microbatch` from
    /// its `output` (the implementation records it), no gradient. Default:
    /// [`Self::loss_grad`] with the gradient dropped.
    fn forward_loss(
        &mut self,
        stream: &Stream,
        microbatch: usize,
        output: &DeviceBuffer<T>,
    ) -> Result<()> {
        self.loss_grad(stream, microbatch, output).map(drop)
    }
}
