//! Bias + GeLU (`ferrotron::ops::BiasGelu`).

use ferrotron::ops::BiasGelu;
use std::ffi::c_void;

use crate::abi::boundary::{export, ftnResult_t};
use crate::abi::descriptors::{read_desc, Desc};
use crate::abi::dtype::dispatch_dtype;
use crate::abi::views::{opt_view, view};
use crate::ops::{gelu_of, shape, stream_of};
use crate::runtime::ftnStream_t;

/// Shape and options of bias + GeLU over a row-major `[rows, cols]` matrix.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnBiasGeluDesc_t {
    /// `sizeof(ftnBiasGeluDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t`: ftnFloat32, ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// `ftnGelu_t`.
    pub gelu: i32,
    pub rows: i64,
    pub cols: i64,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnBiasGeluDesc_t {
    const NAME: &'static str = "ftnBiasGeluDesc_t";
    const V1_SIZE: usize = 32;
}

/// `out = gelu(x + bias)` (`bias` may be NULL: plain GeLU; `out` may be
/// `x`). `x`, `out`: `rows * cols` elements; `bias`: `cols`.
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): `stream`
/// NULL, stale or of another kind; `desc` NULL, misaligned, a bad
/// `desc->size` or non-zero bytes past the known fields; `desc.gelu` or
/// `desc.dtype` outside the allowed values; negative `rows` / `cols` or a
/// product that overflows; `x` / `out` NULL with `rows * cols > 0`, or any
/// data pointer not aligned to the element size. `bias` NULL means no bias.
/// `rows` or `cols` 0 is a no-op. Overlap other than `out == x` is not
/// checked; faults on the device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_bias_gelu_forward(
    stream: ftnStream_t,
    desc: *const ftnBiasGeluDesc_t,
    x: *const c_void,
    bias: *const c_void,
    out: *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        let g = gelu_of(op, d.gelu)?;
        let sh = shape(op, d.rows, d.cols, "desc.cols")?;
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => {
            // SAFETY: pointer contracts: valid for the documented lengths.
            let (xv, bv, mut ov) = unsafe {
                (
                    view::<T>(&dev, op, "x", x, sh.n)?,
                    opt_view::<T>(&dev, op, "bias", bias, sh.cols)?,
                    view::<T>(&dev, op, "out", out, sh.n)?,
                )
            };
            BiasGelu::new(sh.rows, sh.cols).with_gelu(g).forward(&s.stream, &xv, bv.as_ref().map(|b| b as _), &mut ov)
        })
    })
}

/// `dx = dy * gelu'(x + bias)` (`dx` may be `dy`; `bias` may be NULL, as
/// in the forward) and, when `dbias` is not NULL, `dbias` (`cols`) =
/// column sums of `dx` (deterministic).
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): as for
/// the forward (`stream`, `desc`, enums, dims, alignment), and `dy` / `x` /
/// `dx` NULL with `rows * cols > 0`. `bias` and `dbias` may be NULL (no
/// bias / no bias gradient). `rows` 0 with a `dbias` zero-fills `dbias`;
/// otherwise 0 elements is a no-op. Overlap other than `dx == dy` is not
/// checked; faults on the device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_bias_gelu_backward(
    stream: ftnStream_t,
    desc: *const ftnBiasGeluDesc_t,
    dy: *const c_void,
    x: *const c_void,
    bias: *const c_void,
    dx: *mut c_void,
    dbias: *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        let g = gelu_of(op, d.gelu)?;
        let sh = shape(op, d.rows, d.cols, "desc.cols")?;
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => {
            // SAFETY: pointer contracts.
            let (dyv, xv, bv, mut dxv, mut dbv) = unsafe {
                (
                    view::<T>(&dev, op, "dy", dy, sh.n)?,
                    view::<T>(&dev, op, "x", x, sh.n)?,
                    opt_view::<T>(&dev, op, "bias", bias, sh.cols)?,
                    view::<T>(&dev, op, "dx", dx, sh.n)?,
                    opt_view::<T>(&dev, op, "dbias", dbias, sh.cols)?,
                )
            };
            BiasGelu::new(sh.rows, sh.cols).with_gelu(g).backward(
                &s.stream,
                &dyv,
                &xv,
                bv.as_ref().map(|b| b as _),
                &mut dxv,
                dbv.as_mut().map(|b| b as _),
            )
        })
    })
}
