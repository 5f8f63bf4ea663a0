//! Megatron-Core's `ColumnParallelLinear` and `RowParallelLinear` behind
//! opaque handles (`ferrotron::parallel::linear`): created from the full
//! host weights on every rank of a communicator, forward and backward over
//! device pointers.

use std::ffi::c_void;
use std::sync::Mutex;

use ferrotron::parallel::linear::{
    ColumnOptions, ColumnParallelLinear, RowOptions, RowParallelLinear, TpElement,
};
use ferrotron::Result;

use crate::abi::args::{dim, mul};
use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::Desc;
use crate::abi::handles::{handle, take};
use crate::abi::views::view;
use crate::comm::ftnComm_t;
use crate::parallel::common::{
    activation, create, flag, ftnLinearGrads_t, ftnLinearParams_t, full_params, local_rows,
    on_typed, owner, tp_new, typed_from, view_iff, with_layer, with_params, write_params,
    GradViews, Typed,
};
use crate::runtime::ftnStream_t;

/// Shape and options of a column-parallel linear layer `Y = X W^T + b`
/// (`W` is `[out_features, in_features]`; rank `r` owns rows
/// `[r*out/tp, (r+1)*out/tp)` of `W` and `b`). All-zero flags are off.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnColumnParallelLinearDesc_t {
    /// `sizeof(ftnColumnParallelLinearDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t`: ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// Non-zero: the layer has a bias.
    pub bias: i32,
    pub in_features: i64,
    /// A multiple of the communicator's size.
    pub out_features: i64,
    /// Non-zero: all-gather the output columns (`[tokens, out]` on every rank).
    pub gather_output: i32,
    /// Non-zero: do not add the bias (the caller adds it later, fused).
    pub skip_bias_add: i32,
    /// Non-zero: the input is this rank's `[tokens/tp, in]` rows, all-gathered.
    pub sequence_parallel: i32,
    /// `ftnActivation_t` fused in the GEMM epilogue (saves the pre-activation).
    pub activation: i32,
    /// Non-zero: backward communication serialised on the compute stream
    /// (zero: overlapped with the weight gradient, Megatron's way).
    pub serialize_comm: i32,
    /// Must be 0.
    pub reserved: i32,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnColumnParallelLinearDesc_t {
    const NAME: &'static str = "ftnColumnParallelLinearDesc_t";
    const V1_SIZE: usize = 56;
}

/// Shape and options of a row-parallel linear layer `Y = X W^T + b` (rank
/// `r` owns columns `[r*in/tp, (r+1)*in/tp)` of `W`; the bias is
/// replicated). All-zero flags are off.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnRowParallelLinearDesc_t {
    /// `sizeof(ftnRowParallelLinearDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t`: ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// Non-zero: the layer has a bias.
    pub bias: i32,
    /// A multiple of the communicator's size.
    pub in_features: i64,
    pub out_features: i64,
    /// Non-zero: the input is already this rank's `[tokens, in/tp]` columns
    /// (Megatron's default); zero: `[tokens, in]`, split here.
    pub input_is_parallel: i32,
    /// Non-zero: do not add the bias (the caller adds it later, fused).
    pub skip_bias_add: i32,
    /// Non-zero: reduce-scatter the output rows (`[tokens/tp, out]`);
    /// requires `input_is_parallel`.
    pub sequence_parallel: i32,
    /// Non-zero: backward communication serialised on the compute stream.
    pub serialize_comm: i32,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnRowParallelLinearDesc_t {
    const NAME: &'static str = "ftnRowParallelLinearDesc_t";
    const V1_SIZE: usize = 48;
}

type ColumnImpl = Typed<ColumnParallelLinear<half::f16>, ColumnParallelLinear<half::bf16>>;
type RowImpl = Typed<RowParallelLinear<half::f16>, RowParallelLinear<half::bf16>>;

handle!(ftnColumnParallelLinear, ftnColumnParallelLinear_t, 0x4654_4e43_504c_0006, "ftnColumnParallelLinear_t", {
    inner: Mutex<ColumnImpl>,
});
handle!(ftnRowParallelLinear, ftnRowParallelLinear_t, 0x4654_4e52_504c_0007, "ftnRowParallelLinear_t", {
    inner: Mutex<RowImpl>,
});
typed_from!(ColumnParallelLinear);
typed_from!(RowParallelLinear);
owner!(ftnColumnParallelLinear, ColumnImpl);
owner!(ftnRowParallelLinear, RowImpl);

// ---- column-parallel ----

unsafe fn column_new<T: TpElement>(
    op: &'static str,
    comm: &ferrotron::comm::Communicator,
    d: &ftnColumnParallelLinearDesc_t,
    weight: *const c_void,
    bias: *const c_void,
) -> Result<ColumnParallelLinear<T>> {
    if d.reserved != 0 {
        return Err(invalid(op, "desc.reserved", "0", d.reserved));
    }
    let inp = dim(op, "desc.in_features", d.in_features)?;
    let out = dim(op, "desc.out_features", d.out_features)?;
    let options = ColumnOptions {
        bias: flag(d.bias),
        gather_output: flag(d.gather_output),
        skip_bias_add: flag(d.skip_bias_add),
        sequence_parallel: flag(d.sequence_parallel),
        activation: activation(op, "desc.activation", d.activation)?,
        overlap: !flag(d.serialize_comm),
    };
    // SAFETY: host pointer contracts: `out * in` and `out` elements.
    let (w, b) = unsafe { full_params::<T>(op, weight, bias, (out, inp))? };
    ColumnParallelLinear::from_full(comm, inp, out, w, b, options)
}

/// Creates this rank's shard of a column-parallel layer from the full
/// weight `full_weight` (host memory, row-major `[out_features,
/// in_features]`) and bias `full_bias` (host, `[out_features]`; NULL iff
/// `desc->bias` is 0). Every rank passes the same full parameters. The
/// layer keeps its shard in device memory (`ftn_column_parallel_linear_get_params`).
/// `in_features` or `out_features` 0, or `out_features` not a multiple of
/// the communicator's size: ftnInvalidArgument (never an empty layer).
///
/// Bad input (at the call, no handle created, `*layer` untouched;
/// ftnInvalidArgument): `comm` NULL, stale or of another kind; `desc` NULL,
/// misaligned, a bad `desc->size`, non-zero bytes past the known fields or
/// a non-zero `reserved`; `dtype` not fp16 / bf16; `activation` outside
/// `ftnActivation_t`; `layer` NULL or misaligned; negative features;
/// `sequence_parallel` with `gather_output`, or an activation with
/// `skip_bias_add`; `full_weight` NULL or not 2-byte aligned; `full_bias`
/// NULL while `desc->bias` is set, non-NULL while it is not, or misaligned.
/// Device memory that cannot be had: ftnBackendError. Local to this rank
/// (no communication); the host arrays are trusted for their sizes.
#[no_mangle]
pub unsafe extern "C" fn ftn_column_parallel_linear_create(
    comm: ftnComm_t,
    desc: *const ftnColumnParallelLinearDesc_t,
    full_weight: *const c_void,
    full_bias: *const c_void,
    layer: *mut ftnColumnParallelLinear_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle, descriptor and host pointer contracts.
        unsafe {
            create(
                op,
                comm,
                desc,
                ("layer", layer),
                |c, d| tp_new!(op, d.dtype, T => column_new::<T>(op, c, d, full_weight, full_bias)),
            )
        }
    })
}

/// Destroys a column-parallel layer (waits for the device's work first).
///
/// Bad input: NULL, a stale handle or another kind: ftnInvalidArgument,
/// nothing destroyed. Failures of pending work are not reported here.
#[no_mangle]
pub unsafe extern "C" fn ftn_column_parallel_linear_destroy(
    layer: ftnColumnParallelLinear_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        drop(unsafe { take(op, "layer", layer)? });
        Ok(())
    })
}

/// This rank's weight shard `[out/tp, in]` and bias shard `[out/tp]` in
/// device memory (owned by the layer).
///
/// Bad input (ftnInvalidArgument, nothing written): `layer` NULL, stale or
/// of another kind; `params` NULL, misaligned or with a bad `size` (below
/// the first version's, between versions, or above `FTN_MAX_DESC_SIZE`).
#[no_mangle]
pub unsafe extern "C" fn ftn_column_parallel_linear_get_params(
    layer: ftnColumnParallelLinear_t,
    params: *mut ftnLinearParams_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle and out-struct contracts.
        unsafe {
            with_params(
                op,
                "layer",
                layer,
                |g| on_typed!(g, l, T => write_params(op, "params", params, &l.weight, l.bias.as_ref())),
            )
        }
    })
}

/// Element counts of a column layer's tensors for `tokens` on `tp` ranks:
/// (input, output, pre-activation).
fn column_sizes<T: TpElement>(
    op: &'static str,
    l: &ColumnParallelLinear<T>,
    tokens: usize,
    tp: usize,
) -> Result<(usize, usize, usize)> {
    let o = &l.options;
    let rows = local_rows(op, tokens, tp, o.sequence_parallel)?;
    let cols = if o.gather_output {
        l.out_features
    } else {
        l.out_per_rank()
    };
    Ok((
        mul(op, "tokens", rows, l.in_features)?,
        mul(op, "tokens", tokens, cols)?,
        mul(op, "tokens", tokens, l.out_per_rank())?,
    ))
}

#[allow(clippy::too_many_arguments)]
unsafe fn column_forward_t<T: TpElement>(
    op: &'static str,
    l: &mut ColumnParallelLinear<T>,
    c: &crate::comm::Call,
    input: *const c_void,
    output: *mut c_void,
    pre: *mut c_void,
    tokens: usize,
) -> Result<()> {
    let (nin, nout, npre) = column_sizes(op, l, tokens, c.comm.size())?;
    let fused = l.options.activation.is_some();
    // SAFETY: pointer contracts, sizes from the layer's shape.
    let (x, mut y, mut p) = unsafe {
        (
            view::<T>(&c.dev, op, "input", input, nin)?,
            view::<T>(&c.dev, op, "output", output, nout)?,
            view_iff::<T>(
                &c.dev,
                op,
                "pre",
                pre,
                npre,
                fused,
                "given iff the layer fuses an activation",
            )?,
        )
    };
    l.forward(
        c.comm,
        c.stream,
        &x,
        &mut y,
        p.as_mut().map(|b| b as _),
        tokens,
    )
}

/// Forward on `stream`: `output = [act](input W^T + b)`. `input`: `[tokens,
/// in]` (`[tokens/tp, in]` with sequence parallelism); `output`: `[tokens,
/// out/tp]` (`[tokens, out]` with gather_output); `pre` receives the
/// pre-activation `[tokens, out/tp]`, given iff the layer has an activation.
/// Every rank calls it; returns when enqueued.
///
/// Bad input (at the call, nothing enqueued): `layer`, `comm` or `stream`
/// NULL, stale or of another kind; negative `tokens`; a `comm` whose size
/// or rank differs from the one the layer was built for; `tokens` not a
/// multiple of the size with sequence parallelism; `input` / `output` NULL
/// when they describe elements or not 2-byte aligned; `pre` NULL with an
/// activation or non-NULL without: ftnInvalidArgument; a `stream` of
/// another context: ftnDeviceMismatch; a broken communicator:
/// ftnBackendError (at its first collective: work enqueued before it stays
/// enqueued). `tokens` 0 is allowed (collectives still run: every rank
/// calls). Peers that time out or are gone: ftnBackendError at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_column_parallel_linear_forward(
    layer: ftnColumnParallelLinear_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    input: *const c_void,
    output: *mut c_void,
    pre: *mut c_void,
    tokens: i64,
) -> ftnResult_t {
    export!(|op| {
        let tokens = dim(op, "tokens", tokens)?;
        // SAFETY: handle and pointer contracts.
        unsafe {
            with_layer(
                op,
                "layer",
                layer,
                comm,
                stream,
                |g, c| on_typed!(g, l, T => column_forward_t::<T>(op, l, c, input, output, pre, tokens)),
            )
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn column_backward_t<T: TpElement>(
    op: &'static str,
    l: &mut ColumnParallelLinear<T>,
    c: &crate::comm::Call,
    input: *const c_void,
    grad_output: *const c_void,
    pre: *const c_void,
    grad_input: *mut c_void,
    grads: *const ftnLinearGrads_t,
    tokens: usize,
) -> Result<()> {
    let (nin, nout, npre) = column_sizes(op, l, tokens, c.comm.size())?;
    let nw = mul(op, "weight", l.out_per_rank(), l.in_features)?;
    // SAFETY: pointer contracts, sizes from the layer's shape.
    let (x, dy, p, mut dx, mut gv) = unsafe {
        (
            view::<T>(&c.dev, op, "input", input, nin)?,
            view::<T>(&c.dev, op, "grad_output", grad_output, nout)?,
            if pre.is_null() {
                None
            } else {
                Some(view::<T>(&c.dev, op, "pre", pre, npre)?)
            },
            view::<T>(&c.dev, op, "grad_input", grad_input, nin)?,
            GradViews::<T>::read(&c.dev, op, "grads", grads, nw, l.out_per_rank())?,
        )
    };
    l.backward(
        c.comm,
        c.stream,
        &x,
        &dy,
        p.as_ref().map(|b| b as _),
        &mut dx,
        gv.as_grads(),
        tokens,
    )
}

/// Backward on `stream`: `grad_input` (shaped like the forward's `input`,
/// which is passed again) and the gradients in `grads` (weight `[out/tp,
/// in]`, bias `[out/tp]`) from `grad_output` (shaped like `output`). With a
/// fused activation, `pre` is the forward's pre-activation and
/// `grad_output` the gradient of the activated output; `pre = NULL` means
/// `grad_output` already is the pre-activation's gradient (the GeLU
/// backward fused into the next row layer's dgrad). The dgrad all-reduce
/// (reduce-scatter with sequence parallelism) overlaps the weight gradient
/// unless `serialize_comm`.
///
/// Bad input (at the call, nothing enqueued): `layer`, `comm` or `stream`
/// NULL, stale or of another kind; negative `tokens`; a `comm` of another
/// size or rank than the layer's; `tokens` not a multiple of the size with
/// sequence parallelism; `input`, `grad_output`, `grad_input` NULL when
/// they describe elements or not 2-byte aligned; a non-NULL `pre` for a
/// layer without activation; `grads` NULL, misaligned, a bad `size`, a
/// non-zero `reserved` or a bad `weight_mode`, `grads->weight` NULL or
/// misaligned for its mode (fp32 for accumulate); `grads->bias` may be NULL
/// (skipped): ftnInvalidArgument; a `stream` of another context:
/// ftnDeviceMismatch; a broken communicator: ftnBackendError (at its first
/// collective: work enqueued before it stays enqueued). Peers that time out
/// or are gone: ftnBackendError at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_column_parallel_linear_backward(
    layer: ftnColumnParallelLinear_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    input: *const c_void,
    grad_output: *const c_void,
    pre: *const c_void,
    grad_input: *mut c_void,
    grads: *const ftnLinearGrads_t,
    tokens: i64,
) -> ftnResult_t {
    export!(|op| {
        let tokens = dim(op, "tokens", tokens)?;
        // SAFETY: handle and pointer contracts.
        unsafe {
            with_layer(
                op,
                "layer",
                layer,
                comm,
                stream,
                |g, c| on_typed!(g, l, T => column_backward_t::<T>(op, l, c, input, grad_output, pre, grad_input, grads, tokens)),
            )
        }
    })
}

// ---- row-parallel ----

unsafe fn row_new<T: TpElement>(
    op: &'static str,
    comm: &ferrotron::comm::Communicator,
    d: &ftnRowParallelLinearDesc_t,
    weight: *const c_void,
    bias: *const c_void,
) -> Result<RowParallelLinear<T>> {
    let inp = dim(op, "desc.in_features", d.in_features)?;
    let out = dim(op, "desc.out_features", d.out_features)?;
    let options = RowOptions {
        bias: flag(d.bias),
        input_is_parallel: flag(d.input_is_parallel),
        skip_bias_add: flag(d.skip_bias_add),
        sequence_parallel: flag(d.sequence_parallel),
        overlap: !flag(d.serialize_comm),
    };
    // SAFETY: host pointer contracts: `out * in` and `out` elements.
    let (w, b) = unsafe { full_params::<T>(op, weight, bias, (out, inp))? };
    RowParallelLinear::from_full(comm, inp, out, w, b, options)
}

/// Creates this rank's shard of a row-parallel layer from the full weight
/// (host, row-major `[out_features, in_features]`) and bias (host,
/// `[out_features]`, replicated; NULL iff `desc->bias` is 0).
/// `in_features` or `out_features` 0, or `in_features` not a multiple of
/// the communicator's size: ftnInvalidArgument (never an empty layer).
///
/// Bad input (at the call, no handle created, `*layer` untouched;
/// ftnInvalidArgument): `comm` NULL, stale or of another kind; `desc` NULL,
/// misaligned, a bad `desc->size` or non-zero bytes past the known fields;
/// `dtype` not fp16 / bf16; `layer` NULL or misaligned; negative features;
/// `sequence_parallel` without `input_is_parallel`; `full_weight` NULL or
/// not 2-byte aligned; `full_bias` NULL while `desc->bias` is set, non-NULL
/// while it is not, or misaligned. Device memory that cannot be had:
/// ftnBackendError. Local to this rank (no communication); the host arrays
/// are trusted for their sizes.
#[no_mangle]
pub unsafe extern "C" fn ftn_row_parallel_linear_create(
    comm: ftnComm_t,
    desc: *const ftnRowParallelLinearDesc_t,
    full_weight: *const c_void,
    full_bias: *const c_void,
    layer: *mut ftnRowParallelLinear_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle, descriptor and host pointer contracts.
        unsafe {
            create(
                op,
                comm,
                desc,
                ("layer", layer),
                |c, d| tp_new!(op, d.dtype, T => row_new::<T>(op, c, d, full_weight, full_bias)),
            )
        }
    })
}

/// Destroys a row-parallel layer (waits for the device's work first).
///
/// Bad input: NULL, a stale handle or another kind: ftnInvalidArgument,
/// nothing destroyed. Failures of pending work are not reported here.
#[no_mangle]
pub unsafe extern "C" fn ftn_row_parallel_linear_destroy(
    layer: ftnRowParallelLinear_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        drop(unsafe { take(op, "layer", layer)? });
        Ok(())
    })
}

/// This rank's weight shard `[out, in/tp]` and the replicated bias `[out]`
/// in device memory (owned by the layer).
///
/// Bad input (ftnInvalidArgument, nothing written): `layer` NULL, stale or
/// of another kind; `params` NULL, misaligned or with a bad `size` (below
/// the first version's, between versions, or above `FTN_MAX_DESC_SIZE`).
#[no_mangle]
pub unsafe extern "C" fn ftn_row_parallel_linear_get_params(
    layer: ftnRowParallelLinear_t,
    params: *mut ftnLinearParams_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle and out-struct contracts.
        unsafe {
            with_params(
                op,
                "layer",
                layer,
                |g| on_typed!(g, l, T => write_params(op, "params", params, &l.weight, l.bias.as_ref())),
            )
        }
    })
}

/// Element counts of a row layer's tensors: (input, output).
fn row_sizes<T: TpElement>(
    op: &'static str,
    l: &RowParallelLinear<T>,
    tokens: usize,
    tp: usize,
) -> Result<(usize, usize)> {
    let o = &l.options;
    let cols = if o.input_is_parallel {
        l.in_per_rank()
    } else {
        l.in_features
    };
    let rows = local_rows(op, tokens, tp, o.sequence_parallel)?;
    Ok((
        mul(op, "tokens", tokens, cols)?,
        mul(op, "tokens", rows, l.out_features)?,
    ))
}

unsafe fn row_forward_t<T: TpElement>(
    op: &'static str,
    l: &mut RowParallelLinear<T>,
    c: &crate::comm::Call,
    input: *const c_void,
    output: *mut c_void,
    tokens: usize,
) -> Result<()> {
    let (nin, nout) = row_sizes(op, l, tokens, c.comm.size())?;
    // SAFETY: pointer contracts, sizes from the layer's shape.
    let (x, mut y) = unsafe {
        (
            view::<T>(&c.dev, op, "input", input, nin)?,
            view::<T>(&c.dev, op, "output", output, nout)?,
        )
    };
    l.forward(c.comm, c.stream, &x, &mut y, tokens)
}

/// Forward on `stream`: `output = sum over ranks of input_r W_r^T + b`.
/// `input`: `[tokens, in/tp]` (`[tokens, in]` unless input_is_parallel);
/// `output`: `[tokens, out]` (`[tokens/tp, out]` with sequence
/// parallelism). Every rank calls it; returns when enqueued.
///
/// Bad input (at the call, nothing enqueued): `layer`, `comm` or `stream`
/// NULL, stale or of another kind; negative `tokens`; a `comm` whose size
/// or rank differs from the one the layer was built for; `tokens` not a
/// multiple of the size with sequence parallelism; `input` / `output` NULL
/// when they describe elements or not 2-byte aligned: ftnInvalidArgument; a
/// `stream` of another context: ftnDeviceMismatch; a broken communicator:
/// ftnBackendError (at its first collective: work enqueued before it stays
/// enqueued). `tokens` 0 is allowed (collectives still run: every rank
/// calls). Peers that time out or are gone: ftnBackendError at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_row_parallel_linear_forward(
    layer: ftnRowParallelLinear_t,
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
                "layer",
                layer,
                comm,
                stream,
                |g, c| on_typed!(g, l, T => row_forward_t::<T>(op, l, c, input, output, tokens)),
            )
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn row_backward_t<T: TpElement>(
    op: &'static str,
    l: &mut RowParallelLinear<T>,
    c: &crate::comm::Call,
    input: *const c_void,
    grad_output: *const c_void,
    dgelu: i32,
    dgelu_pre: *const c_void,
    grad_input: *mut c_void,
    grads: *const ftnLinearGrads_t,
    tokens: usize,
) -> Result<()> {
    let (nin, nout) = row_sizes(op, l, tokens, c.comm.size())?;
    let act = activation(op, "dgelu", dgelu)?;
    let npre = mul(op, "tokens", tokens, l.in_per_rank())?;
    let nw = mul(op, "weight", l.out_features, l.in_per_rank())?;
    // SAFETY: pointer contracts, sizes from the layer's shape.
    let (x, dy, pre, mut dx, mut gv) = unsafe {
        (
            view::<T>(&c.dev, op, "input", input, nin)?,
            view::<T>(&c.dev, op, "grad_output", grad_output, nout)?,
            view_iff::<T>(
                &c.dev,
                op,
                "dgelu_pre",
                dgelu_pre,
                npre,
                act.is_some(),
                "given iff dgelu is not ftnActivationNone",
            )?,
            view::<T>(&c.dev, op, "grad_input", grad_input, nin)?,
            GradViews::<T>::read(&c.dev, op, "grads", grads, nw, l.out_features)?,
        )
    };
    let fused = act.zip(pre.as_ref().map(|b| b as _));
    l.backward(
        c.comm,
        c.stream,
        &x,
        &dy,
        fused,
        &mut dx,
        gv.as_grads(),
        tokens,
    )
}

/// Backward on `stream`: `grad_input` (shaped like `input`, passed again)
/// and the gradients in `grads` (weight `[out, in/tp]`, bias `[out]`) from
/// `grad_output` (shaped like `output`). `dgelu` (`ftnActivation_t`) other
/// than ftnActivationNone fuses the GeLU backward of a preceding fused
/// column layer into dgrad: `grad_input = (dY W) * gelu'(dgelu_pre)` with
/// `dgelu_pre` that layer's pre-activation `[tokens, in/tp]` (requires
/// input_is_parallel); NULL otherwise.
///
/// Bad input (at the call, nothing enqueued): `layer`, `comm` or `stream`
/// NULL, stale or of another kind; negative `tokens`; a `comm` of another
/// size or rank than the layer's; `dgelu` outside `ftnActivation_t`;
/// `dgelu_pre` NULL with a `dgelu`, non-NULL without, or given for a layer
/// without `input_is_parallel`; `input`, `grad_output`, `grad_input` NULL
/// when they describe elements or not 2-byte aligned; `grads` bad as for
/// `ftn_column_parallel_linear_backward`: ftnInvalidArgument; a `stream` of
/// another context: ftnDeviceMismatch; a broken communicator:
/// ftnBackendError (at its first collective: work enqueued before it stays
/// enqueued). Peers that time out or are gone: ftnBackendError at
/// synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_row_parallel_linear_backward(
    layer: ftnRowParallelLinear_t,
    comm: ftnComm_t,
    stream: ftnStream_t,
    input: *const c_void,
    grad_output: *const c_void,
    dgelu: i32,
    dgelu_pre: *const c_void,
    grad_input: *mut c_void,
    grads: *const ftnLinearGrads_t,
    tokens: i64,
) -> ftnResult_t {
    export!(|op| {
        let tokens = dim(op, "tokens", tokens)?;
        // SAFETY: handle and pointer contracts.
        unsafe {
            with_layer(
                op,
                "layer",
                layer,
                comm,
                stream,
                |g, c| on_typed!(g, l, T => row_backward_t::<T>(op, l, c, input, grad_output, dgelu, dgelu_pre, grad_input, grads, tokens)),
            )
        }
    })
}
