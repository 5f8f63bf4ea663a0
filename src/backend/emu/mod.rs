//! The emulator backend: buffers are host memory, streams are worker threads
//! that run their queue in order, kernels run through `ftn_emu_launch`.

mod stream;
pub(crate) mod sys;

use std::alloc::Layout;
use std::ffi::CString;
use std::sync::{Arc, Mutex, Weak};

pub(crate) use stream::{EmuEvent, EmuStream, Task};

use crate::core::{Error, LaunchConfig, Result};
use crate::kernels::{Kernel, KernelParams};

/// Allocation alignment, as `cudaMalloc` gives.
const ALLOC_ALIGN: usize = 256;

pub(crate) struct EmuDevice {
    workers: u32,
    streams: Mutex<Vec<Weak<stream::StreamCore>>>,
    /// Frees memory once every stream has done the work enqueued before the
    /// drop (as the CUDA backend's release stream does); not registered, so
    /// device synchronisation never waits for it.
    release: EmuStream,
}

impl EmuDevice {
    /// Worker threads of [`EmuDevice::new`]: `FTN_EMU_THREADS` when set to
    /// a positive number, else every hardware thread.
    pub fn default_workers() -> u32 {
        Self::workers_from_env().unwrap_or_else(Self::hardware_threads)
    }

    /// `FTN_EMU_THREADS`, when set to a positive number.
    pub fn workers_from_env() -> Option<u32> {
        std::env::var("FTN_EMU_THREADS")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|&n| n > 0)
    }

    pub fn hardware_threads() -> u32 {
        std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
    }

    pub fn new() -> EmuDevice {
        Self::with_workers(Self::default_workers())
    }

    /// Launches spread over `workers` (>= 1) OS threads.
    pub fn with_workers(workers: u32) -> EmuDevice {
        EmuDevice {
            workers,
            streams: Mutex::new(Vec::new()),
            release: EmuStream::spawn(1),
        }
    }

    pub fn name(&self) -> String {
        let s = if self.workers == 1 { "" } else { "s" };
        format!("CPU emulator ({} worker thread{s})", self.workers)
    }

    pub fn workers(&self) -> u32 {
        self.workers
    }

    pub fn new_stream(&self) -> EmuStream {
        let s = EmuStream::spawn(self.workers);
        let mut list = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&s.core));
        s
    }

    fn live_streams(&self) -> Vec<Arc<stream::StreamCore>> {
        let list = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        list.iter().filter_map(Weak::upgrade).collect()
    }

    /// Waits for every stream; reports (and clears) the first kernel error.
    pub fn synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        for s in self.live_streams() {
            let r = s.synchronize();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Waits for every stream without consuming errors (host reads).
    pub fn wait_idle(&self) {
        for s in self.live_streams() {
            s.wait_idle();
        }
    }

    /// Frees `mem` once every stream has run what was enqueued before this
    /// call; the caller does not wait.
    pub fn release(&self, mem: EmuMemory) {
        let fences: Vec<_> = self
            .live_streams()
            .into_iter()
            .map(|s| {
                let target = s.fence();
                (s, target)
            })
            .collect();
        self.release.enqueue(Box::new(move || {
            for (s, target) in fences {
                s.wait_reached(target);
            }
            drop(mem);
            Ok(())
        }));
    }
}

/// Host memory standing in for device memory.
pub(crate) struct EmuMemory {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: a plain heap allocation; access is ordered by streams and events
// exactly as device memory is.
unsafe impl Send for EmuMemory {}
// SAFETY: as above; &EmuMemory only exposes the address.
unsafe impl Sync for EmuMemory {}

impl EmuMemory {
    pub fn zeroed(bytes: usize) -> Result<EmuMemory> {
        let layout =
            Layout::from_size_align(bytes.max(1), ALLOC_ALIGN).map_err(|_| Error::Backend {
                backend: "emu",
                message: format!("cannot allocate {bytes} bytes"),
            })?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::Backend {
                backend: "emu",
                message: format!("out of host memory allocating {bytes} bytes"),
            });
        }
        Ok(EmuMemory { ptr, layout })
    }

    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for EmuMemory {
    fn drop(&mut self) {
        // Poison first (0xFF bytes are NaN in every float dtype), so work
        // that was wrongly let run after the free reads NaN, not stale data.
        // SAFETY: we own all `layout.size()` bytes until the dealloc below.
        unsafe { std::ptr::write_bytes(self.ptr, 0xFF, self.layout.size()) };
        // SAFETY: allocated in `zeroed` with this layout; dropped only after
        // the streams' work that may use it (EmuDevice::release, free_on).
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// A value that may cross to a stream worker thread.
pub(crate) struct SendCell<T>(pub T);
// SAFETY: used only for kernel parameter structs and raw addresses whose
// targets are kept alive and ordered by the stream protocol.
unsafe impl<T> Send for SendCell<T> {}

/// Enqueues a kernel launch on `stream`.
pub(crate) fn launch<P: KernelParams>(
    stream: &EmuStream,
    kernel: &'static Kernel<P>,
    cfg: LaunchConfig,
    params: P,
) -> Result<()> {
    // SAFETY: returns sizeof(Params) from the C++ side; no arguments.
    let c_size = unsafe { (kernel.emu.params_size)() };
    if c_size != std::mem::size_of::<P>() {
        return Err(Error::InvalidLaunch {
            kernel: kernel.name.into(),
            message: format!(
                "parameter struct is {} bytes in Rust but {c_size} in C++ (stale bindings?)",
                std::mem::size_of::<P>()
            ),
        });
    }
    let workers = stream.workers();
    let params = SendCell(params);
    stream.enqueue(Box::new(move || {
        let params = params;
        let name = CString::new(kernel.name).unwrap_or_default();
        let desc = sys::LaunchDesc {
            kernel_name: name.as_ptr(),
            entry: Some(kernel.emu.run),
            params: &params.0 as *const P as *const core::ffi::c_void,
            grid: cfg.grid,
            block: cfg.block,
            dynamic_smem_bytes: cfg.dynamic_smem_bytes as usize,
            num_workers: workers,
            cluster_x: kernel.cluster,
        };
        let mut err = vec![0u8; 1024];
        // SAFETY: desc points at live locals; err is writable for its length;
        // the kernel's addresses are valid per the KernelParams contract.
        let rc = unsafe { sys::ftn_emu_launch(&desc, err.as_mut_ptr().cast(), err.len()) };
        if rc == 0 {
            Ok(())
        } else {
            let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
            Err(Error::KernelFailed {
                kernel: kernel.name.into(),
                message: String::from_utf8_lossy(&err[..end]).into_owned(),
            })
        }
    }));
    Ok(())
}
