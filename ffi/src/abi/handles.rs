//! Opaque handles: the magic-tagged header every handle starts with, how a
//! handle is borrowed or taken back from C, and out-pointers.

use ferrotron::Result;

use crate::abi::boundary::invalid;

/// First field of every handle: tells a live handle of the right kind from a
/// destroyed one or one of another kind (best effort: passing freed memory
/// is still undefined behaviour).
pub(crate) trait Handle {
    const MAGIC: u64;
    const KIND: &'static str;
    fn magic(&self) -> u64;
    fn clear_magic(&mut self);
}

macro_rules! handle {
    ($name:ident, $alias:ident, $magic:expr, $kind:literal, { $($f:ident : $t:ty),* $(,)? }) => {
        #[repr(C)]
        pub struct $name {
            magic: u64,
            $(pub(crate) $f: $t),*
        }
        #[allow(non_camel_case_types)]
        pub type $alias = *mut $name;
        impl Handle for $name {
            const MAGIC: u64 = $magic;
            const KIND: &'static str = $kind;
            fn magic(&self) -> u64 {
                self.magic
            }
            fn clear_magic(&mut self) {
                self.magic = 0;
            }
        }
        impl $name {
            pub(crate) fn into_raw($($f: $t),*) -> *mut $name {
                Box::into_raw(Box::new($name { magic: $magic, $($f),* }))
            }
        }
    };
}

pub(crate) use handle;

/// Borrows the handle behind `p`, checking NULL and its kind.
///
/// # Safety
/// `p` is NULL or points to a handle created by this library and not yet
/// destroyed (a destroyed handle is detected on a best-effort basis).
pub(crate) unsafe fn get<'a, H: Handle>(
    op: &'static str,
    arg: &'static str,
    p: *mut H,
) -> Result<&'a H> {
    if p.is_null() {
        return Err(invalid(op, arg, format!("a live {}", H::KIND), "NULL"));
    }
    // SAFETY: non-NULL and, by the contract, a live handle of this library;
    // every handle is repr(C) with the magic first, so reading it is sound
    // even for a handle of another kind.
    let h = unsafe { &*p };
    if h.magic() != H::MAGIC {
        return Err(invalid(
            op,
            arg,
            format!("a live {}", H::KIND),
            "a destroyed handle or a handle of another kind",
        ));
    }
    Ok(h)
}

/// Takes ownership of the handle behind `p` (for destroy functions).
///
/// # Safety
/// As [`get`]; `p` must not be used after this.
pub(crate) unsafe fn take<H: Handle>(
    op: &'static str,
    arg: &'static str,
    p: *mut H,
) -> Result<Box<H>> {
    // SAFETY: forwarded contract.
    unsafe { get(op, arg, p)? };
    // SAFETY: a live handle created by Box::into_raw.
    let mut b = unsafe { Box::from_raw(p) };
    b.clear_magic();
    Ok(b)
}

/// Writes `v` through an out-pointer after checking it for NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(
    op: &'static str,
    arg: &'static str,
    out: *mut T,
    v: T,
) -> Result<()> {
    if out.is_null() {
        return Err(invalid(
            op,
            arg,
            "a non-NULL pointer to write the result to",
            "NULL",
        ));
    }
    // SAFETY: non-NULL and valid by the contract.
    unsafe { out.write(v) };
    Ok(())
}

/// Checks an out-pointer for NULL before any work is done.
pub(crate) fn check_out<T>(op: &'static str, arg: &'static str, out: *mut T) -> Result<()> {
    if out.is_null() {
        return Err(invalid(
            op,
            arg,
            "a non-NULL pointer to write the result to",
            "NULL",
        ));
    }
    Ok(())
}
