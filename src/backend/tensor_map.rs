//! TMA tensor maps (`CUtensorMap`, 128 opaque bytes) for kernels that load
//! through `cp.async.bulk.tensor` (`cuda/gemm_sm90.cu`): encoded on the host
//! by the CUDA driver's `cuTensorMapEncodeTiled` (looked up in `libcuda` at
//! first use; a missing library or symbol is an error, never a panic) or,
//! on the emulator, by `ftn_emu_tensor_map_encode_tiled`, which takes the
//! same arguments, enum values and checks (`cuda/emu/README.md`).

use crate::core::{Error, Result};
use crate::kernel_params::FtnTensorMap;

use super::{BackendKind, Device};

/// Element types (`CUtensorMapDataType`; the emulator uses the same values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum TmaDType {
    F16 = 6,
    BF16 = 9,
}

/// A tiled, 128-byte-swizzled, zero-filling map of a tensor of up to 5
/// dimensions, innermost first (`dims[0]` is contiguous).
pub(crate) struct TiledMap<'a> {
    pub dtype: TmaDType,
    pub addr: u64,
    pub dims: &'a [u64],
    /// Byte strides of dims 1.. (`dims.len() - 1` of them).
    pub strides: &'a [u64],
    pub boxes: &'a [u32],
}

const SWIZZLE_128B: i32 = 3;
const INTERLEAVE_NONE: i32 = 0;
const L2_PROMOTION_128B: i32 = 2;
const OOB_FILL_ZERO: i32 = 0;

/// Encodes `m` for a kernel on `device`; `op` names the caller in errors.
pub(crate) fn encode_tiled(
    device: &Device,
    op: &'static str,
    m: &TiledMap,
) -> Result<FtnTensorMap> {
    let rank = m.dims.len();
    if rank == 0 || rank > 5 || m.strides.len() + 1 != rank || m.boxes.len() != rank {
        return Err(Error::invalid(
            op,
            "tensor map",
            "rank 1..=5 with rank-1 strides and rank box sizes",
            format!(
                "{} dims, {} strides, {} boxes",
                rank,
                m.strides.len(),
                m.boxes.len()
            ),
        ));
    }
    let mut map = FtnTensorMap { opaque: [0; 16] };
    let estrides = [1u32; 5];
    match device.kind() {
        BackendKind::Emu => {
            let mut err = [0 as core::ffi::c_char; 256];
            // SAFETY: every pointer covers the lengths checked above; `map` is
            // 128 bytes, 64-byte aligned (FtnTensorMap); `err` is NUL-terminated
            // by the callee within its length.
            let rc = unsafe {
                super::emu::sys::ftn_emu_tensor_map_encode_tiled(
                    &mut map,
                    m.dtype as i32,
                    rank as u32,
                    m.addr as *mut core::ffi::c_void,
                    m.dims.as_ptr(),
                    m.strides.as_ptr(),
                    m.boxes.as_ptr(),
                    estrides.as_ptr(),
                    INTERLEAVE_NONE,
                    SWIZZLE_128B,
                    L2_PROMOTION_128B,
                    OOB_FILL_ZERO,
                    err.as_mut_ptr(),
                    err.len(),
                )
            };
            if rc != 0 {
                // SAFETY: the callee wrote a NUL-terminated message into err.
                let msg = unsafe { core::ffi::CStr::from_ptr(err.as_ptr()) };
                return Err(Error::invalid(
                    op,
                    "tensor map",
                    "a shape cuTensorMapEncodeTiled accepts",
                    msg.to_string_lossy(),
                ));
            }
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            let f = driver_encode()?;
            // SAFETY: as above; the driver reads rank entries of each array
            // (rank - 1 of the strides) and writes the 128-byte map.
            let rc = unsafe {
                f(
                    &mut map,
                    m.dtype as i32,
                    rank as u32,
                    m.addr as *mut core::ffi::c_void,
                    m.dims.as_ptr(),
                    m.strides.as_ptr(),
                    m.boxes.as_ptr(),
                    estrides.as_ptr(),
                    INTERLEAVE_NONE,
                    SWIZZLE_128B,
                    L2_PROMOTION_128B,
                    OOB_FILL_ZERO,
                )
            };
            if rc != 0 {
                return Err(Error::Backend {
                    backend: "cuda",
                    message: format!(
                        "cuTensorMapEncodeTiled for {op} failed with CUresult {rc} \
                         (dims {:?}, strides {:?}, box {:?})",
                        m.dims, m.strides, m.boxes
                    ),
                });
            }
        }
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => {
            return Err(Error::BackendUnavailable {
                backend: "cuda",
                reason: "ferrotron was built without feature `cuda`".into(),
            })
        }
    }
    Ok(map)
}

#[cfg(feature = "cuda")]
type EncodeTiled = unsafe extern "C" fn(
    *mut FtnTensorMap,
    i32,
    u32,
    *mut core::ffi::c_void,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    i32,
    i32,
    i32,
    i32,
) -> i32;

/// `cuTensorMapEncodeTiled` from the driver library, looked up once.
#[cfg(feature = "cuda")]
fn driver_encode() -> Result<EncodeTiled> {
    use std::sync::OnceLock;
    static F: OnceLock<std::result::Result<(libloading::Library, EncodeTiled), String>> =
        OnceLock::new();
    let found = F.get_or_init(|| {
        // SAFETY: loading the NVIDIA driver library runs its initialisers only.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }
            .or_else(|_| unsafe { libloading::Library::new("libcuda.so") })
            .map_err(|e| {
                format!("the NVIDIA driver library (libcuda.so) could not be loaded: {e}")
            })?;
        // SAFETY: the symbol has this C signature in every driver since CUDA 12.0.
        let f = unsafe { lib.get::<EncodeTiled>(b"cuTensorMapEncodeTiled\0") }
            .map(|s| *s)
            .map_err(|e| {
                format!("the driver has no cuTensorMapEncodeTiled (CUDA >= 12.0 needed): {e}")
            })?;
        Ok((lib, f))
    });
    match found {
        Ok((_, f)) => Ok(*f),
        Err(reason) => Err(Error::BackendUnavailable {
            backend: "cuda",
            reason: reason.clone(),
        }),
    }
}
