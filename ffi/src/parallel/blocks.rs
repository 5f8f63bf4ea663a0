//! The tensor-parallel transformer blocks behind opaque handles: the MLP
//! (`ferrotron::parallel::mlp::TpMlp`) and causal self-attention
//! (`ferrotron::parallel::attention::TpAttention`). Each keeps the
//! activations of its last forward for the backward.

use std::ffi::c_void;
use std::sync::Mutex;

use ferrotron::ops::DropoutMode;
use ferrotron::parallel::attention::{
    AttentionGrads, AttentionMask, AttentionOptions, TpAttention,
};
use ferrotron::parallel::linear::TpElement;
use ferrotron::parallel::mlp::{MlpGrads, MlpOptions, TpMlp};
use ferrotron::Result;

use crate::abi::args::{dim, mul};
use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{check_out_desc, Desc};
use crate::abi::handles::{handle, take};
use crate::abi::views::{host_slice, view};
use crate::comm::{ftnComm_t, Call};
use crate::ops::gelu_of;
use crate::parallel::common::{
    create, flag, ftnLinearGrads_t, ftnLinearParams_t, local_rows, on_typed, owner, tp_new,
    typed_from, with_layer, with_params, write_params, GradViews, Typed,
};
use crate::runtime::ftnStream_t;

/// Shape and options of the tensor-parallel MLP block `Y = gelu(X W1^T +
/// b1) W2^T + b2` (fc1 column-parallel `[ffn, hidden]`, fc2 row-parallel
/// `[hidden, ffn]`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnTpMlpDesc_t {
    /// `sizeof(ftnTpMlpDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t`: ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// `ftnGelu_t`.
    pub gelu: i32,
    pub hidden: i64,
    /// A multiple of the communicator's size.
    pub ffn: i64,
    /// Non-zero: input and output are this rank's `[tokens/tp, hidden]` rows.
    pub sequence_parallel: i32,
    /// Non-zero: backward communication serialised on the compute stream.
    pub serialize_comm: i32,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnTpMlpDesc_t {
    const NAME: &'static str = "ftnTpMlpDesc_t";
    const V1_SIZE: usize = 40;
}

/// Shape and options of the tensor-parallel causal self-attention block
/// (QKV column-parallel `[3*heads*head_dim, hidden]` with rows ordered
/// `(head, {q,k,v}, dim)`, output projection row-parallel `[hidden,
/// heads*head_dim]`; tokens in Megatron's `[seq, batch]` order).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnTpAttentionDesc_t {
    /// `sizeof(ftnTpAttentionDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t`: ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// Must be 0.
    pub reserved: i32,
    pub hidden: i64,
    /// A positive multiple of the communicator's size.
    pub heads: i64,
    pub head_dim: i64,
    /// Non-zero: input and output are this rank's `[seq*batch/tp, hidden]` rows.
    pub sequence_parallel: i32,
    /// Non-zero: backward communication serialised on the compute stream.
    pub serialize_comm: i32,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnTpAttentionDesc_t {
    const NAME: &'static str = "ftnTpAttentionDesc_t";
    const V1_SIZE: usize = 48;
}

type MlpImpl = Typed<TpMlp<half::f16>, TpMlp<half::bf16>>;
type AttentionImpl = Typed<TpAttention<half::f16>, TpAttention<half::bf16>>;

handle!(ftnTpMlp, ftnTpMlp_t, 0x4654_4e4d_4c50_0008, "ftnTpMlp_t", {
    inner: Mutex<MlpImpl>,
});
handle!(ftnTpAttention, ftnTpAttention_t, 0x4654_4e41_544e_0009, "ftnTpAttention_t", {
    inner: Mutex<AttentionImpl>,
});
typed_from!(TpMlp);
typed_from!(TpAttention);
owner!(ftnTpMlp, MlpImpl);
owner!(ftnTpAttention, AttentionImpl);

/// The host parameters of a block: four arrays of the given lengths.
///
/// # Safety
/// Each pointer is valid for reads of its length during the call.
unsafe fn host_params<'a, T: TpElement>(
    op: &'static str,
    names: [&'static str; 4],
    ptrs: [*const c_void; 4],
    lens: [usize; 4],
) -> Result<[&'a [T]; 4]> {
    let mut out: [&[T]; 4] = [&[]; 4];
    for i in 0..4 {
        // SAFETY: forwarded contract.
        out[i] = unsafe { host_slice::<T>(op, names[i], ptrs[i], lens[i])? };
    }
    Ok(out)
}

// ---- MLP ----

/// Creates this rank's shard of the MLP block from the full host
/// parameters: fc1 weight `[ffn, hidden]` and bias `[ffn]`, fc2 weight
/// `[hidden, ffn]` and bias `[hidden]` (Megatron's `[out, in]` layout).
/// `hidden` or `ffn` 0, or `ffn` not a multiple of the communicator's size:
/// ftnInvalidArgument (a zero-sized block is an error, not an empty one).
///
/// Bad input (at the call, no handle created, `*mlp` untouched;
/// ftnInvalidArgument): `comm` NULL, stale or of another kind; `desc` NULL,
/// misaligned, a bad `desc->size` or non-zero bytes past the known fields;
/// `dtype` not fp16 / bf16; `gelu` outside `ftnGelu_t`; negative or 0
/// `hidden` / `ffn`, `ffn` not a multiple of the size; `mlp` NULL or
/// misaligned; any of the four host arrays NULL (biases included) or not
/// 2-byte aligned. Device memory that cannot be had: ftnBackendError. Local
/// to this rank (no communication); host arrays are trusted for their
/// sizes.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_mlp_create(
    comm: ftnComm_t,
    desc: *const ftnTpMlpDesc_t,
    fc1_weight: *const c_void,
    fc1_bias: *const c_void,
    fc2_weight: *const c_void,
    fc2_bias: *const c_void,
    mlp: *mut ftnTpMlp_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle, descriptor and host pointer contracts.
        unsafe {
            create(op, comm, desc, ("mlp", mlp), |c, d| {
                let hidden = dim(op, "desc.hidden", d.hidden)?;
                let ffn = dim(op, "desc.ffn", d.ffn)?;
                let options = MlpOptions {
                    gelu: gelu_of(op, d.gelu)?,
                    sequence_parallel: flag(d.sequence_parallel),
                    overlap: !flag(d.serialize_comm),
                };
                let w = mul(op, "desc.hidden * ffn", hidden, ffn)?;
                let names = ["fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"];
                let ptrs = [fc1_weight, fc1_bias, fc2_weight, fc2_bias];
                tp_new!(op, d.dtype, T => {
                    let [w1, b1, w2, b2] = host_params::<T>(op, names, ptrs, [w, ffn, w, hidden])?;
                    TpMlp::from_full(c, hidden, ffn, w1, b1, w2, b2, options)
                })
            })
        }
    })
}

/// Destroys an MLP block (waits for the device's work first).
///
/// Bad input: NULL, a stale handle or another kind: ftnInvalidArgument,
/// nothing destroyed.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_mlp_destroy(mlp: ftnTpMlp_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        drop(unsafe { take(op, "mlp", mlp)? });
        Ok(())
    })
}

/// This rank's parameters in device memory (owned by the block): fc1
/// weight `[ffn/tp, hidden]` and bias `[ffn/tp]`, fc2 weight `[hidden,
/// ffn/tp]` and the replicated bias `[hidden]`. `fc1` and `fc2` are both
/// checked (non-NULL, aligned, `size` set) before either is written.
///
/// Bad input (ftnInvalidArgument, nothing written): `fc1` or `fc2` NULL,
/// misaligned or with a bad `size` (below the first version's, between
/// versions, or above `FTN_MAX_DESC_SIZE`); `mlp` NULL, stale or of another
/// kind.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_mlp_get_params(
    mlp: ftnTpMlp_t,
    fc1: *mut ftnLinearParams_t,
    fc2: *mut ftnLinearParams_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle and out-struct contracts.
        unsafe {
            // Both out-structs are checked before either is written.
            check_out_desc(op, "fc1", fc1)?;
            check_out_desc(op, "fc2", fc2)?;
            with_params(op, "mlp", mlp, |g| {
                on_typed!(g, m, T => {
                    write_params(op, "fc1", fc1, &m.fc1.weight, m.fc1.bias.as_ref())?;
                    write_params(op, "fc2", fc2, &m.fc2.weight, m.fc2.bias.as_ref())
                })
            })
        }
    })
}

unsafe fn mlp_forward_t<T: TpElement>(
    op: &'static str,
    m: &mut TpMlp<T>,
    c: &Call,
    input: *const c_void,
    output: *mut c_void,
    tokens: usize,
) -> Result<()> {
    let n = mul(op, "tokens", m.rows(c.comm, tokens)?, m.hidden)?;
    // SAFETY: pointer contracts, sizes from the block's shape.
    let (x, mut y) = unsafe {
        (
            view::<T>(&c.dev, op, "input", input, n)?,
            view::<T>(&c.dev, op, "output", output, n)?,
        )
    };
    m.forward(c.comm, c.stream, &x, &mut y, tokens)
}

/// Forward on `stream`: `input` and `output` `[tokens, hidden]`
/// (`[tokens/tp, hidden]` with sequence parallelism). Saves the
/// activations for `ftn_tp_mlp_backward`.
///
/// Bad input (at the call, nothing enqueued): `mlp`, `comm` or `stream`
/// NULL, stale or of another kind; negative `tokens`; a `comm` of another
/// size or rank than the block's; `tokens` not a multiple of the size with
/// sequence parallelism; `input` / `output` NULL when they describe
/// elements or not 2-byte aligned: ftnInvalidArgument; a `stream` of
/// another context: ftnDeviceMismatch; a broken communicator:
/// ftnBackendError (at its first collective: work enqueued before it stays
/// enqueued). Peers that time out or are gone: ftnBackendError at
/// synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_mlp_forward(
    mlp: ftnTpMlp_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    input: *const c_void,
    output: *mut c_void,
    tokens: i64,
) -> ftnResult_t {
    export!(|op| {
        let tokens = dim(op, "tokens", tokens)?;
        // SAFETY: handle and pointer contracts.
        unsafe {
            with_layer(
                op,
                "mlp",
                mlp,
                comm,
                stream,
                |g, c| on_typed!(g, m, T => mlp_forward_t::<T>(op, m, c, input, output, tokens)),
            )
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn mlp_backward_t<T: TpElement>(
    op: &'static str,
    m: &mut TpMlp<T>,
    c: &Call,
    input: *const c_void,
    grad_output: *const c_void,
    grad_input: *mut c_void,
    fc1: *const ftnLinearGrads_t,
    fc2: *const ftnLinearGrads_t,
    tokens: usize,
) -> Result<()> {
    if let Some(t) = m.saved_tokens().filter(|&t| t != tokens) {
        return Err(invalid(
            op,
            "tokens",
            format!("the last forward's {t}"),
            tokens,
        ));
    }
    let n = mul(op, "tokens", m.rows(c.comm, tokens)?, m.hidden)?;
    let fp = m.fc1.out_per_rank();
    let nw = mul(op, "weight", fp, m.hidden)?;
    // SAFETY: pointer contracts, sizes from the block's shape.
    let (x, dy, mut dx, mut g1, mut g2) = unsafe {
        (
            view::<T>(&c.dev, op, "input", input, n)?,
            view::<T>(&c.dev, op, "grad_output", grad_output, n)?,
            view::<T>(&c.dev, op, "grad_input", grad_input, n)?,
            GradViews::<T>::read(&c.dev, op, "fc1", fc1, nw, fp)?,
            GradViews::<T>::read(&c.dev, op, "fc2", fc2, nw, m.hidden)?,
        )
    };
    let grads = MlpGrads {
        fc1: g1.as_grads(),
        fc2: g2.as_grads(),
    };
    m.backward(c.comm, c.stream, &x, &dy, &mut dx, grads)
}

/// Backward on `stream` of the last forward (same `tokens` and `input`):
/// `grad_input` and the gradients of fc1 (weight `[ffn/tp, hidden]`, bias
/// `[ffn/tp]`) and fc2 (weight `[hidden, ffn/tp]`, bias `[hidden]`) from
/// `grad_output`, all shaped like the forward's tensors.
///
/// Bad input (at the call, nothing enqueued): as for the forward, and no
/// preceding forward, a `tokens` other than the last forward's,
/// `grad_output` / `grad_input` NULL or misaligned, `fc1` / `fc2` bad as
/// `ftnLinearGrads_t` (NULL, `size`, `reserved`, `weight_mode`, a NULL or
/// misaligned `weight`; `bias` may be NULL): ftnInvalidArgument;
/// ftnDeviceMismatch and ftnBackendError as for the forward. Peers that
/// time out or are gone: ftnBackendError at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_mlp_backward(
    mlp: ftnTpMlp_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    input: *const c_void,
    grad_output: *const c_void,
    grad_input: *mut c_void,
    fc1: *const ftnLinearGrads_t,
    fc2: *const ftnLinearGrads_t,
    tokens: i64,
) -> ftnResult_t {
    export!(|op| {
        let tokens = dim(op, "tokens", tokens)?;
        // SAFETY: handle and pointer contracts.
        unsafe {
            with_layer(
                op,
                "mlp",
                mlp,
                comm,
                stream,
                |g, c| on_typed!(g, m, T => mlp_backward_t::<T>(op, m, c, input, grad_output, grad_input, fc1, fc2, tokens)),
            )
        }
    })
}

// ---- attention ----

/// Creates this rank's shard of the attention block from the full host
/// parameters: QKV weight `[3*heads*head_dim, hidden]` (rows ordered
/// `(head, {q,k,v}, dim)`) and bias `[3*heads*head_dim]`, output
/// projection weight `[hidden, heads*head_dim]` and bias `[hidden]`.
///
/// Bad input (at the call, no handle created, `*attention` untouched;
/// ftnInvalidArgument): `comm` NULL, stale or of another kind; `desc` NULL,
/// misaligned, a bad `desc->size`, non-zero bytes past the known fields or
/// a non-zero `reserved`; `dtype` not fp16 / bf16; negative or 0 `hidden` /
/// `heads` / `head_dim`, `heads` not a multiple of the size, sizes that
/// overflow; `attention` NULL or misaligned; any of the four host arrays
/// NULL (biases included) or not 2-byte aligned. Device memory that cannot
/// be had: ftnBackendError. Local to this rank (no communication).
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_attention_create(
    comm: ftnComm_t,
    desc: *const ftnTpAttentionDesc_t,
    qkv_weight: *const c_void,
    qkv_bias: *const c_void,
    proj_weight: *const c_void,
    proj_bias: *const c_void,
    attention: *mut ftnTpAttention_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle, descriptor and host pointer contracts.
        unsafe {
            create(op, comm, desc, ("attention", attention), |c, d| {
                if d.reserved != 0 {
                    return Err(invalid(op, "desc.reserved", "0", d.reserved));
                }
                let hidden = dim(op, "desc.hidden", d.hidden)?;
                let heads = dim(op, "desc.heads", d.heads)?;
                let head_dim = dim(op, "desc.head_dim", d.head_dim)?;
                let options = AttentionOptions {
                    sequence_parallel: flag(d.sequence_parallel),
                    overlap: !flag(d.serialize_comm),
                    ..Default::default()
                };
                let proj_in = mul(op, "desc.heads * head_dim", heads, head_dim)?;
                let qkv_out = mul(op, "desc.heads * head_dim", 3, proj_in)?;
                let nqkv = mul(op, "desc.hidden", qkv_out, hidden)?;
                let nproj = mul(op, "desc.hidden", hidden, proj_in)?;
                let names = ["qkv_weight", "qkv_bias", "proj_weight", "proj_bias"];
                let ptrs = [qkv_weight, qkv_bias, proj_weight, proj_bias];
                let lens = [nqkv, qkv_out, nproj, hidden];
                tp_new!(op, d.dtype, T => {
                    let [wq, bq, wo, bo] = host_params::<T>(op, names, ptrs, lens)?;
                    TpAttention::from_full(c, hidden, heads, head_dim, wq, bq, wo, bo, options)
                })
            })
        }
    })
}

/// Destroys an attention block (waits for the device's work first).
///
/// Bad input: NULL, a stale handle or another kind: ftnInvalidArgument,
/// nothing destroyed.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_attention_destroy(attention: ftnTpAttention_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        drop(unsafe { take(op, "attention", attention)? });
        Ok(())
    })
}

/// This rank's parameters in device memory (owned by the block): QKV
/// weight `[3*hp*d, hidden]` and bias `[3*hp*d]` (`hp = heads/tp` whole
/// heads), projection weight `[hidden, hp*d]` and the replicated bias.
/// `qkv` and `proj` are both checked before either is written.
///
/// Bad input (ftnInvalidArgument, nothing written): `qkv` or `proj` NULL,
/// misaligned or with a bad `size` (below the first version's, between
/// versions, or above `FTN_MAX_DESC_SIZE`); `attention` NULL, stale or of
/// another kind.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_attention_get_params(
    attention: ftnTpAttention_t,
    qkv: *mut ftnLinearParams_t,
    proj: *mut ftnLinearParams_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle and out-struct contracts.
        unsafe {
            // Both out-structs are checked before either is written.
            check_out_desc(op, "qkv", qkv)?;
            check_out_desc(op, "proj", proj)?;
            with_params(op, "attention", attention, |g| {
                on_typed!(g, a, T => {
                    write_params(op, "qkv", qkv, &a.qkv.weight, a.qkv.bias.as_ref())?;
                    write_params(op, "proj", proj, &a.proj.weight, a.proj.bias.as_ref())
                })
            })
        }
    })
}

/// Elements of the block's input/output on this rank.
fn attention_rows<T: TpElement>(
    op: &'static str,
    a: &TpAttention<T>,
    tp: usize,
    seq: i64,
    batch: i64,
) -> Result<(usize, usize, usize)> {
    let seq = dim(op, "seq", seq)?;
    let batch = dim(op, "batch", batch)?;
    let tokens = mul(op, "seq * batch", seq, batch)?;
    let rows = local_rows(op, tokens, tp, a.options.sequence_parallel)?;
    Ok((seq, batch, mul(op, "seq * batch", rows, a.hidden)?))
}

/// A padding mask as C passes it: `[mask_batches, 1, seq, seq]` uint8.
#[derive(Clone, Copy)]
struct CPaddingMask {
    mask: *const c_void,
    batches: i64,
}

unsafe fn attention_forward_t<T: TpElement>(
    op: &'static str,
    a: &mut TpAttention<T>,
    c: &Call,
    input: *const c_void,
    output: *mut c_void,
    (seq, batch): (i64, i64),
    padding: Option<CPaddingMask>,
) -> Result<()> {
    let (seq, batch, n) = attention_rows(op, a, c.comm.size(), seq, batch)?;
    // SAFETY: pointer contracts, sizes from the block's shape.
    let (x, mut y) = unsafe {
        (
            view::<T>(&c.dev, op, "input", input, n)?,
            view::<T>(&c.dev, op, "output", output, n)?,
        )
    };
    let Some(p) = padding else {
        return a.forward(c.comm, c.stream, &x, &mut y, seq, batch);
    };
    let mb = usize::try_from(p.batches)
        .ok()
        .filter(|&m| m == 1 || m == batch)
        .ok_or_else(|| {
            invalid(
                op,
                "mask_batches",
                format!("1 (one mask for the batch) or batch = {batch}"),
                p.batches,
            )
        })?;
    let n_mask = mul(op, "seq", mb, mul(op, "seq", seq, seq)?)?;
    // SAFETY: pointer contract, the size from the call's shape.
    let m = unsafe { view::<u8>(&c.dev, op, "mask", p.mask, n_mask)? };
    a.forward_masked(
        c.comm,
        c.stream,
        &x,
        &mut y,
        (seq, batch),
        DropoutMode::Eval,
        AttentionMask::Padding(&m),
    )
}

/// The body of both attention forwards: the handles resolved, then the
/// typed forward.
unsafe fn attention_forward(
    op: &'static str,
    (attention, comm, stream): (ftnTpAttention_t, ftnComm_t, ftnStream_t),
    (input, output): (*const c_void, *mut c_void),
    (seq, batch): (i64, i64),
    padding: Option<CPaddingMask>,
) -> Result<()> {
    // SAFETY: handle and pointer contracts.
    unsafe {
        with_layer(
            op,
            "attention",
            attention,
            comm,
            stream,
            |g, c| on_typed!(g, a, T => attention_forward_t::<T>(op, a, c, input, output, (seq, batch), padding)),
        )
    }
}

/// Forward on `stream`: `input` and `output` `[seq*batch, hidden]` in
/// `[seq, batch]` row order (this rank's `[seq*batch/tp, hidden]` rows
/// with sequence parallelism). Saves the activations for the backward.
///
/// Bad input (at the call, nothing enqueued): `attention`, `comm` or
/// `stream` NULL, stale or of another kind; negative, 0 or overflowing
/// `seq` / `batch`; a `comm` of another size or rank than the block's;
/// `seq*batch` not a multiple of the size with sequence parallelism;
/// `input` / `output` NULL or not 2-byte aligned: ftnInvalidArgument; a
/// `stream` of another context: ftnDeviceMismatch; a broken communicator:
/// ftnBackendError (at its first collective: work enqueued before it stays
/// enqueued). Peers that time out or are gone: ftnBackendError at
/// synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_attention_forward(
    attention: ftnTpAttention_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    input: *const c_void,
    output: *mut c_void,
    seq: i64,
    batch: i64,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: the caller's contracts, passed on.
        unsafe {
            attention_forward(
                op,
                (attention, comm, stream),
                (input, output),
                (seq, batch),
                None,
            )
        }
    })
}

/// `ftn_tp_attention_forward` with a padding mask in place of the causal
/// one (an encoder's, e.g. BERT's): `mask` is uint8
/// `[mask_batches, 1, seq, seq]`, nonzero = masked (the scaled score
/// becomes -10000, as Megatron's fused softmax does; a row with every key
/// masked gives zero probabilities); `mask_batches` is `batch` (one mask per
/// sequence, shared by the heads) or 1 (one for the whole batch). The
/// backward is `ftn_tp_attention_backward`, as for the causal forward.
///
/// Bad input: as for `ftn_tp_attention_forward`, and `mask_batches`
/// neither 1 nor `batch`, or `mask` NULL: ftnInvalidArgument, at the call,
/// nothing enqueued.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ftn_tp_attention_forward_padded(
    attention: ftnTpAttention_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    input: *const c_void,
    output: *mut c_void,
    seq: i64,
    batch: i64,
    mask: *const u8,
    mask_batches: i64,
) -> ftnResult_t {
    export!(|op| {
        let padding = Some(CPaddingMask {
            mask: mask as *const c_void,
            batches: mask_batches,
        });
        // SAFETY: the caller's contracts, passed on.
        unsafe {
            attention_forward(
                op,
                (attention, comm, stream),
                (input, output),
                (seq, batch),
                padding,
            )
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn attention_backward_t<T: TpElement>(
    op: &'static str,
    a: &mut TpAttention<T>,
    c: &Call,
    input: *const c_void,
    grad_output: *const c_void,
    grad_input: *mut c_void,
    qkv: *const ftnLinearGrads_t,
    proj: *const ftnLinearGrads_t,
    (seq, batch): (i64, i64),
) -> Result<()> {
    let (sq, bt, n) = attention_rows(op, a, c.comm.size(), seq, batch)?;
    if let Some((s0, b0)) = a.saved_shape().filter(|&s| s != (sq, bt)) {
        return Err(invalid(
            op,
            "seq/batch",
            format!("the last forward's {s0}/{b0}"),
            format!("{sq}/{bt}"),
        ));
    }
    let (qo, pi) = (a.qkv.out_per_rank(), a.proj.in_per_rank());
    // SAFETY: pointer contracts, sizes from the block's shape.
    let (x, dy, mut dx, mut gq, mut gp) = unsafe {
        (
            view::<T>(&c.dev, op, "input", input, n)?,
            view::<T>(&c.dev, op, "grad_output", grad_output, n)?,
            view::<T>(&c.dev, op, "grad_input", grad_input, n)?,
            GradViews::<T>::read(&c.dev, op, "qkv", qkv, mul(op, "weight", qo, a.hidden)?, qo)?,
            GradViews::<T>::read(
                &c.dev,
                op,
                "proj",
                proj,
                mul(op, "weight", a.hidden, pi)?,
                a.hidden,
            )?,
        )
    };
    let grads = AttentionGrads {
        qkv: gq.as_grads(),
        proj: gp.as_grads(),
    };
    a.backward(c.comm, c.stream, &x, &dy, &mut dx, grads)
}

/// Backward on `stream` of the last forward (same `seq`, `batch` and
/// `input`): `grad_input` and the gradients of the QKV layer (weight
/// `[3*hp*d, hidden]`, bias `[3*hp*d]`) and the output projection (weight
/// `[hidden, hp*d]`, bias `[hidden]`) from `grad_output`.
///
/// Bad input (at the call, nothing enqueued): as for the forward, and no
/// preceding forward, a `seq` / `batch` other than the last forward's,
/// `grad_output` / `grad_input` NULL or misaligned, `qkv` / `proj` bad as
/// `ftnLinearGrads_t` (NULL, `size`, `reserved`, `weight_mode`, a NULL or
/// misaligned `weight`; `bias` may be NULL): ftnInvalidArgument;
/// ftnDeviceMismatch and ftnBackendError as for the forward. Peers that
/// time out or are gone: ftnBackendError at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_attention_backward(
    attention: ftnTpAttention_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    input: *const c_void,
    grad_output: *const c_void,
    grad_input: *mut c_void,
    qkv: *const ftnLinearGrads_t,
    proj: *const ftnLinearGrads_t,
    seq: i64,
    batch: i64,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle and pointer contracts.
        unsafe {
            with_layer(
                op,
                "attention",
                attention,
                comm,
                stream,
                |g, c| on_typed!(g, a, T => attention_backward_t::<T>(op, a, c, input, grad_output, grad_input, qkv, proj, (seq, batch))),
            )
        }
    })
}
