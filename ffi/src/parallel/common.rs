//! What the tensor-parallel layer and block handles share: the 16-bit element
//! type switch, the activation enum, the gradient and parameter structs, and
//! the per-call checks.

use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

use ferrotron::comm::Communicator;
use ferrotron::ops::Gelu;
use ferrotron::parallel::linear::{LinearGrads, TpElement, WeightGrad};
use ferrotron::{Device, DeviceBuffer, Result};

use crate::abi::args::mul;
use crate::abi::boundary::invalid;
use crate::abi::descriptors::{check_out_desc, read_desc, Desc};
use crate::abi::enums::{c_enum, parse_enum};
use crate::abi::handles::{check_out, get, Handle};
use crate::abi::views::{host_slice, view};
use crate::comm::{call, ftnComm, ftnComm_t, Call};
use crate::runtime::ftnStream_t;

/// A fused activation (`ftnColumnParallelLinearDesc_t.activation`, the
/// `dgelu` of `ftn_row_parallel_linear_backward`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnActivation_t {
    ftnActivationNone = 0,
    /// GeLU, Megatron's tanh approximation.
    ftnActivationGeluTanh = 1,
    /// GeLU, exact (erf).
    ftnActivationGeluErf = 2,
}
c_enum!(ftnActivation_t: ftnActivationNone, ftnActivationGeluTanh, ftnActivationGeluErf);

/// Where a weight gradient goes (`ftnLinearGrads_t.weight_mode`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnWeightGradMode_t {
    /// `weight = dW` in the layer's element type (overwritten).
    ftnWeightGradStore = 0,
    /// `weight += dW` into an fp32 main_grad, fused into the GEMM.
    ftnWeightGradAccumulate = 1,
}
c_enum!(ftnWeightGradMode_t: ftnWeightGradStore, ftnWeightGradAccumulate);

/// Where one linear layer's backward writes its gradients.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnLinearGrads_t {
    /// `sizeof(ftnLinearGrads_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnWeightGradMode_t`.
    pub weight_mode: i32,
    /// Must be 0.
    pub reserved: i32,
    /// The weight shard's gradient: the layer's element type
    /// (`ftnWeightGradStore`) or fp32 (`ftnWeightGradAccumulate`), shaped
    /// like the weight shard (`ftn_*_get_params` tells the count).
    pub weight: *mut c_void,
    /// The bias gradient (the layer's element type, shaped like the bias);
    /// NULL skips it.
    pub bias: *mut c_void,
}
// SAFETY: repr(C), size_t first, integer and raw-pointer fields (any bytes
// are valid raw pointers; the pointers are checked before use), no padding.
unsafe impl Desc for ftnLinearGrads_t {
    const NAME: &'static str = "ftnLinearGrads_t";
    const V1_SIZE: usize = 32;
}

/// A layer's parameters in device memory, owned by the layer (valid until
/// it is destroyed): update them in place (an optimizer step).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnLinearParams_t {
    /// `sizeof(ftnLinearParams_t)` as the caller compiled it (set it).
    pub size: usize,
    /// The weight shard, row-major `[out, in]` of this rank.
    pub weight: *mut c_void,
    /// Elements of `weight`.
    pub weight_count: usize,
    /// The bias (shard), NULL for a layer without bias.
    pub bias: *mut c_void,
    /// Elements of `bias` (0 without bias).
    pub bias_count: usize,
}
// SAFETY: repr(C), size_t first, integer and raw-pointer fields, no padding.
unsafe impl Desc for ftnLinearParams_t {
    const NAME: &'static str = "ftnLinearParams_t";
    const V1_SIZE: usize = 40;
}

/// A value of either 16-bit element type the parallel layers support.
pub(crate) enum Typed<A, B> {
    F16(A),
    Bf16(B),
}

/// `on_typed!(value, binding, T => body)`: `body` with `binding` the inner
/// value and `T` its element type.
macro_rules! on_typed {
    ($v:expr, $b:ident, $T:ident => $body:expr) => {
        match $v {
            $crate::parallel::common::Typed::F16($b) => {
                #[allow(dead_code)]
                type $T = half::f16;
                $body
            }
            $crate::parallel::common::Typed::Bf16($b) => {
                #[allow(dead_code)]
                type $T = half::bf16;
                $body
            }
        }
    };
}
pub(crate) use on_typed;

/// `typed_from!(Layer)`: `Layer<f16>` and `Layer<bf16>` convert into
/// their [`Typed`] variant (what [`tp_new!`] builds).
macro_rules! typed_from {
    ($l:ident) => {
        impl From<$l<half::f16>>
            for $crate::parallel::common::Typed<$l<half::f16>, $l<half::bf16>>
        {
            fn from(v: $l<half::f16>) -> Self {
                $crate::parallel::common::Typed::F16(v)
            }
        }
        impl From<$l<half::bf16>>
            for $crate::parallel::common::Typed<$l<half::f16>, $l<half::bf16>>
        {
            fn from(v: $l<half::bf16>) -> Self {
                $crate::parallel::common::Typed::Bf16(v)
            }
        }
    };
}
pub(crate) use typed_from;

/// `tp_new!(op, dtype, T => body)`: `body` (a `Result` of a layer) with `T`
/// the element type named by a descriptor's `dtype` (fp16 or bf16 only,
/// through `with_dtype!`), its value converted into its [`Typed`] variant.
macro_rules! tp_new {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {{
        use $crate::abi::dtype::{dtype_in, dtype_names, HALVES};
        match dtype_in($dtype, &HALVES) {
            None => Err($crate::abi::boundary::invalid(
                $op,
                "desc.dtype",
                format!("{} (the tensor-core GEMM's inputs)", dtype_names(&HALVES)),
                $dtype,
            )),
            Some(d) => ::ferrotron::with_dtype!(d, [F16, BF16], $T => ($body).map(Into::into),
                else other => unreachable!("dtype_in admitted the unlisted {other}")),
        }
    }};
}
pub(crate) use tp_new;

/// Locks a layer for one call (a poisoned lock is taken over: the layer's
/// state is only scratch buffers and saved activations).
pub(crate) fn lock<L>(m: &Mutex<L>) -> MutexGuard<'_, L> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn flag(v: i32) -> bool {
    v != 0
}

/// The GeLU of an `ftnActivation_t` (`None` for `ftnActivationNone`).
pub(crate) fn activation(op: &'static str, arg: &'static str, v: i32) -> Result<Option<Gelu>> {
    Ok(match parse_enum(op, arg, v)? {
        ftnActivation_t::ftnActivationNone => None,
        ftnActivation_t::ftnActivationGeluTanh => Some(Gelu::Tanh),
        ftnActivation_t::ftnActivationGeluErf => Some(Gelu::Erf),
    })
}

/// A tensor-parallel size argument (`int`, at least 1) as `usize`.
pub(crate) fn tp_size(op: &'static str, tp: std::ffi::c_int) -> Result<usize> {
    usize::try_from(tp)
        .ok()
        .filter(|&t| t >= 1)
        .ok_or_else(|| invalid(op, "tp", "at least 1", tp))
}

/// `rows` of a sequence-parallel tensor on `tp` ranks (`tokens / tp`): an
/// error naming `tokens`, never a truncated size, when it does not divide.
pub(crate) fn local_rows(
    op: &'static str,
    tokens: usize,
    tp: usize,
    sequence_parallel: bool,
) -> Result<usize> {
    if !sequence_parallel {
        return Ok(tokens);
    }
    if tp == 0 || tokens % tp != 0 {
        return Err(invalid(
            op,
            "tokens",
            format!("a multiple of the tensor-parallel size {tp} (sequence parallelism)"),
            tokens,
        ));
    }
    Ok(tokens / tp)
}

enum WeightView<T: TpElement> {
    Store(DeviceBuffer<T>),
    Accumulate(DeviceBuffer<f32>),
}

/// Views of the memory an `ftnLinearGrads_t` names, alive for one call.
pub(crate) struct GradViews<T: TpElement> {
    weight: WeightView<T>,
    bias: Option<DeviceBuffer<T>>,
}

impl<T: TpElement> GradViews<T> {
    /// Reads and checks `grads` (`arg` names it in errors) for a weight of
    /// `weight_len` and a bias of `bias_len` elements.
    ///
    /// # Safety
    /// `grads` is NULL or a valid descriptor whose pointers are valid for the
    /// counts above until the call's work has finished.
    pub(crate) unsafe fn read(
        dev: &Device,
        op: &'static str,
        arg: &'static str,
        grads: *const ftnLinearGrads_t,
        weight_len: usize,
        bias_len: usize,
    ) -> Result<GradViews<T>> {
        // SAFETY: descriptor contract.
        let g = unsafe { read_desc(op, arg, grads)? };
        // Field names as the caller wrote them: `grads.weight_mode` for the
        // layers, `fc1.weight_mode` / `qkv.weight_mode` ... for the blocks.
        let (reserved, mode, weight, bias) = field_names(arg);
        if g.reserved != 0 {
            return Err(invalid(op, reserved, "0", g.reserved));
        }
        let weight = match parse_enum(op, mode, g.weight_mode)? {
            // SAFETY (both arms): pointer contract, `weight_len` elements.
            ftnWeightGradMode_t::ftnWeightGradStore => {
                WeightView::Store(unsafe { view::<T>(dev, op, weight, g.weight, weight_len)? })
            }
            ftnWeightGradMode_t::ftnWeightGradAccumulate => WeightView::Accumulate(unsafe {
                view::<f32>(dev, op, weight, g.weight, weight_len)?
            }),
        };
        let bias = if g.bias.is_null() {
            None
        } else {
            // SAFETY: pointer contract, `bias_len` elements.
            Some(unsafe { view::<T>(dev, op, bias, g.bias, bias_len)? })
        };
        Ok(GradViews { weight, bias })
    }

    /// The Rust API's gradients over these views.
    pub(crate) fn as_grads(&mut self) -> LinearGrads<'_, T> {
        LinearGrads {
            weight: match &mut self.weight {
                WeightView::Store(b) => WeightGrad::Store(b),
                WeightView::Accumulate(b) => WeightGrad::Accumulate(b),
            },
            bias: self.bias.as_mut().map(|b| b as _),
        }
    }
}

/// The `reserved`, `weight_mode`, `weight` and `bias` fields of the
/// `ftnLinearGrads_t` argument `arg`, as names for errors.
fn field_names(arg: &'static str) -> (&'static str, &'static str, &'static str, &'static str) {
    match arg {
        "fc1" => ("fc1.reserved", "fc1.weight_mode", "fc1.weight", "fc1.bias"),
        "fc2" => ("fc2.reserved", "fc2.weight_mode", "fc2.weight", "fc2.bias"),
        "qkv" => ("qkv.reserved", "qkv.weight_mode", "qkv.weight", "qkv.bias"),
        "proj" => (
            "proj.reserved",
            "proj.weight_mode",
            "proj.weight",
            "proj.bias",
        ),
        _ => (
            "grads.reserved",
            "grads.weight_mode",
            "grads.weight",
            "grads.bias",
        ),
    }
}

/// Writes a layer's parameter pointers to `out` (whose `size` the caller
/// has set).
///
/// # Safety
/// `out` is NULL or valid for writes of its `size` bytes.
pub(crate) unsafe fn write_params<T: TpElement>(
    op: &'static str,
    arg: &'static str,
    out: *mut ftnLinearParams_t,
    weight: &DeviceBuffer<T>,
    bias: Option<&DeviceBuffer<T>>,
) -> Result<()> {
    // SAFETY: descriptor contract.
    unsafe { check_out_desc(op, arg, out)? };
    // SAFETY: checked non-NULL, aligned and at least V1_SIZE bytes.
    unsafe {
        (*out).weight = weight.addr() as *mut c_void;
        (*out).weight_count = weight.len();
        (*out).bias = bias.map_or(std::ptr::null_mut(), |b| b.addr() as *mut c_void);
        (*out).bias_count = bias.map_or(0, DeviceBuffer::len);
    }
    Ok(())
}

/// A device view of an optional caller pointer that must be given iff
/// `wanted` (`what` explains when).
///
/// # Safety
/// As [`view`].
pub(crate) unsafe fn view_iff<T: TpElement>(
    dev: &Device,
    op: &'static str,
    arg: &'static str,
    ptr: *const c_void,
    len: usize,
    wanted: bool,
    what: &str,
) -> Result<Option<DeviceBuffer<T>>> {
    match (ptr.is_null(), wanted) {
        (true, false) => Ok(None),
        // SAFETY: forwarded contract.
        (false, true) => unsafe { view::<T>(dev, op, arg, ptr, len).map(Some) },
        (true, true) => Err(invalid(
            op,
            arg,
            format!("a pointer to {len} elements ({what})"),
            "NULL",
        )),
        (false, false) => Err(invalid(op, arg, format!("NULL ({what})"), "a pointer")),
    }
}

/// A handle that owns one layer or block behind a lock.
pub(crate) trait Owner: Handle + Sized {
    type Inner;
    fn inner(&self) -> &Mutex<Self::Inner>;
    fn new_raw(inner: Self::Inner) -> *mut Self;
}

/// `owner!(Handle, Inner)`: implements [`Owner`] for a handle whose one
/// field is `inner: Mutex<Inner>`.
macro_rules! owner {
    ($h:ty, $inner:ty) => {
        impl $crate::parallel::common::Owner for $h {
            type Inner = $inner;
            fn inner(&self) -> &std::sync::Mutex<$inner> {
                &self.inner
            }
            fn new_raw(inner: $inner) -> *mut Self {
                <$h>::into_raw(std::sync::Mutex::new(inner))
            }
        }
    };
}
pub(crate) use owner;

/// The body of a `*_create`: checks `comm` and the out-pointer, reads the
/// descriptor, builds the layer and writes a new handle to `out`.
///
/// # Safety
/// Handle, descriptor and out-pointer contracts of the exported function.
pub(crate) unsafe fn create<H: Owner, D: Desc>(
    op: &'static str,
    comm: ftnComm_t,
    desc: *const D,
    (out_arg, out): (&'static str, *mut *mut H),
    build: impl FnOnce(&Communicator, &D) -> Result<H::Inner>,
) -> Result<()> {
    // SAFETY: forwarded contracts.
    let (c, d) = unsafe {
        (
            get::<ftnComm>(op, "comm", comm)?,
            read_desc(op, "desc", desc)?,
        )
    };
    check_out(op, out_arg, out)?;
    let inner = build(&c.comm, &d)?;
    // SAFETY: checked non-NULL.
    unsafe { out.write(H::new_raw(inner)) };
    Ok(())
}

/// The body of a per-call function (forward, backward, get_params without
/// comm): checks the handle, the communicator and the stream, locks the
/// layer and runs `f` on it.
///
/// # Safety
/// Handle contracts of the exported function.
pub(crate) unsafe fn with_layer<H: Owner>(
    op: &'static str,
    arg: &'static str,
    h: *mut H,
    comm: ftnComm_t,
    stream: ftnStream_t,
    f: impl FnOnce(&mut H::Inner, &Call) -> Result<()>,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let h = unsafe { get::<H>(op, arg, h)? };
    let c = call(op, comm, stream)?;
    f(&mut lock(h.inner()), &c)
}

/// The body of a `*_get_params`: checks the handle, locks it, runs `f`.
///
/// # Safety
/// Handle contract of the exported function.
pub(crate) unsafe fn with_params<H: Owner>(
    op: &'static str,
    arg: &'static str,
    h: *mut H,
    f: impl FnOnce(&H::Inner) -> Result<()>,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let h = unsafe { get::<H>(op, arg, h)? };
    f(&lock(h.inner()))
}

/// A full weight `[out, in]` and optional bias `[out]` in host memory.
///
/// # Safety
/// Each non-NULL pointer is valid for reads of its length during the call.
pub(crate) unsafe fn full_params<'a, T: TpElement>(
    op: &'static str,
    weight: *const c_void,
    bias: *const c_void,
    (out, inp): (usize, usize),
) -> Result<(&'a [T], Option<&'a [T]>)> {
    let nw = mul(op, "desc.out_features * in_features", out, inp)?;
    // SAFETY: forwarded contract.
    unsafe {
        Ok((
            host_slice::<T>(op, "full_weight", weight, nw)?,
            if bias.is_null() {
                None
            } else {
                Some(host_slice::<T>(op, "full_bias", bias, out)?)
            },
        ))
    }
}
