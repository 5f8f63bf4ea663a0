//! LayerNorm and RMSNorm (`ferrotron::ops::{LayerNorm, RmsNorm}`).

use ferrotron::ops::{LayerNorm, RmsNorm};
use std::ffi::c_void;

use ferrotron::Result;

use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{read_desc, Desc};
use crate::abi::dtype::dispatch_dtype;
use crate::abi::views::{opt_view, view};
use crate::ops::{shape, stream_of, Shape};
use crate::runtime::ftnStream_t;

/// Shape and options of LayerNorm / RMSNorm over a row-major `[rows, hidden]`
/// matrix.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnNormDesc_t {
    /// `sizeof(ftnNormDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t`: ftnFloat32, ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// Non-zero: scale by `gamma + 1` (gamma stored centred on zero).
    pub zero_centered_gamma: i32,
    pub rows: i64,
    /// `>= 1`.
    pub hidden: i64,
    /// Finite and `> 0` (1e-5 is Megatron's and PyTorch's default).
    pub eps: f32,
    /// Must be 0.
    pub reserved: u32,
}
// SAFETY: repr(C), size_t first, integer/float fields, explicit padding.
unsafe impl Desc for ftnNormDesc_t {
    const NAME: &'static str = "ftnNormDesc_t";
    const V1_SIZE: usize = 40;
}

fn norm_shape(op: &'static str, d: &ftnNormDesc_t) -> Result<Shape> {
    if d.reserved != 0 {
        return Err(invalid(op, "desc.reserved", 0, d.reserved));
    }
    shape(op, d.rows, d.hidden, "desc.hidden")
}

/// LayerNorm forward: `y = (x - mean) * rstd * g + beta`; writes fp32
/// `mean[rows]` and `rstd[rows]` for the backward. `gamma`, `beta`
/// (`hidden` elements) may be NULL. `y` must not overlap `x`.
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): `stream`
/// NULL, stale or of another kind; `desc` NULL, misaligned, a bad
/// `desc->size`, non-zero bytes past the known fields or a non-zero
/// `reserved`; `desc.dtype` not a float type; negative `rows`, `hidden` 0,
/// sizes that overflow; `eps` not finite and > 0; `x`, `y`, `mean`, `rstd`
/// NULL with `rows > 0`, or any data pointer not aligned to its element
/// size (4 bytes for `mean` / `rstd`); `y` sharing a byte with `x` (in
/// place included). `rows` 0 is a no-op. Faults on the device come at
/// synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_layer_norm_forward(
    stream: ftnStream_t,
    desc: *const ftnNormDesc_t,
    x: *const c_void,
    gamma: *const c_void,
    beta: *const c_void,
    y: *mut c_void,
    mean: *mut f32,
    rstd: *mut f32,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        let sh = norm_shape(op, &d)?;
        let ln = LayerNorm::new(sh.rows, sh.cols)
            .with_eps(d.eps)
            .with_zero_centered_gamma(d.zero_centered_gamma != 0);
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => {
            // SAFETY: pointer contracts.
            let (xv, gv, bv, mut yv, mut mv, mut rv) = unsafe {
                (
                    view::<T>(&dev, op, "x", x, sh.n)?,
                    opt_view::<T>(&dev, op, "gamma", gamma, sh.cols)?,
                    opt_view::<T>(&dev, op, "beta", beta, sh.cols)?,
                    view::<T>(&dev, op, "y", y, sh.n)?,
                    view::<f32>(&dev, op, "mean", mean as *const c_void, sh.rows)?,
                    view::<f32>(&dev, op, "rstd", rstd as *const c_void, sh.rows)?,
                )
            };
            ln.forward(&s.stream, &xv, gv.as_ref().map(|b| b as _), bv.as_ref().map(|b| b as _), &mut yv, &mut mv, &mut rv)
        })
    })
}

/// LayerNorm backward: `dx`, and when not NULL `dgamma`, `dbeta`
/// (`hidden` elements, deterministic). `mean`, `rstd` from the forward;
/// `gamma` may be NULL, as in the forward.
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): as for
/// the forward (`stream`, `desc`, `reserved`, dtype, dims, alignment; `eps`
/// is not checked here), and `dy`, `x`, `mean`, `rstd`, `dx` NULL with
/// `rows > 0`. `gamma`, `dgamma`, `dbeta` may be NULL. `rows` 0 zero-fills
/// `dgamma` / `dbeta` when given and does nothing else. Faults on the
/// device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_layer_norm_backward(
    stream: ftnStream_t,
    desc: *const ftnNormDesc_t,
    dy: *const c_void,
    x: *const c_void,
    mean: *const f32,
    rstd: *const f32,
    gamma: *const c_void,
    dx: *mut c_void,
    dgamma: *mut c_void,
    dbeta: *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        let sh = norm_shape(op, &d)?;
        let ln = LayerNorm::new(sh.rows, sh.cols)
            .with_eps(d.eps)
            .with_zero_centered_gamma(d.zero_centered_gamma != 0);
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => {
            // SAFETY: pointer contracts.
            let (dyv, xv, mv, rv, gv, mut dxv, mut dgv, mut dbv) = unsafe {
                (
                    view::<T>(&dev, op, "dy", dy, sh.n)?,
                    view::<T>(&dev, op, "x", x, sh.n)?,
                    view::<f32>(&dev, op, "mean", mean as *const c_void, sh.rows)?,
                    view::<f32>(&dev, op, "rstd", rstd as *const c_void, sh.rows)?,
                    opt_view::<T>(&dev, op, "gamma", gamma, sh.cols)?,
                    view::<T>(&dev, op, "dx", dx, sh.n)?,
                    opt_view::<T>(&dev, op, "dgamma", dgamma, sh.cols)?,
                    opt_view::<T>(&dev, op, "dbeta", dbeta, sh.cols)?,
                )
            };
            ln.backward(&s.stream, &dyv, &xv, &mv, &rv, gv.as_ref().map(|b| b as _), &mut dxv, dgv.as_mut().map(|b| b as _), dbv.as_mut().map(|b| b as _))
        })
    })
}

/// RMSNorm forward: `y = x * rstd * g`; writes fp32 `rstd[rows]`.
/// `gamma` may be NULL. `y` must not overlap `x`.
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): `stream`
/// NULL, stale or of another kind; `desc` NULL, misaligned, a bad
/// `desc->size`, non-zero bytes past the known fields or a non-zero
/// `reserved`; `desc.dtype` not a float type; negative `rows`, `hidden` 0,
/// sizes that overflow; `eps` not finite and > 0; `x`, `y`, `rstd` NULL
/// with `rows > 0`, or any data pointer not aligned to its element size.
/// `y` sharing a byte with `x` (in place included). `gamma` may be NULL.
/// `rows` 0 is a no-op. Faults on the device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_rms_norm_forward(
    stream: ftnStream_t,
    desc: *const ftnNormDesc_t,
    x: *const c_void,
    gamma: *const c_void,
    y: *mut c_void,
    rstd: *mut f32,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        let sh = norm_shape(op, &d)?;
        let rms = RmsNorm::new(sh.rows, sh.cols)
            .with_eps(d.eps)
            .with_zero_centered_gamma(d.zero_centered_gamma != 0);
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => {
            // SAFETY: pointer contracts.
            let (xv, gv, mut yv, mut rv) = unsafe {
                (
                    view::<T>(&dev, op, "x", x, sh.n)?,
                    opt_view::<T>(&dev, op, "gamma", gamma, sh.cols)?,
                    view::<T>(&dev, op, "y", y, sh.n)?,
                    view::<f32>(&dev, op, "rstd", rstd as *const c_void, sh.rows)?,
                )
            };
            rms.forward(&s.stream, &xv, gv.as_ref().map(|b| b as _), &mut yv, &mut rv)
        })
    })
}

/// RMSNorm backward: `dx`, and when not NULL `dgamma` (deterministic).
/// `gamma` may be NULL, as in the forward.
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): as for
/// the forward (`stream`, `desc`, `reserved`, dtype, dims, alignment; `eps`
/// is not checked here), and `dy`, `x`, `rstd`, `dx` NULL with `rows > 0`.
/// `gamma` and `dgamma` may be NULL. `rows` 0 zero-fills `dgamma` when
/// given and does nothing else. Faults on the device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_rms_norm_backward(
    stream: ftnStream_t,
    desc: *const ftnNormDesc_t,
    dy: *const c_void,
    x: *const c_void,
    rstd: *const f32,
    gamma: *const c_void,
    dx: *mut c_void,
    dgamma: *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        let sh = norm_shape(op, &d)?;
        let rms = RmsNorm::new(sh.rows, sh.cols)
            .with_eps(d.eps)
            .with_zero_centered_gamma(d.zero_centered_gamma != 0);
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => {
            // SAFETY: pointer contracts.
            let (dyv, xv, rv, gv, mut dxv, mut dgv) = unsafe {
                (
                    view::<T>(&dev, op, "dy", dy, sh.n)?,
                    view::<T>(&dev, op, "x", x, sh.n)?,
                    view::<f32>(&dev, op, "rstd", rstd as *const c_void, sh.rows)?,
                    opt_view::<T>(&dev, op, "gamma", gamma, sh.cols)?,
                    view::<T>(&dev, op, "dx", dx, sh.n)?,
                    opt_view::<T>(&dev, op, "dgamma", dgamma, sh.cols)?,
                )
            };
            rms.backward(&s.stream, &dyv, &xv, &rv, gv.as_ref().map(|b| b as _), &mut dxv, dgv.as_mut().map(|b| b as _))
        })
    })
}
