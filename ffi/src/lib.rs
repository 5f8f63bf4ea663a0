//! The C ABI of ferrotron: `include/ferrotron.h` (generated from this crate
//! by the pinned cbindgen: `cargo run -p xtask -- cbindgen`).
//!
//! Model: NCCL's `nccl.h`. Opaque handles (`ftnContext_t`, `ftnStream_t`,
//! `ftnEvent_t`, `ftnComm_t`, `ftnGradScaler_t`, the layers', `ftnAdam_t`,
//! `ftnParamRegistry_t`, `ftnDdp_t`, `ftnDistOpt_t`); every function returns an
//! `ftnResult_t` and runs inside a panic boundary (`abi::boundary::guard`);
//! failures leave a message naming the failing argument in a thread-local
//! last error (`ftn_get_last_error`). Ops take raw pointers (device pointers
//! on CUDA, host pointers on the emulator), a stream and a `size`-prefixed
//! descriptor that can grow. Raw pointers are wrapped in non-owning
//! [`ferrotron::DeviceBuffer::from_raw_parts`] views so that every op's full
//! validation of the Rust API applies.
#![allow(clippy::missing_safety_doc)] // the contracts are in the header's comments

mod abi;
mod comm;
mod dlpack;
mod ops;
mod parallel;
mod runtime;

pub use abi::boundary::ftnResult_t;
pub use abi::descriptors::FTN_MAX_DESC_SIZE;
pub use abi::dtype::ftnDataType_t;
pub use comm::collectives::*;
pub use comm::job::*;
pub use comm::*;
pub use dlpack::*;
pub use ops::adam::*;
pub use ops::bias_gelu::*;
pub use ops::copy::*;
pub use ops::ftnGelu_t;
pub use ops::gemm::*;
pub use ops::grad_scaler::*;
pub use ops::layernorm::*;
pub use ops::multi_tensor::*;
pub use ops::softmax::*;
pub use parallel::blocks::*;
pub use parallel::common::{
    ftnActivation_t, ftnLinearGrads_t, ftnLinearParams_t, ftnWeightGradMode_t,
};
pub use parallel::ddp::*;
pub use parallel::linear::*;
pub use parallel::mappings::*;
pub use parallel::pipeline::*;
pub use parallel::shard::*;
pub use parallel::vocab::*;
pub use runtime::*;

use std::ffi::{c_char, c_int};

use abi::boundary::export;

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
///
/// Bad input: `version` NULL or not aligned for an `int`:
/// ftnInvalidArgument, nothing written.
#[no_mangle]
pub unsafe extern "C" fn ftn_get_version(version: *mut c_int) -> ftnResult_t {
    export!(|op| {
        // SAFETY: out-pointer contract.
        unsafe { abi::handles::write_out(op, "version", version, FTN_VERSION) }
    })
}

/// A static, human-readable description of a status (any value: unknown
/// ones give "unknown status"). Never NULL.
///
/// Bad input: none; any `status` value is accepted and no status is
/// returned (the call cannot fail and never sets the last error).
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
///
/// Bad input: none (no arguments; the call cannot fail and does not change
/// the last error).
#[no_mangle]
pub extern "C" fn ftn_get_last_error() -> *const c_char {
    abi::boundary::last_error_ptr()
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
        assert_thread_safe::<ftnAdam>();
        assert_thread_safe::<ftnParamRegistry>();
        assert_thread_safe::<ftnDdp>();
        assert_thread_safe::<ftnDistOpt>();
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.rs` file under `src/`: its items before the tests, without
    /// comment lines.
    fn sources() -> Vec<(String, String)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&root, &mut files);
        files.sort();
        files
            .into_iter()
            .map(|p| {
                let name = p.strip_prefix(&root).unwrap().display().to_string();
                // Code only: comments and tests may quote an export.
                let text = std::fs::read_to_string(&p).unwrap();
                let items = text.split("#[cfg(test)]\nmod tests").next().unwrap();
                let code: Vec<&str> = items
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .collect();
                (name, code.join("\n") + "\n")
            })
            .collect()
    }

    /// Every exported function of every file is `#[no_mangle] pub unsafe
    /// extern "C"` and its whole body is `export!(|op| ..)`, the panic
    /// boundary (the two infallible, allocation-free accessors excepted); no
    /// other code calls `guard` directly.
    #[test]
    fn every_export_is_inside_the_panic_boundary() {
        const ACCESSORS: [&str; 2] = ["ftn_get_error_string", "ftn_get_last_error"];
        // Callbacks handed to C through a struct (DLPack deleters): not
        // exported, private, and their body is `deleter_body(..)`, which
        // swallows a panic instead of unwinding into the caller.
        const CALLBACKS: [&str; 2] = ["delete_versioned", "delete_legacy"];
        let mut exports = 0;
        for (f, src) in sources() {
            let callbacks = CALLBACKS
                .iter()
                .filter(|c| src.contains(&format!("unsafe extern \"C\" fn {c}(")))
                .count();
            assert_eq!(
                src.matches("extern \"C\" fn ").count(),
                src.matches("#[no_mangle]").count() + callbacks,
                "{f}: every `extern \"C\" fn` is #[no_mangle] and vice versa (callbacks aside)"
            );
            for c in CALLBACKS {
                let Some(at) = src.find(&format!("unsafe extern \"C\" fn {c}(")) else {
                    continue;
                };
                assert!(
                    !src[..at].ends_with("pub ") && !src[..at].trim_end().ends_with("#[no_mangle]"),
                    "{f}: callback `{c}` is private and not exported"
                );
                let body = &src[at..];
                let body = body[body.find(") {").unwrap() + 3..].trim_start();
                assert!(
                    body.starts_with("deleter_body(||"),
                    "{f}: callback `{c}` does not start with deleter_body(|| ..)"
                );
            }
            if f != "abi/boundary.rs" {
                assert!(
                    !src.contains("guard("),
                    "{f}: calls guard( directly, not export!"
                );
            }
            for chunk in src.split("extern \"C\" fn ").skip(1) {
                let name: String = chunk
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if CALLBACKS.contains(&name.as_str()) {
                    continue;
                }
                exports += 1;
                if ACCESSORS.contains(&name.as_str()) {
                    continue;
                }
                let sig_end = chunk
                    .find(") -> ftnResult_t {")
                    .unwrap_or_else(|| panic!("{f}: export `{name}` does not return ftnResult_t"));
                let body = chunk[sig_end + ") -> ftnResult_t {".len()..].trim_start();
                assert!(
                    body.starts_with("export!(|"),
                    "{f}: export `{name}` does not start with export!(|op| ..)"
                );
                // The export! call is the whole body: the function ends right
                // after it (at the first line that closes a top-level item).
                let end = body.find("\n}\n").unwrap_or(body.len());
                assert!(
                    body[..end].trim_end().ends_with(')'),
                    "{f}: export `{name}`: something follows export!(..)"
                );
            }
            for (i, _) in src.match_indices("extern \"C\" fn ") {
                let before = &src[..i];
                let name = &src[i + "extern \"C\" fn ".len()..];
                if CALLBACKS.iter().any(|c| name.starts_with(&format!("{c}("))) {
                    continue;
                }
                let public = before.ends_with("pub unsafe ")
                    || (before.ends_with("pub ") && ACCESSORS.iter().any(|a| name.starts_with(a)));
                assert!(
                    public,
                    "{f}: an export that is not `pub unsafe extern \"C\"`"
                );
            }
        }
        assert!(exports >= 104, "found only {exports} exports");
    }

    /// `export!` binds `op` to the function's own name, in every module.
    #[test]
    fn export_names_itself() {
        let null = std::ptr::null_mut::<std::ffi::c_void>();
        let last = || {
            // SAFETY: a valid NUL-terminated string.
            unsafe { std::ffi::CStr::from_ptr(ftn_get_last_error()) }
                .to_str()
                .unwrap()
                .to_owned()
        };
        type Call = Box<dyn Fn() -> ftnResult_t>;
        let cases: [(&str, Call); 7] = [
            // SAFETY (all): NULL handles and pointers are rejected first.
            (
                "ftn_get_version",
                Box::new(|| unsafe { ftn_get_version(std::ptr::null_mut()) }),
            ),
            (
                "ftn_stream_synchronize",
                Box::new(|| unsafe { ftn_stream_synchronize(std::ptr::null_mut()) }),
            ),
            (
                "ftn_gemm",
                Box::new(move || unsafe {
                    ftn_gemm(
                        std::ptr::null_mut(),
                        std::ptr::null(),
                        null,
                        null,
                        null,
                        null,
                        null,
                        null,
                    )
                }),
            ),
            (
                "ftn_comm_count",
                Box::new(|| unsafe { ftn_comm_count(std::ptr::null_mut(), std::ptr::null_mut()) }),
            ),
            (
                "ftn_all_reduce",
                Box::new(move || unsafe {
                    ftn_all_reduce(
                        null,
                        null,
                        1,
                        0,
                        0,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                }),
            ),
            (
                "ftn_rank_grid_dp",
                Box::new(|| unsafe { ftn_rank_grid_dp(std::ptr::null(), std::ptr::null_mut()) }),
            ),
            (
                "ftn_tp_mlp_destroy",
                Box::new(|| unsafe { ftn_tp_mlp_destroy(std::ptr::null_mut()) }),
            ),
        ];
        for (name, call) in cases {
            assert_eq!(call(), ftnResult_t::ftnInvalidArgument, "{name}");
            let msg = last();
            assert!(msg.starts_with(&format!("{name}: ")), "{name}: {msg}");
        }
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
