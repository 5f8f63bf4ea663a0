//! Fused multi-tensor AdamW (`ferrotron::ops::adam`): the `ftnAdam_t`
//! handle, its step over a list of tensors, and the shared helpers the
//! distributed optimizer's C config uses.

use std::ffi::c_void;
use std::sync::Mutex;

use ferrotron::ops::adam::{
    AdamConfig, AdamScalars, AdamTensors, FusedAdam, Unscale, WeightDecayMode,
};
use ferrotron::ops::multi_tensor::{GradRef, TensorRef};
use ferrotron::{AnyBuffer, DType, Device, DeviceBuffer, Result};

use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{check_out_desc, read_desc, Desc};
use crate::abi::dtype::{dtype_in, dtype_names, FLOATS};
use crate::abi::enums::{c_enum, parse_enum};
use crate::abi::handles::{check_out, get, handle, take, Child, ChildKind};
use crate::abi::views::{any_view, view};
use crate::ops::grad_scaler::ftnGradScaler_t;
use crate::ops::stream_of;
use crate::runtime::{ftnContext_t, ftnStream_t};

/// How weight decay enters the Adam update (`ftnAdamConfig_t.mode`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnAdamMode_t {
    /// AdamW: `p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)`.
    ftnAdamDecoupled = 0,
    /// Adam with L2 regularisation: `g += wd * p` before the moments.
    ftnAdamL2 = 1,
}
c_enum!(ftnAdamMode_t: ftnAdamDecoupled, ftnAdamL2);

/// The fixed hyper-parameters of a fused Adam optimizer (lr lives in device
/// memory and is passed to each step). `ftn_adam_config_default` fills in
/// the defaults (0.9, 0.999, 1e-8, decoupled).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnAdamConfig_t {
    /// `sizeof(ftnAdamConfig_t)` as the caller compiled it.
    pub size: usize,
    /// In `[0, 1)`.
    pub beta1: f32,
    /// In `[0, 1)`.
    pub beta2: f32,
    /// Finite and `> 0`.
    pub eps: f32,
    /// `ftnAdamMode_t`.
    pub mode: i32,
}
// SAFETY: repr(C), size_t first, integer/float fields, no implicit padding.
unsafe impl Desc for ftnAdamConfig_t {
    const NAME: &'static str = "ftnAdamConfig_t";
    const V1_SIZE: usize = 24;
}

/// One tensor of an Adam step (fixed layout: `ftnAdamStepDesc_t` carries
/// the versioning). Every pointer is device memory (host memory on the
/// emulator), aligned for its dtype, and may be NULL only when `numel` is 0.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnAdamTensor_t {
    /// fp32 master parameters (updated in place).
    pub param: *mut c_void,
    /// fp32 first moment (updated in place).
    pub exp_avg: *mut c_void,
    /// fp32 second moment (updated in place).
    pub exp_avg_sq: *mut c_void,
    /// Gradient of `grad_dtype` (read only).
    pub grad: *const c_void,
    /// Optional model copy of `model_dtype` written with the new values.
    /// Either every tensor of the list has one (NULL allowed only with
    /// `numel` 0) or none does (all NULL).
    pub model: *mut c_void,
    /// Elements of each of the above.
    pub numel: i64,
    /// `ftnDataType_t` of `grad`: ftnFloat32, ftnFloat16 or ftnBfloat16.
    pub grad_dtype: i32,
    /// `ftnDataType_t` of `model`: float types; ignored without models.
    pub model_dtype: i32,
    /// This tensor's weight decay, finite and `>= 0`
    /// (`ftn_adam_default_weight_decay`).
    pub weight_decay: f32,
    /// Must be 0.
    pub reserved: i32,
}

/// The list of one Adam step.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnAdamStepDesc_t {
    /// `sizeof(ftnAdamStepDesc_t)` as the caller compiled it.
    pub size: usize,
    /// Entries of the `tensors` array (0 is fine: only the step moves).
    pub num_tensors: usize,
}
// SAFETY: repr(C), size_t first, integer fields.
unsafe impl Desc for ftnAdamStepDesc_t {
    const NAME: &'static str = "ftnAdamStepDesc_t";
    const V1_SIZE: usize = 16;
}

handle!(ftnAdam, ftnAdam_t, 0x4654_4e41_444d_000b, "ftnAdam_t", {
    adam: Mutex<FusedAdam>,
    dev: Device,
    _child: Child,
});

/// The core config of a C one (validated by `FusedAdam::new`).
pub(crate) fn adam_config(
    op: &'static str,
    mode_arg: &'static str,
    beta1: f32,
    beta2: f32,
    eps: f32,
    mode: i32,
) -> Result<AdamConfig> {
    let mode = match parse_enum(op, mode_arg, mode)? {
        ftnAdamMode_t::ftnAdamDecoupled => WeightDecayMode::Decoupled,
        ftnAdamMode_t::ftnAdamL2 => WeightDecayMode::L2,
    };
    Ok(AdamConfig {
        betas: (beta1, beta2),
        eps,
        mode,
    })
}

/// The device scalars of a step over the caller's `lr` (`[1]` fp32) and
/// `step` (`[1]` int32) device pointers.
///
/// # Safety
/// Pointer contract: each valid for one element on `dev`.
pub(crate) unsafe fn scalars(
    dev: &Device,
    op: &'static str,
    lr: *const f32,
    step: *mut i32,
) -> Result<AdamScalars> {
    if lr.is_null() {
        return Err(invalid(
            op,
            "lr",
            "a non-NULL device pointer to one fp32",
            "NULL",
        ));
    }
    if step.is_null() {
        return Err(invalid(
            op,
            "step",
            "a non-NULL device pointer to one int32",
            "NULL",
        ));
    }
    // SAFETY: pointer contract: one element each.
    let (l, s) = unsafe {
        (
            view::<f32>(dev, op, "lr", lr as *const c_void, 1)?,
            view::<i32>(dev, op, "step", step as *const c_void, 1)?,
        )
    };
    AdamScalars::from_buffers(l, s)
}

/// Fills `config` (whose `size` the caller has set) with the defaults:
/// betas (0.9, 0.999), eps 1e-8, `ftnAdamDecoupled` (AdamW).
///
/// Bad input (ftnInvalidArgument, nothing written): `config` NULL, not
/// aligned for the struct, or a bad `config->size` (below the first
/// version's, between versions, or above `FTN_MAX_DESC_SIZE`); bytes past
/// the known fields are left alone.
#[no_mangle]
pub unsafe extern "C" fn ftn_adam_config_default(config: *mut ftnAdamConfig_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contract.
        unsafe { check_out_desc(op, "config", config)? };
        let c = AdamConfig::default();
        // SAFETY: checked non-NULL, aligned and at least V1_SIZE bytes.
        unsafe {
            (*config).beta1 = c.betas.0;
            (*config).beta2 = c.betas.1;
            (*config).eps = c.eps;
            (*config).mode = ftnAdamMode_t::ftnAdamDecoupled as i32;
        }
        Ok(())
    })
}

/// Creates a fused Adam / AdamW optimizer on `ctx` (it keeps the device
/// tables of the last few lists it stepped, so a loop passing the same
/// tensors uploads nothing after the first step). It counts as a child of
/// `ctx` until destroyed.
///
/// Bad input (ftnInvalidArgument, no handle created): `ctx` NULL, stale or
/// of another kind; `adam` NULL or misaligned; `config` NULL, misaligned,
/// with a wrong `size`, betas outside `[0, 1)`, eps not finite and > 0, an
/// unknown `mode`.
#[no_mangle]
pub unsafe extern "C" fn ftn_adam_create(
    ctx: ftnContext_t,
    config: *const ftnAdamConfig_t,
    adam: *mut ftnAdam_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        check_out(op, "adam", adam)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "config", config)? };
        let cfg = adam_config(op, "config.mode", d.beta1, d.beta2, d.eps, d.mode)?;
        let fused = FusedAdam::new(cfg).map_err(|e| rename(op, e))?;
        let h = ftnAdam::into_raw(
            Mutex::new(fused),
            c.dev.clone(),
            Child::new(&c.children, ChildKind::Adam),
        );
        // SAFETY: checked non-NULL and aligned.
        unsafe { adam.write(h) };
        Ok(())
    })
}

/// The core's `FusedAdam` errors name `beta1` / `beta2` / `eps`: name the C
/// fields instead (`config.beta1`, ...), as reported by `op`.
pub(crate) fn rename(op: &'static str, e: ferrotron::Error) -> ferrotron::Error {
    match e {
        ferrotron::Error::InvalidArgument {
            arg, expected, got, ..
        } => {
            let arg = match arg {
                "beta1" => "config.beta1",
                "beta2" => "config.beta2",
                "eps" => "config.eps",
                other => other,
            };
            ferrotron::Error::InvalidArgument {
                op,
                arg,
                expected,
                got,
            }
        }
        other => other,
    }
}

/// Destroys an Adam optimizer (waits for its device's work first).
///
/// Bad input: NULL, stale or another kind of handle: ftnInvalidArgument,
/// nothing destroyed. A pending failure of the device's work
/// (ftnKernelFailed, ftnBackendError) is returned, and the optimizer is
/// destroyed either way.
#[no_mangle]
pub unsafe extern "C" fn ftn_adam_destroy(adam: ftnAdam_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let a = unsafe { take(op, "adam", adam)? };
        let r = a.dev.synchronize();
        drop(a);
        r
    })
}

/// Enqueues one fused Adam step on `stream` over `desc.num_tensors`
/// entries of `tensors` (one launch for the whole list, then one that
/// advances the step count).
///
/// * `lr` (one fp32) and `step` (one int32: the steps taken so far; the
///   update uses `t = *step + 1` and then advances `*step` on the device)
///   are device pointers, required.
/// * The gradients are multiplied by an unscale factor: 1 when `inv_scale`
///   and `scaler` are both NULL, `*inv_scale` (one fp32 on the device), or
///   `1 / scale` of the device loss scaler `scaler`; not both.
/// * `found_inf` (one fp32 on the device, or NULL for none): when
///   `*found_inf > 0` (as set by `ftn_multi_tensor_unscale`) nothing is
///   written and `*step` is not advanced.
///
/// Bad input (ftnInvalidArgument, nothing enqueued): `stream` or `adam`
/// NULL, stale or of another kind (a stream of another context than the
/// optimizer's: ftnDeviceMismatch); `desc` NULL, misaligned or with a wrong
/// `size`; `tensors` NULL or misaligned with `num_tensors > 0`; per tensor
/// (named `tensors[i].<field>`, the message gives `i`): negative `numel`,
/// a NULL or misaligned pointer with `numel > 0`, a `grad_dtype` or
/// `model_dtype` that is not a float type, a weight decay that is not
/// finite and `>= 0`, `reserved` non-zero; some but not all tensors
/// with a model copy; `lr` or `step` NULL or misaligned; `inv_scale` or
/// `found_inf` misaligned; `inv_scale` and `scaler` both given; a stale
/// or wrong-kind `scaler` (one of another context: ftnDeviceMismatch).
/// `num_tensors` 0 is not an error: only `*step` advances (unless
/// `*found_inf > 0`). The values behind `lr`, `step`, `inv_scale` and
/// `found_inf` are read on the device and never checked; faults on the
/// device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_adam_step(
    stream: ftnStream_t,
    adam: ftnAdam_t,
    desc: *const ftnAdamStepDesc_t,
    tensors: *const ftnAdamTensor_t,
    lr: *const f32,
    step: *mut i32,
    inv_scale: *const f32,
    scaler: ftnGradScaler_t,
    found_inf: *const f32,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: handle contract.
        let a = unsafe { get(op, "adam", adam)? };
        a.dev.check_same_as(op, "stream", &dev, "`adam`")?;
        // SAFETY: descriptor and pointer contracts.
        let d = unsafe { read_desc(op, "desc", desc)? };
        // SAFETY: pointer contract: `num_tensors` entries.
        let list = unsafe { entries(op, tensors, d.num_tensors)? };
        let mut lists = Lists::new(op, d.num_tensors)?;
        let with_model = list.iter().any(|t| !t.model.is_null());
        for (i, t) in list.iter().enumerate() {
            // SAFETY: pointer contract of each entry.
            unsafe { lists.push(op, &dev, i, t, with_model)? };
        }
        // SAFETY: pointer contract: one element each.
        let mut sc = unsafe { scalars(&dev, op, lr, step)? };
        // SAFETY: pointer contract: one fp32.
        let fi = unsafe {
            if found_inf.is_null() {
                None
            } else {
                Some(view::<f32>(
                    &dev,
                    op,
                    "found_inf",
                    found_inf as *const c_void,
                    1,
                )?)
            }
        };
        if !inv_scale.is_null() && !scaler.is_null() {
            return Err(invalid(
                op,
                "scaler",
                "NULL when inv_scale is given (one unscale factor)",
                "a scaler and an inv_scale",
            ));
        }
        // SAFETY: pointer contract: one fp32.
        let inv = unsafe {
            if inv_scale.is_null() {
                None
            } else {
                Some(view::<f32>(
                    &dev,
                    op,
                    "inv_scale",
                    inv_scale as *const c_void,
                    1,
                )?)
            }
        };
        let sg = if scaler.is_null() {
            None
        } else {
            // SAFETY: handle contract.
            Some(unsafe { get(op, "scaler", scaler)? })
        };
        let sguard = sg.map(|g| g.scaler.lock().unwrap_or_else(|p| p.into_inner()));
        let unscale = match (&inv, &sguard) {
            (Some(b), _) => Unscale::Device(b),
            (None, Some(g)) => Unscale::Scaler(g),
            (None, None) => Unscale::None,
        };
        let Lists {
            mut params,
            mut m,
            mut v,
            grads,
            mut models,
            wd,
        } = lists;
        let mut p: Vec<&mut DeviceBuffer<f32>> = params.iter_mut().collect();
        let mut mm: Vec<&mut DeviceBuffer<f32>> = m.iter_mut().collect();
        let mut vv: Vec<&mut DeviceBuffer<f32>> = v.iter_mut().collect();
        let g: Vec<TensorRef<'_>> = grads.iter().map(tensor_ref).collect();
        let mut md: Vec<GradRef<'_>> = models.iter_mut().map(grad_ref).collect();
        let mut t = AdamTensors {
            params: &mut p,
            exp_avg: &mut mm,
            exp_avg_sq: &mut vv,
            grads: &g,
            model: with_model.then_some(&mut md[..]),
            weight_decay: &wd,
        };
        let mut fa = a.adam.lock().unwrap_or_else(|p| p.into_inner());
        fa.step(
            &s.stream,
            &mut t,
            &mut sc,
            fi.as_ref().map(|b| b as _),
            unscale,
        )
    })
}

/// The caller's array of `n` entries, checked for NULL and alignment.
///
/// # Safety
/// `p` valid for `n` entries.
unsafe fn entries<'a>(
    op: &'static str,
    p: *const ftnAdamTensor_t,
    n: usize,
) -> Result<&'a [ftnAdamTensor_t]> {
    if n.checked_mul(std::mem::size_of::<ftnAdamTensor_t>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(invalid(
            op,
            "desc.num_tensors",
            "a count whose array size fits in isize",
            n,
        ));
    }
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(
            op,
            "tensors",
            format!("a non-NULL array of {n} ftnAdamTensor_t"),
            "NULL",
        ));
    }
    if (p as usize) % std::mem::align_of::<ftnAdamTensor_t>() != 0 {
        return Err(invalid(
            op,
            "tensors",
            "a pointer aligned for ftnAdamTensor_t",
            format!("{p:p}"),
        ));
    }
    // SAFETY: non-NULL, aligned, `n` entries by the contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// The validated views of a step's list.
struct Lists {
    params: Vec<DeviceBuffer<f32>>,
    m: Vec<DeviceBuffer<f32>>,
    v: Vec<DeviceBuffer<f32>>,
    grads: Vec<AnyBuffer>,
    models: Vec<AnyBuffer>,
    wd: Vec<f32>,
}

impl Lists {
    fn new(op: &'static str, n: usize) -> Result<Lists> {
        use crate::abi::args::try_vec;
        Ok(Lists {
            params: try_vec(op, "tensors", n)?,
            m: try_vec(op, "tensors", n)?,
            v: try_vec(op, "tensors", n)?,
            grads: try_vec(op, "tensors", n)?,
            models: try_vec(op, "tensors", n)?,
            wd: try_vec(op, "tensors", n)?,
        })
    }

    /// Checks entry `i` and appends its views.
    ///
    /// # Safety
    /// Pointer contract of the entry.
    unsafe fn push(
        &mut self,
        op: &'static str,
        dev: &Device,
        i: usize,
        t: &ftnAdamTensor_t,
        with_model: bool,
    ) -> Result<()> {
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
        let float = |arg: &'static str, v: i32| -> Result<DType> {
            dtype_in(v, &FLOATS)
                .ok_or_else(|| invalid(op, arg, dtype_names(&FLOATS), format!("{v} (tensor {i})")))
        };
        let gd = float("tensors[i].grad_dtype", t.grad_dtype)?;
        let wd = t.weight_decay;
        if !(wd.is_finite() && wd >= 0.0) {
            return Err(invalid(
                op,
                "tensors[i].weight_decay",
                "a finite value >= 0",
                format!("{wd:?} (tensor {i})"),
            ));
        }
        let f32_view = |arg: &'static str, p: *const c_void| {
            // SAFETY: pointer contract: `numel` fp32.
            unsafe { view::<f32>(dev, op, arg, p, numel) }.map_err(|e| at(e, i))
        };
        self.params.push(f32_view("tensors[i].param", t.param)?);
        self.m.push(f32_view("tensors[i].exp_avg", t.exp_avg)?);
        self.v
            .push(f32_view("tensors[i].exp_avg_sq", t.exp_avg_sq)?);
        // SAFETY: pointer contract: `numel` elements of the grad dtype.
        let g = unsafe { any_view(dev, op, "tensors[i].grad", gd, t.grad, numel) };
        self.grads.push(g.map_err(|e| at(e, i))?);
        if with_model {
            let md = float("tensors[i].model_dtype", t.model_dtype)?;
            if t.model.is_null() && numel > 0 {
                return Err(invalid(
                    op,
                    "tensors[i].model",
                    "a model copy for every tensor (other tensors of the list have one) or for none",
                    format!("NULL (tensor {i})"),
                ));
            }
            // SAFETY: pointer contract: `numel` elements of the model dtype.
            let mv = unsafe { any_view(dev, op, "tensors[i].model", md, t.model, numel) };
            self.models.push(mv.map_err(|e| at(e, i))?);
        }
        self.wd.push(wd);
        Ok(())
    }
}

/// Adds the tensor index to a per-tensor pointer error.
fn at(e: ferrotron::Error, i: usize) -> ferrotron::Error {
    match e {
        ferrotron::Error::InvalidArgument {
            op,
            arg,
            expected,
            got,
        } => ferrotron::Error::InvalidArgument {
            op,
            arg,
            expected,
            got: format!("{got} (tensor {i})"),
        },
        other => other,
    }
}

fn tensor_ref(b: &AnyBuffer) -> TensorRef<'_> {
    match b {
        AnyBuffer::F32(x) => TensorRef::from(x),
        AnyBuffer::F16(x) => TensorRef::from(x),
        AnyBuffer::BF16(x) => TensorRef::from(x),
        other => unreachable!("Lists admits floats only, not {}", other.dtype()),
    }
}

fn grad_ref(b: &mut AnyBuffer) -> GradRef<'_> {
    match b {
        AnyBuffer::F32(x) => GradRef::from(x),
        AnyBuffer::F16(x) => GradRef::from(x),
        AnyBuffer::BF16(x) => GradRef::from(x),
        other => unreachable!("Lists admits floats only, not {}", other.dtype()),
    }
}

/// The usual weight decay per tensor: `out[i] = 0` for tensors of at most
/// one dimension (`ndims[i] <= 1`: biases, norm gains), `weight_decay`
/// otherwise. `ndims` and `out` are host arrays of `n` entries (NULL only
/// when `n` is 0).
///
/// Bad input (ftnInvalidArgument, nothing written): `ndims` NULL or
/// misaligned with `n > 0`; `out` NULL with `n > 0`, or misaligned (checked
/// even when `n` is 0); a negative `ndims[i]`; `weight_decay` not finite or
/// negative.
#[no_mangle]
pub unsafe extern "C" fn ftn_adam_default_weight_decay(
    ndims: *const i64,
    n: usize,
    weight_decay: f32,
    out: *mut f32,
) -> ftnResult_t {
    export!(|op| {
        if !(weight_decay.is_finite() && weight_decay >= 0.0) {
            return Err(invalid(
                op,
                "weight_decay",
                "a finite value >= 0",
                format!("{weight_decay:?}"),
            ));
        }
        // SAFETY: pointer contract: `n` entries.
        let nd = unsafe {
            crate::abi::views::host_slice::<i64>(op, "ndims", ndims as *const c_void, n)?
        };
        crate::abi::views::check_ptr::<f32>(op, "out", out as *const c_void, n)?;
        if let Some(i) = nd.iter().position(|&d| d < 0) {
            return Err(invalid(
                op,
                "ndims",
                "dimension counts >= 0",
                format!("{} at {i}", nd[i]),
            ));
        }
        let shapes: Vec<Vec<usize>> = nd.iter().map(|&d| vec![1; (d as usize).min(2)]).collect();
        let refs: Vec<&[usize]> = shapes.iter().map(|s| &s[..]).collect();
        let wd = ferrotron::ops::adam::default_weight_decay(&refs, weight_decay);
        if n > 0 {
            // SAFETY: checked non-NULL, aligned, `n` entries by the contract.
            unsafe { std::ptr::copy_nonoverlapping(wd.as_ptr(), out, n) };
        }
        Ok(())
    })
}
