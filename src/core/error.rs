//! The one error type of the library. Every variant says what failed in
//! words a user can act on: which argument, what was expected, what came.

use alloc::string::{String, ToString};
use core::fmt;

pub type Result<T, E = Error> = core::result::Result<T, E>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// An argument failed validation before anything was enqueued.
    InvalidArgument {
        op: &'static str,
        arg: &'static str,
        expected: String,
        got: String,
    },
    /// A backend cannot be used on this machine (no driver, no GPU, feature off).
    BackendUnavailable {
        backend: &'static str,
        reason: String,
    },
    /// A kernel failed while running (device assert, emulator-detected misuse).
    KernelFailed { kernel: String, message: String },
    /// A launch configuration the device cannot run.
    InvalidLaunch { kernel: String, message: String },
    /// Buffers from two different devices were mixed in one call: `arg`
    /// lives on another device than `than` (e.g. "the stream").
    DeviceMismatch {
        op: &'static str,
        arg: &'static str,
        than: &'static str,
    },
    /// Any other error reported by a backend (driver errors, allocation).
    Backend {
        backend: &'static str,
        message: String,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(
        op: &'static str,
        arg: &'static str,
        expected: impl ToString,
        got: impl ToString,
    ) -> Self {
        Error::InvalidArgument {
            op,
            arg,
            expected: expected.to_string(),
            got: got.to_string(),
        }
    }
}

impl Error {
    /// The same error under a caller's op name: an invalid argument or a
    /// device mismatch found by a building block a caller checked with
    /// reads as the caller's. Other errors are returned unchanged.
    pub fn reported_by(self, caller: &'static str) -> Self {
        match self {
            Error::InvalidArgument {
                arg, expected, got, ..
            } => Error::InvalidArgument {
                op: caller,
                arg,
                expected,
                got,
            },
            Error::DeviceMismatch { arg, than, .. } => Error::DeviceMismatch {
                op: caller,
                arg,
                than,
            },
            other => other,
        }
    }

    /// The same error as a caller's boundary reports it: [`Error::reported_by`],
    /// and an invalid argument's value as the caller passed it (a C `int`
    /// before its conversion, say), so that the check itself stays in one
    /// place.
    pub fn as_seen_by(self, caller: &'static str, got: impl ToString) -> Self {
        match self.reported_by(caller) {
            Error::InvalidArgument {
                op, arg, expected, ..
            } => Error::InvalidArgument {
                op,
                arg,
                expected,
                got: got.to_string(),
            },
            other => other,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument {
                op,
                arg,
                expected,
                got,
            } => write!(f, "{op}: argument `{arg}`: expected {expected}, got {got}"),
            Error::BackendUnavailable { backend, reason } => {
                write!(f, "backend {backend} is unavailable: {reason}")
            }
            Error::KernelFailed { kernel, message } => {
                write!(f, "kernel {kernel} failed: {message}")
            }
            Error::InvalidLaunch { kernel, message } => {
                write!(f, "kernel {kernel}: invalid launch: {message}")
            }
            Error::DeviceMismatch { op, arg, than } => {
                write!(
                    f,
                    "{op}: argument `{arg}` lives on a different device than {than}"
                )
            }
            Error::Backend { backend, message } => write!(f, "{backend}: {message}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_argument_names_everything() {
        let e = Error::invalid("bias_gelu_forward", "bias", "length 7 (= cols)", "length 6");
        let s = alloc::format!("{e}");
        assert!(s.contains("bias_gelu_forward"), "{s}");
        assert!(s.contains("`bias`"), "{s}");
        assert!(s.contains("length 7"), "{s}");
        assert!(s.contains("length 6"), "{s}");
    }
}
