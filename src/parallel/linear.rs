//! Megatron-Core's `ColumnParallelLinear` and `RowParallelLinear` as explicit
//! forward and backward functions over device buffers and streams, built from
//! the GEMM family ([`crate::ops::gemm`]), the communicator and the mapping
//! primitives ([`super::mappings`]).
//!
//! Matrices are row-major; a layer computes `Y = X W^T (+ b)` with `X`
//! `[tokens, in]` and `W` `[out, in]`. `tokens` is always the full (gathered)
//! row count: with sequence parallelism a rank holds `tokens / tp` rows.
//!
//! * Column-parallel: rank `r` owns rows `[r*out/tp, (r+1)*out/tp)` of `W` and
//!   of `b`. Forward: (sequence parallel: all-gather the input rows) → local
//!   GEMM (bias or bias+GeLU fused in the epilogue, pre-activation saved) →
//!   (gather_output: all-gather the columns). Backward as Megatron overlaps
//!   it: dgrad `dX = dY W`, its all-reduce (reduce-scatter with sequence
//!   parallelism) started on the communicator's stream, wgrad `dW = dY^T X`
//!   and the bias gradient computed meanwhile on the compute stream (with
//!   sequence parallelism the input is all-gathered again for wgrad, also on
//!   the communication stream, before dgrad), then the compute stream waits.
//! * Row-parallel: rank `r` owns columns `[r*in/tp, (r+1)*in/tp)` of `W`; the
//!   bias is replicated. Forward: local GEMM of the parallel input → all-reduce
//!   (reduce-scatter rows with sequence parallelism). The bias is added once:
//!   fused into rank 0's GEMM epilogue before the sum, which equals adding it
//!   after the reduction (one rounding fewer). Backward: (sequence parallel:
//!   all-gather `dY` rows) → dgrad (optionally fused with the GeLU backward of
//!   the preceding column layer: the MLP's `dgelu`) → (input not parallel:
//!   its all-gather along columns started on the communication stream) →
//!   wgrad and bias gradient meanwhile → wait.
//!
//! Weight gradients are either stored in the input type or accumulated into
//! an fp32 `main_grad` with a `beta = 1` GEMM (Megatron's gradient-accumulation
//! fusion): [`WeightGrad`]. Bias gradients are column sums of `dY` in a fixed
//! order (bitwise reproducible), stored in the input type.
//!
//! Intermediate buffers live in the layer (grown on demand), so calls return
//! as soon as the work is enqueued; everything a call enqueues on the
//! communication stream is waited for by the compute stream before it
//! returns, so later work on the compute stream is ordered after it.
//! Every rank of the communicator must make the same calls in the same order.

use crate::backend::{Device, DeviceBuffer, DeviceRead, DeviceWrite, Event, Stream};
use crate::comm::{CommElement, Communicator, ReduceOp};
use crate::core::dtype::FloatElement;
use crate::core::{Element, Error, Result};
use crate::ops::gemm::{Aux, BiasGrad, Epilogue, Gemm, GemmInputs};
use crate::ops::{BiasGelu, Gelu};
use crate::parallel::mappings::Mapping;

const COL: &str = "ColumnParallelLinear";
const ROW: &str = "RowParallelLinear";

/// The element types of the parallel layers: fp16 and bf16 (the GEMM's
/// inputs) that the communicator can reduce.
pub trait TpElement: FloatElement + CommElement {}
impl<T: FloatElement + CommElement> TpElement for T {}

/// Where a weight gradient goes.
pub enum WeightGrad<'a, T: Element> {
    /// `grad = dW` in the input type (overwritten).
    Store(&'a mut dyn DeviceWrite<T>),
    /// `main_grad += dW` in fp32, fused into the GEMM (`beta = 1`).
    Accumulate(&'a mut dyn DeviceWrite<f32>),
}

/// The gradients a backward writes. `bias = None` skips the bias gradient.
pub struct LinearGrads<'a, T: Element> {
    pub weight: WeightGrad<'a, T>,
    pub bias: Option<&'a mut dyn DeviceWrite<T>>,
}

/// Rows `[rank*rows/tp, (rank+1)*rows/tp)` of a row-major `[rows, cols]`
/// matrix: a column-parallel weight (`[out, in]`) or bias (`cols = 1`) shard.
pub fn shard_rows<T: Copy>(
    full: &[T],
    rows: usize,
    cols: usize,
    tp: usize,
    rank: usize,
) -> Result<Vec<T>> {
    check_shard("shard_rows", full.len(), rows, cols, tp, rank, rows)?;
    let h = rows / tp;
    Ok(full[rank * h * cols..(rank + 1) * h * cols].to_vec())
}

/// Columns `[rank*cols/tp, (rank+1)*cols/tp)` of a row-major `[rows, cols]`
/// matrix: a row-parallel weight (`[out, in]`) shard.
pub fn shard_cols<T: Copy>(
    full: &[T],
    rows: usize,
    cols: usize,
    tp: usize,
    rank: usize,
) -> Result<Vec<T>> {
    check_shard("shard_cols", full.len(), rows, cols, tp, rank, cols)?;
    let w = cols / tp;
    if w == 0 {
        // Empty shard: do not walk `rows` empty rows (rows may be huge).
        return Ok(Vec::new());
    }
    Ok((0..rows)
        .flat_map(|i| {
            full[i * cols + rank * w..i * cols + (rank + 1) * w]
                .iter()
                .copied()
        })
        .collect())
}

fn check_shard(
    op: &'static str,
    len: usize,
    rows: usize,
    cols: usize,
    tp: usize,
    rank: usize,
    split: usize,
) -> Result<()> {
    if tp == 0 || rank >= tp {
        return Err(Error::invalid(
            op,
            "rank",
            format!("a rank in 0..{tp}"),
            rank,
        ));
    }
    if split % tp != 0 {
        return Err(Error::invalid(
            op,
            "tp",
            format!("a divisor of the split dimension {split}"),
            tp,
        ));
    }
    let n = crate::core::validate::elements(op, rows, cols)?;
    exact(op, "full", len, n, "rows * cols")
}

fn exact(op: &'static str, arg: &'static str, len: usize, want: usize, what: &str) -> Result<()> {
    if len != want {
        return Err(Error::invalid(
            op,
            arg,
            format!("exactly {want} elements ({what})"),
            len,
        ));
    }
    Ok(())
}

fn product(op: &'static str, arg: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid(op, arg, "a size that fits in usize", "an overflow"))
}

/// `v` is a multiple of `tp`.
pub(crate) fn divides(op: &'static str, arg: &'static str, v: usize, tp: usize) -> Result<()> {
    if tp == 0 || v % tp != 0 {
        return Err(Error::invalid(
            op,
            arg,
            format!("a multiple of the tensor-parallel size {tp}"),
            v,
        ));
    }
    Ok(())
}

/// `v >= 1`, else an error naming `arg` (a zero-sized layer is a caller
/// error, not an empty layer).
pub(crate) fn positive(op: &'static str, arg: &'static str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(Error::invalid(op, arg, "a size >= 1", 0));
    }
    Ok(())
}

/// Checks that `comm` is the one a layer or block was built for (`tp`
/// ranks, this one `rank`) and, with sequence parallelism, that `tokens`
/// splits over them; returns this rank's rows (`tokens / tp` with sequence
/// parallelism, else `tokens`).
pub(crate) fn check_comm(
    op: &'static str,
    comm: &Communicator,
    (tp, rank): (usize, usize),
    sequence_parallel: bool,
    tokens: usize,
) -> Result<usize> {
    if comm.size() != tp || comm.rank() != rank {
        return Err(Error::invalid(
            op,
            "comm",
            format!("rank {rank} of the {tp}-rank communicator it was built for"),
            format!("rank {} of {}", comm.rank(), comm.size()),
        ));
    }
    if sequence_parallel {
        divides(op, "tokens", tokens, tp)?;
        Ok(tokens / tp)
    } else {
        Ok(tokens)
    }
}

/// Intermediate buffers owned by a layer, handed out as non-owning views.
struct Scratch<T: Element> {
    slots: Vec<Option<DeviceBuffer<T>>>,
}

impl<T: Element> Scratch<T> {
    fn new() -> Self {
        Scratch { slots: Vec::new() }
    }

    /// A view of `len` elements of slot `slot`, grown on demand (growing drops
    /// the old buffer, which waits for the device's pending work).
    fn view(&mut self, device: &Device, slot: usize, len: usize) -> Result<DeviceBuffer<T>> {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        let s = &mut self.slots[slot];
        if s.as_ref().is_none_or(|b| b.len() < len.max(1)) {
            *s = None;
            *s = Some(device.alloc_zeros::<T>(len.max(1))?);
        }
        let addr = s.as_ref().map_or(0, |b| b.addr());
        // SAFETY: the slot's buffer holds at least `len` elements of `T` and is
        // owned by the layer: it is freed only when replaced or when the layer
        // drops, both of which wait for the device's pending work (a
        // DeviceBuffer drop does), so the view stays valid for all work
        // enqueued with it.
        unsafe { DeviceBuffer::from_raw_parts(device, addr, len) }
    }
}

/// Runs `f` on the communicator's stream after the work enqueued so far on
/// `compute` (`overlap`), or on `compute` itself (serialised).
fn start_comm(
    comm: &Communicator,
    compute: &Stream,
    overlap: bool,
    f: impl FnOnce(&Stream) -> Result<()>,
) -> Result<Event> {
    let s = if overlap {
        let ev = compute.record_event()?;
        comm.stream().wait_event(&ev)?;
        comm.stream()
    } else {
        compute
    };
    f(s)?;
    // For the compute stream to wait on: an event after the work on `s`.
    s.record_event()
}

fn wgrad<T: TpElement>(
    stream: &Stream,
    (out, inp, tokens): (usize, usize, usize),
    dy: &dyn DeviceRead<T>,
    x: &dyn DeviceRead<T>,
    grad: &mut WeightGrad<'_, T>,
) -> Result<()> {
    let g = Gemm::new(out, inp, tokens).trans_a(true);
    match grad {
        WeightGrad::Store(w) => g.run(
            stream,
            GemmInputs {
                a: dy,
                b: x,
                bias: None,
                c: None,
            },
            Aux::None,
            &mut **w,
        ),
        WeightGrad::Accumulate(m) => g.beta(1.0).run(
            stream,
            GemmInputs::<T, f32> {
                a: dy,
                b: x,
                bias: None,
                c: None,
            },
            Aux::None,
            &mut **m,
        ),
    }
}

fn check_grads<T: Element>(
    op: &'static str,
    grads: &LinearGrads<'_, T>,
    weight_len: usize,
    bias_len: Option<usize>,
) -> Result<()> {
    let wl = match &grads.weight {
        WeightGrad::Store(b) => b.len(),
        WeightGrad::Accumulate(b) => b.len(),
    };
    exact(op, "grads.weight", wl, weight_len, "the weight shard")?;
    match (&grads.bias, bias_len) {
        (Some(b), Some(n)) => exact(op, "grads.bias", b.len(), n, "the bias"),
        (Some(_), None) => Err(Error::invalid(
            op,
            "grads.bias",
            "None for a layer without bias",
            "a buffer",
        )),
        (None, _) => Ok(()),
    }
}

/// Options of [`ColumnParallelLinear`] (defaults: bias on, everything else
/// off, communication overlapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnOptions {
    pub bias: bool,
    /// All-gather the output columns: every rank gets `[tokens, out]`.
    pub gather_output: bool,
    /// Do not add the bias; the caller adds `layer.bias` later (fused).
    pub skip_bias_add: bool,
    /// The input is `[tokens/tp, in]` (sequence-sharded) and is all-gathered.
    pub sequence_parallel: bool,
    /// GeLU fused in the forward GEMM's epilogue (`Y = gelu(X W^T + b)`);
    /// forward stores the pre-activation, backward takes it back.
    pub activation: Option<Gelu>,
    /// Backward communication on the communicator's stream, overlapped with
    /// wgrad (`false`: serialised on the compute stream, for comparison).
    pub overlap: bool,
}

impl Default for ColumnOptions {
    fn default() -> Self {
        ColumnOptions {
            bias: true,
            gather_output: false,
            skip_bias_add: false,
            sequence_parallel: false,
            activation: None,
            overlap: true,
        }
    }
}

/// One rank's shard of a column-parallel linear layer.
pub struct ColumnParallelLinear<T: TpElement> {
    pub in_features: usize,
    pub out_features: usize,
    tp: usize,
    rank: usize,
    /// `[out/tp, in]`.
    pub weight: DeviceBuffer<T>,
    /// `[out/tp]`.
    pub bias: Option<DeviceBuffer<T>>,
    pub options: ColumnOptions,
    scratch: Scratch<T>,
}

impl<T: TpElement> ColumnParallelLinear<T> {
    /// This rank's shard of the full `[out, in]` weight and `[out]` bias
    /// (given iff `options.bias`).
    pub fn from_full(
        comm: &Communicator,
        in_features: usize,
        out_features: usize,
        full_weight: &[T],
        full_bias: Option<&[T]>,
        options: ColumnOptions,
    ) -> Result<Self> {
        let (tp, r) = (comm.size(), comm.rank());
        positive(COL, "in_features", in_features)?;
        positive(COL, "out_features", out_features)?;
        divides(COL, "out_features", out_features, tp)?;
        if options.sequence_parallel && options.gather_output {
            return Err(Error::invalid(
                COL,
                "options",
                "gather_output off with sequence_parallel",
                "both on",
            ));
        }
        if options.activation.is_some() && options.skip_bias_add {
            return Err(Error::invalid(
                COL,
                "options",
                "skip_bias_add off with a fused activation",
                "both on",
            ));
        }
        let w = shard_rows(full_weight, out_features, in_features, tp, r).map_err(|_| {
            Error::invalid(COL, "full_weight", "out * in elements", full_weight.len())
        })?;
        let dev = comm.device();
        let bias = match (options.bias, full_bias) {
            (true, Some(b)) => {
                exact(COL, "full_bias", b.len(), out_features, "out_features")?;
                Some(dev.upload(&shard_rows(b, out_features, 1, tp, r)?)?)
            }
            (false, None) => None,
            (true, None) => {
                return Err(Error::invalid(
                    COL,
                    "full_bias",
                    "a bias (options.bias)",
                    "None",
                ))
            }
            (false, Some(_)) => {
                return Err(Error::invalid(
                    COL,
                    "full_bias",
                    "None (options.bias is off)",
                    "a bias",
                ))
            }
        };
        Ok(ColumnParallelLinear {
            in_features,
            out_features,
            tp,
            rank: r,
            weight: dev.upload(&w)?,
            bias,
            options,
            scratch: Scratch::new(),
        })
    }

    /// Size of the communicator the layer was built for.
    pub fn tp(&self) -> usize {
        self.tp
    }

    /// Rank the layer holds the shard of.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Output columns on this rank.
    pub fn out_per_rank(&self) -> usize {
        self.out_features / self.tp
    }

    fn check_comm(&self, comm: &Communicator, tokens: usize) -> Result<()> {
        let at = (self.tp, self.rank);
        check_comm(COL, comm, at, self.options.sequence_parallel, tokens).map(drop)
    }

    fn input_rows(&self, tokens: usize) -> usize {
        if self.options.sequence_parallel {
            tokens / self.tp
        } else {
            tokens
        }
    }

    fn output_cols(&self) -> usize {
        if self.options.gather_output {
            self.out_features
        } else {
            self.out_per_rank()
        }
    }

    /// `output = [gelu](input W^T + b)`: `input` `[tokens, in]` (`[tokens/tp,
    /// in]` with sequence parallelism), `output` `[tokens, out/tp]` (`[tokens,
    /// out]` with gather_output). `pre` (`[tokens, out/tp]`) receives the
    /// pre-activation; required iff `options.activation` is set.
    pub fn forward(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        output: &mut dyn DeviceWrite<T>,
        pre: Option<&mut dyn DeviceWrite<T>>,
        tokens: usize,
    ) -> Result<()> {
        self.check_comm(comm, tokens)?;
        let (inp, op) = (self.in_features, self.out_per_rank());
        let rows = self.input_rows(tokens);
        exact(
            COL,
            "input",
            input.len(),
            product(COL, "input", rows, inp)?,
            "[rows, in]",
        )?;
        let out_n = product(COL, "output", tokens, self.output_cols())?;
        exact(COL, "output", output.len(), out_n, "[tokens, out columns]")?;
        let local_n = product(COL, "output", tokens, op)?;
        if self.options.activation.is_some() != pre.is_some() {
            return Err(Error::invalid(
                COL,
                "pre",
                "a buffer iff options.activation is set",
                if pre.is_some() { "a buffer" } else { "None" },
            ));
        }
        if let Some(p) = &pre {
            exact(COL, "pre", p.len(), local_n, "[tokens, out/tp]")?;
        }
        let dev = comm.device().clone();
        let gathered;
        let x = if self.options.sequence_parallel {
            let mut g = self
                .scratch
                .view(&dev, 0, product(COL, "input", tokens, inp)?)?;
            comm.all_gather(stream, input, &mut g)?;
            gathered = g;
            &gathered
        } else {
            input
        };
        let add_bias = !self.options.skip_bias_add;
        let bias = self.bias.as_ref().filter(|_| add_bias);
        let (epi, aux) = match (self.options.activation, pre) {
            (Some(g), Some(p)) => (Epilogue::BiasGelu(g), Aux::Store(p)),
            _ if bias.is_some() => (Epilogue::Bias, Aux::None),
            _ => (Epilogue::None, Aux::None),
        };
        let gemm = Gemm::new(tokens, op, inp).trans_b(true).epilogue(epi);
        let inputs = GemmInputs {
            a: x,
            b: &self.weight,
            bias: bias.map(|b| b as _),
            c: None,
        };
        if self.options.gather_output {
            let mut local = self.scratch.view(&dev, 1, local_n)?;
            gemm.run(stream, inputs, aux, &mut local)?;
            Mapping::GatherFromTp.forward(comm, stream, &local, output, (tokens, op))
        } else {
            gemm.run(stream, inputs, aux, output)
        }
    }

    /// Gradients from `grad_output` (shaped like the forward's output):
    /// `grad_input` (shaped like `input`, the forward's input, passed again),
    /// the weight and bias gradients. With `options.activation`, `pre` is the
    /// forward's pre-activation and `grad_output` the gradient of the
    /// activated output; `pre = None` means `grad_output` is already the
    /// gradient of the pre-activation (the GeLU backward was fused into the
    /// next layer's dgrad, as [`RowParallelLinear::backward`]'s `dgelu`).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        grad_output: &dyn DeviceRead<T>,
        pre: Option<&dyn DeviceRead<T>>,
        grad_input: &mut dyn DeviceWrite<T>,
        mut grads: LinearGrads<'_, T>,
        tokens: usize,
    ) -> Result<()> {
        self.check_comm(comm, tokens)?;
        let (inp, op, tp) = (self.in_features, self.out_per_rank(), self.tp);
        let rows = self.input_rows(tokens);
        let in_n = product(COL, "input", rows, inp)?;
        exact(COL, "input", input.len(), in_n, "[rows, in]")?;
        exact(COL, "grad_input", grad_input.len(), in_n, "[rows, in]")?;
        let out_n = product(COL, "grad_output", tokens, self.output_cols())?;
        exact(
            COL,
            "grad_output",
            grad_output.len(),
            out_n,
            "[tokens, out columns]",
        )?;
        let local_n = product(COL, "grad_output", tokens, op)?;
        if self.options.activation.is_none() && pre.is_some() {
            return Err(Error::invalid(
                COL,
                "pre",
                "None for a layer without activation",
                "a buffer",
            ));
        }
        if let Some(p) = pre {
            exact(COL, "pre", p.len(), local_n, "[tokens, out/tp]")?;
        }
        check_grads(
            COL,
            &grads,
            self.weight.len(),
            self.bias.as_ref().map(|_| op),
        )?;
        let dev = comm.device().clone();
        let overlap = self.options.overlap;

        // dY of this rank's columns, then through the GeLU.
        let split;
        let mut dy = grad_output;
        if self.options.gather_output {
            let mut s = self.scratch.view(&dev, 1, local_n)?;
            Mapping::GatherFromTp.backward(
                comm,
                stream,
                grad_output,
                &mut s,
                (tokens, self.out_features),
            )?;
            split = s;
            dy = &split;
        }
        let through;
        if let (Some(g), Some(p)) = (self.options.activation, pre) {
            let mut d = self.scratch.view(&dev, 2, local_n)?;
            BiasGelu::new(tokens, op)
                .with_gelu(g)
                .backward(stream, dy, p, None, &mut d, None)?;
            through = d;
            dy = &through;
        }

        // Sequence parallel: all-gather the input again for wgrad, started
        // before dgrad so it runs meanwhile.
        let sp = self.options.sequence_parallel && tp > 1;
        let mut x = input;
        let gathered;
        let mut ag = None;
        if self.options.sequence_parallel {
            let mut g = self
                .scratch
                .view(&dev, 0, product(COL, "input", tokens, inp)?)?;
            ag = Some(start_comm(comm, stream, overlap && sp, |s| {
                comm.all_gather(s, input, &mut g).map(drop)
            })?);
            gathered = g;
            x = &gathered;
        }

        // dgrad, then its reduction on the communication stream.
        let dgrad = Gemm::new(tokens, inp, op);
        let reduce = if self.options.sequence_parallel {
            let mut partial = self
                .scratch
                .view(&dev, 3, product(COL, "input", tokens, inp)?)?;
            dgrad.run(
                stream,
                GemmInputs {
                    a: dy,
                    b: &self.weight,
                    bias: None,
                    c: None,
                },
                Aux::None,
                &mut partial,
            )?;
            if let Some(h) = &ag {
                stream.wait_event(h)?;
            }
            start_comm(comm, stream, overlap && sp, |s| {
                comm.reduce_scatter(s, &partial, grad_input, ReduceOp::Sum)
                    .map(drop)
            })?
        } else {
            dgrad.run(
                stream,
                GemmInputs {
                    a: dy,
                    b: &self.weight,
                    bias: None,
                    c: None,
                },
                Aux::None,
                grad_input,
            )?;
            start_comm(comm, stream, overlap && tp > 1, |s| {
                comm.all_reduce_in_place(s, grad_input, ReduceOp::Sum)
                    .map(drop)
            })?
        };

        // wgrad and the bias gradient meanwhile.
        wgrad(stream, (op, inp, tokens), dy, x, &mut grads.weight)?;
        if let Some(db) = grads.bias.as_deref_mut() {
            BiasGrad::new(tokens, op).run(stream, dy, db)?;
        }
        stream.wait_event(&reduce)
    }
}

/// Options of [`RowParallelLinear`] (defaults: bias on, parallel input,
/// everything else off, communication overlapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowOptions {
    pub bias: bool,
    /// The input is already split along columns (`[tokens, in/tp]`); else it
    /// is `[tokens, in]` and split here.
    pub input_is_parallel: bool,
    /// Do not add the bias; the caller adds `layer.bias` later (fused).
    pub skip_bias_add: bool,
    /// Reduce-scatter the output rows (`[tokens/tp, out]`) instead of
    /// all-reducing; requires `input_is_parallel`.
    pub sequence_parallel: bool,
    /// Backward communication overlapped with wgrad (see [`ColumnOptions`]).
    pub overlap: bool,
}

impl Default for RowOptions {
    fn default() -> Self {
        RowOptions {
            bias: true,
            input_is_parallel: true,
            skip_bias_add: false,
            sequence_parallel: false,
            overlap: true,
        }
    }
}

/// One rank's shard of a row-parallel linear layer.
pub struct RowParallelLinear<T: TpElement> {
    pub in_features: usize,
    pub out_features: usize,
    tp: usize,
    rank: usize,
    /// `[out, in/tp]`.
    pub weight: DeviceBuffer<T>,
    /// `[out]`, replicated.
    pub bias: Option<DeviceBuffer<T>>,
    pub options: RowOptions,
    scratch: Scratch<T>,
}

impl<T: TpElement> RowParallelLinear<T> {
    /// This rank's shard of the full `[out, in]` weight; the `[out]` bias
    /// (given iff `options.bias`) is replicated.
    pub fn from_full(
        comm: &Communicator,
        in_features: usize,
        out_features: usize,
        full_weight: &[T],
        full_bias: Option<&[T]>,
        options: RowOptions,
    ) -> Result<Self> {
        let (tp, r) = (comm.size(), comm.rank());
        positive(ROW, "in_features", in_features)?;
        divides(ROW, "in_features", in_features, tp)?;
        positive(ROW, "out_features", out_features)?;
        if options.sequence_parallel && !options.input_is_parallel {
            return Err(Error::invalid(
                ROW,
                "options",
                "input_is_parallel with sequence_parallel",
                "input_is_parallel off",
            ));
        }
        let w = shard_cols(full_weight, out_features, in_features, tp, r).map_err(|_| {
            Error::invalid(ROW, "full_weight", "out * in elements", full_weight.len())
        })?;
        let dev = comm.device();
        let bias = match (options.bias, full_bias) {
            (true, Some(b)) => {
                exact(ROW, "full_bias", b.len(), out_features, "out_features")?;
                Some(dev.upload(b)?)
            }
            (false, None) => None,
            (true, None) => {
                return Err(Error::invalid(
                    ROW,
                    "full_bias",
                    "a bias (options.bias)",
                    "None",
                ))
            }
            (false, Some(_)) => {
                return Err(Error::invalid(
                    ROW,
                    "full_bias",
                    "None (options.bias is off)",
                    "a bias",
                ))
            }
        };
        Ok(RowParallelLinear {
            in_features,
            out_features,
            tp,
            rank: r,
            weight: dev.upload(&w)?,
            bias,
            options,
            scratch: Scratch::new(),
        })
    }

    /// Size of the communicator the layer was built for.
    pub fn tp(&self) -> usize {
        self.tp
    }

    /// Rank the layer holds the shard of.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Input columns on this rank.
    pub fn in_per_rank(&self) -> usize {
        self.in_features / self.tp
    }

    fn check_comm(&self, comm: &Communicator, tokens: usize) -> Result<()> {
        let at = (self.tp, self.rank);
        check_comm(ROW, comm, at, self.options.sequence_parallel, tokens).map(drop)
    }

    fn input_cols(&self) -> usize {
        if self.options.input_is_parallel {
            self.in_per_rank()
        } else {
            self.in_features
        }
    }

    fn output_rows(&self, tokens: usize) -> usize {
        if self.options.sequence_parallel {
            tokens / self.tp
        } else {
            tokens
        }
    }

    /// `output = reduce(input_r W_r^T) + b`: `input` `[tokens, in/tp]`
    /// (`[tokens, in]` unless input_is_parallel), `output` `[tokens, out]`
    /// (`[tokens/tp, out]` with sequence parallelism).
    pub fn forward(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        output: &mut dyn DeviceWrite<T>,
        tokens: usize,
    ) -> Result<()> {
        self.check_comm(comm, tokens)?;
        let (ip, out) = (self.in_per_rank(), self.out_features);
        let in_n = product(ROW, "input", tokens, self.input_cols())?;
        exact(ROW, "input", input.len(), in_n, "[tokens, in columns]")?;
        let out_n = product(ROW, "output", self.output_rows(tokens), out)?;
        exact(ROW, "output", output.len(), out_n, "[rows, out]")?;
        let dev = comm.device().clone();
        let split;
        let mut x = input;
        if !self.options.input_is_parallel {
            let mut s = self
                .scratch
                .view(&dev, 0, product(ROW, "input", tokens, ip)?)?;
            Mapping::ScatterToTp.forward(
                comm,
                stream,
                input,
                &mut s,
                (tokens, self.in_features),
            )?;
            split = s;
            x = &split;
        }
        // The bias joins rank 0's partial product: added once to the sum.
        let bias = self
            .bias
            .as_ref()
            .filter(|_| !self.options.skip_bias_add && self.rank == 0);
        let gemm = Gemm::new(tokens, out, ip)
            .trans_b(true)
            .epilogue(if bias.is_some() {
                Epilogue::Bias
            } else {
                Epilogue::None
            });
        let inputs = GemmInputs {
            a: x,
            b: &self.weight,
            bias: bias.map(|b| b as _),
            c: None,
        };
        if self.options.sequence_parallel {
            let mut partial = self
                .scratch
                .view(&dev, 1, product(ROW, "output", tokens, out)?)?;
            gemm.run(stream, inputs, Aux::None, &mut partial)?;
            comm.reduce_scatter(stream, &partial, output, ReduceOp::Sum)?;
        } else {
            gemm.run(stream, inputs, Aux::None, output)?;
            if self.tp > 1 {
                comm.all_reduce_in_place(stream, output, ReduceOp::Sum)?;
            }
        }
        Ok(())
    }

    /// Gradients from `grad_output` (shaped like the forward's output):
    /// `grad_input` (shaped like `input`, passed again), weight and bias.
    /// `dgelu = Some((gelu, pre))` fuses the GeLU backward of a preceding
    /// fused column layer into dgrad: `grad_input = (dY W) * gelu'(pre)`
    /// (requires `input_is_parallel`; `pre` is `[tokens, in/tp]`).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        grad_output: &dyn DeviceRead<T>,
        dgelu: Option<(Gelu, &dyn DeviceRead<T>)>,
        grad_input: &mut dyn DeviceWrite<T>,
        mut grads: LinearGrads<'_, T>,
        tokens: usize,
    ) -> Result<()> {
        self.check_comm(comm, tokens)?;
        let (ip, out, tp) = (self.in_per_rank(), self.out_features, self.tp);
        let in_n = product(ROW, "input", tokens, self.input_cols())?;
        exact(ROW, "input", input.len(), in_n, "[tokens, in columns]")?;
        exact(
            ROW,
            "grad_input",
            grad_input.len(),
            in_n,
            "[tokens, in columns]",
        )?;
        let go_n = product(ROW, "grad_output", self.output_rows(tokens), out)?;
        exact(ROW, "grad_output", grad_output.len(), go_n, "[rows, out]")?;
        let local_n = product(ROW, "input", tokens, ip)?;
        if let Some((_, pre)) = dgelu {
            if !self.options.input_is_parallel {
                return Err(Error::invalid(
                    ROW,
                    "dgelu",
                    "None unless input_is_parallel",
                    "a pre-activation",
                ));
            }
            exact(ROW, "dgelu", pre.len(), local_n, "[tokens, in/tp]")?;
        }
        check_grads(
            ROW,
            &grads,
            self.weight.len(),
            self.bias.as_ref().map(|_| out),
        )?;
        let dev = comm.device().clone();
        let overlap = self.options.overlap && tp > 1;

        // Sequence parallel: the full dY (backward of the reduce-scatter).
        let gathered;
        let mut dy = grad_output;
        if self.options.sequence_parallel {
            let mut g = self
                .scratch
                .view(&dev, 2, product(ROW, "grad_output", tokens, out)?)?;
            comm.all_gather(stream, grad_output, &mut g)?;
            gathered = g;
            dy = &gathered;
        }
        // This rank's input columns (split again when the input is whole).
        let split;
        let mut x = input;
        if !self.options.input_is_parallel {
            let mut s = self.scratch.view(&dev, 0, local_n)?;
            Mapping::ScatterToTp.forward(
                comm,
                stream,
                input,
                &mut s,
                (tokens, self.in_features),
            )?;
            split = s;
            x = &split;
        }

        // dgrad (optionally through the GeLU), then its gather if needed.
        let (epi, aux) = match dgelu {
            Some((g, pre)) => (Epilogue::DGelu(g), Aux::PreActivation(pre)),
            None => (Epilogue::None, Aux::None),
        };
        let dgrad = Gemm::new(tokens, ip, out).epilogue(epi);
        let inputs = GemmInputs {
            a: dy,
            b: &self.weight,
            bias: None,
            c: None,
        };
        let gather = if self.options.input_is_parallel {
            dgrad.run(stream, inputs, aux, grad_input)?;
            None
        } else {
            let mut dx = self.scratch.view(&dev, 3, local_n)?;
            dgrad.run(stream, inputs, aux, &mut dx)?;
            Some(start_comm(comm, stream, overlap, |s| {
                Mapping::ScatterToTp.backward(comm, s, &dx, grad_input, (tokens, ip))
            })?)
        };

        wgrad(stream, (out, ip, tokens), dy, x, &mut grads.weight)?;
        if let Some(db) = grads.bias.as_deref_mut() {
            BiasGrad::new(tokens, out).run(stream, dy, db)?;
        }
        match gather {
            Some(h) => stream.wait_event(&h),
            None => Ok(()),
        }
    }
}
