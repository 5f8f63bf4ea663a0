//! Fused scale + mask + softmax (`ferrotron::ops::softmax`).

use crate::abi::args::{dim, mul};
use crate::abi::enums::{c_enum, parse_enum};
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask};
use std::ffi::c_void;

use ferrotron::Result;

use crate::abi::boundary::{export, ftnResult_t};
use crate::abi::descriptors::{read_desc, Desc};
use crate::abi::dtype::dispatch_dtype;
use crate::abi::views::view;
use crate::ops::stream_of;
use crate::runtime::ftnStream_t;

/// Masks of the softmax forward (`ftnSoftmaxDesc_t.mask`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnSoftmaxMask_t {
    ftnSoftmaxMaskNone = 0,
    /// uint8 mask, nonzero = masked (the scaled logit becomes -10000);
    /// `[batch, 1, sq, sk]`, or `[1, 1, sq, sk]` with `mask_broadcast`.
    ftnSoftmaxMaskPadding = 1,
    /// Row `i` keeps columns `<= i` (`sq == sk`).
    ftnSoftmaxMaskCausal = 2,
}
c_enum!(ftnSoftmaxMask_t: ftnSoftmaxMaskNone, ftnSoftmaxMaskPadding, ftnSoftmaxMaskCausal);

/// Shape and options of the fused scale + mask + softmax over logits
/// `[batch, heads, sq, sk]` (last dimension).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnSoftmaxDesc_t {
    /// `sizeof(ftnSoftmaxDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t`: ftnFloat32, ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// `ftnSoftmaxMask_t` (forward only; the backward reads the mask from `y`).
    pub mask: i32,
    pub batch: i64,
    pub heads: i64,
    pub sq: i64,
    /// `>= 1`.
    pub sk: i64,
    /// Multiplies the logits before masking (e.g. `1/sqrt(head_dim)`); finite.
    pub scale: f32,
    /// Non-zero: the padding mask is `[1, 1, sq, sk]` (shared by the batch).
    pub mask_broadcast: i32,
}
// SAFETY: repr(C), size_t first, integer/float fields, no implicit padding.
unsafe impl Desc for ftnSoftmaxDesc_t {
    const NAME: &'static str = "ftnSoftmaxDesc_t";
    const V1_SIZE: usize = 56;
}

fn softmax_shape(
    op: &'static str,
    d: &ftnSoftmaxDesc_t,
) -> Result<(ScaleMaskSoftmax, usize, usize)> {
    let b = dim(op, "desc.batch", d.batch)?;
    let h = dim(op, "desc.heads", d.heads)?;
    let q = dim(op, "desc.sq", d.sq)?;
    let k = dim(op, "desc.sk", d.sk)?;
    let matrix = mul(op, "desc.sq * sk", q, k)?;
    let n = mul(
        op,
        "desc.batch * heads * sq * sk",
        mul(op, "desc.batch * heads", b, h)?,
        matrix,
    )?;
    Ok((ScaleMaskSoftmax::new(b, h, q, k, d.scale), n, matrix))
}

/// `y = softmax(mask(scale * x))` over the last dimension (`y` may be `x`).
/// `x`, `y`: `batch * heads * sq * sk` elements; `mask` (uint8, only with
/// `ftnSoftmaxMaskPadding`, else ignored): `batch * sq * sk` elements, or
/// `sq * sk` with `mask_broadcast`. Fully masked rows give zeros.
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): `stream`
/// NULL, stale or of another kind; `desc` NULL, misaligned, a bad
/// `desc->size` or non-zero bytes past the known fields; `desc.mask` or
/// `desc.dtype` outside the allowed values; negative dims or products that
/// overflow; `sk` 0; a non-finite `scale`; a causal mask with `sq != sk`;
/// `x` / `y` (and `mask` with `ftnSoftmaxMaskPadding`) NULL when they
/// describe elements, or `x` / `y` not aligned to the element size. `mask`
/// is not read (may be NULL) without a padding mask. `batch`, `heads` or
/// `sq` 0 is a no-op. Overlap other than `y == x` is not checked; faults on
/// the device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_softmax_forward(
    stream: ftnStream_t,
    desc: *const ftnSoftmaxDesc_t,
    x: *const c_void,
    mask: *const u8,
    y: *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        let (sm, n, matrix) = softmax_shape(op, &d)?;
        let kind: ftnSoftmaxMask_t = parse_enum(op, "desc.mask", d.mask)?;
        let mask_view = match kind {
            ftnSoftmaxMask_t::ftnSoftmaxMaskNone | ftnSoftmaxMask_t::ftnSoftmaxMaskCausal => None,
            ftnSoftmaxMask_t::ftnSoftmaxMaskPadding => {
                let len = if d.mask_broadcast != 0 {
                    matrix
                } else {
                    mul(op, "desc.batch * sq * sk", sm.batch, matrix)?
                };
                // SAFETY: pointer contract: `len` bytes.
                Some(unsafe { view::<u8>(&dev, op, "mask", mask as *const c_void, len)? })
            }
        };
        let m = match (kind, mask_view.as_ref()) {
            (ftnSoftmaxMask_t::ftnSoftmaxMaskPadding, Some(v)) => SoftmaxMask::Padding(v),
            (ftnSoftmaxMask_t::ftnSoftmaxMaskCausal, _) => SoftmaxMask::Causal,
            _ => SoftmaxMask::None,
        };
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => {
            // SAFETY: pointer contracts.
            let (xv, mut yv) = unsafe { (view::<T>(&dev, op, "x", x, n)?, view::<T>(&dev, op, "y", y, n)?) };
            sm.forward(&s.stream, &xv, m, &mut yv)
        })
    })
}

/// `dx = scale * (dy*y - y * sum(dy*y))` per row, `y` the forward's output
/// (`dx` may be `dy`). All three: `batch * heads * sq * sk` elements.
/// `desc.mask` is not used but checked as in the forward (an invalid
/// value is ftnInvalidArgument).
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): as for
/// the forward (`stream`, `desc`, enums, dims, `sk` 0, non-finite `scale`),
/// and `y` / `dy` / `dx` NULL when they describe elements or not aligned to
/// the element size. `batch`, `heads` or `sq` 0 is a no-op. Overlap other
/// than `dx == dy` is not checked; faults on the device come at
/// synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_softmax_backward(
    stream: ftnStream_t,
    desc: *const ftnSoftmaxDesc_t,
    y: *const c_void,
    dy: *const c_void,
    dx: *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "desc", desc)? };
        let (sm, n, _) = softmax_shape(op, &d)?;
        // The backward does not read the mask, but a descriptor with an
        // invalid enum is rejected as the forward rejects it.
        let _: ftnSoftmaxMask_t = parse_enum(op, "desc.mask", d.mask)?;
        dispatch_dtype!(op, "desc.dtype", d.dtype, [F32, F16, BF16], T => {
            // SAFETY: pointer contracts.
            let (yv, dyv, mut dxv) = unsafe {
                (view::<T>(&dev, op, "y", y, n)?, view::<T>(&dev, op, "dy", dy, n)?, view::<T>(&dev, op, "dx", dx, n)?)
            };
            sm.backward(&s.stream, &yv, &dyv, &mut dxv)
        })
    })
}
