//! The panic boundary, the status enum and the thread-local last error.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::abi::enums::c_enum;
use ferrotron::Error;

/// Status of every `ftn_*` call. The values are part of the ABI and never
/// change; new statuses get new values.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnResult_t {
    /// The call succeeded (asynchronous work may still fail later: that is
    /// reported by the next synchronize of its stream).
    ftnSuccess = 0,
    /// An argument failed validation (NULL, wrong `size` field, dims that
    /// overflow, mismatched lengths, bad enum value); nothing was enqueued.
    ftnInvalidArgument = 1,
    /// The backend asked for cannot be used here (no driver, no GPU, built
    /// without CUDA).
    ftnBackendUnavailable = 2,
    /// A kernel failed while running (device-side assert, emulator-detected
    /// misuse); reported by a synchronize.
    ftnKernelFailed = 3,
    /// A launch configuration the device cannot run.
    ftnInvalidLaunch = 4,
    /// Handles or buffers of two different contexts were mixed in one call.
    ftnDeviceMismatch = 5,
    /// Any other error reported by a backend (driver, allocation, NCCL,
    /// collective timeout).
    ftnBackendError = 6,
    /// A bug in ferrotron (a caught panic). Please report it.
    ftnInternalError = 7,
}
c_enum!(
    ftnResult_t: ftnSuccess,
    ftnInvalidArgument,
    ftnBackendUnavailable,
    ftnKernelFailed,
    ftnInvalidLaunch,
    ftnDeviceMismatch,
    ftnBackendError,
    ftnInternalError,
);

use ftnResult_t::*;

impl ftnResult_t {
    pub(crate) fn from_code(code: i32) -> Option<ftnResult_t> {
        crate::abi::enums::from_value(code)
    }

    pub(crate) fn text(self) -> &'static std::ffi::CStr {
        match self {
            ftnSuccess => c"success",
            ftnInvalidArgument => c"invalid argument",
            ftnBackendUnavailable => c"backend unavailable",
            ftnKernelFailed => c"kernel failed",
            ftnInvalidLaunch => c"invalid launch configuration",
            ftnDeviceMismatch => c"handles or buffers of different contexts mixed",
            ftnBackendError => c"backend error",
            ftnInternalError => c"internal error (a bug in ferrotron: please report it)",
        }
    }
}

pub(crate) fn status_of(e: &Error) -> ftnResult_t {
    match e {
        Error::InvalidArgument { .. } => ftnInvalidArgument,
        Error::BackendUnavailable { .. } => ftnBackendUnavailable,
        Error::KernelFailed { .. } => ftnKernelFailed,
        Error::InvalidLaunch { .. } => ftnInvalidLaunch,
        Error::DeviceMismatch { .. } => ftnDeviceMismatch,
        Error::Backend { .. } => ftnBackendError,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Pointer to this thread's last error message (empty string if none). Valid
/// until the next failing call on this thread.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// Runs `f` as the body of an exported function: an `Err` becomes its status
/// and the thread's last error; a panic becomes `ftnInternalError` (never an
/// unwind across the C boundary).
pub(crate) fn guard(name: &'static str, f: impl FnOnce() -> ferrotron::Result<()>) -> ftnResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ftnSuccess,
        Ok(Err(e)) => {
            let msg = e.to_string();
            if msg.starts_with(name) {
                set_last_error(&msg);
            } else {
                set_last_error(&format!("{name}: {msg}"));
            }
            status_of(&e)
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".into());
            // Dropping the payload could itself panic; leak it instead.
            std::mem::forget(payload);
            set_last_error(&format!("{name}: internal error (panic): {what}"));
            ftnInternalError
        }
    }
}

/// The body of every exported function, which names itself once (in its
/// `fn` item):
///
/// ```ignore
/// #[no_mangle]
/// pub unsafe extern "C" fn ftn_x(stream: ftnStream_t) -> ftnResult_t {
///     export!(|op| { /* a ferrotron::Result<()>, errors naming `op` */ })
/// }
/// ```
///
/// runs the body inside the panic boundary ([`guard`]) with `op` bound to
/// the exported function's own name, `"ftn_x"`. The name comes from the
/// path of an item the macro declares inside the function (see
/// [`export_name`]), so it cannot drift from the symbol. A macro around the
/// body rather than the whole `fn` item: cbindgen does not look inside
/// macro invocations (only `bitflags!`), so the signature, `#[no_mangle]` and
/// the doc comment stay written out for the header.
macro_rules! export {
    (|$op:ident| $body:expr) => {{
        fn __export() {}
        let name = $crate::abi::boundary::export_name(::std::any::type_name_of_val(&__export));
        $crate::abi::boundary::guard(name, move || {
            let $op: &'static str = name;
            $body
        })
    }};
}
pub(crate) use export;

/// The exported function's name from the type name of the item [`export!`]
/// declares in it (`ferrotron::ops::gemm::ftn_gemm::__export` gives
/// `ftn_gemm`). The tests check it on exports of several modules.
pub(crate) fn export_name(path: &'static str) -> &'static str {
    let f = path.strip_suffix("::__export").unwrap_or(path);
    f.rsplit("::").next().unwrap_or(f)
}

/// `Error::InvalidArgument` for `op`'s argument `arg`.
pub(crate) fn invalid(
    op: &'static str,
    arg: &'static str,
    expected: impl ToString,
    got: impl ToString,
) -> Error {
    Error::invalid(op, arg, expected, got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let r = guard("ftn_test", || panic!("boom {}", 42));
        assert_eq!(r, ftnInternalError);
        // SAFETY: last_error_ptr returns a valid NUL-terminated string.
        let msg = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        let msg = msg.to_str().unwrap();
        assert!(msg.contains("ftn_test") && msg.contains("boom 42"), "{msg}");
    }

    #[test]
    fn errors_map_to_their_status() {
        let r = guard("ftn_x", || Err(invalid("op", "arg", "1", "2")));
        assert_eq!(r, ftnInvalidArgument);
        assert_eq!(guard("ftn_x", || Ok(())), ftnSuccess);
        for c in 0..8 {
            assert_eq!(ftnResult_t::from_code(c).unwrap() as i32, c);
        }
        assert!(ftnResult_t::from_code(8).is_none());
    }
}
