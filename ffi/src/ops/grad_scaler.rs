//! Megatron's dynamic loss scaler: the host state machine and the device
//! scaler behind `ftnGradScaler_t`.

use crate::abi::descriptors::check_out_desc;
use crate::abi::handles::{check_out, get, handle, take, Child, ChildKind};
use crate::runtime::ftnContext_t;
use ferrotron::core::loss_scaler::{DynamicGradScaler, GradScalerConfig};
use ferrotron::ops::multi_tensor::DeviceGradScaler;
use std::ffi::c_int;
use std::ffi::c_void;
use std::sync::Mutex;

use ferrotron::Result;

use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{read_desc, Desc};
use crate::abi::views::view;
use crate::ops::stream_of;
use crate::runtime::ftnStream_t;

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
    /// Overflows still tolerated before backing off (at most
    /// `config.hysteresis`; negative after repeated overflows).
    pub hysteresis_tracker: i32,
    /// Must be 0 (checked: anything else is ftnInvalidArgument).
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
    if st.reserved != 0 {
        return Err(invalid(op, "state.reserved", "0", st.reserved));
    }
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
///
/// Bad input (ftnInvalidArgument, nothing written): `config` NULL, not
/// aligned for the struct, or a bad `config->size` (below the first
/// version's, between versions, or above `FTN_MAX_DESC_SIZE`); bytes past
/// the known fields are left alone.
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_config_default(
    config: *mut ftnGradScalerConfig_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contract.
        unsafe { check_out_desc(op, "config", config)? };
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
///
/// Bad input (ftnInvalidArgument, nothing written): `config` or `state`
/// NULL, misaligned or with a wrong `size`; an invalid config (see
/// `ftnGradScalerConfig_t`).
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_host_init(
    config: *const ftnGradScalerConfig_t,
    state: *mut ftnGradScalerState_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contracts.
        unsafe {
            check_out_desc(op, "state", state)?;
            let s = host_scaler(op, config, std::ptr::null())?;
            write_state(state, &s);
        }
        Ok(())
    })
}

/// Host state machine: one step of Megatron's `DynamicGradScaler.update`
/// with `found_inf` (non-zero: an overflow), in place on `state`.
///
/// Every state this function or the device scaler can reach is accepted
/// (including `scale = +inf` after growing past the fp32 maximum, as in
/// Megatron, and negative hysteresis trackers), and steps exactly as
/// `ftn_grad_scaler_update` does. Bad input (ftnInvalidArgument, `state`
/// unchanged): `config` or `state` NULL (`state` is in/out), misaligned or
/// with a wrong `size`; an invalid config; a state no update can reach
/// (NaN or non-positive scale, growth tracker outside `0..growth_interval`,
/// hysteresis tracker above `hysteresis`, `reserved` non-zero).
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_host_update(
    config: *const ftnGradScalerConfig_t,
    state: *mut ftnGradScalerState_t,
    found_inf: c_int,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contracts.
        unsafe {
            // `state` is in/out: NULL must not fall back to a fresh state.
            check_out_desc(op, "state", state)?;
            let mut s = host_scaler(op, config, state)?;
            s.update(found_inf != 0);
            write_state(state, &s);
        }
        Ok(())
    })
}

handle!(ftnGradScaler, ftnGradScaler_t, 0x4654_4e47_5343_0004, "ftnGradScaler_t", {
    scaler: Mutex<DeviceGradScaler>,
    _child: Child,
});

/// A loss scaler whose state lives in device memory and is stepped by a
/// kernel (`ftn_grad_scaler_update`), so a training step never waits for
/// the host. `state` may be NULL (fresh state) or a saved state.
///
/// Bad input (at the call, no handle created, `*scaler` untouched;
/// ftnInvalidArgument): `ctx` NULL, stale or of another kind; `scaler`
/// NULL or misaligned; `config` NULL, misaligned, a bad `size` or invalid
/// values; a non-NULL `state` with a bad `size` or
/// that `ftn_grad_scaler_host_update` would reject (`reserved` non-zero,
/// unreachable trackers, NaN or non-positive scale; `+inf` is accepted).
/// Device memory that cannot be had: ftnBackendError. The scaler counts
/// as a child of `ctx` until destroyed.
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_create(
    ctx: ftnContext_t,
    config: *const ftnGradScalerConfig_t,
    state: *const ftnGradScalerState_t,
    scaler: *mut ftnGradScaler_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        check_out(op, "scaler", scaler)?;
        // SAFETY: descriptor contracts.
        let host = unsafe { host_scaler(op, config, state)? };
        let dev = DeviceGradScaler::from_host(&c.dev, &host)?;
        let h = ftnGradScaler::into_raw(
            Mutex::new(dev),
            Child::new(&c.children, ChildKind::GradScaler),
        );
        // SAFETY: checked non-NULL.
        unsafe { scaler.write(h) };
        Ok(())
    })
}

/// Destroys a device scaler (waits for the device's work first).
///
/// Bad input: NULL, stale or another kind of handle: ftnInvalidArgument,
/// nothing destroyed. Failures of pending work are not reported here (they
/// come from the streams' synchronize).
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_destroy(scaler: ftnGradScaler_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        drop(unsafe { take(op, "scaler", scaler)? });
        Ok(())
    })
}

/// Enqueues one scaler step on `stream`, reading `*found_inf` (one fp32
/// in device memory, non-zero = overflow, e.g. written by
/// `ftn_multi_tensor_unscale` and MAX-all-reduced); with
/// `reset_found_inf` non-zero it is then set to 0 for the next step.
///
/// Bad input (at the call, nothing enqueued): `stream` or `scaler` NULL,
/// stale or of another kind, `found_inf` NULL or not 4-byte aligned:
/// ftnInvalidArgument; a `stream` of another context than the scaler's:
/// ftnDeviceMismatch. `found_inf` is read on the device: its value is never
/// an error. Faults on the device come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_update(
    scaler: ftnGradScaler_t,
    stream: ftnStream_t,
    found_inf: *mut f32,
    reset_found_inf: c_int,
) -> ftnResult_t {
    export!(|op| {
        let (s, dev) = stream_of(op, stream)?;
        // SAFETY: handle contract.
        let sc = unsafe { get(op, "scaler", scaler)? };
        // SAFETY: pointer contract: one fp32.
        let mut fi = unsafe { view::<f32>(&dev, op, "found_inf", found_inf as *const c_void, 1)? };
        let mut g = sc.scaler.lock().unwrap_or_else(|p| p.into_inner());
        g.update(&s.stream, &mut fi, reset_found_inf != 0)
    })
}

/// Waits for the device's work and writes the scaler's state (to save it,
/// or to read the current scale on the host).
///
/// Bad input (ftnInvalidArgument, checked before waiting, nothing written):
/// `scaler` NULL, stale or of another kind; `state` NULL, misaligned or
/// with a bad `size` (below the first version's, between versions, or above
/// `FTN_MAX_DESC_SIZE`). A failure of the device read (a driver fault, e.g.
/// after an earlier fault on the device) is returned with `*state`
/// untouched.
#[no_mangle]
pub unsafe extern "C" fn ftn_grad_scaler_get_state(
    scaler: ftnGradScaler_t,
    state: *mut ftnGradScalerState_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let sc = unsafe { get(op, "scaler", scaler)? };
        // SAFETY: descriptor contract.
        unsafe { check_out_desc(op, "state", state)? };
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
