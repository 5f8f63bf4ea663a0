//! Devices, streams, events and typed device buffers over the two backends
//! (docs/architecture.md): `Emu`, the CUDA-on-CPU emulator (always available), and
//! `Cuda` (feature `cuda`). Both take the same launch plans from
//! [`crate::core::plan`]; launch configurations are checked against the
//! device limits before anything is enqueued.
//!
//! Semantics follow CUDA: work on one stream runs in order and asynchronously
//! to the host; streams are ordered against each other only by events; a
//! kernel failure is reported by the next `synchronize` of its stream.
//! Memory is stream-ordered: dropping a buffer never blocks the host; the
//! memory is released once every stream has done the work enqueued before
//! the drop (`DeviceBuffer::free_on` orders after one stream only).
//! Allocating and host copies wait only for private streams, never the
//! whole device (docs/architecture.md, "Memory").

mod any_buffer;
mod buffer;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::cublaslt;
/// The targets the embedded fatbins were built for (`FTN_CUDA_ARCHS`).
#[cfg(feature = "cuda")]
pub(crate) fn cuda_archs() -> &'static str {
    cuda::CUDA_ARCHS
}
mod emu;
mod stream;
pub(crate) mod tensor_map;
mod view;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use any_buffer::AnyBuffer;
pub use buffer::DeviceBuffer;
pub use view::{DeviceRead, DeviceSlice, DeviceSliceMut, DeviceWrite, HostScope};

/// The emulator's scalar fp16/bf16 conversions (bit-exact with the CUDA
/// headers' round-to-nearest-even), exposed for tests and tools.
pub mod emu_half {
    use super::emu::sys;

    pub fn f32_to_f16_bits(x: f32) -> u16 {
        // SAFETY: pure function of its argument.
        unsafe { sys::ftn_emu_f32_to_f16_bits(x) }
    }
    pub fn f16_bits_to_f32(h: u16) -> f32 {
        // SAFETY: pure function of its argument.
        unsafe { sys::ftn_emu_f16_bits_to_f32(h) }
    }
    pub fn f32_to_bf16_bits(x: f32) -> u16 {
        // SAFETY: pure function of its argument.
        unsafe { sys::ftn_emu_f32_to_bf16_bits(x) }
    }
    pub fn bf16_bits_to_f32(b: u16) -> f32 {
        // SAFETY: pure function of its argument.
        unsafe { sys::ftn_emu_bf16_bits_to_f32(b) }
    }
}
pub use stream::{Event, Stream};

use crate::core::{DeviceLimits, Error, Result};

/// Which backend a device runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The CUDA-on-CPU emulator: the kernels' source run by host threads.
    Emu,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Emu => "emu",
            BackendKind::Cuda => "cuda",
        })
    }
}

pub(crate) enum DeviceImpl {
    Emu(emu::EmuDevice),
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaDevice>),
}

pub(crate) struct DeviceInner {
    id: u64,
    pub(crate) imp: DeviceImpl,
}

/// A device: the emulator or one GPU. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({}, {})", self.kind(), self.name())
    }
}

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

/// Most worker threads one emulator launch uses (the emulator's own cap).
pub const MAX_EMU_WORKERS: usize = 1024;

impl Device {
    fn wrap(imp: DeviceImpl) -> Device {
        Device {
            inner: Arc::new(DeviceInner {
                id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
                imp,
            }),
        }
    }

    /// The CUDA-on-CPU emulator. Blocks of a launch are spread over
    /// `FTN_EMU_THREADS` OS threads (default: all hardware threads).
    pub fn emu() -> Device {
        Device::wrap(DeviceImpl::Emu(emu::EmuDevice::new()))
    }

    /// The emulator with each launch's blocks spread over `workers` OS
    /// threads, whatever `FTN_EMU_THREADS` says: for programs that run
    /// several emulator devices at once (in-process ranks), where the
    /// devices already share the cores. `workers` must be 1 to 1024.
    pub fn emu_with_workers(workers: usize) -> Result<Device> {
        if !(1..=MAX_EMU_WORKERS).contains(&workers) {
            return Err(Error::invalid(
                "Device::emu_with_workers",
                "workers",
                format!("1 to {MAX_EMU_WORKERS} worker threads"),
                workers,
            ));
        }
        Ok(Device::wrap(DeviceImpl::Emu(emu::EmuDevice::with_workers(
            workers as u32,
        ))))
    }

    /// Emulator workers for each of `ranks` emulator devices that run at
    /// once in one process: `FTN_EMU_THREADS` when set, else the hardware
    /// threads divided among the ranks (at least 1). More workers than cores
    /// gain nothing there, and each extra worker is an OS thread started per
    /// launch.
    pub fn emu_workers_per_rank(ranks: usize) -> usize {
        emu::EmuDevice::workers_from_env()
            .map(|n| n as usize)
            .unwrap_or_else(|| (emu::EmuDevice::hardware_threads() as usize / ranks.max(1)).max(1))
            .min(MAX_EMU_WORKERS)
    }

    /// GPU `ordinal` through the CUDA driver. Fails with
    /// [`Error::BackendUnavailable`] (never a panic) when the crate was built
    /// without feature `cuda`, the driver library is missing, or there is no
    /// such GPU.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        #[cfg(feature = "cuda")]
        {
            Ok(Device::wrap(DeviceImpl::Cuda(Box::new(
                cuda::CudaDevice::new(ordinal)?,
            ))))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(Error::BackendUnavailable {
                backend: "cuda",
                reason: "ferrotron was built without feature `cuda` (cargo build --features cuda)"
                    .into(),
            })
        }
    }

    /// GPU 0 when one can be used, else the emulator; the second value says
    /// why the GPU could not be used.
    pub fn best() -> (Device, Option<Error>) {
        match Device::cuda(0) {
            Ok(d) => (d, None),
            Err(e) => (Device::emu(), Some(e)),
        }
    }

    pub fn kind(&self) -> BackendKind {
        match &self.inner.imp {
            DeviceImpl::Emu(_) => BackendKind::Emu,
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(_) => BackendKind::Cuda,
        }
    }

    /// A human-readable name ("CPU emulator (2 worker threads)", "NVIDIA H200").
    pub fn name(&self) -> String {
        match &self.inner.imp {
            DeviceImpl::Emu(e) => e.name(),
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(c) => c.name(),
        }
    }

    /// A GPU's compute capability `(major, minor)`; `None` on the emulator.
    pub fn compute_capability(&self) -> Option<(u32, u32)> {
        match &self.inner.imp {
            DeviceImpl::Emu(_) => None,
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(c) => Some(c.compute_capability()),
        }
    }

    /// A GPU's streaming multiprocessors; on the emulator, its worker
    /// threads (what runs blocks concurrently there).
    pub fn multiprocessor_count(&self) -> u32 {
        match &self.inner.imp {
            DeviceImpl::Emu(e) => e.workers(),
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(c) => c.multiprocessor_count(),
        }
    }

    /// Whether freeing memory is stream-ordered on this device (the
    /// emulator, and GPUs with memory pools); otherwise a drop waits for the
    /// whole device, as `cudaFree` does.
    pub fn stream_ordered_memory(&self) -> bool {
        match &self.inner.imp {
            DeviceImpl::Emu(_) => true,
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(c) => c.pooled_memory(),
        }
    }

    /// The limits launches are checked against: sm_90's (the emulator's),
    /// with a GPU's own shared memory per block where it has less.
    pub fn limits(&self) -> DeviceLimits {
        match &self.inner.imp {
            DeviceImpl::Emu(_) => DeviceLimits::SM90,
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(c) => DeviceLimits {
                max_smem_per_block: DeviceLimits::SM90
                    .max_smem_per_block
                    .min(c.max_smem_per_block()),
                max_cluster_size: if c.compute_capability().0 >= 9 {
                    DeviceLimits::SM90.max_cluster_size
                } else {
                    1
                },
                ..DeviceLimits::SM90
            },
        }
    }

    /// A new stream on this device.
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(self)
    }

    /// Waits for all work on every stream of this device.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner.imp {
            DeviceImpl::Emu(e) => e.synchronize(),
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(c) => c.synchronize(),
        }
    }

    /// A zero-filled buffer of `len` elements.
    pub fn alloc_zeros<T: crate::core::Element>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        DeviceBuffer::zeros(self, len)
    }

    /// A buffer holding a copy of `data` (synchronous).
    pub fn upload<T: crate::core::Element>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        DeviceBuffer::from_host(self, data)
    }

    pub(crate) fn same(&self, other: &Device) -> bool {
        self.inner.id == other.inner.id
    }

    /// `Err(DeviceMismatch)` naming `op` and `arg` unless `other` is this
    /// very device (the same handle, not merely the same GPU).
    /// (This device is the stream's: the error says "than the stream".)
    pub fn check_same(&self, op: &'static str, arg: &'static str, other: &Device) -> Result<()> {
        self.check_same_as(op, arg, other, "the stream")
    }

    /// As [`check_same`](Self::check_same), naming what this device is
    /// (`than`, e.g. "the communicator" or "`ctx`") in the error.
    pub fn check_same_as(
        &self,
        op: &'static str,
        arg: &'static str,
        other: &Device,
        than: &'static str,
    ) -> Result<()> {
        if self.same(other) {
            Ok(())
        } else {
            Err(Error::DeviceMismatch { op, arg, than })
        }
    }
}
