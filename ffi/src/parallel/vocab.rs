//! Vocab-parallel embedding and cross-entropy
//! (`ferrotron::parallel::vocab`): the padded vocabulary's rows split over
//! the ranks of a tensor-parallel communicator.

use std::ffi::{c_int, c_void};

use ferrotron::comm::CommElement;
use ferrotron::core::dtype::FloatElement;
use ferrotron::parallel::vocab::{
    padded_vocab_size, vocab_range, CrossEntropySaved, TokenId, VocabParallelCrossEntropy,
    VocabParallelEmbedding,
};
use ferrotron::Result;

use crate::abi::args::{dim, mul, to_i64};
use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{read_desc, Desc};
use crate::abi::dtype::dispatch_dtype;
use crate::abi::handles::{check_out, get, handle, take, write_out};
use crate::abi::views::view;
use crate::comm::{call, ftnComm_t, Call};
use crate::parallel::common::tp_size;
use crate::runtime::ftnStream_t;

/// The vocabulary size padded up to a multiple of `128 * tp` (Megatron's
/// `make_vocab_size_divisible_by = 128`).
///
/// Bad input (ftnInvalidArgument, nothing written): negative `vocab`; `tp`
/// < 1; a padded size that overflows; `padded` NULL or not 8-byte aligned.
/// `vocab` 0 gives 0.
#[no_mangle]
pub unsafe extern "C" fn ftn_vocab_padded_size(
    vocab: i64,
    tp: c_int,
    padded: *mut i64,
) -> ftnResult_t {
    export!(|op| {
        let v = dim(op, "vocab", vocab)?;
        let p = padded_vocab_size(v, tp_size(op, tp)?)
            .ok_or_else(|| invalid(op, "vocab", "a size whose padding fits in size_t", vocab))?;
        // SAFETY: out-pointer contract.
        unsafe { write_out(op, "padded", padded, to_i64(op, "vocab", p)?) }
    })
}

/// Rows `[*start, *start + *rows)` of the padded vocabulary owned by `rank`
/// of `tp`.
///
/// Bad input (ftnInvalidArgument, nothing written): negative `vocab`; `tp`
/// < 1 or `rank` outside `0..tp`; a padded size that overflows; `start` or
/// `rows` NULL or not 8-byte aligned (both checked before either is
/// written).
#[no_mangle]
pub unsafe extern "C" fn ftn_vocab_range(
    vocab: i64,
    tp: c_int,
    rank: c_int,
    start: *mut i64,
    rows: *mut i64,
) -> ftnResult_t {
    export!(|op| {
        let v = dim(op, "vocab", vocab)?;
        let tp = tp_size(op, tp)?;
        let r = usize::try_from(rank)
            .ok()
            .filter(|&r| r < tp)
            .ok_or_else(|| invalid(op, "rank", format!("a rank in 0..{tp}"), rank))?;
        let (s, n) = vocab_range(v, tp, r)
            .ok_or_else(|| invalid(op, "vocab", "a size whose padding fits in size_t", vocab))?;
        check_out(op, "rows", rows)?;
        // SAFETY: out-pointer contracts.
        unsafe {
            write_out(op, "start", start, to_i64(op, "vocab", s)?)?;
            write_out(op, "rows", rows, to_i64(op, "vocab", n)?)
        }
    })
}

/// Shape of a vocab-parallel embedding table `[vocab, hidden]`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnVocabEmbeddingDesc_t {
    /// `sizeof(ftnVocabEmbeddingDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t` of the table and output: ftnFloat32, ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// `ftnDataType_t` of the token ids: ftnInt32 or ftnInt64.
    pub id_dtype: i32,
    /// Unpadded vocabulary size.
    pub vocab: i64,
    pub hidden: i64,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnVocabEmbeddingDesc_t {
    const NAME: &'static str = "ftnVocabEmbeddingDesc_t";
    const V1_SIZE: usize = 32;
}

fn embedding(
    op: &'static str,
    d: &ftnVocabEmbeddingDesc_t,
    c: &Call,
) -> Result<(VocabParallelEmbedding, usize)> {
    let e = VocabParallelEmbedding::new(
        dim(op, "desc.vocab", d.vocab)?,
        dim(op, "desc.hidden", d.hidden)?,
    );
    let (_, rows) = e.shard(c.comm.size(), c.comm.rank()).ok_or_else(|| {
        invalid(
            op,
            "desc.vocab",
            "a size whose padding fits in size_t",
            d.vocab,
        )
    })?;
    let n = mul(op, "desc.hidden", rows, e.hidden)?;
    Ok((e, n))
}

/// How a forward leaves the lookup: all-reduced (every token on every
/// rank) or reduce-scattered (this rank's `tokens / tp` rows).
#[derive(Clone, Copy)]
enum EmbeddingOut {
    AllReduced,
    Scattered,
}

#[allow(clippy::too_many_arguments)]
unsafe fn embed_fwd_t<T: FloatElement + CommElement, I: TokenId>(
    op: &'static str,
    c: &Call,
    d: &ftnVocabEmbeddingDesc_t,
    ids: *const c_void,
    weight: *const c_void,
    out: *mut c_void,
    tokens: usize,
    mode: EmbeddingOut,
) -> Result<()> {
    let (e, nw) = embedding(op, d, c)?;
    // Scattered: `tokens` not a multiple of tp is the Rust call's named
    // error; the view covers the rows it would write.
    let out_tokens = match mode {
        EmbeddingOut::AllReduced => tokens,
        EmbeddingOut::Scattered => tokens / c.comm.size(),
    };
    let nout = mul(op, "tokens", out_tokens, e.hidden)?;
    let out_name = match mode {
        EmbeddingOut::AllReduced => "out",
        EmbeddingOut::Scattered => "out_rows",
    };
    // SAFETY: pointer contracts.
    let (i, w, mut y) = unsafe {
        (
            view::<I>(&c.dev, op, "ids", ids, tokens)?,
            view::<T>(&c.dev, op, "weight_shard", weight, nw)?,
            view::<T>(&c.dev, op, out_name, out, nout)?,
        )
    };
    match mode {
        EmbeddingOut::AllReduced => e.forward(c.comm, c.stream, &i, &w, &mut y),
        EmbeddingOut::Scattered => e.forward_scattered(c.comm, c.stream, &i, &w, &mut y),
    }
}

/// The body of both embedding forwards: the descriptor and handles read,
/// then the typed forward.
unsafe fn embedding_forward(
    op: &'static str,
    desc: *const ftnVocabEmbeddingDesc_t,
    (comm, stream): (ftnComm_t, ftnStream_t),
    (ids, weight_shard, out): (*const c_void, *const c_void, *mut c_void),
    tokens: i64,
    mode: EmbeddingOut,
) -> Result<()> {
    // SAFETY: descriptor contract.
    let d = unsafe { read_desc(op, "desc", desc)? };
    let c = call(op, comm, stream)?;
    let tokens = dim(op, "tokens", tokens)?;
    // SAFETY: pointer contracts.
    dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => dispatch_dtype!(op, "desc.id_dtype", d.id_dtype, [I32, I64], I => unsafe {
        embed_fwd_t::<T, I>(op, &c, &d, ids, weight_shard, out, tokens, mode)
    }))
}

/// `out[t, :] = weight[ids[t], :]` as the all-reduce of each rank's lookup:
/// ids outside the padded vocabulary `[0, V)` (`V` = `ftn_vocab_padded_size`)
/// give zero rows; ids in `[vocab, V)` read their padding rows, as in
/// Megatron (real token ids are below `vocab`). `weight_shard`: this rank's rows
/// `[rows, hidden]` of the padded table (`ftn_vocab_range`); `ids`
/// (`[tokens]`) and `out` (`[tokens, hidden]`) are the same on every rank.
/// `desc.vocab` or `desc.hidden` 0: ftnInvalidArgument (not a no-op).
///
/// Bad input (at the call, nothing enqueued): `desc` NULL, misaligned, a
/// bad `desc->size` or non-zero bytes past the known fields; `comm` or
/// `stream` NULL, stale or of another kind; negative `tokens`; `dtype` not
/// a float type or `id_dtype` not int32 / int64; negative `vocab` /
/// `hidden`; `ids`, `weight_shard`, `out` NULL when they describe elements
/// or not aligned to their element size: ftnInvalidArgument; a `stream` of
/// another context: ftnDeviceMismatch; a broken communicator:
/// ftnBackendError (at its first collective: work enqueued before it stays
/// enqueued). Id values are device data and never an error. `tokens` 0
/// still all-reduces (every rank calls). Peers that time out or are gone:
/// ftnBackendError at synchronize.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ftn_vocab_parallel_embedding_forward(
    desc: *const ftnVocabEmbeddingDesc_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    ids: *const c_void,
    weight_shard: *const c_void,
    out: *mut c_void,
    tokens: i64,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: the caller's contracts, passed on.
        unsafe {
            embedding_forward(
                op,
                desc,
                (comm, stream),
                (ids, weight_shard, out),
                tokens,
                EmbeddingOut::AllReduced,
            )
        }
    })
}

/// `ftn_vocab_parallel_embedding_forward` for sequence parallelism: this
/// rank's rows of the lookup, reduce-scattered instead of all-reduced (the
/// same values, half the traffic; Megatron's `reduce_scatter_embeddings`):
/// `out_rows[j, :] = weight[ids[r * tokens / tp + j], :]` for
/// `j < tokens / tp`, `r` this rank. `ids` (`[tokens]`) are the whole
/// micro-batch's, the same on every rank; `out_rows` is
/// `[tokens / tp, hidden]`. The backward
/// (`ftn_vocab_parallel_embedding_backward`) takes the whole `dy`:
/// all-gather the rows' gradients first.
///
/// Bad input: as for `ftn_vocab_parallel_embedding_forward` (`out_rows` in
/// place of `out`), and `tokens` not a multiple of the communicator's size:
/// ftnInvalidArgument naming `ids`, at the call, nothing enqueued.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ftn_vocab_parallel_embedding_forward_scattered(
    desc: *const ftnVocabEmbeddingDesc_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    ids: *const c_void,
    weight_shard: *const c_void,
    out_rows: *mut c_void,
    tokens: i64,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: the caller's contracts, passed on.
        unsafe {
            embedding_forward(
                op,
                desc,
                (comm, stream),
                (ids, weight_shard, out_rows),
                tokens,
                EmbeddingOut::Scattered,
            )
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn embed_bwd_t<T: FloatElement + CommElement, I: TokenId>(
    op: &'static str,
    c: &Call,
    d: &ftnVocabEmbeddingDesc_t,
    ids: *const c_void,
    dy: *const c_void,
    dweight: *mut c_void,
    tokens: usize,
    accumulate: bool,
) -> Result<()> {
    let (e, nw) = embedding(op, d, c)?;
    let ndy = mul(op, "tokens", tokens, e.hidden)?;
    // SAFETY: pointer contracts.
    let (i, g, mut dw) = unsafe {
        (
            view::<I>(&c.dev, op, "ids", ids, tokens)?,
            view::<T>(&c.dev, op, "dy", dy, ndy)?,
            view::<f32>(&c.dev, op, "dweight", dweight, nw)?,
        )
    };
    e.backward(c.comm, c.stream, &i, &g, &mut dw, accumulate)
}

/// This rank's weight gradient, fp32 `[rows, hidden]`: `dweight[v] (+)=` the
/// sum of `dy[t]` over the tokens with `ids[t] == start + v`, in token order
/// (bitwise deterministic). `accumulate` non-zero adds to `dweight` (a
/// main_grad), zero overwrites it. No communication.
///
/// Bad input (at the call, nothing enqueued): as for the forward (`desc`,
/// handles, dtypes, `vocab` / `hidden` 0 or negative, negative `tokens`),
/// and `ids`, `dy`, `dweight` NULL when they describe elements or not
/// aligned to their element size (4 bytes for `dweight`):
/// ftnInvalidArgument. The stream is not checked against `comm`'s context
/// (no communication). Out-of-range ids are skipped, not an error.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ftn_vocab_parallel_embedding_backward(
    desc: *const ftnVocabEmbeddingDesc_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    ids: *const c_void,
    dy: *const c_void,
    dweight: *mut f32,
    tokens: i64,
    accumulate: c_int,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        let c = call(op, comm, stream)?;
        let tokens = dim(op, "tokens", tokens)?;
        let dw = dweight as *mut c_void;
        // SAFETY: pointer contracts.
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => dispatch_dtype!(op, "desc.id_dtype", d.id_dtype, [I32, I64], I => unsafe {
            embed_bwd_t::<T, I>(op, &c, &d, ids, dy, dw, tokens, accumulate != 0)
        }))
    })
}

/// Shape and options of the vocab-parallel cross-entropy over this rank's
/// `[tokens, shard_vocab]` logits (the padded vocabulary is `tp * shard_vocab`).
///
/// Version 2 (56 bytes) added `ignore_index` / `has_ignore_index`. A
/// version-1 descriptor (`size` = 40, compiled against an older header) is
/// still accepted and reads as `has_ignore_index = 0`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnCrossEntropyDesc_t {
    /// `sizeof(ftnCrossEntropyDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t` of the logits: ftnFloat32, ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// `ftnDataType_t` of the labels: ftnInt32 or ftnInt64.
    pub label_dtype: i32,
    pub tokens: i64,
    /// Vocab columns on each rank.
    pub shard_vocab: i64,
    /// `eps` in `[0, 1)`; 0 disables label smoothing.
    pub label_smoothing: f32,
    /// Must be 0.
    pub reserved: u32,
    /// Version 2. With `has_ignore_index` non-zero: a token whose label
    /// equals this value (PyTorch's `ignore_index`, -100 there by default;
    /// any value, also one inside `[0, V)`) gets loss 0 and a zero gradient
    /// row, label smoothing included. With int32 labels it must fit in
    /// int32. Ignored when `has_ignore_index` is 0.
    pub ignore_index: i64,
    /// Version 2. Non-zero: use `ignore_index`; 0 (the default, and what a
    /// version-1 descriptor reads as): every label counts, one outside
    /// `[0, V)` with no target (Megatron's behaviour).
    pub has_ignore_index: i32,
    /// Version 2. Must be 0.
    pub reserved2: u32,
}
// SAFETY: repr(C), size_t first, integer/float fields, explicit padding.
unsafe impl Desc for ftnCrossEntropyDesc_t {
    const NAME: &'static str = "ftnCrossEntropyDesc_t";
    const V1_SIZE: usize = 40;
}

handle!(ftnCrossEntropySaved, ftnCrossEntropySaved_t, 0x4654_4e43_4553_000a, "ftnCrossEntropySaved_t", {
    saved: CrossEntropySaved,
});

fn cross_entropy(
    op: &'static str,
    d: &ftnCrossEntropyDesc_t,
) -> Result<(VocabParallelCrossEntropy, usize)> {
    if d.reserved != 0 {
        return Err(invalid(op, "desc.reserved", "0", d.reserved));
    }
    if d.reserved2 != 0 {
        return Err(invalid(op, "desc.reserved2", "0", d.reserved2));
    }
    let tokens = dim(op, "desc.tokens", d.tokens)?;
    let shard = dim(op, "desc.shard_vocab", d.shard_vocab)?;
    let n = mul(op, "desc.tokens * shard_vocab", tokens, shard)?;
    // An ignore index int32 labels cannot equal: refused by the Rust layer
    // (naming `ignore_index`).
    let ignore = (d.has_ignore_index != 0).then_some(d.ignore_index);
    Ok((
        VocabParallelCrossEntropy::new(tokens, shard)
            .with_label_smoothing(d.label_smoothing)
            .with_ignore_index(ignore),
        n,
    ))
}

unsafe fn ce_fwd_t<T: FloatElement, I: TokenId>(
    op: &'static str,
    c: &Call,
    d: &ftnCrossEntropyDesc_t,
    logits: *const c_void,
    labels: *const c_void,
    loss: *mut c_void,
) -> Result<CrossEntropySaved> {
    let (ce, n) = cross_entropy(op, d)?;
    // SAFETY: pointer contracts.
    let (x, l, mut y) = unsafe {
        (
            view::<T>(&c.dev, op, "logits", logits, n)?,
            view::<I>(&c.dev, op, "labels", labels, ce.tokens)?,
            view::<f32>(&c.dev, op, "loss", loss, ce.tokens)?,
        )
    };
    ce.forward(c.comm, c.stream, &x, &l, &mut y)
}

/// Per-token loss `loss` (fp32 `[tokens]`) of this rank's `logits`
/// (`[tokens, shard_vocab]`) and the replicated `labels` (`[tokens]`; ids
/// of the padded vocabulary). Every rank calls it (two all-reduces, MAX then SUM; none with one rank).
/// `*saved` receives the statistics the backward needs (a new handle; free
/// it with `ftn_cross_entropy_saved_destroy`).
/// A label outside `[0, V)` is not an error (labels are device data, not
/// checked): it has no target on any rank, its loss is `log(sum exp)` and
/// the backward gives it the plain softmax (Megatron's behaviour), unless
/// it equals `desc.ignore_index` with `desc.has_ignore_index` set (PyTorch's
/// behaviour): then, as for any label equal to it, loss 0 and a zero
/// gradient row. A mean over the batch then divides by the rows not
/// ignored.
///
/// Bad input (at the call, nothing enqueued, `*saved` untouched): `desc`
/// NULL, misaligned, a `size` below 56 other than 40 (version 1), above
/// `FTN_MAX_DESC_SIZE`, or non-zero bytes past the known fields, a non-zero
/// `reserved` or `reserved2`; `comm` or `stream` NULL, stale or of another
/// kind; `saved` NULL or misaligned; `dtype` not a float type or
/// `label_dtype` not int32 / int64; negative `tokens`, `shard_vocab` 0,
/// sizes that overflow; `label_smoothing` outside `[0, 1)`; an
/// `ignore_index` that does not fit int32 labels; `logits`, `labels`,
/// `loss` NULL when they describe elements or misaligned:
/// ftnInvalidArgument; a `stream` of another context: ftnDeviceMismatch; a
/// broken communicator: ftnBackendError (at its first collective: work
/// enqueued before it stays enqueued). Peers that time out or are gone:
/// ftnBackendError at synchronize.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ftn_vocab_parallel_cross_entropy_forward(
    desc: *const ftnCrossEntropyDesc_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    logits: *const c_void,
    labels: *const c_void,
    loss: *mut f32,
    saved: *mut ftnCrossEntropySaved_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        let c = call(op, comm, stream)?;
        check_out(op, "saved", saved)?;
        let loss = loss as *mut c_void;
        // SAFETY: pointer contracts.
        let s = dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => dispatch_dtype!(op, "desc.label_dtype", d.label_dtype, [I32, I64], I => unsafe {
            ce_fwd_t::<T, I>(op, &c, &d, logits, labels, loss)
        }))?;
        // SAFETY: checked non-NULL.
        unsafe { saved.write(ftnCrossEntropySaved::into_raw(s)) };
        Ok(())
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn ce_bwd_t<T: FloatElement, I: TokenId>(
    op: &'static str,
    c: &Call,
    d: &ftnCrossEntropyDesc_t,
    logits: *const c_void,
    labels: *const c_void,
    saved: &CrossEntropySaved,
    dloss: *const c_void,
    grad: *mut c_void,
) -> Result<()> {
    let (ce, n) = cross_entropy(op, d)?;
    // SAFETY: pointer contracts.
    let (mut x, l, dl) = unsafe {
        (
            view::<T>(&c.dev, op, "logits", logits, n)?,
            view::<I>(&c.dev, op, "labels", labels, ce.tokens)?,
            view::<f32>(&c.dev, op, "dloss", dloss, ce.tokens)?,
        )
    };
    if std::ptr::eq(grad, logits) {
        return ce.backward_in_place(c.comm, c.stream, &mut x, &l, saved, &dl);
    }
    // SAFETY: pointer contract.
    let mut g = unsafe { view::<T>(&c.dev, op, "grad", grad, n)? };
    ce.backward(c.comm, c.stream, &x, &l, saved, &dl, &mut g)
}

/// This rank's logits gradient `grad` (`[tokens, shard_vocab]`, may equal
/// `logits`: in place) `= dloss[t] * (softmax - (1 - eps) * onehot - eps / V)`
/// from the forward's `logits`, `labels` and `saved`; `dloss` is fp32
/// `[tokens]`; a zero row for a label equal to the ignore index. `desc` must
/// be the forward's (a different `ignore_index` / `has_ignore_index` or label
/// smoothing than `saved` was made with: ftnInvalidArgument naming `saved`).
/// No communication.
///
/// Bad input (at the call, nothing enqueued): `desc` bad as for the
/// forward; `saved`, `comm` or `stream` NULL, stale or of another kind; a
/// `desc` whose shape, label smoothing or ignore index differ from the
/// forward's: ftnInvalidArgument naming `saved`; `logits`, `labels`,
/// `dloss`, `grad` NULL when they describe elements or misaligned:
/// ftnInvalidArgument. The stream is not checked against `comm`'s context
/// (no communication). `grad == logits` is in place; other overlaps are not
/// checked.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ftn_vocab_parallel_cross_entropy_backward(
    desc: *const ftnCrossEntropyDesc_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    logits: *const c_void,
    labels: *const c_void,
    saved: ftnCrossEntropySaved_t,
    dloss: *const f32,
    grad: *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor and handle contracts.
        let (d, s) = unsafe {
            (
                read_desc(op, "desc", desc)?,
                get::<ftnCrossEntropySaved>(op, "saved", saved)?,
            )
        };
        let c = call(op, comm, stream)?;
        let dloss = dloss as *const c_void;
        // SAFETY: pointer contracts.
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => dispatch_dtype!(op, "desc.label_dtype", d.label_dtype, [I32, I64], I => unsafe {
            ce_bwd_t::<T, I>(op, &c, &d, logits, labels, &s.saved, dloss, grad)
        }))
    })
}

/// Frees the statistics of a cross-entropy forward (stream-ordered: after
/// the work enqueued so far on every stream; the caller does not wait).
///
/// Bad input: NULL, a stale handle (freed before) or another kind:
/// ftnInvalidArgument, nothing freed.
#[no_mangle]
pub unsafe extern "C" fn ftn_cross_entropy_saved_destroy(
    saved: ftnCrossEntropySaved_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        drop(unsafe { take(op, "saved", saved)? });
        Ok(())
    })
}
