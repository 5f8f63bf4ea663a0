//! The tensor-parallel self-attention block of a transformer layer, causal
//! (a decoder's) or with a padding mask (an encoder's: [`AttentionMask`]),
//! built from the parallel linear layers, the batched GEMM and the fused
//! scale + mask + softmax:
//!
//! ```text
//! QKV = X Wqkv^T + bqkv                  ColumnParallelLinear (heads split)
//! P   = softmax(mask(Q K^T / sqrt(d)))    batched GEMM + fused softmax
//! C   = P V                               batched GEMM
//! Y   = C Wo^T + bo                       RowParallelLinear
//! ```
//!
//! # Layouts
//! * Tokens are ordered sequence-major like Megatron's `[s, b, h]`: row
//!   `i * batch + b` is position `i` of sequence `b` (`tokens = seq * batch`).
//!   With sequence parallelism a rank holds the contiguous rows
//!   `[r * tokens/tp, (r+1) * tokens/tp)` of `X` and `Y`.
//! * The full QKV weight is `[3 * heads * head_dim, hidden]` with its rows
//!   (and the bias) ordered `(head, {q, k, v}, dim)`: row
//!   `n*3d + p*d + j`. The column-parallel shard of rank `r` thus holds whole
//!   heads `[r*heads/tp, (r+1)*heads/tp)`, and the local QKV activation
//!   `[tokens, 3*hp*d]` (`hp = heads/tp`) holds, for batch entry
//!   `k = b*hp + n`, `Q_k` at column `n*3d` of rows `i*batch + b`. In
//!   elements: `Q_k[i, j] = qkv[i*L + k*3d + j]` with `L = batch*3*hp*d`; `K`
//!   and `V` are at `+d` and `+2d`. So every per-head product is ONE batched
//!   GEMM over the `batch*hp` entries (leading dimension `L`, batch stride
//!   `3d`), without any transpose of the inputs.
//! * Scores and probabilities are packed `[batch, hp, seq, seq]` (the fused
//!   softmax's layout); the probabilities are kept for backward.
//! * The context `C` is the row-parallel input `[tokens, hp*d]`, heads
//!   interleaved per token (column `n*d + j`), matching the rows of the
//!   output projection's full `[hidden, heads*d]` weight shard. The GEMM's
//!   output must be a non-interleaved batch, so `P V` (and the backward's
//!   `dQ`, `dK`, `dV`) are written packed `[batch*hp, seq, d]` and moved into
//!   place with strided 2-D copies ([`copy_2d`]): `min(batch*hp, seq)`
//!   copies per tensor.
//!
//! # Backward
//! The output projection's backward gives `dC`; then `dP = dC V^T`,
//! `dV = P^T dC`, `dS = softmax_backward(P, dP)` (the scale is included),
//! `dQ = dS K`, `dK = dS^T Q` (all batched), `dQKV` assembled, and the QKV
//! layer's backward gives `dX` and the QKV gradients. Communication (and its
//! overlap with the weight gradients) is that of the two linear layers.
//!
//! # Attention dropout
//! With [`AttentionOptions::attention_dropout`] `= p > 0` and
//! [`TpAttention::forward_with_dropout`] in [`DropoutMode::Train`], `C = P_d V`
//! with `P_d = dropout(P, p)` (kept values scaled by `1/(1-p)`), fused into the
//! softmax ([`ScaleMaskSoftmax::forward_dropout`]). Element `i` of the
//! packed `[batch, hp, seq, seq]` probabilities draws random value
//! `offset + i` of the state's Philox stream; the heads are sharded, so pass a
//! state of the **model-parallel stream**
//! ([`crate::core::rng::MODEL_PARALLEL_STREAM`], seeded differently on every
//! tensor-parallel rank, as Megatron does), drawing
//! [`TpAttention::random_values`] values. The saved activations keep the
//! state: backward regenerates the mask (`dV = P_d^T dC`, and the softmax
//! backward takes `dP_d` through the mask).
//!
//! # Selective recomputation
//! With [`AttentionOptions::recompute_core`] (Korthikanti et al., "Reducing
//! Activation Recomputation in Large Transformer Models"), forward keeps only
//! QKV and the context; backward recomputes `Q K^T`, the softmax and the
//! dropout from the saved QKV and Philox state with the same kernels, so the
//! gradients equal the stored path's bit for bit while the `5·a·s/h` bytes per
//! token and hidden unit of the probabilities are not held between forward
//! and backward.
//!
//! # Saved activations as values
//! [`TpAttention::take_saved`] moves the last forward's activations out
//! ([`AttentionSaved`], with [`AttentionSaved::bytes`] for memory reports)
//! and [`TpAttention::restore_saved`] puts them back before their backward:
//! several micro-batches' forwards can run before their backwards (pipeline
//! parallelism).

use crate::backend::{DeviceBuffer, DeviceRead, DeviceWrite, Stream};
use crate::comm::Communicator;
use crate::core::{Element, Error, Result};
use crate::ops::copy::{copy_2d, Block2d};
use crate::ops::dropout::DropoutMode;
use crate::ops::gemm::{Aux, Gemm, GemmInputs};
use crate::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask};
use crate::parallel::linear::{
    ColumnOptions, ColumnParallelLinear, LinearGrads, RowOptions, RowParallelLinear, TpElement,
};
use crate::parallel::mlp::{check_block_io, exact_buf};

const OP: &str = "TpAttention";

/// Options of [`TpAttention`] (defaults: no sequence parallelism, overlapped
/// backward communication, no attention dropout, probabilities stored).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionOptions {
    /// Input and output sharded along tokens (`[tokens/tp, hidden]`).
    pub sequence_parallel: bool,
    /// Backward communication overlapped with the weight gradients.
    pub overlap: bool,
    /// Dropout probability on the attention probabilities, in `[0, 1)`;
    /// applied only by [`TpAttention::forward_with_dropout`] in
    /// [`DropoutMode::Train`].
    pub attention_dropout: f32,
    /// Selective recomputation: forward does not keep the softmax / dropout
    /// outputs; backward recomputes them from the saved QKV (bitwise the
    /// same gradients).
    pub recompute_core: bool,
}

impl Default for AttentionOptions {
    fn default() -> Self {
        AttentionOptions {
            sequence_parallel: false,
            overlap: true,
            attention_dropout: 0.0,
            recompute_core: false,
        }
    }
}

fn check_dropout(p: f32) -> Result<()> {
    if (0.0..1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::invalid(
            OP,
            "options.attention_dropout",
            "a probability in [0, 1)",
            p,
        ))
    }
}

/// Which scores a [`TpAttention`] forward masks (Megatron's
/// `AttnMaskType`: causal or padding).
#[derive(Clone, Copy, Debug)]
pub enum AttentionMask<'a> {
    /// Position `i` attends to positions `<= i` (a decoder: GPT).
    Causal,
    /// uint8 `[batch, 1, seq, seq]` (one mask per sequence, shared by the
    /// heads) or `[1, 1, seq, seq]` (one for the whole batch): nonzero =
    /// masked, the scaled score becomes -10000 (Megatron's fused softmax);
    /// an encoder's padding (BERT). A row with every key masked gives zero
    /// probabilities, as the fused softmax does. With
    /// [`AttentionOptions::recompute_core`] the block keeps a copy of it
    /// for the backward's recomputation (`batch·seq²` or `seq²` bytes).
    Padding(&'a dyn DeviceRead<u8>),
}

/// The forward's mask as the backward needs it: only a recomputing
/// backward does, and a padding mask is then held as a copy.
enum KeptMask {
    /// The probabilities are stored: the backward needs no mask.
    Unneeded,
    Causal,
    Padding(DeviceBuffer<u8>),
}

/// The gradients of a [`TpAttention`] backward: the QKV shards (`[3*hp*d,
/// hidden]` weight, `[3*hp*d]` bias) and the output projection's
/// (`[hidden, hp*d]` weight shard, replicated `[hidden]` bias).
pub struct AttentionGrads<'a, T: TpElement> {
    pub qkv: LinearGrads<'a, T>,
    pub proj: LinearGrads<'a, T>,
}

/// The activations one [`TpAttention`] forward saves for its backward, as a
/// value: [`TpAttention::take_saved`] moves them out of the layer and
/// [`TpAttention::restore_saved`] back in (several micro-batches in flight
/// with pipeline parallelism). They own device memory
/// ([`AttentionSaved::bytes`]) and remember the forward's dropout state.
pub struct AttentionSaved<T: Element> {
    seq: usize,
    batch: usize,
    /// `[tokens, 3*hp*d]`.
    qkv: DeviceBuffer<T>,
    /// Undropped probabilities `[batch, hp, seq, seq]`; `None` with
    /// selective recomputation.
    probs: Option<DeviceBuffer<T>>,
    /// Dropped probabilities (the `P V` operand); `None` without dropout or
    /// with selective recomputation.
    dropped: Option<DeviceBuffer<T>>,
    /// `[tokens, hp*d]`.
    ctx: DeviceBuffer<T>,
    /// `Train(state)` when attention dropout was applied, else `Eval`.
    mode: DropoutMode,
    /// The drop probability of that dropout (0 with `Eval`).
    p: f32,
    /// The mask, for a backward that recomputes the probabilities.
    mask: KeptMask,
}

impl<T: Element> AttentionSaved<T> {
    /// Device bytes held (for activation-memory reports).
    pub fn bytes(&self) -> usize {
        let n = self.qkv.len()
            + self.ctx.len()
            + self.probs.as_ref().map_or(0, DeviceBuffer::len)
            + self.dropped.as_ref().map_or(0, DeviceBuffer::len);
        let mask = match &self.mask {
            KeptMask::Padding(m) => m.len(),
            KeptMask::Unneeded | KeptMask::Causal => 0,
        };
        n * T::DTYPE.size() + mask
    }

    /// `(seq, batch)` of the forward that saved them.
    pub fn shape(&self) -> (usize, usize) {
        (self.seq, self.batch)
    }

    /// The dropout the forward applied: `Train(state)` (the backward
    /// regenerates its mask from `state`) or `Eval` (none).
    pub fn dropout(&self) -> DropoutMode {
        self.mode
    }

    /// Whether the probabilities are held (`false`: selective
    /// recomputation, the backward recomputes them).
    pub fn holds_probabilities(&self) -> bool {
        self.probs.is_some()
    }
}

struct Scratch<T: Element> {
    scores: Option<DeviceBuffer<T>>,
    packed: [Option<DeviceBuffer<T>>; 3],
    dctx: Option<DeviceBuffer<T>>,
    dqkv: Option<DeviceBuffer<T>>,
    /// Probabilities (and dropped ones) not kept: selective recomputation.
    probs: Option<DeviceBuffer<T>>,
    dropped: Option<DeviceBuffer<T>>,
}

impl<T: Element> Default for Scratch<T> {
    fn default() -> Self {
        Scratch {
            scores: None,
            packed: [None, None, None],
            dctx: None,
            dqkv: None,
            probs: None,
            dropped: None,
        }
    }
}

/// One rank's shard of the tensor-parallel self-attention block (causal,
/// or with a padding mask: [`TpAttention::forward_masked`]).
pub struct TpAttention<T: TpElement> {
    pub hidden: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub options: AttentionOptions,
    pub qkv: ColumnParallelLinear<T>,
    pub proj: RowParallelLinear<T>,
    tp: usize,
    saved: Option<AttentionSaved<T>>,
    scratch: Scratch<T>,
}

fn mul(arg: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid(OP, arg, "a size that fits in usize", "an overflow"))
}

/// A non-owning view of `buf` from element `offset` on.
fn view_from<T: Element>(buf: &dyn DeviceRead<T>, offset: usize) -> Result<DeviceBuffer<T>> {
    let len = buf
        .len()
        .checked_sub(offset)
        .ok_or_else(|| Error::invalid(OP, "offset", format!("<= {}", buf.len()), offset))?;
    let addr = buf.addr() + (offset * T::DTYPE.size()) as u64;
    // SAFETY: `[offset, len)` lies inside `buf`, which outlives every use of
    // the view in this module (the views are dropped before the owning
    // buffers, which wait for pending device work when they drop); the
    // address is aligned for `T` since `buf`'s is and `offset` counts whole
    // elements.
    unsafe { DeviceBuffer::from_raw_parts(buf.device(), addr, len) }
}

/// Reuses `old` when it has `n` elements, else allocates.
fn reuse<T: TpElement>(
    old: Option<DeviceBuffer<T>>,
    comm: &Communicator,
    n: usize,
) -> Result<DeviceBuffer<T>> {
    match old {
        Some(b) if b.len() == n => Ok(b),
        _ => comm.device().alloc_zeros::<T>(n),
    }
}

/// Scores `S_k = Q_k K_k^T` of the `bh` entries, straight from the QKV
/// activation (`l = bh*3d`). Forward and recomputation share it, so the
/// recomputed scores are the forward's bit for bit.
fn scores_gemm<T: TpElement>(
    stream: &Stream,
    qkv: &dyn DeviceRead<T>,
    scores: &mut dyn DeviceWrite<T>,
    (bh, seq, d): (usize, usize, usize),
) -> Result<()> {
    let l = bh * 3 * d;
    let q = view_from(qkv, 0)?;
    let k = view_from(qkv, d)?;
    Gemm::new(seq, seq, d)
        .trans_b(true)
        .batch(bh)
        .lds(Some(l), Some(l), None, None, None)
        .strides(Some(3 * d), Some(3 * d), None, None, None)
        .run(
            stream,
            GemmInputs {
                a: &q,
                b: &k,
                bias: None,
                c: None,
            },
            Aux::None,
            scores,
        )
}

/// The masked softmax of the scores into `probs` and, with dropout, the
/// dropped probabilities into `dropped` (forward and recomputation).
fn core_probs<T: TpElement>(
    softmax: &ScaleMaskSoftmax,
    stream: &Stream,
    scores: &dyn DeviceRead<T>,
    mask: SoftmaxMask<'_>,
    probs: &mut dyn DeviceWrite<T>,
    dropped: Option<&mut dyn DeviceWrite<T>>,
    mode: DropoutMode,
) -> Result<()> {
    match dropped {
        Some(dr) => softmax.forward_dropout(stream, scores, mask, probs, dr, mode),
        None => softmax.forward(stream, scores, mask, probs),
    }
}

fn softmax_mask(mask: AttentionMask<'_>) -> SoftmaxMask<'_> {
    match mask {
        AttentionMask::Causal => SoftmaxMask::Causal,
        AttentionMask::Padding(m) => SoftmaxMask::Padding(m),
    }
}

/// `C_k = P_k V_k` into packed `[bh, seq, d]`.
fn pv_gemm<T: TpElement>(
    stream: &Stream,
    probs: &dyn DeviceRead<T>,
    qkv: &dyn DeviceRead<T>,
    packed: &mut dyn DeviceWrite<T>,
    (bh, seq, d): (usize, usize, usize),
) -> Result<()> {
    let l = bh * 3 * d;
    let v = view_from(qkv, 2 * d)?;
    Gemm::new(seq, d, seq)
        .batch(bh)
        .lds(None, Some(l), None, None, None)
        .strides(None, Some(3 * d), None, None, None)
        .run(
            stream,
            GemmInputs {
                a: probs,
                b: &v,
                bias: None,
                c: None,
            },
            Aux::None,
            packed,
        )
}

/// The layer's own buffer if it keeps one, else the scratch one.
fn held<'a, T: Element>(
    own: &'a Option<DeviceBuffer<T>>,
    scratch: &'a Option<DeviceBuffer<T>>,
) -> Result<&'a DeviceBuffer<T>> {
    own.as_ref()
        .or(scratch.as_ref())
        .ok_or_else(|| Error::invalid(OP, "scratch", "an allocated buffer", "none"))
}

/// Copies packed `[heads, seq, d]` into a strided layout where element
/// `(k, i, j)` lives at `base + i*pitch + k*head_stride + j`.
#[allow(clippy::too_many_arguments)]
fn unpack_heads<T: Element>(
    stream: &Stream,
    src: &dyn DeviceRead<T>,
    dst: &mut dyn DeviceWrite<T>,
    (heads, seq, d): (usize, usize, usize),
    base: usize,
    pitch: usize,
    head_stride: usize,
) -> Result<()> {
    if heads <= seq {
        for k in 0..heads {
            copy_2d(
                stream,
                src,
                Block2d {
                    offset: k * seq * d,
                    pitch: d,
                },
                dst,
                Block2d {
                    offset: base + k * head_stride,
                    pitch,
                },
                seq,
                d,
            )?;
        }
    } else {
        for i in 0..seq {
            copy_2d(
                stream,
                src,
                Block2d {
                    offset: i * d,
                    pitch: seq * d,
                },
                dst,
                Block2d {
                    offset: base + i * pitch,
                    pitch: head_stride,
                },
                heads,
                d,
            )?;
        }
    }
    Ok(())
}

impl<T: TpElement> TpAttention<T> {
    /// This rank's shards of the full QKV weight `[3*heads*head_dim, hidden]`
    /// and bias `[3*heads*head_dim]` (rows ordered `(head, {q,k,v}, dim)`)
    /// and of the output projection's weight `[hidden, heads*head_dim]` and
    /// bias `[hidden]`; `heads` must be a multiple of `tp`.
    #[allow(clippy::too_many_arguments)]
    pub fn from_full(
        comm: &Communicator,
        hidden: usize,
        heads: usize,
        head_dim: usize,
        qkv_weight: &[T],
        qkv_bias: &[T],
        proj_weight: &[T],
        proj_bias: &[T],
        options: AttentionOptions,
    ) -> Result<Self> {
        let tp = comm.size();
        if heads == 0 || heads % tp != 0 {
            return Err(Error::invalid(
                OP,
                "heads",
                format!("a positive multiple of the tensor-parallel size {tp}"),
                heads,
            ));
        }
        if head_dim == 0 {
            return Err(Error::invalid(OP, "head_dim", "a positive size", head_dim));
        }
        if hidden == 0 {
            return Err(Error::invalid(OP, "hidden", "a positive size", hidden));
        }
        check_dropout(options.attention_dropout)?;
        let proj_in = mul("heads", heads, head_dim)?;
        let co = ColumnOptions {
            sequence_parallel: options.sequence_parallel,
            overlap: options.overlap,
            ..Default::default()
        };
        let ro = RowOptions {
            sequence_parallel: options.sequence_parallel,
            overlap: options.overlap,
            ..Default::default()
        };
        Ok(TpAttention {
            hidden,
            heads,
            head_dim,
            options,
            qkv: ColumnParallelLinear::from_full(
                comm,
                hidden,
                mul("heads", 3, proj_in)?,
                qkv_weight,
                Some(qkv_bias),
                co,
            )?,
            proj: RowParallelLinear::from_full(
                comm,
                proj_in,
                hidden,
                proj_weight,
                Some(proj_bias),
                ro,
            )?,
            tp,
            saved: None,
            scratch: Scratch::default(),
        })
    }

    /// `(seq, batch)` of the last forward (what [`TpAttention::backward`]
    /// will use), if any.
    pub fn saved_shape(&self) -> Option<(usize, usize)> {
        self.saved.as_ref().map(|s| (s.seq, s.batch))
    }

    /// Moves the last forward's activations out of the layer (`None` if
    /// there are none): the next forward then allocates fresh ones. Put them
    /// back with [`TpAttention::restore_saved`] before their backward.
    pub fn take_saved(&mut self) -> Option<AttentionSaved<T>> {
        self.saved.take()
    }

    /// Makes `saved` (from [`TpAttention::take_saved`] on this layer) the
    /// activations the next [`TpAttention::backward`] uses, replacing any the
    /// layer holds. Activations of another shape or device are an error (and
    /// the layer's own are kept).
    pub fn restore_saved(&mut self, saved: AttentionSaved<T>) -> Result<()> {
        self.qkv
            .weight
            .device()
            .check_same_as(OP, "saved", saved.qkv.device(), "the layer")?;
        let (hp, d) = (self.heads_per_rank(), self.head_dim);
        let (seq, batch) = (saved.seq, saved.batch);
        let expect = |n: Option<usize>| {
            n.ok_or_else(|| {
                Error::invalid(OP, "saved", "activations of a valid shape", "an overflow")
            })
        };
        let tokens = expect(seq.checked_mul(batch))?;
        let qkv_n = expect(tokens.checked_mul(3 * hp * d))?;
        let ctx_n = expect(tokens.checked_mul(hp * d))?;
        let sc_n = expect(
            batch
                .checked_mul(hp)
                .and_then(|v| v.checked_mul(seq))
                .and_then(|v| v.checked_mul(seq)),
        )?;
        let ok = seq > 0
            && batch > 0
            && saved.qkv.len() == qkv_n
            && saved.ctx.len() == ctx_n
            && saved.probs.as_ref().is_none_or(|b| b.len() == sc_n)
            && saved.dropped.as_ref().is_none_or(|b| b.len() == sc_n)
            && (saved.dropped.is_none() || saved.probs.is_some())
            && match &saved.mask {
                KeptMask::Unneeded => saved.probs.is_some(),
                KeptMask::Causal => saved.probs.is_none(),
                KeptMask::Padding(m) => {
                    saved.probs.is_none()
                        && (m.len() == seq * seq || Some(m.len()) == batch.checked_mul(seq * seq))
                }
            };
        if !ok {
            return Err(Error::invalid(
                OP,
                "saved",
                format!(
                    "activations of this layer ({hp} heads of {d} per rank) for seq {seq} x batch {batch}: QKV {qkv_n}, context {ctx_n}, probabilities {sc_n} elements"
                ),
                format!(
                    "QKV {}, context {}, probabilities {:?}",
                    saved.qkv.len(),
                    saved.ctx.len(),
                    saved.probs.as_ref().map(DeviceBuffer::len)
                ),
            ));
        }
        self.saved = Some(saved);
        Ok(())
    }

    /// Device bytes of the layer's workspace (scores, packed products,
    /// gradients, and with [`AttentionOptions::recompute_core`] the
    /// probabilities): reused by every forward and backward of this layer,
    /// not held per micro-batch (that is [`AttentionSaved::bytes`]).
    pub fn workspace_bytes(&self) -> usize {
        let sc = &self.scratch;
        let n: usize = [&sc.scores, &sc.dctx, &sc.dqkv, &sc.probs, &sc.dropped]
            .into_iter()
            .chain(&sc.packed)
            .map(|b| b.as_ref().map_or(0, DeviceBuffer::len))
            .sum();
        n * T::DTYPE.size()
    }

    /// Frees the workspace (the next forward or backward allocates it
    /// again); the saved activations are kept.
    pub fn release_workspace(&mut self) {
        self.scratch = Scratch::default();
    }

    /// Random values one training forward of `(seq, batch)` draws from its
    /// Philox stream: `batch * heads_per_rank * seq * seq` (pass it to
    /// [`crate::core::rng::RngTracker::next`] on the model-parallel stream).
    pub fn random_values(&self, seq: usize, batch: usize) -> u64 {
        self.softmax(seq, batch).random_values()
    }

    /// Heads on this rank.
    pub fn heads_per_rank(&self) -> usize {
        self.heads / self.tp
    }

    /// `1 / sqrt(head_dim)`, the softmax's scale.
    pub fn scale(&self) -> f32 {
        (1.0 / (self.head_dim as f64).sqrt()) as f32
    }

    fn softmax(&self, seq: usize, batch: usize) -> ScaleMaskSoftmax {
        ScaleMaskSoftmax::new(batch, self.heads_per_rank(), seq, seq, self.scale())
    }

    /// `output = attention(input)`: `input` and `output` `[seq*batch,
    /// hidden]` in `[s, b]` row order (`[seq*batch/tp, hidden]`, this rank's
    /// rows, with sequence parallelism). Saves the activations (QKV, softmax
    /// output unless [`AttentionOptions::recompute_core`], context) for
    /// [`TpAttention::backward`]. No attention dropout (evaluation):
    /// [`TpAttention::forward_with_dropout`] with [`DropoutMode::Eval`].
    pub fn forward(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        output: &mut dyn DeviceWrite<T>,
        seq: usize,
        batch: usize,
    ) -> Result<()> {
        self.forward_with_dropout(comm, stream, input, output, seq, batch, DropoutMode::Eval)
    }

    /// [`TpAttention::forward`] with attention dropout: in
    /// [`DropoutMode::Train`] and with [`AttentionOptions::attention_dropout`]
    /// `> 0`, the probabilities are dropped before `P V`, the mask drawn from
    /// the state (take it from the **model-parallel** stream, drawing
    /// [`TpAttention::random_values`]`(seq, batch)` values). The saved
    /// activations remember the state; backward needs no extra argument.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with_dropout(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        output: &mut dyn DeviceWrite<T>,
        seq: usize,
        batch: usize,
        mode: DropoutMode,
    ) -> Result<()> {
        self.forward_masked(
            comm,
            stream,
            input,
            output,
            (seq, batch),
            mode,
            AttentionMask::Causal,
        )
    }

    /// [`TpAttention::forward_with_dropout`] with the mask chosen:
    /// [`AttentionMask::Causal`] (what the other forwards use) or
    /// [`AttentionMask::Padding`] (an encoder's padding mask, `[batch, 1,
    /// seq, seq]` or `[1, 1, seq, seq]` uint8 on the layer's device; its
    /// length and device are checked before any work). The backward is the
    /// same call either way.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_masked(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        output: &mut dyn DeviceWrite<T>,
        (seq, batch): (usize, usize),
        mode: DropoutMode,
        mask: AttentionMask<'_>,
    ) -> Result<()> {
        if seq == 0 || batch == 0 {
            return Err(Error::invalid(
                OP,
                "seq/batch",
                "positive sizes",
                format!("{seq}/{batch}"),
            ));
        }
        let (hp, d) = (self.heads_per_rank(), self.head_dim);
        let tokens = mul("seq", seq, batch)?;
        // Everything that can be wrong with the call is checked before the
        // saved activations are touched: a rejected forward keeps them.
        check_block_io(
            OP,
            comm,
            (self.proj.tp(), self.proj.rank()),
            self.options.sequence_parallel,
            tokens,
            self.hidden,
            input.len(),
            output.len(),
        )?;
        let bh = mul("batch", batch, hp)?;
        mul("batch", bh, 3 * d)?; // the GEMMs' leading dimension
        let qkv_n = mul("seq", tokens, 3 * hp * d)?;
        let ctx_n = mul("seq", tokens, hp * d)?;
        let sc_n = mul("seq", bh, mul("seq", seq, seq)?)?;
        let packed_n = mul("seq", bh, seq * d)?;
        let p = self.options.attention_dropout;
        check_dropout(p)?;
        // The dropout actually applied (and remembered for backward).
        let (mode, p) = match mode {
            DropoutMode::Train(st) if p > 0.0 => {
                if st.offset.checked_add(sc_n as u64).is_none() {
                    return Err(Error::invalid(
                        OP,
                        "mode",
                        "a Philox offset with offset + batch*heads*seq*seq within 2^64",
                        st.offset,
                    ));
                }
                (mode, p)
            }
            _ => (DropoutMode::Eval, 0.0),
        };
        let dropping = p > 0.0;
        let keep = !self.options.recompute_core;
        let softmax = self.softmax(seq, batch).with_dropout(p);
        softmax
            .check_mask(stream, softmax_mask(mask))
            .map_err(|e| e.reported_by(OP))?;

        let old = self.saved.take();
        let (old_qkv, old_probs, old_dropped, old_ctx) = match old {
            Some(s) => (Some(s.qkv), s.probs, s.dropped, Some(s.ctx)),
            None => (None, None, None, None),
        };
        let mut qkv = reuse(old_qkv, comm, qkv_n)?;
        let mut ctx = reuse(old_ctx, comm, ctx_n)?;
        let mut probs = if keep {
            Some(reuse(old_probs, comm, sc_n)?)
        } else {
            None
        };
        let mut dropped = if keep && dropping {
            Some(reuse(old_dropped, comm, sc_n)?)
        } else {
            None
        };
        self.qkv
            .forward(comm, stream, input, &mut qkv, None, tokens)?;

        let sc = &mut self.scratch;
        let scores = exact_buf(&mut sc.scores, comm, sc_n)?;
        scores_gemm(stream, &qkv, scores, (bh, seq, d))?;
        // Probabilities: kept (saved) or in scratch (recomputed in backward).
        let probs_buf = match probs.as_mut() {
            Some(b) => b,
            None => exact_buf(&mut sc.probs, comm, sc_n)?,
        };
        let dropped_buf = match (dropping, dropped.as_mut()) {
            (false, _) => None,
            (true, Some(b)) => Some(b),
            (true, None) => Some(exact_buf(&mut sc.dropped, comm, sc_n)?),
        };
        core_probs(
            &softmax,
            stream,
            scores,
            softmax_mask(mask),
            probs_buf,
            dropped_buf.map(|b| b as _),
            mode,
        )?;
        // C_k = P_k V_k (P dropped with dropout), packed, then interleaved
        // into [tokens, hp*d].
        let pv_in = if dropping {
            held(&dropped, &sc.dropped)?
        } else {
            held(&probs, &sc.probs)?
        };
        let packed = exact_buf(&mut sc.packed[0], comm, packed_n)?;
        pv_gemm(stream, pv_in, &qkv, packed, (bh, seq, d))?;
        unpack_heads(stream, packed, &mut ctx, (bh, seq, d), 0, bh * d, d)?;
        self.proj.forward(comm, stream, &ctx, output, tokens)?;
        let mask = match (keep, mask) {
            (true, _) => KeptMask::Unneeded,
            (false, AttentionMask::Causal) => KeptMask::Causal,
            (false, AttentionMask::Padding(m)) => {
                let mut copy = comm.device().alloc_zeros::<u8>(m.len())?;
                stream.copy_device(m, &mut copy)?;
                KeptMask::Padding(copy)
            }
        };
        self.saved = Some(AttentionSaved {
            seq,
            batch,
            qkv,
            probs,
            dropped,
            ctx,
            mode,
            p,
            mask,
        });
        Ok(())
    }

    /// Gradients from `grad_output` (shaped like the output): `grad_input`
    /// (shaped like `input`, which must be the last forward's input) and the
    /// weight and bias gradients of both linear layers.
    pub fn backward(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        grad_output: &dyn DeviceRead<T>,
        grad_input: &mut dyn DeviceWrite<T>,
        grads: AttentionGrads<'_, T>,
    ) -> Result<()> {
        let Some(sv) = self.saved.as_ref() else {
            return Err(Error::invalid(
                OP,
                "backward",
                "a preceding forward",
                "no saved activations",
            ));
        };
        let (seq, batch) = (sv.seq, sv.batch);
        let (hp, d) = (self.heads / self.tp, self.head_dim);
        let tokens = seq * batch;
        let bh = batch * hp;
        let l = bh * 3 * d;
        let packed_n = bh * seq * d;
        let sc_n = bh * seq * seq;
        let softmax = ScaleMaskSoftmax::new(batch, hp, seq, seq, self.scale()).with_dropout(sv.p);
        let dropping = matches!(sv.mode, DropoutMode::Train(_));
        let sc = &mut self.scratch;

        // dC from the output projection.
        let dctx = exact_buf(&mut sc.dctx, comm, sv.ctx.len())?;
        self.proj.backward(
            comm,
            stream,
            &sv.ctx,
            grad_output,
            None,
            dctx,
            grads.proj,
            tokens,
        )?;
        // The probabilities: saved, or recomputed from the saved QKV and
        // Philox state by the forward's own kernels (selective recomputation).
        if sv.probs.is_none() {
            let scores = exact_buf(&mut sc.scores, comm, sc_n)?;
            scores_gemm(stream, &sv.qkv, scores, (bh, seq, d))?;
            let probs = exact_buf(&mut sc.probs, comm, sc_n)?;
            let dropped = match dropping {
                true => Some(exact_buf(&mut sc.dropped, comm, sc_n)?),
                false => None,
            };
            let mask = match &sv.mask {
                KeptMask::Causal => SoftmaxMask::Causal,
                KeptMask::Padding(m) => SoftmaxMask::Padding(m),
                KeptMask::Unneeded => {
                    return Err(Error::invalid(
                        OP,
                        "saved",
                        "activations with their probabilities or their mask",
                        "neither",
                    ))
                }
            };
            core_probs(
                &softmax,
                stream,
                scores,
                mask,
                probs,
                dropped.map(|b| b as _),
                sv.mode,
            )?;
        }
        let probs = held(&sv.probs, &sc.probs)?;
        let pv_in = match dropping {
            true => held(&sv.dropped, &sc.dropped)?,
            false => probs,
        };
        let q = view_from(&sv.qkv, 0)?;
        let k = view_from(&sv.qkv, d)?;
        let v = view_from(&sv.qkv, 2 * d)?;
        let dctx = &*dctx;

        // dP_k = dC_k V_k^T (the gradient of the dropped probabilities with
        // dropout), then dS = softmax backward (in place, through the
        // regenerated dropout mask).
        let dp = exact_buf(&mut sc.scores, comm, sc_n)?;
        Gemm::new(seq, seq, d)
            .trans_b(true)
            .batch(bh)
            .lds(Some(bh * d), Some(l), None, None, None)
            .strides(Some(d), Some(3 * d), None, None, None)
            .run(
                stream,
                GemmInputs {
                    a: dctx,
                    b: &v,
                    bias: None,
                    c: None,
                },
                Aux::None,
                dp,
            )?;
        let dqkv = exact_buf(&mut sc.dqkv, comm, sv.qkv.len())?;
        // dV_k = P_k^T dC_k (P dropped with dropout).
        {
            let dv = exact_buf(&mut sc.packed[2], comm, packed_n)?;
            Gemm::new(seq, d, seq)
                .trans_a(true)
                .batch(bh)
                .lds(None, Some(bh * d), None, None, None)
                .strides(None, Some(d), None, None, None)
                .run(
                    stream,
                    GemmInputs {
                        a: pv_in,
                        b: dctx,
                        bias: None,
                        c: None,
                    },
                    Aux::None,
                    dv,
                )?;
            unpack_heads(stream, dv, dqkv, (bh, seq, d), 2 * d, l, 3 * d)?;
        }
        softmax.backward_dropout_in_place(stream, probs, dp, sv.mode)?;
        let ds = &*dp;
        // dQ_k = dS_k K_k, dK_k = dS_k^T Q_k.
        for (slot, trans, operand, base) in [(0, false, &k, 0), (1, true, &q, d)] {
            let out = exact_buf(&mut sc.packed[slot], comm, packed_n)?;
            Gemm::new(seq, d, seq)
                .trans_a(trans)
                .batch(bh)
                .lds(None, Some(l), None, None, None)
                .strides(None, Some(3 * d), None, None, None)
                .run(
                    stream,
                    GemmInputs {
                        a: ds,
                        b: operand,
                        bias: None,
                        c: None,
                    },
                    Aux::None,
                    out,
                )?;
            unpack_heads(stream, out, dqkv, (bh, seq, d), base, l, 3 * d)?;
        }
        self.qkv.backward(
            comm, stream, input, dqkv, None, grad_input, grads.qkv, tokens,
        )
    }
}
