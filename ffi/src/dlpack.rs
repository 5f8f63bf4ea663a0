//! DLPack 1.x interop: borrow a caller's tensor (`ftn_dlpack_import`) and
//! hand a `ftn_malloc` allocation to another framework
//! (`ftn_dlpack_export`).
//!
//! The DLPack structs are defined here from the public standard (DLPack
//! 1.0 / 1.1, `dlpack.h`); they are not part of `ferrotron.h` (the exports
//! take `void *`), so a C program can include its own `dlpack.h` next to
//! ours without a clash. The layouts are checked by the tests below and by
//! the C test `ffi/tests/c/consumer_dlpack.c`, which declares them itself.

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use ferrotron::{BackendKind, DType, DeviceBuffer, Error, Result};

use crate::abi::args::{dim, mul};
use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{check_out_desc, Desc};
use crate::abi::dtype::parse_dtype;
use crate::abi::handles::{check_out, get};
use crate::runtime::{ftnContext, ftnContext_t};

/// Most dimensions a DLPack tensor may have to be imported or exported
/// (the ops take at most 4).
pub const FTN_DLPACK_MAX_DIMS: usize = 8;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DLPackVersion {
    pub(crate) major: u32,
    pub(crate) minor: u32,
}

/// `DLDevice`: `device_type` is a `DLDeviceType` (an `int` enum).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DLDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

/// `DLDataType`: a `DLDataTypeCode`, the bits of one lane, the lanes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DLDataType {
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct DLTensor {
    pub(crate) data: *mut c_void,
    pub(crate) device: DLDevice,
    pub(crate) ndim: i32,
    pub(crate) dtype: DLDataType,
    pub(crate) shape: *mut i64,
    /// In elements; NULL means compact row-major.
    pub(crate) strides: *mut i64,
    pub(crate) byte_offset: u64,
}

/// `DLManagedTensor` (the unversioned struct of DLPack < 1.0, still the
/// `"dltensor"` capsule of the Python protocol).
#[repr(C)]
pub(crate) struct DLManagedTensor {
    pub(crate) dl_tensor: DLTensor,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (DLPack 1.x, the `"dltensor_versioned"`
/// capsule).
#[repr(C)]
pub(crate) struct DLManagedTensorVersioned {
    pub(crate) version: DLPackVersion,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub(crate) flags: u64,
    pub(crate) dl_tensor: DLTensor,
}

/// The DLPack major version this library reads and writes.
pub(crate) const DLPACK_MAJOR_VERSION: u32 = 1;
/// The minor version written by `ftn_dlpack_export`.
pub(crate) const DLPACK_MINOR_VERSION: u32 = 0;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub(crate) const DLPACK_FLAG_READ_ONLY: u64 = 1;

/// `DLDeviceType` values used here.
pub(crate) const KDL_CPU: i32 = 1;
pub(crate) const KDL_CUDA: i32 = 2;

/// `DLDataTypeCode` values used here.
const KDL_INT: u8 = 0;
const KDL_UINT: u8 = 1;
const KDL_FLOAT: u8 = 2;
const KDL_BFLOAT: u8 = 4;

/// The DLPack type of a dtype (one lane).
pub(crate) fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::F32 => (KDL_FLOAT, 32),
        DType::F16 => (KDL_FLOAT, 16),
        DType::BF16 => (KDL_BFLOAT, 16),
        DType::U8 => (KDL_UINT, 8),
        DType::I32 => (KDL_INT, 32),
        DType::I64 => (KDL_INT, 64),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

fn dtype_of(t: DLDataType) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| dl_dtype(d) == t)
}

/// A borrowed DLPack tensor as the ops see it: the first element's
/// address, the element type and the shape (compact row-major).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnTensorView_t {
    /// `sizeof(ftnTensorView_t)` as the caller compiled it.
    pub size: usize,
    /// `dl_tensor.data + dl_tensor.byte_offset`: the first element, the
    /// pointer to pass to an op.
    pub data: *mut c_void,
    /// `ftnDataType_t` of the elements.
    pub dtype: i32,
    /// Dimensions, 0 to `FTN_DLPACK_MAX_DIMS`.
    pub ndim: i32,
    /// The first `ndim` entries are the dimensions, the rest 0.
    pub shape: [i64; FTN_DLPACK_MAX_DIMS],
    /// The number of elements (the product of the dimensions; 1 when
    /// `ndim` is 0).
    pub numel: i64,
    /// Non-zero when the producer marked the tensor read-only (DLPack 1.x
    /// flag): do not pass it as an op's output.
    pub read_only: i32,
    /// Written as 0.
    pub reserved: i32,
}
// SAFETY: repr(C), size_t first, integer fields and a raw pointer (any
// bytes are a valid value), explicit padding.
unsafe impl Desc for ftnTensorView_t {
    const NAME: &'static str = "ftnTensorView_t";
    const V1_SIZE: usize = 104;
}

/// The `DLTensor` of `managed` and its read-only flag.
///
/// # Safety
/// `managed` is non-NULL, aligned and points to a live struct of the kind
/// `versioned` says.
unsafe fn tensor_of(
    op: &'static str,
    managed: *const c_void,
    versioned: bool,
) -> Result<(DLTensor, bool)> {
    if versioned {
        // SAFETY: the caller's contract.
        let m = unsafe { &*(managed as *const DLManagedTensorVersioned) };
        if m.version.major != DLPACK_MAJOR_VERSION {
            return Err(invalid(
                op,
                "managed->version.major",
                format!(
                    "DLPack major version {DLPACK_MAJOR_VERSION} (this library reads DLPack 1.x)"
                ),
                m.version.major,
            ));
        }
        Ok((m.dl_tensor, m.flags & DLPACK_FLAG_READ_ONLY != 0))
    } else {
        // SAFETY: the caller's contract.
        let m = unsafe { &*(managed as *const DLManagedTensor) };
        Ok((m.dl_tensor, false))
    }
}

/// The device a context takes DLPack tensors of, as a `DLDevice`.
fn dl_device(c: &ftnContext) -> DLDevice {
    match c.dev.kind() {
        BackendKind::Emu => DLDevice {
            device_type: KDL_CPU,
            device_id: 0,
        },
        BackendKind::Cuda => DLDevice {
            device_type: KDL_CUDA,
            device_id: c.ordinal as i32,
        },
    }
}

/// Reads and checks a borrowed tensor against `c`; returns the view.
///
/// # Safety
/// As [`tensor_of`]; `shape` / `strides` valid for `ndim` entries.
unsafe fn import(
    op: &'static str,
    c: &ftnContext,
    managed: *const c_void,
    versioned: bool,
) -> Result<ftnTensorView_t> {
    // SAFETY: forwarded contract.
    let (t, read_only) = unsafe { tensor_of(op, managed, versioned)? };
    let want = dl_device(c);
    let same_device = t.device.device_type == want.device_type
        && (want.device_type == KDL_CPU || t.device.device_id == want.device_id);
    if !same_device {
        return Err(Error::DeviceMismatch {
            op,
            arg: "managed->dl_tensor.device",
            than: match want.device_type {
                KDL_CPU => "the context `ctx` (an emulator context takes kDLCPU tensors only)",
                _ => "the context `ctx` (a CUDA context takes kDLCUDA tensors of its own ordinal only)",
            },
        });
    }
    let dtype = dtype_of(t.dtype).ok_or_else(|| {
        invalid(
            op,
            "managed->dl_tensor.dtype",
            "float32 (code 2, 32 bits), float16 (2, 16), bfloat16 (4, 16), uint8 (1, 8), int32 (0, 32) or int64 (0, 64), one lane",
            format!(
                "code {}, {} bits, {} lanes",
                t.dtype.code, t.dtype.bits, t.dtype.lanes
            ),
        )
    })?;
    let ndim = usize::try_from(t.ndim)
        .ok()
        .filter(|&n| n <= FTN_DLPACK_MAX_DIMS)
        .ok_or_else(|| {
            invalid(
                op,
                "managed->dl_tensor.ndim",
                format!("0 to FTN_DLPACK_MAX_DIMS = {FTN_DLPACK_MAX_DIMS} dimensions"),
                t.ndim,
            )
        })?;
    if ndim > 0 && t.shape.is_null() {
        return Err(invalid(
            op,
            "managed->dl_tensor.shape",
            format!("a non-NULL array of {ndim} dimensions"),
            "NULL",
        ));
    }
    let mut shape = [0i64; FTN_DLPACK_MAX_DIMS];
    let mut numel = 1usize;
    for (i, s) in shape.iter_mut().enumerate().take(ndim) {
        // SAFETY: `shape` holds `ndim` entries (the producer's contract).
        *s = unsafe { t.shape.add(i).read_unaligned() };
        numel = mul(
            op,
            "managed->dl_tensor.shape",
            numel,
            dim(op, "managed->dl_tensor.shape", *s)?,
        )?;
    }
    if !t.strides.is_null() && numel > 0 {
        let mut expected = 1i64;
        for i in (0..ndim).rev() {
            // SAFETY: `strides` holds `ndim` entries when not NULL.
            let st = unsafe { t.strides.add(i).read_unaligned() };
            if shape[i] != 1 && st != expected {
                return Err(invalid(
                    op,
                    "managed->dl_tensor.strides",
                    format!(
                        "compact row-major strides (dimension {i} of shape {:?}: stride {expected} elements); the ops do not take non-contiguous tensors: pass a contiguous copy",
                        &shape[..ndim]
                    ),
                    format!("stride {st} in dimension {i} (strides {:?})", {
                        // SAFETY: as above.
                        (0..ndim)
                            .map(|j| unsafe { t.strides.add(j).read_unaligned() })
                            .collect::<Vec<_>>()
                    }),
                ));
            }
            expected = expected.saturating_mul(shape[i]);
        }
    }
    let data = (t.data as usize)
        .checked_add(usize::try_from(t.byte_offset).unwrap_or(usize::MAX))
        .ok_or_else(|| {
            invalid(
                op,
                "managed->dl_tensor.byte_offset",
                "data + byte_offset inside the address space",
                t.byte_offset,
            )
        })?;
    if t.data.is_null() && numel > 0 {
        return Err(invalid(
            op,
            "managed->dl_tensor.data",
            format!("a non-NULL pointer to {numel} elements"),
            "NULL",
        ));
    }
    let size = dtype.size();
    if data % size != 0 {
        return Err(invalid(
            op,
            "managed->dl_tensor.data",
            format!(
                "data + byte_offset aligned to {size} bytes for {}",
                dtype.name()
            ),
            format!("{data:#x}"),
        ));
    }
    if numel
        .checked_mul(size)
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(invalid(
            op,
            "managed->dl_tensor.shape",
            "a size in bytes that fits in ptrdiff_t",
            format!("{numel} elements of {}", dtype.name()),
        ));
    }
    Ok(ftnTensorView_t {
        size: 0,
        data: data as *mut c_void,
        dtype: dtype.to_c(),
        ndim: ndim as i32,
        shape,
        numel: numel as i64,
        read_only: read_only as i32,
        reserved: 0,
    })
}

/// Borrows a DLPack tensor: checks it against the context and writes a
/// view of it (`view->data` is `data + byte_offset`, the pointer to pass to
/// an op; `view->shape`, `view->numel`, `view->dtype` as an
/// `ftnDataType_t`). `managed` is a `DLManagedTensorVersioned *` (DLPack
/// 1.x) when `versioned` is 1, a `DLManagedTensor *` when it is 0.
///
/// Ownership: the import takes nothing. The caller keeps the managed
/// tensor alive until the work using the view has finished (synchronize
/// the stream), then calls its `deleter` itself, exactly once (never
/// through this library). The view holds no reference.
///
/// Checked: the device (an emulator context takes `kDLCPU` tensors, a CUDA
/// context `kDLCUDA` tensors of its own ordinal), the dtype (float32,
/// float16, bfloat16, uint8, int32, int64; one lane), the strides (NULL,
/// or compact row-major: size-1 dimensions may have any stride), the
/// alignment of `data + byte_offset` to the element size (no op needs
/// more; 16-byte aligned data lets some kernels use 128-bit accesses) and
/// the DLPack major version (1). Not checkable: that the memory really
/// holds `numel` elements; the producer's word is trusted.
///
/// Bad input (at the call, nothing written to `*view`): `ctx` NULL, stale
/// or of another kind; `managed` NULL or not aligned to 8 bytes; `view`
/// NULL, misaligned or a bad `view->size`; `versioned` outside 0..=1; a
/// DLPack major version other than 1; `ndim` outside
/// 0..=FTN_DLPACK_MAX_DIMS; a NULL `shape` with `ndim > 0`; a negative
/// dimension or an element count that overflows; an unsupported dtype or
/// `lanes != 1`; non-contiguous strides (the error names the dimension);
/// `data` NULL with elements; `data + byte_offset` not aligned to the
/// element size: ftnInvalidArgument. A tensor on another device than the
/// context's: ftnDeviceMismatch. The deleter is never called, on success
/// or failure.
#[no_mangle]
pub unsafe extern "C" fn ftn_dlpack_import(
    ctx: ftnContext_t,
    managed: *const c_void,
    versioned: c_int,
    view: *mut ftnTensorView_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        // SAFETY: descriptor contract (`view->size` is set).
        let size = unsafe {
            check_out_desc(op, "view", view)?;
            (*view).size
        };
        check_managed(op, managed)?;
        let versioned = parse_versioned(op, versioned)?;
        // SAFETY: `managed` is non-NULL and aligned; its validity is the
        // caller's contract.
        let v = unsafe { import(op, c, managed, versioned)? };
        // SAFETY: checked above; at least sizeof(ftnTensorView_t) bytes.
        unsafe { view.write(ftnTensorView_t { size, ..v }) };
        Ok(())
    })
}

fn check_managed(op: &'static str, managed: *const c_void) -> Result<()> {
    if managed.is_null() {
        return Err(invalid(
            op,
            "managed",
            "a non-NULL pointer to a DLManagedTensorVersioned or DLManagedTensor",
            "NULL",
        ));
    }
    if (managed as usize) % 8 != 0 {
        return Err(invalid(
            op,
            "managed",
            "a pointer aligned to 8 bytes",
            format!("{managed:p}"),
        ));
    }
    Ok(())
}

fn parse_versioned(op: &'static str, v: c_int) -> Result<bool> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(invalid(
            op,
            "versioned",
            "1 (a DLManagedTensorVersioned) or 0 (a DLManagedTensor)",
            v,
        )),
    }
}

/// Live exported tensors (their deleter not yet called); for the tests.
static LIVE_EXPORTS: AtomicUsize = AtomicUsize::new(0);

/// The memory and shape an exported tensor owns.
struct Owned {
    _buf: DeviceBuffer<u8>,
    _shape: Box<[i64]>,
}

impl Owned {
    fn new(buf: DeviceBuffer<u8>, shape: Box<[i64]>) -> Owned {
        LIVE_EXPORTS.fetch_add(1, Ordering::Relaxed);
        Owned {
            _buf: buf,
            _shape: shape,
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        LIVE_EXPORTS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An exported versioned tensor: the managed struct first (its address is
/// the box's), then what it owns.
#[repr(C)]
struct ExportedVersioned {
    managed: DLManagedTensorVersioned,
    owned: Owned,
}

#[repr(C)]
struct ExportedLegacy {
    managed: DLManagedTensor,
    owned: Owned,
}

/// A deleter may run on any thread (DLPack allows it): what it drops must
/// be `Send`.
const _: () = {
    fn assert_send<T: Send>() {}
    #[allow(dead_code)]
    fn owned_is_send() {
        assert_send::<DeviceBuffer<u8>>();
        assert_send::<Box<[i64]>>();
    }
};

/// Runs a deleter's body: never unwinds into the caller (a panic is
/// swallowed: a deleter has no way to report one).
fn deleter_body(f: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
        std::mem::forget(payload);
    }
}

/// The deleter of a versioned exported tensor: frees the memory (in the
/// order of the work already enqueued on the context's streams) and the
/// bookkeeping. NULL is a no-op.
unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    deleter_body(|| {
        if !m.is_null() {
            // SAFETY: `m` came from `Box::into_raw` of an ExportedVersioned
            // (its first field) and the DLPack contract calls the deleter
            // once.
            drop(unsafe { Box::from_raw(m as *mut ExportedVersioned) });
        }
    })
}

/// As [`delete_versioned`], for the unversioned struct.
unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    deleter_body(|| {
        if !m.is_null() {
            // SAFETY: as in delete_versioned.
            drop(unsafe { Box::from_raw(m as *mut ExportedLegacy) });
        }
    })
}

/// Hands memory from `ftn_malloc` to another framework as a DLPack tensor
/// of `ndim` dimensions `shape` (compact row-major, `strides` NULL) and
/// element type `datatype` (`ftnDataType_t`); writes a
/// `DLManagedTensorVersioned *` (DLPack 1.0) to `*out` when `versioned` is
/// 1, a `DLManagedTensor *` when it is 0 (for consumers older than DLPack
/// 1.0). The device is `kDLCPU` on the emulator, `kDLCUDA` with the
/// context's ordinal on a GPU; flags 0 (writable).
///
/// Ownership moves with the tensor: on success the allocation leaves the
/// context (`ftn_free` of `ptr` is then an error, and destroying the
/// context no longer frees it) and the tensor's `deleter`, called by the
/// consumer exactly once, frees it, in the order of the work enqueued on
/// the context's streams before the call (as `ftn_free` does), together
/// with the DLPack bookkeeping. The deleter may be called from any thread,
/// also after the context is destroyed.
///
/// Bad input (at the call, nothing written, the allocation stays with the
/// context): `ctx` NULL, stale or of another kind; `out` NULL or not aligned
/// for a pointer; `datatype` outside `ftnDataType_t`; `ndim` outside
/// 0..=FTN_DLPACK_MAX_DIMS; `shape` NULL with `ndim > 0`; a negative
/// dimension or a size that overflows; `versioned` outside 0..=1; `ptr`
/// NULL or not the start of a live `ftn_malloc` allocation of `ctx` (to
/// export an empty tensor, allocate at least one byte); a shape whose
/// bytes exceed the allocation: ftnInvalidArgument. A host allocation
/// that fails: ftnBackendError.
#[no_mangle]
pub unsafe extern "C" fn ftn_dlpack_export(
    ctx: ftnContext_t,
    ptr: *mut c_void,
    datatype: c_int,
    ndim: c_int,
    shape: *const i64,
    versioned: c_int,
    out: *mut *mut c_void,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        check_out(op, "out", out)?;
        let dtype = parse_dtype(op, "datatype", datatype, &DType::ALL)?;
        let n = usize::try_from(ndim)
            .ok()
            .filter(|&n| n <= FTN_DLPACK_MAX_DIMS)
            .ok_or_else(|| {
                invalid(
                    op,
                    "ndim",
                    format!("0 to FTN_DLPACK_MAX_DIMS = {FTN_DLPACK_MAX_DIMS}"),
                    ndim,
                )
            })?;
        // SAFETY: pointer contract: `shape` holds `ndim` entries.
        let dims = unsafe {
            crate::abi::views::host_slice::<i64>(op, "shape", shape as *const c_void, n)?
        };
        let mut numel = 1usize;
        for &d in dims {
            numel = mul(op, "shape", numel, dim(op, "shape", d)?)?;
        }
        let bytes = mul(op, "shape", numel, dtype.size())?;
        let versioned = parse_versioned(op, versioned)?;
        if ptr.is_null() {
            return Err(invalid(
                op,
                "ptr",
                "a pointer returned by ftn_malloc on this context (allocate at least 1 byte for an empty tensor)",
                "NULL",
            ));
        }
        let mut shape_box = crate::abi::args::try_vec::<i64>(op, "shape", n)?;
        shape_box.extend_from_slice(dims);
        let mut shape_box = shape_box.into_boxed_slice();
        let mut table = c.allocs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(len) = table.get(&(ptr as u64)).map(DeviceBuffer::len) else {
            return Err(invalid(
                op,
                "ptr",
                "the start of a live ftn_malloc allocation of this context",
                format!("{ptr:p}"),
            ));
        };
        if bytes > len {
            return Err(invalid(
                op,
                "shape",
                format!("at most {len} bytes (the ftn_malloc allocation at `ptr`)"),
                format!("{numel} elements of {}, {bytes} bytes", dtype.name()),
            ));
        }
        let tensor = DLTensor {
            data: ptr,
            device: dl_device(c),
            ndim,
            dtype: dl_dtype(dtype),
            shape: if n == 0 {
                std::ptr::null_mut()
            } else {
                shape_box.as_mut_ptr()
            },
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let buf = table.remove(&(ptr as u64)).expect("looked up above");
        drop(table);
        let owned = Owned::new(buf, shape_box);
        let m: *mut c_void = if versioned {
            let b = Box::new(ExportedVersioned {
                managed: DLManagedTensorVersioned {
                    version: DLPackVersion {
                        major: DLPACK_MAJOR_VERSION,
                        minor: DLPACK_MINOR_VERSION,
                    },
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(delete_versioned),
                    flags: 0,
                    dl_tensor: tensor,
                },
                owned,
            });
            let p = Box::into_raw(b);
            // SAFETY: just allocated; manager_ctx points to the owner.
            unsafe { (*p).managed.manager_ctx = p as *mut c_void };
            p as *mut c_void
        } else {
            let b = Box::new(ExportedLegacy {
                managed: DLManagedTensor {
                    dl_tensor: tensor,
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(delete_legacy),
                },
                owned,
            });
            let p = Box::into_raw(b);
            // SAFETY: as above.
            unsafe { (*p).managed.manager_ctx = p as *mut c_void };
            p as *mut c_void
        };
        // SAFETY: checked by check_out.
        unsafe { out.write(m) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;
    use std::mem::{offset_of, size_of};

    /// The layouts of DLPack 1.x on a 64-bit target.
    #[test]
    fn layouts_are_dlpacks() {
        assert_eq!(size_of::<DLDevice>(), 8);
        assert_eq!(size_of::<DLDataType>(), 4);
        assert_eq!(size_of::<DLTensor>(), 48);
        assert_eq!(offset_of!(DLTensor, device), 8);
        assert_eq!(offset_of!(DLTensor, ndim), 16);
        assert_eq!(offset_of!(DLTensor, dtype), 20);
        assert_eq!(offset_of!(DLTensor, shape), 24);
        assert_eq!(offset_of!(DLTensor, strides), 32);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);
        assert_eq!(size_of::<DLManagedTensor>(), 64);
        assert_eq!(offset_of!(DLManagedTensor, deleter), 56);
        assert_eq!(size_of::<DLManagedTensorVersioned>(), 80);
        assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
        assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
        assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
        assert_eq!(size_of::<ftnTensorView_t>(), ftnTensorView_t::V1_SIZE);
    }

    fn emu() -> ftnContext_t {
        let mut c = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        assert_eq!(
            unsafe { ftn_context_create(0, 0, &mut c) },
            ftnResult_t::ftnSuccess
        );
        c
    }

    /// Export, import the exported tensor back, free it through its
    /// deleter (after the context's destroy, on another thread): the
    /// allocation leaves the context and is freed once.
    #[test]
    fn export_import_round_trip_and_the_deleter_frees_once() {
        let ctx = emu();
        let mut p = std::ptr::null_mut();
        // SAFETY (all): live handles and out-pointers.
        unsafe {
            assert_eq!(ftn_malloc(ctx, &mut p, 24), ftnResult_t::ftnSuccess);
            let live = LIVE_EXPORTS.load(Ordering::Relaxed);
            let mut m = std::ptr::null_mut();
            let shape = [2i64, 3];
            assert_eq!(
                ftn_dlpack_export(ctx, p, 0, 2, shape.as_ptr(), 1, &mut m),
                ftnResult_t::ftnSuccess
            );
            assert!(LIVE_EXPORTS.load(Ordering::Relaxed) > live);
            // ownership moved: the context no longer frees it
            assert_eq!(ftn_free(ctx, p), ftnResult_t::ftnInvalidArgument);
            let mut v: ftnTensorView_t = std::mem::zeroed();
            v.size = size_of::<ftnTensorView_t>();
            assert_eq!(
                ftn_dlpack_import(ctx, m, 1, &mut v),
                ftnResult_t::ftnSuccess
            );
            assert_eq!((v.data, v.dtype, v.ndim, v.numel), (p, 0, 2, 6));
            assert_eq!(&v.shape[..3], &[2, 3, 0]);
            let mv = m as *mut DLManagedTensorVersioned;
            assert_eq!((*mv).version.major, 1);
            assert_eq!((*mv).dl_tensor.device.device_type, KDL_CPU);
            assert_eq!(ftn_context_destroy(ctx), ftnResult_t::ftnSuccess);
            // the deleter works after the context is gone, on another thread
            let addr = mv as usize;
            std::thread::spawn(move || {
                let mv = addr as *mut DLManagedTensorVersioned;
                ((*mv).deleter.unwrap())(mv);
            })
            .join()
            .unwrap();
            assert_eq!(LIVE_EXPORTS.load(Ordering::Relaxed), live);
        }
    }
}
