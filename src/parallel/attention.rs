//! The tensor-parallel causal self-attention block of a transformer layer,
//! built from the parallel linear layers, the batched GEMM and the fused
//! scale + mask + softmax:
//!
//! ```text
//! QKV = X Wqkv^T + bqkv                  ColumnParallelLinear (heads split)
//! P   = softmax(causal(Q K^T / sqrt(d)))  batched GEMM + fused softmax
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

use crate::backend::{DeviceBuffer, Stream};
use crate::comm::Communicator;
use crate::core::{Element, Error, Result};
use crate::ops::copy::{copy_2d, Block2d};
use crate::ops::gemm::{Aux, Gemm, GemmInputs};
use crate::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask};
use crate::parallel::linear::{
    ColumnOptions, ColumnParallelLinear, LinearGrads, RowOptions, RowParallelLinear, TpElement,
};
use crate::parallel::mlp::{check_block_io, exact_buf};

const OP: &str = "TpAttention";

/// Options of [`TpAttention`] (defaults: no sequence parallelism, overlapped
/// backward communication).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionOptions {
    /// Input and output sharded along tokens (`[tokens/tp, hidden]`).
    pub sequence_parallel: bool,
    /// Backward communication overlapped with the weight gradients.
    pub overlap: bool,
}

impl Default for AttentionOptions {
    fn default() -> Self {
        AttentionOptions {
            sequence_parallel: false,
            overlap: true,
        }
    }
}

/// The gradients of a [`TpAttention`] backward: the QKV shards (`[3*hp*d,
/// hidden]` weight, `[3*hp*d]` bias) and the output projection's
/// (`[hidden, hp*d]` weight shard, replicated `[hidden]` bias).
pub struct AttentionGrads<'a, T: TpElement> {
    pub qkv: LinearGrads<'a, T>,
    pub proj: LinearGrads<'a, T>,
}

/// Activations of the last forward.
struct Saved<T: Element> {
    seq: usize,
    batch: usize,
    qkv: DeviceBuffer<T>,
    probs: DeviceBuffer<T>,
    ctx: DeviceBuffer<T>,
}

struct Scratch<T: Element> {
    scores: Option<DeviceBuffer<T>>,
    packed: [Option<DeviceBuffer<T>>; 3],
    dctx: Option<DeviceBuffer<T>>,
    dqkv: Option<DeviceBuffer<T>>,
}

impl<T: Element> Default for Scratch<T> {
    fn default() -> Self {
        Scratch {
            scores: None,
            packed: [None, None, None],
            dctx: None,
            dqkv: None,
        }
    }
}

/// One rank's shard of the tensor-parallel causal self-attention block.
pub struct TpAttention<T: TpElement> {
    pub hidden: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub options: AttentionOptions,
    pub qkv: ColumnParallelLinear<T>,
    pub proj: RowParallelLinear<T>,
    tp: usize,
    saved: Option<Saved<T>>,
    scratch: Scratch<T>,
}

fn mul(arg: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid(OP, arg, "a size that fits in usize", "an overflow"))
}

/// A non-owning view of `buf` from element `offset` on.
fn view_from<T: Element>(buf: &DeviceBuffer<T>, offset: usize) -> Result<DeviceBuffer<T>> {
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

/// Copies packed `[heads, seq, d]` into a strided layout where element
/// `(k, i, j)` lives at `base + i*pitch + k*head_stride + j`.
#[allow(clippy::too_many_arguments)]
fn unpack_heads<T: Element>(
    stream: &Stream,
    src: &DeviceBuffer<T>,
    dst: &mut DeviceBuffer<T>,
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
    /// output, context) for [`TpAttention::backward`].
    pub fn forward(
        &mut self,
        comm: &Communicator,
        stream: &Stream,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
        seq: usize,
        batch: usize,
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
        let l = mul("batch", bh, 3 * d)?;
        let qkv_n = mul("seq", tokens, 3 * hp * d)?;
        let ctx_n = mul("seq", tokens, hp * d)?;
        let sc_n = mul("seq", bh, mul("seq", seq, seq)?)?;
        let packed_n = mul("seq", bh, seq * d)?;

        let (mut qkv, mut probs, mut ctx) = match self.saved.take() {
            Some(s) if s.qkv.len() == qkv_n && s.probs.len() == sc_n => (s.qkv, s.probs, s.ctx),
            _ => {
                let dev = comm.device();
                (
                    dev.alloc_zeros::<T>(qkv_n)?,
                    dev.alloc_zeros::<T>(sc_n)?,
                    dev.alloc_zeros::<T>(ctx_n)?,
                )
            }
        };
        self.qkv
            .forward(comm, stream, input, &mut qkv, None, tokens)?;

        // Scores S_k = Q_k K_k^T, straight from the QKV activation.
        let softmax = self.softmax(seq, batch);
        let scores = exact_buf(&mut self.scratch.scores, comm, sc_n)?;
        {
            let q = view_from(&qkv, 0)?;
            let k = view_from(&qkv, d)?;
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
                )?;
        }
        softmax.forward(stream, scores, SoftmaxMask::Causal, &mut probs)?;

        // C_k = P_k V_k, packed, then interleaved into [tokens, hp*d].
        let packed = exact_buf(&mut self.scratch.packed[0], comm, packed_n)?;
        {
            let v = view_from(&qkv, 2 * d)?;
            Gemm::new(seq, d, seq)
                .batch(bh)
                .lds(None, Some(l), None, None, None)
                .strides(None, Some(3 * d), None, None, None)
                .run(
                    stream,
                    GemmInputs {
                        a: &probs,
                        b: &v,
                        bias: None,
                        c: None,
                    },
                    Aux::None,
                    packed,
                )?;
        }
        unpack_heads(stream, packed, &mut ctx, (bh, seq, d), 0, bh * d, d)?;
        self.proj.forward(comm, stream, &ctx, output, tokens)?;
        self.saved = Some(Saved {
            seq,
            batch,
            qkv,
            probs,
            ctx,
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
        input: &DeviceBuffer<T>,
        grad_output: &DeviceBuffer<T>,
        grad_input: &mut DeviceBuffer<T>,
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
        let softmax = ScaleMaskSoftmax::new(batch, hp, seq, seq, self.scale());
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
        let q = view_from(&sv.qkv, 0)?;
        let k = view_from(&sv.qkv, d)?;
        let v = view_from(&sv.qkv, 2 * d)?;
        let dctx = &*dctx;

        // dP_k = dC_k V_k^T, then dS = softmax backward (in place).
        let dp = exact_buf(&mut sc.scores, comm, sv.probs.len())?;
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
        // dV_k = P_k^T dC_k.
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
                        a: &sv.probs,
                        b: dctx,
                        bias: None,
                        c: None,
                    },
                    Aux::None,
                    dv,
                )?;
            unpack_heads(stream, dv, dqkv, (bh, seq, d), 2 * d, l, 3 * d)?;
        }
        softmax.backward_in_place(stream, &sv.probs, dp)?;
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
