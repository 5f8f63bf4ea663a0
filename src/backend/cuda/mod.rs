//! The CUDA backend (feature `cuda`): cudarc's driver API, loaded dynamically
//! so a binary built with `cuda` starts (and reports a clear error) where no
//! driver exists. The fatbins nvcc built for `cuda/*.cu` are embedded in the
//! crate; every module is loaded when the device is opened, and functions
//! are cached by name. Memory is stream-ordered ([`memory`]); host copies go
//! through pinned staging ([`staging`]).

pub(crate) mod cublaslt;
mod interop;
mod memory;
mod staging;

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};

use crate::core::launch::dynamic_smem_opt_in;
use crate::core::{Error, LaunchConfig, Result};
use crate::kernels::{Kernel, KernelParams};
pub(crate) use memory::CudaMemory;
use memory::MemoryManager;
use staging::Staging;

mod fatbins {
    include!(concat!(env!("OUT_DIR"), "/fatbins.rs"));
}

pub(crate) use fatbins::CUDA_ARCHS;

fn driver_err(what: &str, e: DriverError) -> Error {
    Error::Backend {
        backend: "cuda",
        message: format!("{what}: {e:?}"),
    }
}

struct LoadedModule(sys::CUmodule);
// SAFETY: a CUmodule handle may be used from any thread with its context bound.
unsafe impl Send for LoadedModule {}

#[derive(Clone, Copy)]
struct LoadedFunction {
    raw: sys::CUfunction,
    /// Dynamic shared memory opted into so far (0 at load).
    opted_in: u32,
    /// The kernel's static shared memory (`__shared__` arrays).
    static_smem: u32,
}
// SAFETY: CUfunction handles are thread-safe driver objects.
unsafe impl Send for LoadedFunction {}

pub(crate) struct CudaDevice {
    ctx: Arc<CudaContext>,
    name: String,
    /// Compute capability (major, minor), SM count and the shared memory a
    /// block may opt into, read once.
    capability: (u32, u32),
    sms: u32,
    max_smem_optin: u32,
    modules: Mutex<HashMap<&'static str, LoadedModule>>,
    functions: Mutex<HashMap<&'static str, LoadedFunction>>,
    mem: Arc<MemoryManager>,
    /// Private streams of `DeviceBuffer::from_host` and `to_host`.
    upload: CudaStreamHandle,
    readback: CudaStreamHandle,
}

impl CudaDevice {
    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))
    }

    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        // SAFETY: only tries to open the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::BackendUnavailable {
                backend: "cuda",
                reason: "the NVIDIA driver library (libcuda.so) was not found on this machine"
                    .into(),
            });
        }
        let count = CudaContext::device_count().map_err(|e| Error::BackendUnavailable {
            backend: "cuda",
            reason: format!("the CUDA driver could not be initialised: {e:?}"),
        })?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::BackendUnavailable {
                backend: "cuda",
                reason: format!("GPU {ordinal} requested, {count} present"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_err("creating a context", e))?;
        // Ordering is ours (streams + events), as in CUDA C.
        // SAFETY: we never use cudarc's CudaSlice, whose safety relies on it.
        unsafe { ctx.disable_event_tracking() };
        Self::on_context(ctx)
    }

    /// A device on an existing context (shared with its creator, e.g. a
    /// cudarc user; its event-tracking setting is left as it is).
    pub fn on_context(ctx: Arc<CudaContext>) -> Result<CudaDevice> {
        let ordinal = ctx.ordinal();
        let name = ctx
            .name()
            .unwrap_or_else(|_| format!("CUDA device {ordinal}"));
        let capability = ctx
            .compute_capability()
            .map(|(a, b)| (a.max(0) as u32, b.max(0) as u32))
            .map_err(|e| driver_err("reading the compute capability", e))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| driver_err("reading the SM count", e))?
            .max(1) as u32;
        let max_smem_optin = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| driver_err("reading the shared memory per block", e))?
            .max(0) as u32;
        let mem = Arc::new(MemoryManager::new(&ctx)?);
        let upload = CudaStreamHandle::new(&ctx, &mem)?;
        let readback = CudaStreamHandle::new(&ctx, &mem)?;
        let dev = CudaDevice {
            ctx,
            name,
            capability,
            sms,
            max_smem_optin,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            mem,
            upload,
            readback,
        };
        dev.load_every_kernel()?;
        Ok(dev)
    }

    /// Loads every embedded module and resolves every kernel now. Under the
    /// driver's lazy loading (the default since CUDA 12.2) the first launch
    /// of a kernel loads it, and that load can wait behind work already
    /// queued on a busy stream (seen on an H200: a launch behind a stream
    /// held by a host function blocked until the host function returned).
    fn load_every_kernel(&self) -> Result<()> {
        for k in crate::kernels::ALL_KERNELS {
            self.function_by_name(k.0, k.1, 0)?;
        }
        Ok(())
    }

    pub fn name(&self) -> String {
        self.name.clone()
    }

    pub fn compute_capability(&self) -> (u32, u32) {
        self.capability
    }

    pub fn multiprocessor_count(&self) -> u32 {
        self.sms
    }

    /// Most dynamic shared memory one block may opt into (227 KiB on
    /// sm_90, 163 KiB on sm_80).
    pub fn max_smem_per_block(&self) -> u32 {
        self.max_smem_optin
    }

    pub fn synchronize(&self) -> Result<()> {
        self.ctx
            .synchronize()
            .map_err(|e| driver_err("synchronize", e))
    }

    pub fn new_stream(&self) -> Result<CudaStreamHandle> {
        CudaStreamHandle::new(&self.ctx, &self.mem)
    }

    /// The context (shared).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Wraps a stream of this device's context made elsewhere (shared:
    /// destroyed when its last holder drops it). Another context's stream
    /// is a `DeviceMismatch` naming `stream`.
    pub fn wrap_stream(
        &self,
        op: &'static str,
        stream: Arc<CudaStream>,
    ) -> Result<CudaStreamHandle> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::DeviceMismatch {
                op,
                arg: "stream",
                than: "the device (a stream of another CUDA context)",
            });
        }
        self.mem.register(&stream);
        Ok(CudaStreamHandle {
            stream,
            mem: self.mem.clone(),
            staging: Mutex::new(None),
        })
    }

    pub fn new_event(&self) -> Result<CudaEventHandle> {
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        Ok(CudaEventHandle(
            self.ctx
                .new_event(Some(flags))
                .map_err(|e| driver_err("creating an event", e))?,
        ))
    }

    /// Whether memory comes from a stream-ordered pool (else `cuMemAlloc`).
    pub fn pooled_memory(&self) -> bool {
        self.mem.pooled()
    }

    /// Zeroed memory, usable by every stream when this returns.
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<CudaMemory> {
        self.mem.alloc(bytes, true)
    }

    /// New memory holding a copy of `src`, usable by every stream when this
    /// returns (no memset: it is about to be overwritten).
    pub fn upload(&self, src: &[u8]) -> Result<CudaMemory> {
        let mem = self.mem.alloc(src.len(), false)?;
        let copied = self
            .upload
            .copy_htod(mem.addr(), src)
            .and_then(|()| self.upload.synchronize());
        match copied {
            Ok(()) => Ok(mem),
            Err(e) => {
                self.mem.free(mem);
                Err(e)
            }
        }
    }

    /// Copies `dst.len()` bytes at `src` to the host after the work enqueued
    /// so far on every stream; waits for nothing else.
    pub fn download(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.readback.bind()?;
        self.mem.order_after_all(&self.readback.stream)?;
        self.readback.copy_dtoh(src, dst)
    }

    /// Frees after every stream's work enqueued so far; the host goes on.
    pub fn free(&self, mem: CudaMemory) {
        self.mem.free(mem)
    }

    /// Frees in `stream`'s order only.
    pub fn free_on(&self, mem: CudaMemory, stream: &CudaStreamHandle) {
        self.mem.free_on(mem, &stream.stream)
    }

    fn function<P>(&self, kernel: &'static Kernel<P>, smem: u32) -> Result<LoadedFunction> {
        self.function_by_name(kernel.name, kernel.module, smem)
    }

    fn function_by_name(
        &self,
        name: &'static str,
        module: &'static str,
        smem: u32,
    ) -> Result<LoadedFunction> {
        let mut fns = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        let f = match fns.get(name) {
            Some(f) => *f,
            None => {
                let module = self.module(module)?;
                let cname = CString::new(name).unwrap_or_default();
                // SAFETY: module is a loaded module of this context.
                let raw = unsafe { result::module::get_function(module, cname) }
                    .map_err(|e| driver_err(&format!("finding kernel {name}"), e))?;
                // SAFETY: raw is a valid function of this context.
                let attr = |a| unsafe { result::function::get_function_attribute(raw, a) };
                let static_smem =
                    attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
                        .map_err(|e| driver_err(&format!("reading {name}'s shared memory"), e))?
                        .max(0) as u32;
                let f = LoadedFunction {
                    raw,
                    opted_in: 0,
                    static_smem,
                };
                fns.insert(name, f);
                f
            }
        };
        // Already opted into at least this much: nothing to check or set.
        if smem <= f.opted_in {
            return Ok(f);
        }
        // Static and dynamic shared memory count together against the
        // 48 KiB a block gets without opting in.
        match dynamic_smem_opt_in(name, f.static_smem, smem, self.max_smem_optin)? {
            Some(bytes) if bytes > f.opted_in => {
                // SAFETY: raw is a valid function of this context.
                unsafe {
                    result::function::set_function_attribute(
                        f.raw,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    )
                }
                .map_err(|e| {
                    driver_err(&format!("opting {name} into {bytes} B of shared memory"), e)
                })?;
                let updated = LoadedFunction {
                    opted_in: bytes,
                    ..f
                };
                fns.insert(name, updated);
                Ok(updated)
            }
            _ => Ok(f),
        }
    }

    fn module(&self, name: &'static str) -> Result<sys::CUmodule> {
        let mut mods = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = mods.get(name) {
            return Ok(m.0);
        }
        let image = fatbins::FATBINS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| *b)
            .ok_or_else(|| Error::Backend {
                backend: "cuda",
                message: format!("no fatbin named {name} is embedded"),
            })?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))?;
        // cuModuleLoadData wants an aligned image; copy into u64 storage.
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..image.len()].copy_from_slice(image);
        // SAFETY: a complete fatbin image produced by nvcc for this crate.
        let m = unsafe { result::module::load_data(aligned.as_ptr().cast()) }.map_err(|e| {
            driver_err(
                &format!(
                    "loading module {name} (built for {}; the driver may be older than the PTX)",
                    fatbins::CUDA_ARCHS
                ),
                e,
            )
        })?;
        mods.insert(name, LoadedModule(m));
        Ok(m)
    }

    pub fn launch<P: KernelParams>(
        &self,
        stream: &CudaStreamHandle,
        kernel: &'static Kernel<P>,
        cfg: LaunchConfig,
        params: P,
    ) -> Result<()> {
        let f = self.function(kernel, cfg.dynamic_smem_bytes)?;
        let mut params = params;
        let mut args = [&mut params as *mut P as *mut core::ffi::c_void];
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))?;
        // SAFETY: one argument, the by-value parameter struct the kernel takes;
        // the typed op validated every address and size in it.
        unsafe {
            result::launch_kernel(
                f.raw,
                (cfg.grid[0], cfg.grid[1], cfg.grid[2]),
                (cfg.block[0], cfg.block[1], cfg.block[2]),
                cfg.dynamic_smem_bytes,
                stream.stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(|e| Error::InvalidLaunch {
            kernel: kernel.name.into(),
            message: format!("{e:?}"),
        })
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Streams no longer wait for their work when dropped: finish it all
        // before the modules it runs go away.
        self.ctx.record_err(self.ctx.bind_to_thread());
        self.ctx.record_err(self.ctx.synchronize());
        let mods = self.modules.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, m) in mods.drain() {
            self.ctx.record_err(self.ctx.bind_to_thread());
            // SAFETY: loaded by this device; no launches can follow.
            self.ctx.record_err(unsafe { result::module::unload(m.0) });
        }
    }
}

pub(crate) struct CudaStreamHandle {
    stream: Arc<CudaStream>,
    mem: Arc<MemoryManager>,
    /// Pinned slots for host copies, made on the first one.
    staging: Mutex<Option<Staging>>,
}

impl Drop for CudaStreamHandle {
    fn drop(&mut self) {
        // Buffers this stream used may be dropped later: their frees must
        // still wait for its pending work.
        self.mem.absorb(&self.stream);
    }
}

impl CudaStreamHandle {
    fn new(ctx: &Arc<CudaContext>, mem: &Arc<MemoryManager>) -> Result<CudaStreamHandle> {
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_err("creating a stream", e))?;
        mem.register(&stream);
        Ok(CudaStreamHandle {
            stream,
            mem: mem.clone(),
            staging: Mutex::new(None),
        })
    }

    pub fn raw(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// The cudarc stream (shared).
    pub fn cudarc(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub(crate) fn bind(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))
    }

    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_err("stream synchronize", e))
    }

    pub fn record(&self, ev: &CudaEventHandle) -> Result<()> {
        ev.0.record(&self.stream)
            .map_err(|e| driver_err("event record", e))
    }

    pub fn wait(&self, ev: &CudaEventHandle) -> Result<()> {
        self.stream
            .wait(&ev.0)
            .map_err(|e| driver_err("stream wait event", e))
    }

    /// Runs `f` with this stream's staging, sized for an `n`-byte copy.
    fn with_staging<R>(&self, n: usize, f: impl FnOnce(&mut Staging) -> Result<R>) -> Result<R> {
        let mut slot = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_none_or(|s| s.too_small_for(n)) {
            *slot = None;
            *slot = Some(Staging::new(self.stream.context(), n)?);
        }
        match slot.as_mut() {
            Some(s) => f(s),
            None => unreachable!("staging was just created"),
        }
    }

    /// Enqueues the copy; `src` is staged (reusable) when this returns.
    pub fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.bind()?;
        self.with_staging(src.len(), |s| s.htod(&self.stream, dst, src))
    }

    /// Copies after this stream's earlier work; returns with `dst` filled.
    pub fn copy_dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        self.with_staging(dst.len(), |s| s.dtoh(&self.stream, src, dst))
    }

    pub fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: both ranges are live allocations of >= bytes (checked).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver_err("copy device to device", e))
    }

    pub fn memset(&self, dst: u64, byte: u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: dst is a live allocation of `bytes` bytes.
        unsafe { result::memset_d8_async(dst, byte, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver_err("memset", e))
    }
}

type HostFn = Box<dyn FnOnce() + Send>;

unsafe extern "C" fn run_host_fn(user: *mut core::ffi::c_void) {
    // SAFETY: `user` is the Box<HostFn> leaked by launch_host_fn, run once.
    let f = unsafe { Box::from_raw(user as *mut HostFn) };
    // Drops inside `f` (CUDA calls are illegal here) defer their frees.
    memory::as_host_fn(f);
}

impl CudaStreamHandle {
    pub fn launch_host_fn(&self, f: HostFn) -> Result<()> {
        self.bind()?;
        let user = Box::into_raw(Box::new(f)) as *mut core::ffi::c_void;
        // SAFETY: the driver calls run_host_fn exactly once with `user`.
        let r = unsafe { sys::cuLaunchHostFunc(self.stream.cu_stream(), Some(run_host_fn), user) }
            .result();
        if let Err(e) = r {
            // SAFETY: not enqueued, so still ours to free.
            drop(unsafe { Box::from_raw(user as *mut HostFn) });
            return Err(driver_err("cuLaunchHostFunc", e));
        }
        Ok(())
    }
}

pub(crate) struct CudaEventHandle(CudaEvent);

impl CudaEventHandle {
    pub fn synchronize(&self) -> Result<()> {
        self.0
            .synchronize()
            .map_err(|e| driver_err("event synchronize", e))
    }

    pub fn is_complete(&self) -> Result<bool> {
        self.0
            .try_is_complete()
            .map_err(|e| driver_err("event query", e))
    }

    pub fn elapsed_ms(&self, later: &CudaEventHandle) -> Result<f32> {
        self.0
            .elapsed_ms(&later.0)
            .map_err(|e| driver_err("event elapsed time", e))
    }
}
