//! The tensor-parallel MLP block of a transformer layer, built from the
//! parallel linear layers: `Y = gelu(X W1^T + b1) W2^T + b2`.
//!
//! * fc1 is a [`ColumnParallelLinear`] `[hidden -> ffn]` with the bias and
//!   GeLU fused in the GEMM epilogue; its pre-activation is saved.
//! * fc2 is a [`RowParallelLinear`] `[ffn -> hidden]` taking fc1's column
//!   shard as its parallel input; its dgrad is fused with the GeLU backward
//!   (`dgelu`), so fc1's backward gets the gradient of the pre-activation.
//!
//! Without sequence parallelism `X` and `Y` are `[tokens, hidden]` on every
//! rank (fc1's backward all-reduces `dX`, fc2's forward all-reduces `Y`).
//! With it, `X` and `Y` are this rank's `[tokens/tp, hidden]` rows (fc1
//! all-gathers `X`, fc2 reduce-scatters `Y`; backward mirrored). The
//! backward communication is overlapped with the weight gradients as
//! [`crate::parallel::linear`] describes, or serialised on the compute stream
//! (`overlap = false`, for comparison).
//!
//! The block keeps the activations it needs for backward (`[tokens, ffn/tp]`
//! GeLU output and pre-activation) from the last forward; `backward` must
//! follow a forward of the same `tokens` and be given the same input.

use crate::backend::{DeviceBuffer, DeviceRead, DeviceWrite, Stream};
use crate::comm::Communicator;
use crate::core::{Error, Result};
use crate::ops::Gelu;
use crate::parallel::linear::{
    check_comm, ColumnOptions, ColumnParallelLinear, LinearGrads, RowOptions, RowParallelLinear,
    TpElement,
};

const OP: &str = "TpMlp";

/// Options of [`TpMlp`] (defaults: tanh GeLU, no sequence parallelism,
/// overlapped backward communication).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlpOptions {
    pub gelu: Gelu,
    /// Input and output sharded along tokens (`[tokens/tp, hidden]`).
    pub sequence_parallel: bool,
    /// Backward communication on the communicator's stream, overlapped with
    /// the weight gradients (`false`: serialised on the compute stream).
    pub overlap: bool,
}

impl Default for MlpOptions {
    fn default() -> Self {
        MlpOptions {
            gelu: Gelu::Tanh,
            sequence_parallel: false,
            overlap: true,
        }
    }
}

/// The gradients of a [`TpMlp`] backward: fc1 `[ffn/tp, hidden]` weight and
/// `[ffn/tp]` bias shards, fc2 `[hidden, ffn/tp]` weight shard and the
/// replicated `[hidden]` bias.
pub struct MlpGrads<'a, T: TpElement> {
    pub fc1: LinearGrads<'a, T>,
    pub fc2: LinearGrads<'a, T>,
}

/// The activations one [`TpMlp`] forward keeps for its backward (the GeLU
/// output and its pre-activation, `[tokens, ffn/tp]` each), moved out with
/// [`TpMlp::take_saved`].
pub struct MlpSaved<T: TpElement> {
    tokens: usize,
    h: DeviceBuffer<T>,
    pre: DeviceBuffer<T>,
}

impl<T: TpElement> MlpSaved<T> {
    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        (self.h.len() + self.pre.len()) * std::mem::size_of::<T>()
    }

    /// Tokens of the forward that saved them.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

/// One rank's shard of the tensor-parallel MLP block.
pub struct TpMlp<T: TpElement> {
    pub hidden: usize,
    pub ffn: usize,
    pub options: MlpOptions,
    pub fc1: ColumnParallelLinear<T>,
    pub fc2: RowParallelLinear<T>,
    /// `(tokens, gelu output, pre-activation)` of the last forward.
    saved: Option<(usize, DeviceBuffer<T>, DeviceBuffer<T>)>,
    grad_h: Option<DeviceBuffer<T>>,
}

/// A buffer of exactly `len` elements, reallocated only when `len` changes.
pub(crate) fn exact_buf<'a, T: TpElement>(
    slot: &'a mut Option<DeviceBuffer<T>>,
    comm: &Communicator,
    len: usize,
) -> Result<&'a mut DeviceBuffer<T>> {
    if slot.as_ref().is_none_or(|b| b.len() != len) {
        *slot = None;
        *slot = Some(comm.device().alloc_zeros::<T>(len)?);
    }
    slot.as_mut()
        .ok_or_else(|| Error::invalid(OP, "scratch", "an allocated buffer", "none"))
}

/// Checks a block's input and output before any state changes: `comm` is
/// the block's ([`check_comm`]) and both tensors are `[rows, hidden]` on
/// this rank.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_block_io(
    op: &'static str,
    comm: &Communicator,
    at: (usize, usize),
    sequence_parallel: bool,
    tokens: usize,
    hidden: usize,
    input: usize,
    output: usize,
) -> Result<()> {
    let rows = check_comm(op, comm, at, sequence_parallel, tokens)?;
    let n = rows
        .checked_mul(hidden)
        .ok_or_else(|| Error::invalid(op, "tokens", "a size that fits in usize", tokens))?;
    for (arg, len) in [("input", input), ("output", output)] {
        if len != n {
            return Err(Error::invalid(
                op,
                arg,
                format!("exactly {rows} x {hidden} = {n} elements for {tokens} tokens"),
                len,
            ));
        }
    }
    Ok(())
}

impl<T: TpElement> TpMlp<T> {
    /// This rank's shards of the full fc1 weight `[ffn, hidden]` and bias
    /// `[ffn]` and fc2 weight `[hidden, ffn]` and bias `[hidden]`
    /// (Megatron's `[out, in]` layout); `ffn` must be a multiple of `tp`.
    #[allow(clippy::too_many_arguments)]
    pub fn from_full(
        comm: &Communicator,
        hidden: usize,
        ffn: usize,
        fc1_weight: &[T],
        fc1_bias: &[T],
        fc2_weight: &[T],
        fc2_bias: &[T],
        options: MlpOptions,
    ) -> Result<Self> {
        crate::parallel::linear::positive(OP, "hidden", hidden)?;
        crate::parallel::linear::positive(OP, "ffn", ffn)?;
        if ffn % comm.size() != 0 {
            return Err(Error::invalid(
                OP,
                "ffn",
                format!("a multiple of the tensor-parallel size {}", comm.size()),
                ffn,
            ));
        }
        let co = ColumnOptions {
            activation: Some(options.gelu),
            sequence_parallel: options.sequence_parallel,
            overlap: options.overlap,
            ..Default::default()
        };
        let ro = RowOptions {
            sequence_parallel: options.sequence_parallel,
            overlap: options.overlap,
            ..Default::default()
        };
        Ok(TpMlp {
            hidden,
            ffn,
            options,
            fc1: ColumnParallelLinear::from_full(
                comm,
                hidden,
                ffn,
                fc1_weight,
                Some(fc1_bias),
                co,
            )?,
            fc2: RowParallelLinear::from_full(comm, ffn, hidden, fc2_weight, Some(fc2_bias), ro)?,
            saved: None,
            grad_h: None,
        })
    }

    /// `tokens` of the last forward (what [`TpMlp::backward`] will use), if any.
    pub fn saved_tokens(&self) -> Option<usize> {
        self.saved.as_ref().map(|s| s.0)
    }

    /// Moves the last forward's saved activations out of the block (for
    /// pipeline schedules that run several micro-batches' forwards before
    /// their backwards); `None` if there are none. The next forward then
    /// allocates fresh buffers.
    pub fn take_saved(&mut self) -> Option<MlpSaved<T>> {
        self.saved
            .take()
            .map(|(tokens, h, pre)| MlpSaved { tokens, h, pre })
    }

    /// Puts back activations [`TpMlp::take_saved`] took (from this block or
    /// one of the same shape), for the matching backward. Errors (nothing
    /// changes): buffers not shaped `[tokens, ffn/tp]` for this block.
    pub fn restore_saved(&mut self, saved: MlpSaved<T>) -> Result<()> {
        let want = saved
            .tokens
            .checked_mul(self.fc1.out_per_rank())
            .ok_or_else(|| {
                Error::invalid(OP, "saved", "a size that fits in usize", saved.tokens)
            })?;
        if saved.h.len() != want || saved.pre.len() != want {
            return Err(Error::invalid(
                OP,
                "saved",
                format!("activations of {want} elements ([tokens, ffn/tp])"),
                format!("{} and {}", saved.h.len(), saved.pre.len()),
            ));
        }
        self.saved = Some((saved.tokens, saved.h, saved.pre));
        Ok(())
    }

    /// Rows of the input and output on this rank: `tokens / tp` with
    /// sequence parallelism (an error, never truncated, when `tokens` is
    /// not a multiple of `tp`), else `tokens`.
    pub fn rows(&self, comm: &Communicator, tokens: usize) -> Result<usize> {
        if self.options.sequence_parallel {
            crate::parallel::linear::divides(OP, "tokens", tokens, comm.size())?;
            Ok(tokens / comm.size())
        } else {
            Ok(tokens)
        }
    }

    /// `output = gelu(input W1^T + b1) W2^T + b2`, `input` and `output`
    /// `[tokens, hidden]` (`[tokens/tp, hidden]` with sequence parallelism).
    /// Saves the activations for [`TpMlp::backward`].
    pub fn forward(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        output: &mut dyn DeviceWrite<T>,
        tokens: usize,
    ) -> Result<()> {
        // Everything that can be wrong with the call is checked before the
        // saved activations are touched: a rejected forward keeps them.
        check_block_io(
            OP,
            comm,
            (self.fc2.tp(), self.fc2.rank()),
            self.options.sequence_parallel,
            tokens,
            self.hidden,
            input.len(),
            output.len(),
        )?;
        let n = tokens
            .checked_mul(self.fc1.out_per_rank())
            .ok_or_else(|| Error::invalid(OP, "tokens", "a size that fits in usize", tokens))?;
        let (mut h, mut pre) = match self.saved.take() {
            Some((_, h, p)) if h.len() == n => (h, p),
            _ => (
                comm.device().alloc_zeros::<T>(n)?,
                comm.device().alloc_zeros::<T>(n)?,
            ),
        };
        self.fc1
            .forward(comm, stream, input, &mut h, Some(&mut pre), tokens)?;
        self.fc2.forward(comm, stream, &h, output, tokens)?;
        self.saved = Some((tokens, h, pre));
        Ok(())
    }

    /// Gradients from `grad_output` (shaped like the output): `grad_input`
    /// (shaped like `input`, which must be the last forward's input) and the
    /// weight and bias gradients of both layers. Enqueued on `stream`; all
    /// communication is ordered before the call's later work on `stream`.
    pub fn backward(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        grad_output: &dyn DeviceRead<T>,
        grad_input: &mut dyn DeviceWrite<T>,
        grads: MlpGrads<'_, T>,
    ) -> Result<()> {
        let Some((tokens, h, pre)) = self.saved.as_ref() else {
            return Err(Error::invalid(
                OP,
                "backward",
                "a preceding forward",
                "no saved activations",
            ));
        };
        let tokens = *tokens;
        let dh = exact_buf(&mut self.grad_h, comm, h.len())?;
        self.fc2.backward(
            comm,
            stream,
            h,
            grad_output,
            Some((self.options.gelu, pre)),
            dh,
            grads.fc2,
            tokens,
        )?;
        self.fc1
            .backward(comm, stream, input, dh, None, grad_input, grads.fc1, tokens)
    }
}
