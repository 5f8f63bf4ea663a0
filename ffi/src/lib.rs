//! The C ABI of ferrotron: `include/ferrotron.h` (generated from this crate
//! by the pinned cbindgen: `cargo run -p xtask -- cbindgen`).
//!
//! Model: NCCL's `nccl.h`. Opaque handles (`ftnContext_t`, `ftnStream_t`,
//! `ftnEvent_t`, `ftnComm_t`, `ftnGradScaler_t`); every function returns an
//! `ftnResult_t` and runs inside a panic boundary ([`boundary::guard`]);
//! failures leave a message naming the failing argument in a thread-local
//! last error (`ftn_get_last_error`). Ops take raw pointers (device pointers
//! on CUDA, host pointers on the emulator), a stream and a `size`-prefixed
//! descriptor that can grow. Raw pointers are wrapped in non-owning
//! [`ferrotron::DeviceBuffer::from_raw_parts`] views so that every op's full
//! validation of the Rust API applies.
#![allow(clippy::missing_safety_doc)] // the contracts are in the header's comments

mod boundary;
mod comm;
mod handles;
mod job;
mod ops;
mod tp_blocks;
mod tp_common;
mod tp_linear;
mod tp_mappings;
mod tp_shard;
mod tp_vocab;

pub use boundary::ftnResult_t;
pub use comm::*;
pub use handles::*;
pub use job::*;
pub use ops::*;
pub use tp_blocks::*;
pub use tp_common::{ftnActivation_t, ftnLinearGrads_t, ftnLinearParams_t, ftnWeightGradMode_t};
pub use tp_linear::*;
pub use tp_mappings::*;
pub use tp_shard::*;
pub use tp_vocab::*;

use std::ffi::{c_char, c_int};

use boundary::guard;

/// Major version of the library this header belongs to.
pub const FTN_VERSION_MAJOR: c_int = 0;
/// Minor version.
pub const FTN_VERSION_MINOR: c_int = 1;
/// Patch version.
pub const FTN_VERSION_PATCH: c_int = 0;
/// `MAJOR * 10000 + MINOR * 100 + PATCH`, what `ftn_get_version` returns.
pub const FTN_VERSION: c_int = 100;

/// The library's version as `MAJOR * 10000 + MINOR * 100 + PATCH`
/// (compare with `FTN_VERSION` from the header you compiled against).
#[no_mangle]
pub unsafe extern "C" fn ftn_get_version(version: *mut c_int) -> ftnResult_t {
    guard("ftn_get_version", move || {
        // SAFETY: out-pointer contract.
        unsafe { handles::write_out("ftn_get_version", "version", version, FTN_VERSION) }
    })
}

/// A static, human-readable description of a status (any value: unknown
/// ones give "unknown status"). Never NULL.
#[no_mangle]
pub extern "C" fn ftn_get_error_string(status: c_int) -> *const c_char {
    match ftnResult_t::from_code(status) {
        Some(s) => s.text().as_ptr(),
        None => c"unknown status".as_ptr(),
    }
}

/// The message of the last failing `ftn_*` call on this thread, naming the
/// function, the failing argument, what was expected and what came (empty
/// string if none failed yet). Valid until the next failing call on this
/// thread; successful calls leave it unchanged. Never NULL.
#[no_mangle]
pub extern "C" fn ftn_get_last_error() -> *const c_char {
    boundary::last_error_ptr()
}

/// Handles may be used from any thread (the header says so): every type
/// behind one must be `Send + Sync`.
const _: () = {
    fn assert_thread_safe<T: Send + Sync>() {}
    #[allow(dead_code)]
    fn handles_are_thread_safe() {
        assert_thread_safe::<ftnContext>();
        assert_thread_safe::<ftnStream>();
        assert_thread_safe::<ftnEvent>();
        assert_thread_safe::<ftnComm>();
        assert_thread_safe::<ftnGradScaler>();
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Every exported function either runs its body inside the panic
    /// boundary (`guard`) or is one of the two infallible, allocation-free
    /// accessors.
    #[test]
    fn every_export_is_inside_the_panic_boundary() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut exports = 0;
        for f in ["lib.rs", "handles.rs", "ops.rs", "comm.rs"] {
            let src = std::fs::read_to_string(dir.join(f)).unwrap();
            for (i, chunk) in src.split("extern \"C\" fn ").skip(1).enumerate() {
                let name: String = chunk
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                exports += 1;
                if name == "ftn_get_error_string" || name == "ftn_get_last_error" {
                    continue;
                }
                let body = &chunk[chunk.find('{').unwrap()..];
                let first = body[1..].trim_start();
                assert!(
                    first.starts_with(&format!("guard(\"{name}\"")),
                    "{f}: export #{i} `{name}` does not start with guard(\"{name}\", ..)"
                );
            }
        }
        assert!(exports >= 59, "found only {exports} exports");
    }

    #[test]
    fn version_matches_the_crate() {
        let p = |s: &str| s.parse::<c_int>().unwrap();
        assert_eq!(FTN_VERSION_MAJOR, p(env!("CARGO_PKG_VERSION_MAJOR")));
        assert_eq!(FTN_VERSION_MINOR, p(env!("CARGO_PKG_VERSION_MINOR")));
        assert_eq!(FTN_VERSION_PATCH, p(env!("CARGO_PKG_VERSION_PATCH")));
        assert_eq!(
            FTN_VERSION,
            FTN_VERSION_MAJOR * 10000 + FTN_VERSION_MINOR * 100 + FTN_VERSION_PATCH
        );
        let mut v = 0;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { ftn_get_version(&mut v) }, ftnResult_t::ftnSuccess);
        assert_eq!(v, FTN_VERSION);
        // SAFETY: NULL is rejected before any write.
        assert_eq!(
            unsafe { ftn_get_version(std::ptr::null_mut()) },
            ftnResult_t::ftnInvalidArgument
        );
    }
}
