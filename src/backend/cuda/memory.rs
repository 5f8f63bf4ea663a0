//! Stream-ordered device memory for the CUDA backend.
//!
//! Allocations come from a memory pool of ferrotron's own (`cuMemPoolCreate`,
//! release threshold "keep everything", no internal cross-stream
//! dependencies), so allocating and freeing never synchronise the device:
//! * an allocation without a stream (`DeviceBuffer::zeros`, uploads) is made
//!   and filled on a private allocation stream, which the host waits for:
//!   only that stream, never the others;
//! * `DeviceBuffer::free_on(stream)` frees on that stream (`cuMemFreeAsync`):
//!   the caller promises no other stream still uses the memory;
//! * a plain drop frees on a private release stream made to wait (events)
//!   for everything enqueued so far on every live stream of the device; the
//!   host does not wait at all;
//! * a drop inside a host function (where CUDA calls are illegal) is
//!   deferred to the next allocation or free made by an ordinary thread.
//!
//! On an H200, while another stream is blocked inside a host function,
//! `alloc_zeros` and device-to-host copies still wait for it, although the
//! same driver operations issued alone do not (an open bug; what is known:
//! docs/perf.md, "Third GPU run"; `tests/memory_ordering.rs` fails there).
//!
//! Devices without memory-pool support (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_
//! SUPPORTED` = 0) fall back to `cuMemAlloc`/`cuMemFree` after a context
//! synchronisation, as `cudaFree` does.

use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};

use super::driver_err;
use crate::core::Result;

thread_local! {
    /// True while this thread runs a host function enqueued on a stream.
    static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` marked as a host function (CUDA calls are illegal inside).
pub(super) fn as_host_fn(f: impl FnOnce()) {
    IN_HOST_FN.with(|c| c.set(true));
    f();
    IN_HOST_FN.with(|c| c.set(false));
}

fn in_host_fn() -> bool {
    IN_HOST_FN.with(Cell::get)
}

/// One allocation of device memory (freed by [`MemoryManager`]).
pub(crate) struct CudaMemory {
    ptr: sys::CUdeviceptr,
}

impl CudaMemory {
    pub fn addr(&self) -> u64 {
        self.ptr
    }
}

struct Pool(sys::CUmemoryPool);
// SAFETY: a memory-pool handle is a thread-safe driver object.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

/// What orders a free after every stream's work.
struct ReleaseState {
    stream: Arc<CudaStream>,
    fence: CudaEvent,
    live: Vec<Weak<CudaStream>>,
}

pub(crate) struct MemoryManager {
    ctx: Arc<CudaContext>,
    pool: Option<Pool>,
    alloc_stream: Arc<CudaStream>,
    release: Mutex<ReleaseState>,
    deferred: Mutex<Vec<sys::CUdeviceptr>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl MemoryManager {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<MemoryManager> {
        let supported = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
            .unwrap_or(0)
            != 0;
        let pool = if supported && std::env::var_os("FTN_CUDA_NO_POOL").is_none() {
            Some(Self::create_pool(ctx)?)
        } else {
            None
        };
        let fence = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver_err("creating the release fence", e))?;
        let new_stream = |what: &str| {
            ctx.new_stream()
                .map_err(|e| driver_err(&format!("creating the {what} stream"), e))
        };
        Ok(MemoryManager {
            ctx: ctx.clone(),
            pool,
            alloc_stream: new_stream("allocation")?,
            release: Mutex::new(ReleaseState {
                stream: new_stream("release")?,
                fence,
                live: Vec::new(),
            }),
            deferred: Mutex::new(Vec::new()),
        })
    }

    fn create_pool(ctx: &Arc<CudaContext>) -> Result<Pool> {
        ctx.bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))?;
        // SAFETY: a zeroed props struct is valid ("no handle types", no
        // reserved bits); we set the allocation type and the device.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ctx.ordinal() as i32;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: props is fully initialised; pool receives the handle.
        unsafe { sys::cuMemPoolCreate(&mut pool, &props) }
            .result()
            .map_err(|e| driver_err("cuMemPoolCreate", e))?;
        // Keep freed memory cached in the pool (no trimming at every
        // synchronisation), and never let an allocation silently wait for
        // another stream's pending free: that would couple the allocation
        // stream to streams the host may be blocking on.
        let mut keep: u64 = u64::MAX;
        let mut off: i32 = 0;
        // SAFETY: attribute values of the documented types (u64, int).
        let set = unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
            .result()
            .and_then(|()| {
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                    (&mut off as *mut i32).cast(),
                )
                .result()
            })
        };
        if let Err(e) = set {
            // SAFETY: created above, no allocations yet.
            let _ = unsafe { sys::cuMemPoolDestroy(pool) };
            return Err(driver_err("configuring the memory pool", e));
        }
        Ok(Pool(pool))
    }

    /// Whether allocation is stream-ordered (a memory pool) on this device.
    pub fn pooled(&self) -> bool {
        self.pool.is_some()
    }

    /// Registers a stream whose work a plain drop must wait for.
    pub fn register(&self, stream: &Arc<CudaStream>) {
        let mut st = lock(&self.release);
        st.live.retain(|w| w.strong_count() > 0);
        st.live.push(Arc::downgrade(stream));
    }

    /// Makes `stream` wait for everything enqueued so far on every other
    /// live stream. The host does not wait.
    pub fn order_after_all(&self, stream: &CudaStream) -> Result<()> {
        let st = lock(&self.release);
        let others = st
            .live
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| s.cu_stream() != stream.cu_stream());
        for s in others {
            st.fence
                .record(&s)
                .and_then(|()| stream.wait(&st.fence))
                .map_err(|e| driver_err("ordering after every stream", e))?;
        }
        Ok(())
    }

    /// A stream is going away: later frees must still wait for its work.
    pub fn absorb(&self, stream: &CudaStream) {
        if in_host_fn() {
            return;
        }
        let st = lock(&self.release);
        let r = st
            .fence
            .record(stream)
            .and_then(|()| st.stream.wait(&st.fence));
        self.ctx.record_err(r);
    }

    /// `bytes` (at least one) of device memory, ready for use by any stream
    /// when this returns; zero-filled if `zero`.
    pub fn alloc(&self, bytes: usize, zero: bool) -> Result<CudaMemory> {
        self.flush_deferred();
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))?;
        let bytes = bytes.max(1);
        let Some(pool) = &self.pool else {
            return self.alloc_sync(bytes, zero);
        };
        let s = self.alloc_stream.cu_stream();
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: allocation from our pool on our allocation stream; the
        // memset covers exactly the allocation; the stream is synchronised
        // before the pointer leaves, so every stream may use it.
        unsafe {
            sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, pool.0, s)
                .result()
                .map_err(|e| driver_err(&format!("allocating {bytes} bytes"), e))?;
            let filled = if zero {
                sys::cuMemsetD8Async(ptr, 0, bytes, s).result()
            } else {
                Ok(())
            };
            if let Err(e) = filled.and_then(|()| sys::cuStreamSynchronize(s).result()) {
                let _ = result::free_async(ptr, s);
                return Err(driver_err("zeroing a new allocation", e));
            }
        }
        Ok(CudaMemory { ptr })
    }

    fn alloc_sync(&self, bytes: usize, zero: bool) -> Result<CudaMemory> {
        // cuMemsetD8 runs on the legacy NULL stream, which every stream of
        // ours (non-blocking) ignores: without the wait below, the memset
        // could land after an upload or a kernel queued on another stream and
        // zero its result (seen on an H200: GEMM outputs all zero under load).
        // SAFETY: plain allocation; a memset of exactly that range and a
        // wait for the NULL stream before anyone can use it.
        unsafe {
            let p = result::malloc_sync(bytes)
                .map_err(|e| driver_err(&format!("allocating {bytes} bytes"), e))?;
            if zero {
                let zeroed = sys::cuMemsetD8_v2(p, 0, bytes)
                    .result()
                    .and_then(|()| sys::cuStreamSynchronize(std::ptr::null_mut()).result());
                if let Err(e) = zeroed {
                    let _ = result::free_sync(p);
                    return Err(driver_err("zeroing a new allocation", e));
                }
            }
            Ok(CudaMemory { ptr: p })
        }
    }

    /// Frees once everything enqueued so far on every stream is done; the
    /// host does not wait. Errors are recorded in the context.
    pub fn free(&self, mem: CudaMemory) {
        if in_host_fn() {
            lock(&self.deferred).push(mem.ptr);
            return;
        }
        self.flush_deferred();
        self.free_after_all(mem.ptr);
    }

    /// Frees in `stream`'s order: the caller promises no other stream
    /// still uses the memory.
    pub fn free_on(&self, mem: CudaMemory, stream: &CudaStream) {
        if in_host_fn() {
            lock(&self.deferred).push(mem.ptr);
            return;
        }
        if self.pool.is_none() {
            return self.free_after_all(mem.ptr);
        }
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: pool memory; stream order makes earlier work finish first.
        self.ctx
            .record_err(unsafe { result::free_async(mem.ptr, stream.cu_stream()) });
    }

    fn flush_deferred(&self) {
        let pending = std::mem::take(&mut *lock(&self.deferred));
        for p in pending {
            self.free_after_all(p);
        }
    }

    fn free_after_all(&self, ptr: sys::CUdeviceptr) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        if self.pool.is_none() {
            self.ctx.record_err(self.ctx.synchronize());
            // SAFETY: from cuMemAlloc; the context is idle.
            self.ctx.record_err(unsafe { result::free_sync(ptr) });
            return;
        }
        let release = lock(&self.release).stream.clone();
        if self.order_after_all(&release).is_err() {
            // Ordering failed (a broken context): wait for everything instead.
            self.ctx.record_err(self.ctx.synchronize());
        }
        // SAFETY: pool memory; the release stream waits for every stream's
        // work enqueued before this drop.
        self.ctx
            .record_err(unsafe { result::free_async(ptr, release.cu_stream()) });
    }

    /// Waits for pending frees (device teardown).
    pub fn drain(&self) {
        self.flush_deferred();
        let release = lock(&self.release).stream.clone();
        self.ctx.record_err(release.synchronize());
    }
}

impl Drop for MemoryManager {
    fn drop(&mut self) {
        self.drain();
        if let Some(pool) = self.pool.take() {
            // SAFETY: every allocation was freed (buffers hold the device);
            // the driver releases the pool once pending frees complete.
            self.ctx
                .record_err(unsafe { sys::cuMemPoolDestroy(pool.0) }.result());
        }
    }
}
