//! Kernel ops: `size`-prefixed descriptors, raw pointers, a stream.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use ferrotron::core::loss_scaler::{DynamicGradScaler, GradScalerConfig};
use ferrotron::ops::gemm::{Aux, BiasGrad, Epilogue, Gemm, GemmInputs};
use ferrotron::ops::multi_tensor::{DeviceGradScaler, GradRef, TensorRef};
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask};
use ferrotron::ops::{BiasGelu, Gelu, LayerNorm, RmsNorm};
use ferrotron::{Device, DeviceBuffer, Result};
use half::{bf16, f16};

use crate::boundary::{ftnResult_t, guard, invalid};
use crate::handles::{check_out, dim, get, mul, opt_view, take, view, Handle};
use crate::handles::{ftnContext_t, ftnStream, ftnStream_t};

/// Element types.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnDataType_t {
    ftnFloat32 = 0,
    ftnFloat16 = 1,
    ftnBfloat16 = 2,
    ftnUint8 = 3,
    ftnInt32 = 4,
    ftnInt64 = 5,
}

/// GeLU flavours (`ftnBiasGeluDesc_t.gelu`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnGelu_t {
    /// Megatron's tanh approximation.
    ftnGeluTanh = 0,
    /// Exact: `0.5 x (1 + erf(x / sqrt 2))` (PyTorch's default).
    ftnGeluErf = 1,
}

/// Largest `size` a descriptor may claim: larger values are almost always an
/// uninitialised `size` field.
pub const FTN_MAX_DESC_SIZE: usize = 4096;

/// A `size`-prefixed descriptor: `#[repr(C)]`, `size_t size` first, only
/// integer and float fields and explicit padding, so all-zero bytes and any
/// bytes are valid values.
///
/// # Safety
/// Implementors must satisfy the above.
pub(crate) unsafe trait Desc: Copy {
    const NAME: &'static str;
    /// `sizeof` of the first published version.
    const V1_SIZE: usize;
}

/// Checks a size-prefixed struct's pointer (non-NULL, aligned) and its
/// `size` field (at least the first version's size, at most
/// [`FTN_MAX_DESC_SIZE`]); returns `size`.
///
/// # Safety
/// `p` is NULL or valid for reads of a `size_t`.
unsafe fn desc_size<D: Desc>(op: &'static str, arg: &'static str, p: *const D) -> Result<usize> {
    if p.is_null() {
        return Err(invalid(
            op,
            arg,
            format!("a non-NULL pointer to a {}", D::NAME),
            "NULL",
        ));
    }
    if (p as usize) % std::mem::align_of::<D>() != 0 {
        return Err(invalid(
            op,
            arg,
            format!("a pointer aligned for {}", D::NAME),
            format!("{p:p}"),
        ));
    }
    // SAFETY: non-NULL, aligned; every descriptor starts with a size_t.
    let size = unsafe { (p as *const usize).read() };
    if size < D::V1_SIZE || size > FTN_MAX_DESC_SIZE {
        return Err(invalid(
            op,
            arg,
            format!(
                "{arg}.size = sizeof({}) = {} in this version (at least {}, at most {FTN_MAX_DESC_SIZE}); set {arg}.size = sizeof(*{arg})",
                D::NAME,
                std::mem::size_of::<D>(),
                D::V1_SIZE
            ),
            size,
        ));
    }
    Ok(size)
}

/// Checks a descriptor's pointer and `size` field and copies the fields this
/// library knows (a smaller `size` than ours but at least the first
/// version's leaves the newer fields zero; a larger one must have its unknown
/// trailing bytes zero).
///
/// # Safety
/// `p` is NULL or valid for reads of `p->size` bytes.
pub(crate) unsafe fn read_desc<D: Desc>(
    op: &'static str,
    arg: &'static str,
    p: *const D,
) -> Result<D> {
    let ours = std::mem::size_of::<D>();
    // SAFETY: forwarded contract.
    let size = unsafe { desc_size(op, arg, p)? };
    // SAFETY: the caller's struct is `size` bytes long by the contract.
    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, size) };
    if let Some(i) = bytes.iter().skip(ours).position(|&b| b != 0) {
        return Err(invalid(
            op,
            arg,
            format!(
                "unknown trailing fields of {arg} (bytes {ours}..{arg}.size = {size}) to be zero: this library knows {} up to byte {ours}",
                D::NAME
            ),
            format!("a non-zero byte at offset {}", ours + i),
        ));
    }
    // SAFETY: any bytes are a valid D (trait contract); copy the known prefix.
    let mut d: D = unsafe { std::mem::zeroed() };
    // SAFETY: both ranges are at least min(size, ours) bytes and disjoint.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), &mut d as *mut D as *mut u8, size.min(ours))
    };
    Ok(d)
}

/// Checks an output struct's pointer and `size` field (same rules, trailing
/// bytes left alone) before the library writes the fields it knows.
///
/// # Safety
/// As [`read_desc`].
pub(crate) unsafe fn check_out_desc<D: Desc>(
    op: &'static str,
    arg: &'static str,
    p: *mut D,
) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { desc_size(op, arg, p as *const D) }.map(drop)
}

macro_rules! float_dispatch {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            0 => {
                type $T = f32;
                $body
            }
            1 => {
                type $T = f16;
                $body
            }
            2 => {
                type $T = bf16;
                $body
            }
            other => Err(invalid(
                $op,
                "desc.dtype",
                "ftnFloat32 (0), ftnFloat16 (1) or ftnBfloat16 (2)",
                other,
            )),
        }
    };
}
pub(crate) use float_dispatch;

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

pub(crate) fn gelu_of(op: &'static str, g: i32) -> Result<Gelu> {
    match g {
        0 => Ok(Gelu::Tanh),
        1 => Ok(Gelu::Erf),
        other => Err(invalid(
            op,
            "desc.gelu",
            "ftnGeluTanh (0) or ftnGeluErf (1)",
            other,
        )),
    }
}

struct Shape {
    rows: usize,
    cols: usize,
    n: usize,
}

fn shape(op: &'static str, rows: i64, cols: i64, cols_name: &'static str) -> Result<Shape> {
    let rows_u = dim(op, "desc.rows", rows)?;
    let cols_u = dim(op, cols_name, cols)?;
    let n = mul(op, "desc.rows * cols", rows_u, cols_u)?;
    Ok(Shape {
        rows: rows_u,
        cols: cols_u,
        n,
    })
}

fn stream_of<'a>(op: &'static str, stream: ftnStream_t) -> Result<(&'a ftnStream, Device)> {
    // SAFETY: handle contract of every exported function.
    let s = unsafe { get::<ftnStream>(op, "stream", stream)? };
    let dev = s.stream.device().clone();
    Ok((s, dev))
}

/// `out = gelu(x + bias)` (`bias` may be NULL: plain GeLU; `out` may be
/// `x`). `x`, `out`: `rows * cols` elements; `bias`: `cols`.
#[no_mangle]
pub unsafe extern "C" fn ftn_bias_gelu_forward(
    stream: ftnStream_t,
    desc: *const ftnBiasGeluDesc_t,
    x: *const c_void,
    bias: *const c_void,
    out: *mut c_void,
) -> ftnResult_t {
    guard("ftn_bias_gelu_forward", move || {
        const OP: &str = "ftn_bias_gelu_forward";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(OP, "desc", desc)? };
        let g = gelu_of(OP, d.gelu)?;
        let sh = shape(OP, d.rows, d.cols, "desc.cols")?;
        float_dispatch!(OP, d.dtype, T => {
            // SAFETY: pointer contracts: valid for the documented lengths.
            let (xv, bv, mut ov) = unsafe {
                (
                    view::<T>(&dev, OP, "x", x, sh.n)?,
                    opt_view::<T>(&dev, OP, "bias", bias, sh.cols)?,
                    view::<T>(&dev, OP, "out", out, sh.n)?,
                )
            };
            BiasGelu::new(sh.rows, sh.cols).with_gelu(g).forward(&s.stream, &xv, bv.as_ref(), &mut ov)
        })
    })
}

/// `dx = dy * gelu'(x + bias)` (`dx` may be `dy`) and, when `dbias` is
/// not NULL, `dbias` (`cols`) = column sums of `dx` (deterministic).
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
    guard("ftn_bias_gelu_backward", move || {
        const OP: &str = "ftn_bias_gelu_backward";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(OP, "desc", desc)? };
        let g = gelu_of(OP, d.gelu)?;
        let sh = shape(OP, d.rows, d.cols, "desc.cols")?;
        float_dispatch!(OP, d.dtype, T => {
            // SAFETY: pointer contracts.
            let (dyv, xv, bv, mut dxv, mut dbv) = unsafe {
                (
                    view::<T>(&dev, OP, "dy", dy, sh.n)?,
                    view::<T>(&dev, OP, "x", x, sh.n)?,
                    opt_view::<T>(&dev, OP, "bias", bias, sh.cols)?,
                    view::<T>(&dev, OP, "dx", dx, sh.n)?,
                    opt_view::<T>(&dev, OP, "dbias", dbias, sh.cols)?,
                )
            };
            BiasGelu::new(sh.rows, sh.cols).with_gelu(g).backward(
                &s.stream,
                &dyv,
                &xv,
                bv.as_ref(),
                &mut dxv,
                dbv.as_mut(),
            )
        })
    })
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
    guard("ftn_layer_norm_forward", move || {
        const OP: &str = "ftn_layer_norm_forward";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(OP, "desc", desc)? };
        let sh = norm_shape(OP, &d)?;
        let ln = LayerNorm::new(sh.rows, sh.cols)
            .with_eps(d.eps)
            .with_zero_centered_gamma(d.zero_centered_gamma != 0);
        float_dispatch!(OP, d.dtype, T => {
            // SAFETY: pointer contracts.
            let (xv, gv, bv, mut yv, mut mv, mut rv) = unsafe {
                (
                    view::<T>(&dev, OP, "x", x, sh.n)?,
                    opt_view::<T>(&dev, OP, "gamma", gamma, sh.cols)?,
                    opt_view::<T>(&dev, OP, "beta", beta, sh.cols)?,
                    view::<T>(&dev, OP, "y", y, sh.n)?,
                    view::<f32>(&dev, OP, "mean", mean as *const c_void, sh.rows)?,
                    view::<f32>(&dev, OP, "rstd", rstd as *const c_void, sh.rows)?,
                )
            };
            ln.forward(&s.stream, &xv, gv.as_ref(), bv.as_ref(), &mut yv, &mut mv, &mut rv)
        })
    })
}

/// LayerNorm backward: `dx`, and when not NULL `dgamma`, `dbeta`
/// (`hidden` elements, deterministic). `mean`, `rstd` from the forward.
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
    guard("ftn_layer_norm_backward", move || {
        const OP: &str = "ftn_layer_norm_backward";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(OP, "desc", desc)? };
        let sh = norm_shape(OP, &d)?;
        let ln = LayerNorm::new(sh.rows, sh.cols)
            .with_eps(d.eps)
            .with_zero_centered_gamma(d.zero_centered_gamma != 0);
        float_dispatch!(OP, d.dtype, T => {
            // SAFETY: pointer contracts.
            let (dyv, xv, mv, rv, gv, mut dxv, mut dgv, mut dbv) = unsafe {
                (
                    view::<T>(&dev, OP, "dy", dy, sh.n)?,
                    view::<T>(&dev, OP, "x", x, sh.n)?,
                    view::<f32>(&dev, OP, "mean", mean as *const c_void, sh.rows)?,
                    view::<f32>(&dev, OP, "rstd", rstd as *const c_void, sh.rows)?,
                    opt_view::<T>(&dev, OP, "gamma", gamma, sh.cols)?,
                    view::<T>(&dev, OP, "dx", dx, sh.n)?,
                    opt_view::<T>(&dev, OP, "dgamma", dgamma, sh.cols)?,
                    opt_view::<T>(&dev, OP, "dbeta", dbeta, sh.cols)?,
                )
            };
            ln.backward(&s.stream, &dyv, &xv, &mv, &rv, gv.as_ref(), &mut dxv, dgv.as_mut(), dbv.as_mut())
        })
    })
}

/// RMSNorm forward: `y = x * rstd * g`; writes fp32 `rstd[rows]`.
/// `gamma` may be NULL. `y` must not overlap `x`.
#[no_mangle]
pub unsafe extern "C" fn ftn_rms_norm_forward(
    stream: ftnStream_t,
    desc: *const ftnNormDesc_t,
    x: *const c_void,
    gamma: *const c_void,
    y: *mut c_void,
    rstd: *mut f32,
) -> ftnResult_t {
    guard("ftn_rms_norm_forward", move || {
        const OP: &str = "ftn_rms_norm_forward";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(OP, "desc", desc)? };
        let sh = norm_shape(OP, &d)?;
        let rms = RmsNorm::new(sh.rows, sh.cols)
            .with_eps(d.eps)
            .with_zero_centered_gamma(d.zero_centered_gamma != 0);
        float_dispatch!(OP, d.dtype, T => {
            // SAFETY: pointer contracts.
            let (xv, gv, mut yv, mut rv) = unsafe {
                (
                    view::<T>(&dev, OP, "x", x, sh.n)?,
                    opt_view::<T>(&dev, OP, "gamma", gamma, sh.cols)?,
                    view::<T>(&dev, OP, "y", y, sh.n)?,
                    view::<f32>(&dev, OP, "rstd", rstd as *const c_void, sh.rows)?,
                )
            };
            rms.forward(&s.stream, &xv, gv.as_ref(), &mut yv, &mut rv)
        })
    })
}

/// RMSNorm backward: `dx`, and when not NULL `dgamma` (deterministic).
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
    guard("ftn_rms_norm_backward", move || {
        const OP: &str = "ftn_rms_norm_backward";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(OP, "desc", desc)? };
        let sh = norm_shape(OP, &d)?;
        let rms = RmsNorm::new(sh.rows, sh.cols)
            .with_eps(d.eps)
            .with_zero_centered_gamma(d.zero_centered_gamma != 0);
        float_dispatch!(OP, d.dtype, T => {
            // SAFETY: pointer contracts.
            let (dyv, xv, rv, gv, mut dxv, mut dgv) = unsafe {
                (
                    view::<T>(&dev, OP, "dy", dy, sh.n)?,
                    view::<T>(&dev, OP, "x", x, sh.n)?,
                    view::<f32>(&dev, OP, "rstd", rstd as *const c_void, sh.rows)?,
                    opt_view::<T>(&dev, OP, "gamma", gamma, sh.cols)?,
                    view::<T>(&dev, OP, "dx", dx, sh.n)?,
                    opt_view::<T>(&dev, OP, "dgamma", dgamma, sh.cols)?,
                )
            };
            rms.backward(&s.stream, &dyv, &xv, &rv, gv.as_ref(), &mut dxv, dgv.as_mut())
        })
    })
}

// ---------------------------------------------------------------------------
// Multi-tensor ops and the loss scaler.

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

enum AnyView {
    F32(DeviceBuffer<f32>),
    F16(DeviceBuffer<f16>),
    BF16(DeviceBuffer<bf16>),
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
) -> Result<(ftnMultiTensorDesc_t, Vec<AnyView>)> {
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
    let mut views = Vec::with_capacity(n);
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
        // SAFETY: pointer contract: each tensor valid for numel elements.
        let v = unsafe {
            match t.dtype {
                0 => AnyView::F32(view(dev, op, "tensors[i].data", t.data, numel)?),
                1 => AnyView::F16(view(dev, op, "tensors[i].data", t.data, numel)?),
                2 => AnyView::BF16(view(dev, op, "tensors[i].data", t.data, numel)?),
                other => {
                    return Err(invalid(
                        op,
                        "tensors[i].dtype",
                        "ftnFloat32 (0), ftnFloat16 (1) or ftnBfloat16 (2)",
                        format!("{other} (tensor {i})"),
                    ))
                }
            }
        };
        views.push(v);
    }
    Ok((d, views))
}

fn grads(views: &mut [AnyView]) -> Vec<GradRef<'_>> {
    views
        .iter_mut()
        .map(|v| match v {
            AnyView::F32(b) => GradRef::F32(b),
            AnyView::F16(b) => GradRef::F16(b),
            AnyView::BF16(b) => GradRef::BF16(b),
        })
        .collect()
}

fn tensor_refs(views: &[AnyView]) -> Vec<TensorRef<'_>> {
    views
        .iter()
        .map(|v| match v {
            AnyView::F32(b) => TensorRef::F32(b),
            AnyView::F16(b) => TensorRef::F16(b),
            AnyView::BF16(b) => TensorRef::BF16(b),
        })
        .collect()
}

/// Multiplies every gradient by `1/scale` in place (one launch for the
/// whole mixed-dtype list) and sets `*found_inf` (one fp32 in device
/// memory) to 1 if any value was non-finite (it is never cleared here).
/// With a `scaler` its current scale is used, read on the device, and
/// `desc.scale` is ignored; `scaler` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn ftn_multi_tensor_unscale(
    stream: ftnStream_t,
    desc: *const ftnMultiTensorDesc_t,
    tensors: *const ftnTensor_t,
    scaler: ftnGradScaler_t,
    found_inf: *mut f32,
) -> ftnResult_t {
    guard("ftn_multi_tensor_unscale", move || {
        const OP: &str = "ftn_multi_tensor_unscale";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor and pointer contracts.
        let (d, mut views) = unsafe { tensor_list(OP, &dev, desc, tensors)? };
        // SAFETY: pointer contract: one fp32.
        let mut fi = unsafe { view::<f32>(&dev, OP, "found_inf", found_inf as *const c_void, 1)? };
        let mut g = grads(&mut views);
        let mut mt = s.mt.lock().unwrap_or_else(|p| p.into_inner());
        if scaler.is_null() {
            mt.unscale(&s.stream, &mut g, d.scale, &mut fi)
        } else {
            // SAFETY: handle contract.
            let sc = unsafe { get(OP, "scaler", scaler)? };
            let sc = sc.scaler.lock().unwrap_or_else(|p| p.into_inner());
            mt.unscale_with_scaler(&s.stream, &mut g, &sc, &mut fi)
        }
    })
}

/// `*norm` (one fp32 in device memory) = the L2 norm over all tensors of
/// the list (fp32 accumulation, deterministic).
#[no_mangle]
pub unsafe extern "C" fn ftn_multi_tensor_l2_norm(
    stream: ftnStream_t,
    desc: *const ftnMultiTensorDesc_t,
    tensors: *const ftnTensor_t,
    norm: *mut f32,
) -> ftnResult_t {
    guard("ftn_multi_tensor_l2_norm", move || {
        const OP: &str = "ftn_multi_tensor_l2_norm";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor and pointer contracts.
        let (_, views) = unsafe { tensor_list(OP, &dev, desc, tensors)? };
        // SAFETY: pointer contract: one fp32.
        let mut nv = unsafe { view::<f32>(&dev, OP, "norm", norm as *const c_void, 1)? };
        let refs = tensor_refs(&views);
        let mut mt = s.mt.lock().unwrap_or_else(|p| p.into_inner());
        mt.l2_norm(&s.stream, &refs, &mut nv)
    })
}

/// Scales every tensor by `min(1, max_norm / (*norm + 1e-6))` in place,
/// with `*norm` read on the device (e.g. from `ftn_multi_tensor_l2_norm`).
#[no_mangle]
pub unsafe extern "C" fn ftn_multi_tensor_clip_by_norm(
    stream: ftnStream_t,
    desc: *const ftnMultiTensorDesc_t,
    tensors: *const ftnTensor_t,
    norm: *const f32,
) -> ftnResult_t {
    guard("ftn_multi_tensor_clip_by_norm", move || {
        const OP: &str = "ftn_multi_tensor_clip_by_norm";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor and pointer contracts.
        let (d, mut views) = unsafe { tensor_list(OP, &dev, desc, tensors)? };
        // SAFETY: pointer contract: one fp32.
        let nv = unsafe { view::<f32>(&dev, OP, "norm", norm as *const c_void, 1)? };
        let mut g = grads(&mut views);
        let mut mt = s.mt.lock().unwrap_or_else(|p| p.into_inner());
        mt.clip_by_norm(&s.stream, &mut g, &nv, d.max_norm)
    })
}

/// `ftn_multi_tensor_l2_norm` then `ftn_multi_tensor_clip_by_norm`:
/// PyTorch's `clip_grad_norm_`; `*norm` receives the norm before clipping.
#[no_mangle]
pub unsafe extern "C" fn ftn_multi_tensor_clip_grad_norm(
    stream: ftnStream_t,
    desc: *const ftnMultiTensorDesc_t,
    tensors: *const ftnTensor_t,
    norm: *mut f32,
) -> ftnResult_t {
    guard("ftn_multi_tensor_clip_grad_norm", move || {
        const OP: &str = "ftn_multi_tensor_clip_grad_norm";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor and pointer contracts.
        let (d, mut views) = unsafe { tensor_list(OP, &dev, desc, tensors)? };
        // SAFETY: pointer contract: one fp32.
        let mut nv = unsafe { view::<f32>(&dev, OP, "norm", norm as *const c_void, 1)? };
        let mut g = grads(&mut views);
        let mut mt = s.mt.lock().unwrap_or_else(|p| p.into_inner());
        mt.clip_grad_norm(&s.stream, &mut g, d.max_norm, &mut nv)
    })
}

/// Hyper-parameters of Megatron's dynamic loss scaler.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnGradScalerConfig_t {
    /// `sizeof(ftnGradScalerConfig_t)` as the caller compiled it.
    pub size: usize,
    /// Scale at the start (Megatron: 2^32).
    pub initial_scale: f32,
    /// The scale never backs off below this (1).
    pub min_scale: f32,
    /// Multiplier after `growth_interval` clean steps (2).
    pub growth_factor: f32,
    /// Multiplier on a backoff (0.5).
    pub backoff_factor: f32,
    /// Clean steps in a row before the scale grows (1000).
    pub growth_interval: u32,
    /// Overflows tolerated before backing off (2).
    pub hysteresis: u32,
}
// SAFETY: repr(C), size_t first, integer/float fields, no implicit padding.
unsafe impl Desc for ftnGradScalerConfig_t {
    const NAME: &'static str = "ftnGradScalerConfig_t";
    const V1_SIZE: usize = 32;
}

/// The scaler's state (Megatron's `state_dict`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnGradScalerState_t {
    /// `sizeof(ftnGradScalerState_t)` as the caller compiled it.
    pub size: usize,
    /// The current loss scale.
    pub scale: f32,
    /// Clean steps since the last overflow or growth.
    pub growth_tracker: i32,
    /// Overflows still tolerated before backing off.
    pub hysteresis_tracker: i32,
    /// Must be 0.
    pub reserved: i32,
}
// SAFETY: repr(C), size_t first, integer/float fields, explicit padding.
unsafe impl Desc for ftnGradScalerState_t {
    const NAME: &'static str = "ftnGradScalerState_t";
    const V1_SIZE: usize = 24;
}

fn config_of(c: &ftnGradScalerConfig_t) -> GradScalerConfig {
    GradScalerConfig {
        initial_scale: c.initial_scale,
        min_scale: c.min_scale,
        growth_factor: c.growth_factor,
        backoff_factor: c.backoff_factor,
        growth_interval: c.growth_interval,
        hysteresis: c.hysteresis,
    }
}

/// # Safety
/// Descriptor contracts.
unsafe fn host_scaler(
    op: &'static str,
    config: *const ftnGradScalerConfig_t,
    state: *const ftnGradScalerState_t,
) -> Result<DynamicGradScaler> {
    // SAFETY: descriptor contract.
    let c = config_of(&unsafe { read_desc(op, "config", config)? });
    if state.is_null() {
        return DynamicGradScaler::new(c);
    }
    // SAFETY: descriptor contract.
    let st = unsafe { read_desc(op, "state", state)? };
    DynamicGradScaler::from_state(c, st.scale, st.growth_tracker, st.hysteresis_tracker)
}

/// # Safety
/// `out` passed [`check_out_desc`].
unsafe fn write_state(out: *mut ftnGradScalerState_t, s: &DynamicGradScaler) {
    // SAFETY: checked non-NULL, aligned and at least V1_SIZE bytes.
    unsafe {
        (*out).scale = s.scale();
        (*out).growth_tracker = s.growth_tracker();
        (*out).hysteresis_tracker = s.hysteresis_tracker();
        (*out).reserved = 0;
    }
}

/// Fills `config` (whose `size` the caller has set) with Megatron's
/// defaults.
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_config_default(
    config: *mut ftnGradScalerConfig_t,
) -> ftnResult_t {
    guard("ftn_grad_scaler_config_default", move || {
        const OP: &str = "ftn_grad_scaler_config_default";
        // SAFETY: descriptor contract.
        unsafe { check_out_desc(OP, "config", config)? };
        let c = GradScalerConfig::default();
        // SAFETY: checked above.
        unsafe {
            (*config).initial_scale = c.initial_scale;
            (*config).min_scale = c.min_scale;
            (*config).growth_factor = c.growth_factor;
            (*config).backoff_factor = c.backoff_factor;
            (*config).growth_interval = c.growth_interval;
            (*config).hysteresis = c.hysteresis;
        }
        Ok(())
    })
}

/// Host state machine: validates `config` and writes the fresh state
/// (scale = initial_scale, growth tracker 0, hysteresis tracker =
/// hysteresis) to `state` (whose `size` the caller has set).
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_host_init(
    config: *const ftnGradScalerConfig_t,
    state: *mut ftnGradScalerState_t,
) -> ftnResult_t {
    guard("ftn_grad_scaler_host_init", move || {
        const OP: &str = "ftn_grad_scaler_host_init";
        // SAFETY: descriptor contracts.
        unsafe {
            check_out_desc(OP, "state", state)?;
            let s = host_scaler(OP, config, std::ptr::null())?;
            write_state(state, &s);
        }
        Ok(())
    })
}

/// Host state machine: one step of Megatron's `DynamicGradScaler.update`
/// with `found_inf` (non-zero: an overflow), in place on `state`.
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_host_update(
    config: *const ftnGradScalerConfig_t,
    state: *mut ftnGradScalerState_t,
    found_inf: c_int,
) -> ftnResult_t {
    guard("ftn_grad_scaler_host_update", move || {
        const OP: &str = "ftn_grad_scaler_host_update";
        // SAFETY: descriptor contracts.
        unsafe {
            let mut s = host_scaler(OP, config, state)?;
            s.update(found_inf != 0);
            write_state(state, &s);
        }
        Ok(())
    })
}

/// The device-side loss scaler behind `ftnGradScaler_t`.
#[repr(C)]
pub struct ftnGradScaler {
    magic: u64,
    pub(crate) scaler: Mutex<DeviceGradScaler>,
}
#[allow(non_camel_case_types)]
pub type ftnGradScaler_t = *mut ftnGradScaler;
impl Handle for ftnGradScaler {
    const MAGIC: u64 = 0x4654_4e47_5343_0004;
    const KIND: &'static str = "ftnGradScaler_t";
    fn magic(&self) -> u64 {
        self.magic
    }
    fn clear_magic(&mut self) {
        self.magic = 0;
    }
}

/// A loss scaler whose state lives in device memory and is stepped by a
/// kernel (`ftn_grad_scaler_update`), so a training step never waits for
/// the host. `state` may be NULL (fresh state) or a saved state.
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_create(
    ctx: ftnContext_t,
    config: *const ftnGradScalerConfig_t,
    state: *const ftnGradScalerState_t,
    scaler: *mut ftnGradScaler_t,
) -> ftnResult_t {
    guard("ftn_grad_scaler_create", move || {
        const OP: &str = "ftn_grad_scaler_create";
        // SAFETY: handle contract.
        let c = unsafe { get(OP, "ctx", ctx)? };
        check_out(OP, "scaler", scaler)?;
        // SAFETY: descriptor contracts.
        let host = unsafe { host_scaler(OP, config, state)? };
        let dev = DeviceGradScaler::from_host(&c.dev, &host)?;
        let h = Box::into_raw(Box::new(ftnGradScaler {
            magic: ftnGradScaler::MAGIC,
            scaler: Mutex::new(dev),
        }));
        // SAFETY: checked non-NULL.
        unsafe { scaler.write(h) };
        Ok(())
    })
}

/// Destroys a device scaler (waits for the device's work first).
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_destroy(scaler: ftnGradScaler_t) -> ftnResult_t {
    guard("ftn_grad_scaler_destroy", move || {
        // SAFETY: handle contract.
        drop(unsafe { take("ftn_grad_scaler_destroy", "scaler", scaler)? });
        Ok(())
    })
}

/// Enqueues one scaler step on `stream`, reading `*found_inf` (one fp32
/// in device memory, non-zero = overflow, e.g. written by
/// `ftn_multi_tensor_unscale` and MAX-all-reduced); with
/// `reset_found_inf` non-zero it is then set to 0 for the next step.
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_update(
    scaler: ftnGradScaler_t,
    stream: ftnStream_t,
    found_inf: *mut f32,
    reset_found_inf: c_int,
) -> ftnResult_t {
    guard("ftn_grad_scaler_update", move || {
        const OP: &str = "ftn_grad_scaler_update";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: handle contract.
        let sc = unsafe { get(OP, "scaler", scaler)? };
        // SAFETY: pointer contract: one fp32.
        let mut fi = unsafe { view::<f32>(&dev, OP, "found_inf", found_inf as *const c_void, 1)? };
        let mut g = sc.scaler.lock().unwrap_or_else(|p| p.into_inner());
        g.update(&s.stream, &mut fi, reset_found_inf != 0)
    })
}

/// Waits for the device's work and writes the scaler's state (to save
/// it, or to read the current scale on the host).
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_get_state(
    scaler: ftnGradScaler_t,
    state: *mut ftnGradScalerState_t,
) -> ftnResult_t {
    guard("ftn_grad_scaler_get_state", move || {
        const OP: &str = "ftn_grad_scaler_get_state";
        // SAFETY: handle contract.
        let sc = unsafe { get(OP, "scaler", scaler)? };
        // SAFETY: descriptor contract.
        unsafe { check_out_desc(OP, "state", state)? };
        let host = sc
            .scaler
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .to_host()?;
        // SAFETY: checked above.
        unsafe { write_state(state, &host) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn first_version_sizes_are_the_current_sizes() {
        assert_eq!(size_of::<ftnBiasGeluDesc_t>(), ftnBiasGeluDesc_t::V1_SIZE);
        assert_eq!(size_of::<ftnNormDesc_t>(), ftnNormDesc_t::V1_SIZE);
        assert_eq!(
            size_of::<ftnMultiTensorDesc_t>(),
            ftnMultiTensorDesc_t::V1_SIZE
        );
        assert_eq!(
            size_of::<ftnGradScalerConfig_t>(),
            ftnGradScalerConfig_t::V1_SIZE
        );
        assert_eq!(
            size_of::<ftnGradScalerState_t>(),
            ftnGradScalerState_t::V1_SIZE
        );
        assert_eq!(size_of::<ftnTensor_t>(), 24);
    }

    #[test]
    fn descriptors_grow_and_shrink_by_the_rules() {
        #[repr(C, align(8))]
        struct Big([u8; 64]);
        let mut b = Big([0; 64]);
        let d = ftnBiasGeluDesc_t {
            size: 48,
            dtype: 0,
            gelu: 1,
            rows: 3,
            cols: 4,
        };
        // SAFETY: Big is 64 bytes, more than the descriptor.
        unsafe { std::ptr::copy_nonoverlapping(&d as *const _ as *const u8, b.0.as_mut_ptr(), 32) };
        let p = b.0.as_ptr() as *const ftnBiasGeluDesc_t;
        // SAFETY: p points to 64 readable bytes, size = 48.
        let r = unsafe { read_desc("t", "desc", p) }.unwrap();
        assert_eq!((r.rows, r.cols, r.gelu), (3, 4, 1));
        b.0[40] = 1;
        // SAFETY: as above.
        let e = unsafe { read_desc("t", "desc", p) }
            .unwrap_err()
            .to_string();
        assert!(e.contains("trailing") && e.contains("offset 40"), "{e}");
        b.0[..8].copy_from_slice(&16usize.to_ne_bytes());
        // SAFETY: as above.
        let e = unsafe { read_desc("t", "desc", p) }
            .unwrap_err()
            .to_string();
        assert!(e.contains("desc.size") && e.contains("got 16"), "{e}");
    }
}

// ---------------------------------------------------------------------------
// Scale + mask + softmax.

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

#[no_mangle]
/// `y = softmax(mask(scale * x))` over the last dimension (`y` may be `x`).
/// `x`, `y`: `batch * heads * sq * sk` elements; `mask` (uint8, only with
/// `ftnSoftmaxMaskPadding`, else ignored): `batch * sq * sk` elements, or
/// `sq * sk` with `mask_broadcast`. Fully masked rows give zeros.
pub unsafe extern "C" fn ftn_softmax_forward(
    stream: ftnStream_t,
    desc: *const ftnSoftmaxDesc_t,
    x: *const c_void,
    mask: *const u8,
    y: *mut c_void,
) -> ftnResult_t {
    guard("ftn_softmax_forward", move || {
        const OP: &str = "ftn_softmax_forward";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(OP, "desc", desc)? };
        let (sm, n, matrix) = softmax_shape(OP, &d)?;
        let mask_view =
            match d.mask {
                0 => None,
                1 => {
                    let len = if d.mask_broadcast != 0 {
                        matrix
                    } else {
                        mul(OP, "desc.batch * sq * sk", sm.batch, matrix)?
                    };
                    // SAFETY: pointer contract: `len` bytes.
                    Some(unsafe { view::<u8>(&dev, OP, "mask", mask as *const c_void, len)? })
                }
                2 => None,
                other => return Err(invalid(
                    OP,
                    "desc.mask",
                    "ftnSoftmaxMaskNone (0), ftnSoftmaxMaskPadding (1) or ftnSoftmaxMaskCausal (2)",
                    other,
                )),
            };
        let m = match (d.mask, mask_view.as_ref()) {
            (1, Some(v)) => SoftmaxMask::Padding(v),
            (2, _) => SoftmaxMask::Causal,
            _ => SoftmaxMask::None,
        };
        float_dispatch!(OP, d.dtype, T => {
            // SAFETY: pointer contracts.
            let (xv, mut yv) = unsafe { (view::<T>(&dev, OP, "x", x, n)?, view::<T>(&dev, OP, "y", y, n)?) };
            sm.forward(&s.stream, &xv, m, &mut yv)
        })
    })
}

#[no_mangle]
/// `dx = scale * (dy*y - y * sum(dy*y))` per row, `y` the forward's output
/// (`dx` may be `dy`). All three: `batch * heads * sq * sk` elements.
pub unsafe extern "C" fn ftn_softmax_backward(
    stream: ftnStream_t,
    desc: *const ftnSoftmaxDesc_t,
    y: *const c_void,
    dy: *const c_void,
    dx: *mut c_void,
) -> ftnResult_t {
    guard("ftn_softmax_backward", move || {
        const OP: &str = "ftn_softmax_backward";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(OP, "desc", desc)? };
        let (sm, n, _) = softmax_shape(OP, &d)?;
        float_dispatch!(OP, d.dtype, T => {
            // SAFETY: pointer contracts.
            let (yv, dyv, mut dxv) = unsafe {
                (view::<T>(&dev, OP, "y", y, n)?, view::<T>(&dev, OP, "dy", dy, n)?, view::<T>(&dev, OP, "dx", dx, n)?)
            };
            sm.backward(&s.stream, &yv, &dyv, &mut dxv)
        })
    })
}

// ---------------------------------------------------------------------------
// GEMM with fused epilogues.

/// What the GEMM does to `v = alpha * op(A) op(B) [+ beta * C]`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnGemmEpilogue_t {
    /// `D = v`.
    ftnGemmEpilogueNone = 0,
    /// `D = v + bias[n]` (bias required).
    ftnGemmEpilogueBias = 1,
    /// `D = gelu(v + bias[n])` (bias optional); a non-NULL `aux` receives
    /// the pre-activation `v + bias`.
    ftnGemmEpilogueBiasGelu = 2,
    /// `D = v * gelu'(aux)`, `aux` (required) the saved pre-activation: the
    /// backward of BiasGelu.
    ftnGemmEpilogueDGelu = 3,
}

/// One (batched) GEMM `D[b] = epilogue(alpha * op(A[b]) op(B[b]) + beta * C[b])`
/// over row-major matrices, `op(A)` `[m, k]`, `op(B)` `[k, n]`; fp16 or bf16
/// inputs, fp32 accumulation, output in the input type or fp32.
///
/// Layouts: leading dimensions (`ld*`, 0 = packed: the stored row length)
/// and batch strides (`stride_*`, 0 = packed: rows * ld), in elements. An
/// operand spans `(batch - 1) * stride + (rows - 1) * ld + cols` elements
/// (`rows x cols` its stored shape: A is `[k, m]` with `trans_a`, B `[n, k]`
/// with `trans_b`); each pointer must hold that many.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnGemmDesc_t {
    /// `sizeof(ftnGemmDesc_t)` as the caller compiled it.
    pub size: usize,
    /// Input type (A, B, bias): ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// Output type (C, D, aux): the input type or ftnFloat32.
    pub out_dtype: i32,
    /// Non-zero: A is stored `[k, m]`.
    pub trans_a: i32,
    /// Non-zero: B is stored `[n, k]` (a linear layer's `X W^T`).
    pub trans_b: i32,
    /// `ftnGemmEpilogue_t`.
    pub epilogue: i32,
    /// `ftnGelu_t` of the GeLU epilogues.
    pub gelu: i32,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    /// Batch entries (1 for a plain GEMM; 0 does nothing).
    pub batch: i64,
    pub alpha: f32,
    /// With `beta != 0`, C is read; a NULL `c` means C is D (accumulate).
    pub beta: f32,
    pub lda: i64,
    pub ldb: i64,
    pub ldc: i64,
    pub ldd: i64,
    pub ld_aux: i64,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
    pub stride_d: i64,
    pub stride_aux: i64,
    /// Non-zero: one A for every batch entry (stride 0).
    pub broadcast_a: i32,
    /// Non-zero: one B for every batch entry (stride 0).
    pub broadcast_b: i32,
}
// SAFETY: repr(C), size_t first, integer/float fields, no implicit padding.
unsafe impl Desc for ftnGemmDesc_t {
    const NAME: &'static str = "ftnGemmDesc_t";
    const V1_SIZE: usize = 160;
}

fn opt_dim(op: &'static str, arg: &'static str, v: i64) -> Result<Option<usize>> {
    Ok(match dim(op, arg, v)? {
        0 => None,
        x => Some(x),
    })
}

/// Elements an operand spans (the header's formula), overflow reported.
fn span(
    op: &'static str,
    arg: &'static str,
    rows: usize,
    cols: usize,
    batch: usize,
    ld: Option<usize>,
    stride: Option<usize>,
) -> Result<usize> {
    let ld = ld.unwrap_or(cols.max(1));
    let over = || {
        invalid(
            op,
            arg,
            "a span that fits in int64_t",
            "an overflowing layout",
        )
    };
    if rows == 0 || cols == 0 || batch == 0 {
        return Ok(0);
    }
    let extent = (rows - 1)
        .checked_mul(ld)
        .and_then(|v| v.checked_add(cols))
        .ok_or_else(over)?;
    let stride = match stride {
        Some(s) => s,
        None => rows.checked_mul(ld).ok_or_else(over)?,
    };
    (batch - 1)
        .checked_mul(stride)
        .and_then(|v| v.checked_add(extent))
        .filter(|&v| v <= i64::MAX as usize)
        .ok_or_else(over)
}

struct GemmArgs {
    a: *const c_void,
    b: *const c_void,
    bias: *const c_void,
    c: *const c_void,
    aux: *mut c_void,
    d: *mut c_void,
}

/// # Safety
/// Pointer contracts of [`ftn_gemm`].
unsafe fn gemm_t<
    T: ferrotron::core::dtype::FloatElement,
    O: ferrotron::core::dtype::FloatElement,
>(
    s: &ftnStream,
    dev: &Device,
    d: &ftnGemmDesc_t,
    p: GemmArgs,
) -> Result<()> {
    const OP: &str = "ftn_gemm";
    let m = dim(OP, "desc.m", d.m)?;
    let n = dim(OP, "desc.n", d.n)?;
    let k = dim(OP, "desc.k", d.k)?;
    let batch = dim(OP, "desc.batch", d.batch)?;
    let lds = [
        opt_dim(OP, "desc.lda", d.lda)?,
        opt_dim(OP, "desc.ldb", d.ldb)?,
        opt_dim(OP, "desc.ldc", d.ldc)?,
        opt_dim(OP, "desc.ldd", d.ldd)?,
        opt_dim(OP, "desc.ld_aux", d.ld_aux)?,
    ];
    let mut strides = [
        opt_dim(OP, "desc.stride_a", d.stride_a)?,
        opt_dim(OP, "desc.stride_b", d.stride_b)?,
        opt_dim(OP, "desc.stride_c", d.stride_c)?,
        opt_dim(OP, "desc.stride_d", d.stride_d)?,
        opt_dim(OP, "desc.stride_aux", d.stride_aux)?,
    ];
    if d.broadcast_a != 0 {
        strides[0] = Some(0);
    }
    if d.broadcast_b != 0 {
        strides[1] = Some(0);
    }
    let g = gelu_of(OP, d.gelu)?;
    let epilogue = match d.epilogue {
        0 => Epilogue::None,
        1 => Epilogue::Bias,
        2 => Epilogue::BiasGelu(g),
        3 => Epilogue::DGelu(g),
        other => {
            return Err(invalid(
                OP,
                "desc.epilogue",
                "an ftnGemmEpilogue_t (0..=3)",
                other,
            ))
        }
    };
    let (ra, ca) = if d.trans_a != 0 { (k, m) } else { (m, k) };
    let (rb, cb) = if d.trans_b != 0 { (n, k) } else { (k, n) };
    let na = span(OP, "a", ra, ca, batch, lds[0], strides[0])?;
    let nb = span(OP, "b", rb, cb, batch, lds[1], strides[1])?;
    let nc = span(OP, "c", m, n, batch, lds[2], strides[2])?;
    let nd = span(OP, "d", m, n, batch, lds[3], strides[3])?;
    let nx = span(OP, "aux", m, n, batch, lds[4], strides[4])?;
    // SAFETY: pointer contracts: each operand spans what its layout says.
    let (av, bv, biasv, cv, mut dv) = unsafe {
        (
            view::<T>(dev, OP, "a", p.a, na)?,
            view::<T>(dev, OP, "b", p.b, nb)?,
            opt_view::<T>(dev, OP, "bias", p.bias, n)?,
            opt_view::<O>(dev, OP, "c", p.c, nc)?,
            view::<O>(dev, OP, "d", p.d, nd)?,
        )
    };
    // SAFETY: as above.
    let mut auxv = unsafe { opt_view::<O>(dev, OP, "aux", p.aux, nx)? };
    let aux = match (epilogue, auxv.as_mut()) {
        (_, None) => Aux::None,
        (Epilogue::DGelu(_), Some(x)) => Aux::PreActivation(x),
        (_, Some(x)) => Aux::Store(x),
    };
    let gemm = Gemm::new(m, n, k)
        .trans_a(d.trans_a != 0)
        .trans_b(d.trans_b != 0)
        .alpha(d.alpha)
        .beta(d.beta)
        .batch(batch)
        .epilogue(epilogue)
        .lds(lds[0], lds[1], lds[2], lds[3], lds[4])
        .strides(strides[0], strides[1], strides[2], strides[3], strides[4]);
    let inputs = GemmInputs {
        a: &av,
        b: &bv,
        bias: biasv.as_ref(),
        c: cv.as_ref(),
    };
    gemm.run(&s.stream, inputs, aux, &mut dv)
}

#[no_mangle]
/// Enqueues one (batched) GEMM described by `desc` (see `ftnGemmDesc_t` for
/// the layouts and how many elements each pointer must hold). `bias` (`n`
/// elements of the input type) and `c` may be NULL as the epilogue and
/// `beta` allow; `aux` is written by BiasGelu when not NULL and read by DGelu.
pub unsafe extern "C" fn ftn_gemm(
    stream: ftnStream_t,
    desc: *const ftnGemmDesc_t,
    a: *const c_void,
    b: *const c_void,
    bias: *const c_void,
    c: *const c_void,
    aux: *mut c_void,
    d: *mut c_void,
) -> ftnResult_t {
    guard("ftn_gemm", move || {
        const OP: &str = "ftn_gemm";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor contract.
        let g = unsafe { read_desc(OP, "desc", desc)? };
        let p = GemmArgs {
            a,
            b,
            bias,
            c,
            aux,
            d,
        };
        // SAFETY: pointer contracts.
        unsafe {
            match (g.dtype, g.out_dtype) {
                (1, 1) => gemm_t::<f16, f16>(s, &dev, &g, p),
                (1, 0) => gemm_t::<f16, f32>(s, &dev, &g, p),
                (2, 2) => gemm_t::<bf16, bf16>(s, &dev, &g, p),
                (2, 0) => gemm_t::<bf16, f32>(s, &dev, &g, p),
                (1 | 2, other) => Err(invalid(
                    OP,
                    "desc.out_dtype",
                    "the input type or ftnFloat32 (0)",
                    other,
                )),
                (other, _) => Err(invalid(
                    OP,
                    "desc.dtype",
                    "ftnFloat16 (1) or ftnBfloat16 (2)",
                    other,
                )),
            }
        }
    })
}

/// Bias gradient `dbias[c] = sum_r dy[r, c]` of a row-major `[rows, cols]`
/// matrix with leading dimension `ld` (0 = `cols`); fp32 accumulation in a
/// fixed order (bitwise reproducible).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnBiasGradDesc_t {
    /// `sizeof(ftnBiasGradDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnDataType_t`: ftnFloat32, ftnFloat16 or ftnBfloat16.
    pub dtype: i32,
    /// Must be 0.
    pub reserved: i32,
    pub rows: i64,
    pub cols: i64,
    pub ld: i64,
}
// SAFETY: repr(C), size_t first, integer fields, explicit padding.
unsafe impl Desc for ftnBiasGradDesc_t {
    const NAME: &'static str = "ftnBiasGradDesc_t";
    const V1_SIZE: usize = 40;
}

#[no_mangle]
/// `dbias` (`cols` elements) = column sums of `dy`, which spans
/// `(rows - 1) * ld + cols` elements.
pub unsafe extern "C" fn ftn_gemm_bias_grad(
    stream: ftnStream_t,
    desc: *const ftnBiasGradDesc_t,
    dy: *const c_void,
    dbias: *mut c_void,
) -> ftnResult_t {
    guard("ftn_gemm_bias_grad", move || {
        const OP: &str = "ftn_gemm_bias_grad";
        let (s, dev) = stream_of(OP, stream)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(OP, "desc", desc)? };
        if d.reserved != 0 {
            return Err(invalid(OP, "desc.reserved", 0, d.reserved));
        }
        let rows = dim(OP, "desc.rows", d.rows)?;
        let cols = dim(OP, "desc.cols", d.cols)?;
        let ld = opt_dim(OP, "desc.ld", d.ld)?;
        let need = span(OP, "dy", rows, cols, 1, ld, None)?;
        let mut bg = BiasGrad::new(rows, cols);
        bg.ld = ld;
        float_dispatch!(OP, d.dtype, T => {
            // SAFETY: pointer contracts.
            let (dyv, mut dbv) = unsafe { (view::<T>(&dev, OP, "dy", dy, need)?, view::<T>(&dev, OP, "dbias", dbias, cols)?) };
            bg.run(&s.stream, &dyv, &mut dbv)
        })
    })
}
