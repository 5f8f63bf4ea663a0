//! Multi-tensor ops over mixed-dtype tensor lists (`ferrotron::ops::multi_tensor`).

use crate::abi::handles::get;
use crate::ops::grad_scaler::ftnGradScaler_t;
use ferrotron::ops::multi_tensor::{GradRef, TensorRef};
use ferrotron::{AnyBuffer, Device};
use std::ffi::c_void;

use ferrotron::Result;

use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{read_desc, Desc};
use crate::abi::dtype::{dtype_in, dtype_names, FLOATS};
use crate::abi::views::{any_view, view};
use crate::ops::stream_of;
use crate::runtime::ftnStream_t;

/// One tensor of a multi-tensor list (fixed layout: the list's descriptor
/// carries the versioning).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnTensor_t {
    /// Device pointer (host pointer on the emulator); NULL only if `numel == 0`.
    pub data: *mut c_void,
    pub numel: i64,
    /// `ftnDataType_t`: ftnFloat32, ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// Must be 0.
    pub reserved: i32,
}

/// A list of tensors and the options of the multi-tensor ops.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnMultiTensorDesc_t {
    /// `sizeof(ftnMultiTensorDesc_t)` as the caller compiled it.
    pub size: usize,
    /// Entries of the `tensors` array.
    pub num_tensors: usize,
    /// Loss scale for `ftn_multi_tensor_unscale` without a scaler (grads are
    /// multiplied by `1/scale`); ignored by the other ops.
    pub scale: f32,
    /// Must be 0.
    pub reserved: u32,
    /// Clip threshold for the clip ops (`coeff = max_norm / (norm + 1e-6)`,
    /// applied when < 1); ignored by the other ops.
    pub max_norm: f64,
}
// SAFETY: repr(C), size_t first, integer/float fields, explicit padding.
unsafe impl Desc for ftnMultiTensorDesc_t {
    const NAME: &'static str = "ftnMultiTensorDesc_t";
    const V1_SIZE: usize = 32;
}

/// Reads and validates the descriptor and the tensor list.
///
/// # Safety
/// Descriptor and pointer contracts of the multi-tensor functions.
unsafe fn tensor_list(
    op: &'static str,
    dev: &Device,
    desc: *const ftnMultiTensorDesc_t,
    tensors: *const ftnTensor_t,
) -> Result<(ftnMultiTensorDesc_t, Vec<AnyBuffer>)> {
    // SAFETY: descriptor contract.
    let d = unsafe { read_desc(op, "desc", desc)? };
    if d.reserved != 0 {
        return Err(invalid(op, "desc.reserved", 0, d.reserved));
    }
    let n = d.num_tensors;
    if n.checked_mul(std::mem::size_of::<ftnTensor_t>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(invalid(
            op,
            "desc.num_tensors",
            "a count whose array size fits in isize",
            n,
        ));
    }
    if n > 0 && tensors.is_null() {
        return Err(invalid(
            op,
            "tensors",
            format!("a non-NULL array of {n} ftnTensor_t"),
            "NULL",
        ));
    }
    if (tensors as usize) % std::mem::align_of::<ftnTensor_t>() != 0 {
        return Err(invalid(
            op,
            "tensors",
            "a pointer aligned for ftnTensor_t",
            format!("{tensors:p}"),
        ));
    }
    let list = if n == 0 {
        &[][..]
    } else {
        // SAFETY: non-NULL, aligned, `n` entries by the contract.
        unsafe { std::slice::from_raw_parts(tensors, n) }
    };
    let mut views = crate::abi::args::try_vec(op, "tensors", n)?;
    for (i, t) in list.iter().enumerate() {
        let numel = usize::try_from(t.numel).map_err(|_| {
            invalid(
                op,
                "tensors[i].numel",
                "a count >= 0",
                format!("{} (tensor {i})", t.numel),
            )
        })?;
        if t.reserved != 0 {
            return Err(invalid(
                op,
                "tensors[i].reserved",
                0,
                format!("{} (tensor {i})", t.reserved),
            ));
        }
        let dtype = dtype_in(t.dtype, &FLOATS).ok_or_else(|| {
            invalid(
                op,
                "tensors[i].dtype",
                dtype_names(&FLOATS),
                format!("{} (tensor {i})", t.dtype),
            )
        })?;
        // SAFETY: pointer contract: each tensor valid for numel elements.
        let v = unsafe { any_view(dev, op, "tensors[i].data", dtype, t.data, numel)? };
        views.push(v);
    }
    Ok((d, views))
}

/// The op's inputs over views that [`tensor_list`] admitted (float dtypes).
fn grads(views: &mut [AnyBuffer]) -> Vec<GradRef<'_>> {
    views
        .iter_mut()
        .map(|v| match v {
            AnyBuffer::F32(b) => GradRef::from(b),
            AnyBuffer::F16(b) => GradRef::from(b),
            AnyBuffer::BF16(b) => GradRef::from(b),
            other => unreachable!("tensor_list admits floats only, not {}", other.dtype()),
        })
        .collect()
}

fn tensor_refs(views: &[AnyBuffer]) -> Vec<TensorRef<'_>> {
    views
        .iter()
        .map(|v| match v {
            AnyBuffer::F32(b) => TensorRef::from(b),
            AnyBuffer::F16(b) => TensorRef::from(b),
            AnyBuffer::BF16(b) => TensorRef::from(b),
            other => unreachable!("tensor_list admits floats only, not {}", other.dtype()),
        })
        .collect()
}

/// Multiplies every gradient by `1/scale` in place (one launch for the
/// whole mixed-dtype list) and sets `*found_inf` (one fp32 in device
/// memory) to 1 if any value was non-finite (it is never cleared here).
/// With a `scaler` its current scale is used, read on the device, and
/// `desc.scale` is ignored; `scaler` may be NULL.
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): `stream`
/// NULL, stale or of another kind; `desc` NULL, misaligned, a bad
/// `desc->size`, non-zero bytes past the known fields or a non-zero
/// `reserved`; `tensors` NULL with `num_tensors > 0` or misaligned; a
/// tensor with a negative `numel`, a non-zero `reserved`, a non-float
/// `dtype`, or `data` NULL with `numel > 0` or not aligned to its element
/// size; `found_inf` NULL or not 4-byte aligned (even for an empty list);
/// without a scaler, `desc.scale` not finite and > 0 (or with an infinite
/// reciprocal). A non-NULL `scaler` that is stale or of another kind:
/// ftnInvalidArgument; of another context: ftnDeviceMismatch. An empty list
/// (or all `numel` 0) is a no-op. Faults on the device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_multi_tensor_unscale(
    stream: ftnStream_t,
    desc: *const ftnMultiTensorDesc_t,
    tensors: *const ftnTensor_t,
    scaler: ftnGradScaler_t,
    found_inf: *mut f32,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor and pointer contracts.
        let (d, mut views) = unsafe { tensor_list(op, &dev, desc, tensors)? };
        // SAFETY: pointer contract: one fp32.
        let mut fi = unsafe { view::<f32>(&dev, op, "found_inf", found_inf as *const c_void, 1)? };
        let mut g = grads(&mut views);
        let mut mt = s.mt.lock().unwrap_or_else(|p| p.into_inner());
        if scaler.is_null() {
            mt.unscale(&s.stream, &mut g, d.scale, &mut fi)
        } else {
            // SAFETY: handle contract.
            let sc = unsafe { get(op, "scaler", scaler)? };
            let sc = sc.scaler.lock().unwrap_or_else(|p| p.into_inner());
            mt.unscale_with_scaler(&s.stream, &mut g, &sc, &mut fi)
        }
    })
}

/// `*norm` (one fp32 in device memory) = the L2 norm over all tensors of
/// the list (fp32 accumulation, deterministic).
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): `stream`
/// NULL, stale or of another kind; `desc` or the tensor list bad as for
/// `ftn_multi_tensor_unscale` (`size`, `reserved` fields, NULL / misaligned
/// `tensors` or `data`, negative `numel`, non-float `dtype`); `norm` NULL
/// or not 4-byte aligned. `desc.scale` and `max_norm` are not read. An
/// empty list writes 0 to `*norm`. Faults on the device come at
/// synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_multi_tensor_l2_norm(
    stream: ftnStream_t,
    desc: *const ftnMultiTensorDesc_t,
    tensors: *const ftnTensor_t,
    norm: *mut f32,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor and pointer contracts.
        let (_, views) = unsafe { tensor_list(op, &dev, desc, tensors)? };
        // SAFETY: pointer contract: one fp32.
        let mut nv = unsafe { view::<f32>(&dev, op, "norm", norm as *const c_void, 1)? };
        let refs = tensor_refs(&views);
        let mut mt = s.mt.lock().unwrap_or_else(|p| p.into_inner());
        mt.l2_norm(&s.stream, &refs, &mut nv)
    })
}

/// Scales every tensor by `min(1, max_norm / (*norm + 1e-6))` in place,
/// with `*norm` read on the device (e.g. from `ftn_multi_tensor_l2_norm`).
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): `stream`
/// NULL, stale or of another kind; `desc` or the tensor list bad as for
/// `ftn_multi_tensor_unscale`; `desc.max_norm` not finite and > 0; `norm`
/// NULL or not 4-byte aligned. An empty list is a no-op. A NaN `*norm`
/// clips nothing (not an error). Faults on the device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_multi_tensor_clip_by_norm(
    stream: ftnStream_t,
    desc: *const ftnMultiTensorDesc_t,
    tensors: *const ftnTensor_t,
    norm: *const f32,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor and pointer contracts.
        let (d, mut views) = unsafe { tensor_list(op, &dev, desc, tensors)? };
        // SAFETY: pointer contract: one fp32.
        let nv = unsafe { view::<f32>(&dev, op, "norm", norm as *const c_void, 1)? };
        let mut g = grads(&mut views);
        let mut mt = s.mt.lock().unwrap_or_else(|p| p.into_inner());
        mt.clip_by_norm(&s.stream, &mut g, &nv, d.max_norm)
    })
}

/// `ftn_multi_tensor_l2_norm` then `ftn_multi_tensor_clip_by_norm`:
/// PyTorch's `clip_grad_norm_`; `*norm` receives the norm before clipping.
///
/// Bad input (at the call, nothing enqueued; ftnInvalidArgument): `stream`
/// NULL, stale or of another kind; `desc` or the tensor list bad as for
/// `ftn_multi_tensor_unscale`; `desc.max_norm` not finite and > 0; `norm`
/// NULL or not 4-byte aligned. An empty list writes 0 to `*norm` and clips
/// nothing. Faults on the device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_multi_tensor_clip_grad_norm(
    stream: ftnStream_t,
    desc: *const ftnMultiTensorDesc_t,
    tensors: *const ftnTensor_t,
    norm: *mut f32,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: descriptor and pointer contracts.
        let (d, mut views) = unsafe { tensor_list(op, &dev, desc, tensors)? };
        // SAFETY: pointer contract: one fp32.
        let mut nv = unsafe { view::<f32>(&dev, op, "norm", norm as *const c_void, 1)? };
        let mut g = grads(&mut views);
        let mut mt = s.mt.lock().unwrap_or_else(|p| p.into_inner());
        mt.clip_grad_norm(&s.stream, &mut g, d.max_norm, &mut nv)
    })
}
