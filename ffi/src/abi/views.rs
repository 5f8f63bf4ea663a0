//! Caller memory: raw pointers checked and wrapped as non-owning device
//! views or host slices.

use std::ffi::c_void;

use ferrotron::{with_dtype, AnyBuffer, DType, Device, DeviceBuffer, Element, Result};

use crate::abi::boundary::invalid;

/// Checks caller memory of `len` elements of `T` at `ptr`: non-NULL (when
/// `len > 0`), aligned for `T`, and a byte size that fits in `isize`.
pub(crate) fn check_ptr<T: Element>(
    op: &'static str,
    arg: &'static str,
    ptr: *const c_void,
    len: usize,
) -> Result<()> {
    if ptr.is_null() && len > 0 {
        return Err(invalid(
            op,
            arg,
            format!("a non-NULL pointer to {len} elements of {}", T::DTYPE),
            "NULL",
        ));
    }
    let align = std::mem::align_of::<T>();
    if (ptr as usize) % align != 0 {
        return Err(invalid(
            op,
            arg,
            format!("a pointer aligned to {align} bytes for {}", T::DTYPE),
            format!("{ptr:p}"),
        ));
    }
    if len
        .checked_mul(std::mem::size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(invalid(
            op,
            arg,
            "a size in bytes that fits in isize",
            format!("{len} elements of {}", T::DTYPE),
        ));
    }
    Ok(())
}

/// A non-owning typed view of `len` elements of caller memory at `ptr` on
/// `dev`, checked by [`check_ptr`].
///
/// # Safety
/// `ptr` must be valid for `len` elements on `dev` until the work using the
/// view has finished (the caller's contract, documented in the header).
pub(crate) unsafe fn view<T: Element>(
    dev: &Device,
    op: &'static str,
    arg: &'static str,
    ptr: *const c_void,
    len: usize,
) -> Result<DeviceBuffer<T>> {
    check_ptr::<T>(op, arg, ptr, len)?;
    // SAFETY: validity for `len` elements is the caller's contract; NULL,
    // alignment and size were checked above.
    unsafe { DeviceBuffer::from_raw_parts(dev, ptr as u64, len) }
}

/// A host slice of `len` elements at `ptr` (caller memory, read during the
/// call), checked for NULL (when `len > 0`), alignment and size overflow.
///
/// # Safety
/// `ptr` must be valid for reads of `len` elements for the call's duration.
pub(crate) unsafe fn host_slice<'a, T: Element>(
    op: &'static str,
    arg: &'static str,
    ptr: *const c_void,
    len: usize,
) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    check_ptr::<T>(op, arg, ptr, len)?;
    // SAFETY: non-NULL, aligned, size fits in isize; validity for `len`
    // elements is the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const T, len) })
}

/// An optional view: NULL gives `None`.
///
/// # Safety
/// As [`view`].
pub(crate) unsafe fn opt_view<T: Element>(
    dev: &Device,
    op: &'static str,
    arg: &'static str,
    ptr: *const c_void,
    len: usize,
) -> Result<Option<DeviceBuffer<T>>> {
    if ptr.is_null() {
        Ok(None)
    } else {
        // SAFETY: forwarded contract.
        unsafe { view(dev, op, arg, ptr, len).map(Some) }
    }
}

/// A view of `len` elements of `dtype` (known only at run time), checked
/// as [`view`] checks its element type.
///
/// # Safety
/// As [`view`].
pub(crate) unsafe fn any_view(
    dev: &Device,
    op: &'static str,
    arg: &'static str,
    dtype: DType,
    ptr: *const c_void,
    len: usize,
) -> Result<AnyBuffer> {
    // SAFETY: forwarded contract.
    with_dtype!(dtype, T => unsafe { view::<T>(dev, op, arg, ptr, len) }.map(AnyBuffer::from))
}
