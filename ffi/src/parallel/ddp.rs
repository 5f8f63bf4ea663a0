//! Data parallelism (`ferrotron::parallel::ddp`): the parameter registry,
//! `DistributedDataParallel` over a communicator (contiguous gradient
//! buffers, bucketed reduction), the distributed optimizer (ZeRO-1 AdamW)
//! and Megatron's memory table.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

use ferrotron::parallel::ddp::{
    bytes_per_param, DdpConfig, DistOptConfig, DistributedDataParallel, DistributedOptimizer,
    GradAveraging, ParamId, ParamRegistry, MAX_PARAM_DIMS,
};
use ferrotron::{with_dtype, Device, Result};

use crate::abi::args::{dim, try_vec};
use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{read_desc, Desc};
use crate::abi::dtype::{parse_dtype, FLOATS};
use crate::abi::enums::{c_enum, parse_enum};
use crate::abi::handles::{check_out, get, handle, take, write_out, Child, ChildKind};
use crate::abi::views::{host_slice, view};
use crate::comm::{ftnComm, ftnComm_t, CommUser};
use crate::ops::adam::{adam_config, rename, scalars};
use crate::ops::grad_scaler::ftnGradScaler_t;
use crate::ops::stream_of;
use crate::runtime::ftnStream_t;

/// How the sum over data-parallel ranks becomes a mean
/// (`ftnDdpConfig_t.averaging`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnGradAveraging_t {
    /// Multiply by `1/dp` before the sum (Megatron's default).
    ftnGradPreScale = 0,
    /// Sum with the collective's average.
    ftnGradAverage = 1,
    /// Sum only (the caller scales).
    ftnGradSum = 2,
}
c_enum!(ftnGradAveraging_t: ftnGradPreScale, ftnGradAverage, ftnGradSum);

/// The data-parallel configuration (zero it, set `size`: the defaults).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnDdpConfig_t {
    /// `sizeof(ftnDdpConfig_t)` as the caller compiled it.
    pub size: usize,
    /// Elements per bucket; 0: Megatron's default `max(40e6, 1e6 * dp)`.
    pub bucket_size: i64,
    /// Non-zero: shard the gradients for the distributed optimizer
    /// (reduce-scatter; parameter buffers allocated).
    pub distributed_optimizer: i32,
    /// `ftnGradAveraging_t`.
    pub averaging: i32,
    /// Non-zero: check every gradient of a bucket for NaN / Inf before its
    /// reduction (synchronises the host once per bucket).
    pub check_for_nan_in_grad: i32,
    /// Must be 0.
    pub reserved: i32,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnDdpConfig_t {
    const NAME: &'static str = "ftnDdpConfig_t";
    const V1_SIZE: usize = 32;
}

/// The distributed optimizer's settings (ZeRO-1 AdamW).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnDistOptConfig_t {
    /// `sizeof(ftnDistOptConfig_t)` as the caller compiled it.
    pub size: usize,
    /// In `[0, 1)` (0.9 usual).
    pub beta1: f32,
    /// In `[0, 1)` (0.999 usual).
    pub beta2: f32,
    /// Finite and `> 0` (1e-8 usual).
    pub eps: f32,
    /// `ftnAdamMode_t`.
    pub mode: i32,
    /// Weight decay of every parameter of two or more dimensions (0 for
    /// the others); finite and `>= 0`.
    pub weight_decay: f32,
    /// Must be 0.
    pub reserved: i32,
    /// Clip the global gradient L2 norm to this; 0: no clipping.
    pub max_grad_norm: f64,
}
// SAFETY: repr(C), size_t first, integer/float fields, no implicit padding.
unsafe impl Desc for ftnDistOptConfig_t {
    const NAME: &'static str = "ftnDistOptConfig_t";
    const V1_SIZE: usize = 40;
}

handle!(ftnParamRegistry, ftnParamRegistry_t, 0x4654_4e50_5247_000c, "ftnParamRegistry_t", {
    reg: Mutex<(ParamRegistry, Vec<ParamId>)>,
});

handle!(ftnDdp, ftnDdp_t, 0x4654_4e44_4450_000d, "ftnDdp_t", {
    // Dropped first: it borrows the communicator `_user` keeps alive.
    ddp: Mutex<DistributedDataParallel<'static>>,
    ids: Vec<ParamId>,
    dev: Device,
    _user: CommUser,
    child: Child,
});

handle!(ftnDistOpt, ftnDistOpt_t, 0x4654_4e44_4f50_000e, "ftnDistOpt_t", {
    opt: Mutex<DistributedOptimizer>,
    dev: Device,
    _child: Child,
});

/// Creates an empty parameter registry (host only: no context). Register
/// every parameter in forward order, then create a DDP from it on every
/// data-parallel rank.
///
/// Bad input: `reg` NULL or not aligned for a pointer: ftnInvalidArgument,
/// nothing written.
#[no_mangle]
pub unsafe extern "C" fn ftn_param_registry_create(reg: *mut ftnParamRegistry_t) -> ftnResult_t {
    export!(|op| {
        check_out(op, "reg", reg)?;
        let h = ftnParamRegistry::into_raw(Mutex::new((ParamRegistry::new(), Vec::new())));
        // SAFETY: checked non-NULL and aligned.
        unsafe { reg.write(h) };
        Ok(())
    })
}

/// Destroys a registry (DDPs created from it keep their own copy).
///
/// Bad input: NULL, stale or another kind of handle: ftnInvalidArgument,
/// nothing destroyed.
#[no_mangle]
pub unsafe extern "C" fn ftn_param_registry_destroy(reg: ftnParamRegistry_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        drop(unsafe { take(op, "reg", reg)? });
        Ok(())
    })
}

/// The most dimensions a parameter of `ftn_param_registry_register` may have.
pub const FTN_MAX_PARAM_DIMS: c_int = 16;
const _: () = assert!(FTN_MAX_PARAM_DIMS as usize == MAX_PARAM_DIMS);

/// Registers a parameter: `name` (NUL-terminated UTF-8, unique in the
/// registry), `shape` (`ndims` dimensions, a host array; NULL only when
/// `ndims` is 0: a scalar), `param_dtype` and `grad_dtype` (ftnFloat32,
/// ftnFloat16 or ftnBfloat16; Megatron's usual gradient is ftnFloat32).
/// `*param_id` receives its id (0, 1, ... in registration order), the id the
/// DDP functions take.
///
/// Bad input (ftnInvalidArgument, nothing registered): `reg` NULL, stale
/// or of another kind; `name` NULL, not UTF-8 or registered before;
/// `ndims` negative or above `FTN_MAX_PARAM_DIMS` (16; checked before
/// `shape` is read); `shape` NULL with `ndims > 0`, a negative dimension
/// or an element count that overflows; a dtype that is not a float type;
/// `param_id` NULL or misaligned.
#[no_mangle]
pub unsafe extern "C" fn ftn_param_registry_register(
    reg: ftnParamRegistry_t,
    name: *const c_char,
    shape: *const i64,
    ndims: c_int,
    param_dtype: c_int,
    grad_dtype: c_int,
    param_id: *mut i64,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let r = unsafe { get(op, "reg", reg)? };
        check_out(op, "param_id", param_id)?;
        if name.is_null() {
            return Err(invalid(
                op,
                "name",
                "a non-NULL NUL-terminated string",
                "NULL",
            ));
        }
        // SAFETY: non-NULL; NUL-terminated by the contract.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|e| invalid(op, "name", "UTF-8", e))?;
        let nd = dim(op, "ndims", ndims as i64)?;
        // Before reading `shape`: its length is trusted, so an absurd
        // `ndims` must not make the library read that far.
        if nd > MAX_PARAM_DIMS {
            return Err(invalid(
                op,
                "ndims",
                format!("at most {MAX_PARAM_DIMS} (FTN_MAX_PARAM_DIMS)"),
                ndims,
            ));
        }
        // SAFETY: pointer contract: `ndims` entries.
        let dims = unsafe { host_slice::<i64>(op, "shape", shape as *const c_void, nd)? };
        let mut sh = try_vec(op, "shape", nd)?;
        for &d in dims {
            sh.push(dim(op, "shape", d)?);
        }
        let pd = parse_dtype(op, "param_dtype", param_dtype, &FLOATS)?;
        let gd = parse_dtype(op, "grad_dtype", grad_dtype, &FLOATS)?;
        let mut g = r.reg.lock().unwrap_or_else(|p| p.into_inner());
        let id =
            g.0.register_with_grad(name, &sh, pd, gd)
                .map_err(|e| match e {
                    ferrotron::Error::InvalidArgument {
                        arg, expected, got, ..
                    } => ferrotron::Error::InvalidArgument {
                        op,
                        arg,
                        expected,
                        got,
                    },
                    other => other,
                })?;
        let idx = g.1.len() as i64;
        // SAFETY: checked non-NULL and aligned above.
        unsafe { param_id.write(idx) };
        g.1.push(id);
        Ok(())
    })
}

/// Creates this rank's data-parallel state over `comm` (the data-parallel
/// communicator; its size is dp) from a copy of `reg`: contiguous gradient
/// buffers (zeroed) laid out in reverse registration order and bucketed,
/// plus parameter buffers with the distributed optimizer. Every rank must
/// register the same parameters in the same order. The DDP counts as a
/// child of `comm`'s context, and `comm` cannot be destroyed while the DDP
/// lives.
///
/// Bad input (ftnInvalidArgument, nothing created): `comm` or `reg` NULL,
/// stale or of another kind; an empty registry; `config` NULL, misaligned
/// or with a wrong `size`; a negative `bucket_size` (0: the default); an
/// unknown `averaging`; `reserved` non-zero; `ddp` NULL or misaligned.
/// Device memory that cannot be had: ftnBackendError. Ranks that
/// registered different parameters are not detected here: their
/// reductions disagree later (ftnBackendError at synchronize).
#[no_mangle]
pub unsafe extern "C" fn ftn_ddp_create(
    comm: ftnComm_t,
    reg: ftnParamRegistry_t,
    config: *const ftnDdpConfig_t,
    ddp: *mut ftnDdp_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract. The communicator stays alive (and at
        // this address) while the DDP holds its `CommUser`:
        // `ftn_comm_destroy` refuses while one is held.
        let c: &'static ftnComm = unsafe { get(op, "comm", comm)? };
        // SAFETY: handle contract.
        let r = unsafe { get(op, "reg", reg)? };
        check_out(op, "ddp", ddp)?;
        // SAFETY: descriptor contract.
        let d = unsafe { read_desc(op, "config", config)? };
        if d.reserved != 0 {
            return Err(invalid(op, "config.reserved", 0, d.reserved));
        }
        let bucket = dim(op, "config.bucket_size", d.bucket_size)?;
        let averaging = match parse_enum(op, "config.averaging", d.averaging)? {
            ftnGradAveraging_t::ftnGradPreScale => GradAveraging::PreScale,
            ftnGradAveraging_t::ftnGradAverage => GradAveraging::Average,
            ftnGradAveraging_t::ftnGradSum => GradAveraging::Sum,
        };
        let (registry, ids) = r.reg.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if ids.is_empty() {
            return Err(invalid(
                op,
                "reg",
                "a registry with at least one parameter",
                "an empty registry",
            ));
        }
        let cfg = DdpConfig {
            bucket_size: (bucket > 0).then_some(bucket),
            distributed_optimizer: d.distributed_optimizer != 0,
            averaging,
            check_for_nan_in_grad: d.check_for_nan_in_grad != 0,
        };
        let user = CommUser::new(c);
        let made = DistributedDataParallel::new(&c.comm, registry, cfg)?;
        let h = ftnDdp::into_raw(
            Mutex::new(made),
            ids,
            c.comm.device().clone(),
            user,
            c.child.sibling(ChildKind::Ddp),
        );
        // SAFETY: checked non-NULL and aligned.
        unsafe { ddp.write(h) };
        Ok(())
    })
}

/// Destroys a DDP (waits for its device's work, reductions in flight
/// included, first); its buffers and the pointers from `ftn_ddp_get_grad` /
/// `ftn_ddp_get_param` are freed.
///
/// Bad input: NULL, stale or another kind of handle: ftnInvalidArgument,
/// nothing destroyed. A pending failure of the device's work (a reduction
/// whose peers timed out or are gone: ftnBackendError) is returned, and the
/// DDP is destroyed either way.
#[no_mangle]
pub unsafe extern "C" fn ftn_ddp_destroy(ddp: ftnDdp_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let d = unsafe { take(op, "ddp", ddp)? };
        let r = d.dev.synchronize();
        drop(d);
        r
    })
}

/// The DDP of a handle and the `ParamId` of a C id.
///
/// # Safety
/// Handle contract.
unsafe fn ddp_param<'a>(
    op: &'static str,
    ddp: ftnDdp_t,
    param_id: i64,
) -> Result<(&'a ftnDdp, ParamId)> {
    // SAFETY: handle contract.
    let h = unsafe { get::<ftnDdp>(op, "ddp", ddp)? };
    let id = usize::try_from(param_id)
        .ok()
        .and_then(|i| h.ids.get(i).copied())
        .ok_or_else(|| {
            invalid(
                op,
                "param_id",
                format!("a registered parameter id in 0..{}", h.ids.len()),
                param_id,
            )
        })?;
    Ok((h, id))
}

/// The device address of `id`'s gradient (`param = false`) or parameter.
fn address(
    op: &'static str,
    d: &DistributedDataParallel<'_>,
    id: ParamId,
    param: bool,
) -> Result<u64> {
    let b = d.buffers();
    let info = b.info(id)?;
    if param {
        if !d.config().distributed_optimizer {
            return Err(invalid(
                op,
                "ddp",
                "a DDP created with config.distributed_optimizer (which holds the parameters)",
                "a DDP without the distributed optimizer",
            ));
        }
        with_dtype!(info.param_dtype, T => b.param::<T>(id).map(|v| v.addr()))
    } else {
        with_dtype!(info.grad_dtype, T => b.grad::<T>(id).map(|v| v.addr()))
    }
}

/// `*grad` = the device pointer of parameter `param_id`'s gradient inside
/// the contiguous buffer (its registered grad dtype and element count),
/// valid until the DDP is destroyed. Accumulate gradients into it, then
/// `ftn_ddp_mark_grad_ready`. Bad input (ftnInvalidArgument): `ddp` NULL,
/// stale or of another kind; `param_id` not registered; `grad` NULL or
/// misaligned.
#[no_mangle]
pub unsafe extern "C" fn ftn_ddp_get_grad(
    ddp: ftnDdp_t,
    param_id: i64,
    grad: *mut *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let (h, id) = unsafe { ddp_param(op, ddp, param_id)? };
        check_out(op, "grad", grad)?;
        let d = h.ddp.lock().unwrap_or_else(|p| p.into_inner());
        let a = address(op, &d, id, false)?;
        // SAFETY: checked above.
        unsafe { write_out(op, "grad", grad, a as *mut c_void) }
    })
}

/// `*param` = the device pointer of parameter `param_id` inside the
/// parameter buffer (its registered param dtype), valid until the DDP is
/// destroyed: write the initial values there before `ftn_dist_opt_create`;
/// the optimizer step writes the updated ones.
///
/// Bad input (ftnInvalidArgument, nothing written): `ddp` NULL, stale or of
/// another kind, or created without the distributed optimizer (naming
/// `ddp`); `param_id` not registered; `param` NULL or misaligned.
#[no_mangle]
pub unsafe extern "C" fn ftn_ddp_get_param(
    ddp: ftnDdp_t,
    param_id: i64,
    param: *mut *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let (h, id) = unsafe { ddp_param(op, ddp, param_id)? };
        check_out(op, "param", param)?;
        let d = h.ddp.lock().unwrap_or_else(|p| p.into_inner());
        let a = address(op, &d, id, true)?;
        // SAFETY: checked above.
        unsafe { write_out(op, "param", param, a as *mut c_void) }
    })
}

/// The checked DDP handle and a stream of its device.
///
/// # Safety
/// Handle contracts.
unsafe fn ddp_stream<'a>(
    op: &'static str,
    ddp: ftnDdp_t,
    stream: ftnStream_t,
) -> Result<(&'a ftnDdp, &'a ferrotron::Stream)> {
    // SAFETY: handle contract.
    let h = unsafe { get::<ftnDdp>(op, "ddp", ddp)? };
    let (s, dev) = stream_of(op, stream)?;
    h.dev.check_same_as(op, "stream", &dev, "`ddp`")?;
    Ok((h, &s.stream))
}

/// Parameter `param_id`'s gradient is complete in `stream`'s order. In the
/// last micro-batch, completing a bucket enqueues its reduction on the
/// communicator's stream after an event of `stream`, while backward goes
/// on. Every rank must mark the same parameters in the same bucket order.
///
/// Bad input (ftnInvalidArgument): `ddp` or `stream` NULL, stale or of
/// another kind (a stream of another context: ftnDeviceMismatch);
/// `param_id` not registered; a parameter marked twice in one backward.
/// A broken communicator: ftnBackendError at the call when a bucket's
/// reduction is to be enqueued. Peers that time out or are gone, or ranks
/// that mark other buckets: ftnBackendError at synchronize (the reduction
/// runs on the communicator's stream).
#[no_mangle]
pub unsafe extern "C" fn ftn_ddp_mark_grad_ready(
    ddp: ftnDdp_t,
    stream: ftnStream_t,
    param_id: i64,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contracts.
        let (h, s) = unsafe { ddp_stream(op, ddp, stream)? };
        // SAFETY: handle contract.
        let (_, id) = unsafe { ddp_param(op, ddp, param_id)? };
        let mut d = h.ddp.lock().unwrap_or_else(|p| p.into_inner());
        d.mark_grad_ready(s, id)
    })
}

/// Megatron's `no_sync`: `is_last` 0 for every micro-batch but the last,
/// whose gradients only accumulate locally (no collective). Changing it
/// halfway through a backward (some parameters marked ready) is
/// ftnInvalidArgument.
///
/// Bad input (ftnInvalidArgument, nothing changed): `ddp` NULL, stale or of
/// another kind; a change while some parameters of this backward are marked
/// ready. Any non-zero `is_last` means 1. Host only: nothing is enqueued.
#[no_mangle]
pub unsafe extern "C" fn ftn_ddp_set_is_last_microbatch(
    ddp: ftnDdp_t,
    is_last: c_int,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let h = unsafe { get::<ftnDdp>(op, "ddp", ddp)? };
        let mut d = h.ddp.lock().unwrap_or_else(|p| p.into_inner());
        d.set_is_last_microbatch(is_last != 0)
    })
}

/// Makes `stream` wait for every bucket's reduction; afterwards the
/// gradients (plain DDP) or this rank's shards of them (distributed
/// optimizer) hold the mean over the ranks. ftnInvalidArgument in a
/// `no_sync` micro-batch or when parameters were never marked ready (the
/// error names them); bad handles as `ftn_ddp_mark_grad_ready`.
///
/// Bad input (at the call, nothing enqueued): `ddp` or `stream` NULL, stale
/// or of another kind, a `no_sync` micro-batch, parameters never marked
/// ready: ftnInvalidArgument; a `stream` of another context:
/// ftnDeviceMismatch. Failures of the reductions themselves (peers that
/// time out or are gone, ranks that disagree) come at synchronize as
/// ftnBackendError (the reductions run on the communicator's stream:
/// `ftn_context_synchronize` or `ftn_comm_wait` reports them).
#[no_mangle]
pub unsafe extern "C" fn ftn_ddp_finish_grad_sync(
    ddp: ftnDdp_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contracts.
        let (h, s) = unsafe { ddp_stream(op, ddp, stream)? };
        let mut d = h.ddp.lock().unwrap_or_else(|p| p.into_inner());
        d.finish_grad_sync(s)
    })
}

/// Waits for reductions in flight, zeroes every gradient buffer on
/// `stream` and starts a new step. Bad handles as
/// `ftn_ddp_mark_grad_ready`.
///
/// Bad input (at the call, nothing enqueued): `ddp` or `stream` NULL, stale
/// or of another kind: ftnInvalidArgument; a `stream` of another context:
/// ftnDeviceMismatch. Always allowed between steps (also after a failed
/// one); the readiness of every parameter is reset.
#[no_mangle]
pub unsafe extern "C" fn ftn_ddp_zero_grad_buffer(
    ddp: ftnDdp_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contracts.
        let (h, s) = unsafe { ddp_stream(op, ddp, stream)? };
        let mut d = h.ddp.lock().unwrap_or_else(|p| p.into_inner());
        d.zero_grad_buffer(s)
    })
}

/// Creates the distributed optimizer (ZeRO-1 AdamW) of this rank's shards
/// of `ddp`, its fp32 master weights copied from the parameter buffer
/// (write the initial parameters through `ftn_ddp_get_param` first; this
/// waits for the device). It counts as a child of `ddp`'s context.
///
/// Bad input (ftnInvalidArgument, nothing created): `ddp` NULL, stale, of
/// another kind or without `config.distributed_optimizer`; `config` NULL,
/// misaligned, with a wrong `size`, betas outside `[0, 1)`, eps not finite
/// and > 0, an unknown `mode`, a weight decay not finite and >= 0, a
/// negative or non-finite `max_grad_norm`, `reserved` non-zero; `opt`
/// NULL or misaligned.
#[no_mangle]
pub unsafe extern "C" fn ftn_dist_opt_create(
    ddp: ftnDdp_t,
    config: *const ftnDistOptConfig_t,
    opt: *mut ftnDistOpt_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let h = unsafe { get::<ftnDdp>(op, "ddp", ddp)? };
        check_out(op, "opt", opt)?;
        // SAFETY: descriptor contract.
        let c = unsafe { read_desc(op, "config", config)? };
        if c.reserved != 0 {
            return Err(invalid(op, "config.reserved", 0, c.reserved));
        }
        let adam = adam_config(op, "config.mode", c.beta1, c.beta2, c.eps, c.mode)?;
        if !(c.weight_decay.is_finite() && c.weight_decay >= 0.0) {
            return Err(invalid(
                op,
                "config.weight_decay",
                "a finite value >= 0",
                format!("{:?}", c.weight_decay),
            ));
        }
        if !(c.max_grad_norm.is_finite() && c.max_grad_norm >= 0.0) {
            return Err(invalid(
                op,
                "config.max_grad_norm",
                "a finite value >= 0 (0: no clipping)",
                format!("{:?}", c.max_grad_norm),
            ));
        }
        let cfg = DistOptConfig {
            adam,
            weight_decay: c.weight_decay,
            max_grad_norm: (c.max_grad_norm > 0.0).then_some(c.max_grad_norm),
        };
        let d = h.ddp.lock().unwrap_or_else(|p| p.into_inner());
        let made = DistributedOptimizer::new(&d, cfg).map_err(|e| rename(op, e))?;
        let o = ftnDistOpt::into_raw(
            Mutex::new(made),
            h.dev.clone(),
            h.child.sibling(ChildKind::DistOpt),
        );
        // SAFETY: checked non-NULL and aligned.
        unsafe { opt.write(o) };
        Ok(())
    })
}

/// Destroys a distributed optimizer (waits for its device's work first).
///
/// Bad input: NULL, stale or another kind of handle: ftnInvalidArgument,
/// nothing destroyed. A pending failure of the device's work is returned,
/// and the optimizer is destroyed either way.
#[no_mangle]
pub unsafe extern "C" fn ftn_dist_opt_destroy(opt: ftnDistOpt_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let o = unsafe { take(op, "opt", opt)? };
        let r = o.dev.synchronize();
        drop(o);
        r
    })
}

/// One optimizer step on `stream`, after `ftn_ddp_finish_grad_sync`, on
/// every rank: global gradient norm, optional clipping, AdamW over this
/// rank's shards, then the updated parameters all-gathered into every
/// rank's parameter buffer. `lr` (one fp32) and `step` (one int32, the
/// steps taken; advanced on the device) are device pointers. With a loss
/// `scaler` the gradient shards are unscaled by it and `found_inf` (one
/// fp32 on the device, required then; zeroed here) becomes the max over
/// the ranks, skipping the update everywhere on overflow; without a scaler
/// `found_inf` must be NULL.
///
/// Bad input (ftnInvalidArgument, nothing enqueued): `opt`, `ddp`, `stream`
/// NULL, stale or of another kind (another context: ftnDeviceMismatch); a
/// `ddp` other than the optimizer's; gradients not synchronised by
/// `ftn_ddp_finish_grad_sync`; `lr` / `step` NULL or misaligned;
/// `found_inf` NULL with a scaler, non-NULL without one, or misaligned; a
/// stale or wrong-kind `scaler`. A broken communicator: ftnBackendError at
/// the call (local work before the first collective may already be
/// enqueued). The values behind `lr`, `step`, `found_inf` are device data,
/// never checked; peers that time out or are gone: ftnBackendError at
/// synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_dist_opt_step(
    opt: ftnDistOpt_t,
    ddp: ftnDdp_t,
    stream: ftnStream_t,
    lr: *const f32,
    step: *mut i32,
    scaler: ftnGradScaler_t,
    found_inf: *mut f32,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let o = unsafe { get::<ftnDistOpt>(op, "opt", opt)? };
        // SAFETY: handle contracts.
        let (h, s) = unsafe { ddp_stream(op, ddp, stream)? };
        o.dev.check_same_as(op, "ddp", &h.dev, "`opt`")?;
        let dev = s.device().clone();
        // SAFETY: pointer contract: one element each.
        let mut sc = unsafe { scalars(&dev, op, lr, step)? };
        let sg = if scaler.is_null() {
            if !found_inf.is_null() {
                return Err(invalid(
                    op,
                    "found_inf",
                    "NULL without a scaler",
                    format!("{found_inf:p}"),
                ));
            }
            None
        } else {
            // SAFETY: handle contract.
            let g = unsafe { get(op, "scaler", scaler)? };
            if found_inf.is_null() {
                return Err(invalid(
                    op,
                    "found_inf",
                    "a device pointer to one fp32 (required with a scaler)",
                    "NULL",
                ));
            }
            // SAFETY: pointer contract: one fp32.
            let fi = unsafe { view::<f32>(&dev, op, "found_inf", found_inf as *const c_void, 1)? };
            Some((g, fi))
        };
        let guard = sg
            .as_ref()
            .map(|(g, _)| g.scaler.lock().unwrap_or_else(|p| p.into_inner()));
        let mut fi = sg.map(|(_, f)| f);
        let arg = match (&guard, fi.as_mut()) {
            (Some(g), Some(f)) => Some((&**g, f)),
            _ => None,
        };
        let mut opt_g = o.opt.lock().unwrap_or_else(|p| p.into_inner());
        let mut d = h.ddp.lock().unwrap_or_else(|p| p.into_inner());
        opt_g.step(&mut d, s, &mut sc, arg)
    })
}

/// `*bytes` = Megatron's memory per parameter (param + grad, fp32 master
/// copy unless the params are fp32, fp32 main-grad copy unless the grads
/// are fp32, fp32 Adam moments), replicated with plain DDP
/// (`distributed_optimizer` 0) or the optimizer part divided by `dp`: bf16
/// / fp32 gives 18 or 6 + 12/dp, fp16 / fp16 20 or 4 + 16/dp, fp32 / fp32 16
/// or 8 + 8/dp. Bad input (ftnInvalidArgument): a dtype that is not a
/// float type, `dp < 1`, `bytes` NULL or misaligned.
#[no_mangle]
pub unsafe extern "C" fn ftn_ddp_bytes_per_param(
    param_dtype: c_int,
    grad_dtype: c_int,
    dp: c_int,
    distributed_optimizer: c_int,
    bytes: *mut f64,
) -> ftnResult_t {
    export!(|op| {
        check_out(op, "bytes", bytes)?;
        let pd = parse_dtype(op, "param_dtype", param_dtype, &FLOATS)?;
        let gd = parse_dtype(op, "grad_dtype", grad_dtype, &FLOATS)?;
        let n = usize::try_from(dp)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| invalid(op, "dp", "at least 1", dp))?;
        let b = bytes_per_param(pd, gd, distributed_optimizer != 0)?;
        // SAFETY: checked above.
        unsafe { write_out(op, "bytes", bytes, b.at(n)) }
    })
}
