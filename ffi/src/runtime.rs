//! The runtime: contexts (devices), streams, events and raw memory.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex};

use ferrotron::ops::multi_tensor::MultiTensor;
use ferrotron::{BackendKind, Device, DeviceBuffer, Event, Stream};

use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::enums::{c_enum, parse_enum};
use crate::abi::handles::{check_out, get, handle, take, write_out, Child, ChildKind, Children};
use crate::abi::views::view;

/// Which backend a context runs on.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnBackend_t {
    /// The CUDA-on-CPU emulator: "device" memory is host memory.
    ftnBackendEmu = 0,
    /// An NVIDIA GPU (library built with feature `cuda`).
    ftnBackendCuda = 1,
    /// The GPU when one can be used, else the emulator.
    ftnBackendAuto = 2,
}
c_enum!(ftnBackend_t: ftnBackendEmu, ftnBackendCuda, ftnBackendAuto);

handle!(ftnContext, ftnContext_t, 0x4654_4e43_5458_0001, "ftnContext_t", {
    dev: Device,
    allocs: Allocs,
    children: Arc<Children>,
    // The GPU ordinal of a CUDA context (0 on the emulator): DLPack
    // tensors are checked against it.
    ordinal: usize,
});
handle!(ftnStream, ftnStream_t, 0x4654_4e53_544d_0002, "ftnStream_t", {
    stream: Stream,
    mt: Mutex<MultiTensor>,
    allocs: Option<Allocs>,
    _child: Child,
});

/// A context's `ftn_malloc` allocations by base address (shared with its
/// streams, which check copy lengths against them).
pub(crate) type Allocs = Arc<Mutex<BTreeMap<u64, DeviceBuffer<u8>>>>;

/// Checks that `bytes` bytes at `ptr` stay inside the `ftn_malloc`
/// allocation `ptr` points into, if it points into one (other memory,
/// e.g. the caller's own, cannot be checked).
fn check_extent(
    op: &'static str,
    arg: &'static str,
    s: &ftnStream,
    ptr: *const c_void,
    bytes: usize,
) -> ferrotron::Result<()> {
    let Some(allocs) = &s.allocs else {
        return Ok(());
    };
    let a = ptr as u64;
    let table = allocs.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((&base, buf)) = table.range(..=a).next_back() {
        let end = base + buf.len() as u64;
        if a < end && (bytes as u64) > end - a {
            return Err(invalid(
                op,
                arg,
                format!(
                    "at most {} bytes (the rest of its ftn_malloc allocation of {} bytes)",
                    end - a,
                    buf.len()
                ),
                format!("{bytes} bytes"),
            ));
        }
    }
    Ok(())
}
handle!(ftnEvent, ftnEvent_t, 0x4654_4e45_5654_0003, "ftnEvent_t", {
    event: Event,
    _child: Child,
});

/// Creates a context on `backend` (`ftnBackend_t`); `device` is the GPU
/// ordinal for `ftnBackendCuda` / `ftnBackendAuto` (ignored by the
/// emulator). With `ftnBackendAuto` the emulator is used when no GPU can
/// be; query which with `ftn_context_get_backend`.
///
/// Bad input (at the call, `*ctx` untouched): `ctx` NULL or not aligned for
/// a pointer, a `backend` value outside `ftnBackend_t`, or a negative
/// `device` (checked on every backend): ftnInvalidArgument;
/// `ftnBackendCuda` with no usable GPU (no driver, bad ordinal, built
/// without CUDA): ftnBackendUnavailable. `ftnBackendAuto` never fails for
/// want of a GPU.
#[no_mangle]
pub unsafe extern "C" fn ftn_context_create(
    backend: c_int,
    device: c_int,
    ctx: *mut ftnContext_t,
) -> ftnResult_t {
    export!(|op| {
        check_out(op, "ctx", ctx)?;
        let kind = parse_enum(op, "backend", backend)?;
        // Checked on every backend (the emulator ignores the ordinal, but a
        // negative one is bad input wherever it is passed).
        let ordinal = usize::try_from(device)
            .map_err(|_| invalid(op, "device", "a GPU ordinal >= 0", device))?;
        let dev = match kind {
            ftnBackend_t::ftnBackendEmu => Device::emu(),
            ftnBackend_t::ftnBackendCuda => Device::cuda(ordinal)?,
            ftnBackend_t::ftnBackendAuto => Device::cuda(ordinal).unwrap_or_else(|_| Device::emu()),
        };
        let h = ftnContext::into_raw(dev, Arc::default(), Arc::default(), ordinal);
        // SAFETY: checked non-NULL above; valid by the contract.
        unsafe { ctx.write(h) };
        Ok(())
    })
}

/// Creates an emulator context whose launches spread their blocks over
/// `workers` OS threads (1 to 1024), whatever `FTN_EMU_THREADS` says: for
/// programs that drive several emulator contexts at once (in-process ranks,
/// `ftn_comm_init_all`), where the contexts already share the cores and
/// each worker beyond the first is an OS thread started per launch.
/// `ftn_emu_workers_per_rank` gives the count for a number of such
/// contexts. `ftn_context_create(ftnBackendEmu, ...)` uses
/// `FTN_EMU_THREADS`, or every hardware thread.
///
/// Bad input (at the call, `*ctx` untouched): `ctx` NULL or not aligned for
/// a pointer, `workers` outside 1..=1024: ftnInvalidArgument.
#[no_mangle]
pub unsafe extern "C" fn ftn_context_create_emu(
    workers: c_int,
    ctx: *mut ftnContext_t,
) -> ftnResult_t {
    export!(|op| {
        check_out(op, "ctx", ctx)?;
        // A negative count is out of range like 0; the range check is
        // `emu_with_workers`', its error relabelled with this function's name
        // and the int as given.
        let dev = Device::emu_with_workers(usize::try_from(workers).unwrap_or(0))
            .map_err(|e| e.as_seen_by(op, workers))?;
        let h = ftnContext::into_raw(dev, Arc::default(), Arc::default(), 0);
        // SAFETY: checked non-NULL above; valid by the contract.
        unsafe { ctx.write(h) };
        Ok(())
    })
}

/// Writes to `*workers` the emulator workers for each of `ranks` emulator
/// contexts driven at once in one process: `FTN_EMU_THREADS` when set,
/// else the hardware threads divided among the ranks (at least 1), at most
/// 1024. Pass it to `ftn_context_create_emu`.
///
/// Bad input (ftnInvalidArgument, nothing written): `ranks` < 1; `workers`
/// NULL or not aligned for an `int`.
#[no_mangle]
pub unsafe extern "C" fn ftn_emu_workers_per_rank(
    ranks: c_int,
    workers: *mut c_int,
) -> ftnResult_t {
    export!(|op| {
        let r = usize::try_from(ranks)
            .ok()
            .filter(|&r| r >= 1)
            .ok_or_else(|| invalid(op, "ranks", "at least 1 rank", ranks))?;
        // At most MAX_EMU_WORKERS (1024): fits an int.
        let n = Device::emu_workers_per_rank(r) as c_int;
        // SAFETY: out-pointer contract.
        unsafe { write_out(op, "workers", workers, n) }
    })
}

/// Destroys a context: waits for its work, frees the memory it allocated
/// with `ftn_malloc` (pointers into it must not be used afterwards).
///
/// Bad input: NULL, a stale (already destroyed) handle or a handle of
/// another kind is `ftnInvalidArgument`. A context that still has live
/// children (streams, events, device grad scalers, communicators created
/// on it, including `ftn_comm_get_stream` handles and split
/// communicators, Adam optimizers, DDPs and distributed optimizers) is
/// not destroyed: `ftnInvalidArgument` listing their counts; destroy them
/// first, then the context. Layers and blocks keep their own memory and
/// need no context. A pending failure of the context's work
/// (ftnKernelFailed, ftnBackendError) is returned, and the context is
/// destroyed either way.
#[no_mangle]
pub unsafe extern "C" fn ftn_context_destroy(ctx: ftnContext_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let live = unsafe { get(op, "ctx", ctx)? }.children.describe();
        if let Some(live) = live {
            return Err(invalid(
                op,
                "ctx",
                "a context without live children (destroy its streams, events, grad scalers, Adam optimizers, distributed optimizers, DDPs and communicators first)",
                format!("a context with {live} still live"),
            ));
        }
        // SAFETY: handle contract.
        let c = unsafe { take(op, "ctx", ctx)? };
        let r = c.dev.synchronize();
        drop(c);
        r
    })
}

/// The backend a context runs on (`ftnBackendEmu` or `ftnBackendCuda`).
///
/// Bad input (ftnInvalidArgument, nothing written): `ctx` NULL, stale or of
/// another kind; `backend` NULL or not aligned for an `int`.
#[no_mangle]
pub unsafe extern "C" fn ftn_context_get_backend(
    ctx: ftnContext_t,
    backend: *mut c_int,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        let b = match c.dev.kind() {
            BackendKind::Emu => ftnBackend_t::ftnBackendEmu,
            BackendKind::Cuda => ftnBackend_t::ftnBackendCuda,
        };
        // SAFETY: out-pointer contract.
        unsafe { write_out(op, "backend", backend, b as c_int) }
    })
}

/// Writes the device's name, NUL-terminated and truncated to `len` bytes.
///
/// Bad input (ftnInvalidArgument, nothing written): `ctx` NULL, stale or of
/// another kind; `name` NULL; `len` 0 (no room for the NUL). A `len`
/// shorter than the name truncates it (not an error); `name` is trusted for
/// `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ftn_context_get_name(
    ctx: ftnContext_t,
    name: *mut c_char,
    len: usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        check_out(op, "name", name)?;
        if len == 0 {
            return Err(invalid(op, "len", "at least 1 (room for the NUL)", 0));
        }
        let s = c.dev.name();
        let n = s.len().min(len - 1);
        // SAFETY: `name` is valid for `len` bytes by the contract; n < len.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), name as *mut u8, n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

/// Waits for all work on every stream of the context; reports the first
/// failure (errors of enqueued work come here or at a stream's
/// synchronize).
///
/// Bad input: `ctx` NULL, stale or of another kind: ftnInvalidArgument.
/// Failures of work enqueued earlier on the context's streams are returned
/// here: ftnKernelFailed (a kernel assert or emulator-detected misuse),
/// ftnBackendError (a driver fault, a collective whose peers timed out or
/// are gone).
#[no_mangle]
pub unsafe extern "C" fn ftn_context_synchronize(ctx: ftnContext_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        unsafe { get(op, "ctx", ctx)? }.dev.synchronize()
    })
}

/// Allocates `bytes` zeroed bytes of device memory (host memory on the
/// emulator), 256-byte aligned. `*ptr` is NULL when `bytes` is 0.
///
/// Bad input (at the call, `*ptr` untouched): `ctx` NULL, stale or of
/// another kind, or `ptr` NULL or not aligned for a pointer:
/// ftnInvalidArgument. `bytes` 0 succeeds and writes NULL. Memory that
/// cannot be had (any size, e.g. 2^62): ftnBackendError (never an abort).
#[no_mangle]
pub unsafe extern "C" fn ftn_malloc(
    ctx: ftnContext_t,
    ptr: *mut *mut c_void,
    bytes: usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        check_out(op, "ptr", ptr)?;
        if bytes == 0 {
            // SAFETY: checked non-NULL.
            unsafe { ptr.write(std::ptr::null_mut()) };
            return Ok(());
        }
        let buf = c.dev.alloc_zeros::<u8>(bytes)?;
        let addr = buf.addr();
        c.allocs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, buf);
        // SAFETY: checked non-NULL.
        unsafe { ptr.write(addr as *mut c_void) };
        Ok(())
    })
}

/// Takes the allocation at `ptr` out of the context's table.
fn take_alloc(
    op: &'static str,
    c: &ftnContext,
    ptr: *mut c_void,
) -> ferrotron::Result<DeviceBuffer<u8>> {
    c.allocs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(ptr as u64))
        .ok_or_else(|| {
            invalid(
                op,
                "ptr",
                "a pointer returned by ftn_malloc on this context",
                format!("{ptr:p}"),
            )
        })
}

/// Frees memory from `ftn_malloc` on the same context. Stream-ordered: the
/// memory is released once every stream of the context has done the work
/// enqueued before this call; the caller does not wait.
///
/// Bad input: `ctx` NULL, stale or of another kind: ftnInvalidArgument.
/// `ptr` NULL is a no-op. A `ptr` that is not a live `ftn_malloc`
/// allocation of this context (freed already, an interior pointer, another
/// context's or foreign memory): ftnInvalidArgument, nothing freed.
#[no_mangle]
pub unsafe extern "C" fn ftn_free(ctx: ftnContext_t, ptr: *mut c_void) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        if ptr.is_null() {
            return Ok(());
        }
        drop(take_alloc(op, c, ptr)?);
        Ok(())
    })
}

/// Frees memory from `ftn_malloc` in `stream`'s order only (like
/// `cudaFreeAsync`): after the work enqueued on `stream` so far, without
/// waiting for other streams. The caller promises that no other stream's
/// pending work uses the memory.
///
/// Bad input (at the call, nothing freed): `ctx` or `stream` NULL, stale or
/// of another kind: ftnInvalidArgument (checked even when `ptr` is NULL);
/// `ptr` NULL is then a no-op; `stream` of another context:
/// ftnDeviceMismatch; a `ptr` that is not a live `ftn_malloc` allocation of
/// `ctx`: ftnInvalidArgument.
#[no_mangle]
pub unsafe extern "C" fn ftn_free_async(
    ctx: ftnContext_t,
    ptr: *mut c_void,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contracts.
        let (c, s) = unsafe { (get(op, "ctx", ctx)?, get(op, "stream", stream)?) };
        if ptr.is_null() {
            return Ok(());
        }
        c.dev
            .check_same_as(op, "stream", s.stream.device(), "`ctx`")?;
        take_alloc(op, c, ptr)?.free_on(&s.stream)
    })
}

/// Creates a stream (an in-order queue of work) on a context; it counts as
/// a child of the context until destroyed.
///
/// Bad input (at the call, `*stream` untouched): `ctx` NULL, stale or of
/// another kind, or `stream` NULL or not aligned for a pointer:
/// ftnInvalidArgument; a backend stream that cannot be created (CUDA):
/// ftnBackendError.
#[no_mangle]
pub unsafe extern "C" fn ftn_stream_create(
    ctx: ftnContext_t,
    stream: *mut ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        check_out(op, "stream", stream)?;
        let s = c.dev.new_stream()?;
        let child = Child::new(&c.children, ChildKind::Stream);
        // SAFETY: checked non-NULL.
        unsafe {
            stream.write(ftnStream::into_raw(
                s,
                Mutex::new(MultiTensor::new()),
                Some(c.allocs.clone()),
                child,
            ))
        };
        Ok(())
    })
}

/// Waits for the stream's work, then destroys it.
///
/// Bad input: NULL, a stale handle (destroyed before) or another kind:
/// ftnInvalidArgument, nothing destroyed. The stream's pending failure, if
/// any (ftnKernelFailed, ftnBackendError), is returned, and the stream is
/// destroyed either way.
#[no_mangle]
pub unsafe extern "C" fn ftn_stream_destroy(stream: ftnStream_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let s = unsafe { take(op, "stream", stream)? };
        let r = s.stream.synchronize();
        drop(s);
        r
    })
}

/// Blocks until all work enqueued on the stream has finished; reports the
/// first failure since the last synchronize.
///
/// Bad input: `stream` NULL, stale or of another kind: ftnInvalidArgument.
/// This is where failures of work enqueued earlier come: ftnKernelFailed (a
/// kernel assert or emulator-detected misuse), ftnBackendError (a driver
/// fault; a collective or transfer whose peers timed out or are gone).
#[no_mangle]
pub unsafe extern "C" fn ftn_stream_synchronize(stream: ftnStream_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        unsafe { get(op, "stream", stream)? }.stream.synchronize()
    })
}

/// Makes later work on `stream` wait for the event's latest record (an
/// event never recorded: no wait).
///
/// Bad input (at the call, nothing enqueued): `stream` or `event` NULL,
/// stale or of another kind: ftnInvalidArgument; an event of another
/// context: ftnDeviceMismatch.
#[no_mangle]
pub unsafe extern "C" fn ftn_stream_wait_event(
    stream: ftnStream_t,
    event: ftnEvent_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contracts.
        let (s, e) = unsafe { (get(op, "stream", stream)?, get(op, "event", event)?) };
        s.stream.wait_event(&e.event)
    })
}

/// Creates an event on a context (not yet recorded: waiting on it returns
/// at once); it counts as a child of the context until destroyed.
///
/// Bad input (at the call, `*event` untouched): `ctx` NULL, stale or of
/// another kind, or `event` NULL or not aligned for a pointer:
/// ftnInvalidArgument; a CUDA event that cannot be created:
/// ftnBackendError.
#[no_mangle]
pub unsafe extern "C" fn ftn_event_create(
    ctx: ftnContext_t,
    event: *mut ftnEvent_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let c = unsafe { get(op, "ctx", ctx)? };
        check_out(op, "event", event)?;
        let e = Event::new(&c.dev)?;
        // SAFETY: checked non-NULL.
        let child = Child::new(&c.children, ChildKind::Event);
        // SAFETY: checked non-NULL.
        unsafe { event.write(ftnEvent::into_raw(e, child)) };
        Ok(())
    })
}

/// Destroys an event.
///
/// Bad input: NULL, a stale handle (destroyed before, even if a new event
/// has been created since: that one is not touched) or another kind:
/// ftnInvalidArgument, nothing destroyed.
#[no_mangle]
pub unsafe extern "C" fn ftn_event_destroy(event: ftnEvent_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        drop(unsafe { take(op, "event", event)? });
        Ok(())
    })
}

/// Records the event at the current end of `stream`.
///
/// Bad input (at the call, nothing recorded): `event` or `stream` NULL,
/// stale or of another kind: ftnInvalidArgument; an event and a stream of
/// two contexts: ftnDeviceMismatch.
#[no_mangle]
pub unsafe extern "C" fn ftn_event_record(event: ftnEvent_t, stream: ftnStream_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contracts.
        let (e, s) = unsafe { (get(op, "event", event)?, get(op, "stream", stream)?) };
        s.stream.record(&e.event)
    })
}

/// Blocks until the event's latest record has been reached (at once for an
/// event never recorded).
///
/// Bad input: `event` NULL, stale or of another kind: ftnInvalidArgument.
/// On the emulator failures of the recorded work are not reported here
/// (they come from that stream's synchronize); on CUDA a device or driver
/// fault may surface here as ftnBackendError.
#[no_mangle]
pub unsafe extern "C" fn ftn_event_synchronize(event: ftnEvent_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        unsafe { get(op, "event", event)? }.event.synchronize()
    })
}

/// `*complete` = 1 when the event's latest record has been reached, else 0
/// (1 for an event never recorded).
///
/// Bad input (ftnInvalidArgument, nothing written): `event` NULL, stale or
/// of another kind; `complete` NULL or not aligned for an `int`. A CUDA
/// driver fault: ftnBackendError.
#[no_mangle]
pub unsafe extern "C" fn ftn_event_query(event: ftnEvent_t, complete: *mut c_int) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let e = unsafe { get(op, "event", event)? };
        check_out(op, "complete", complete)?;
        let done = e.event.is_complete()?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(op, "complete", complete, done as c_int) }
    })
}

/// Milliseconds between two completed records (`start` before `end`); waits
/// for both records on the emulator.
///
/// Bad input (nothing written to `*ms`): `start` or `end` NULL, stale or of
/// another kind, or `ms` NULL or not aligned for a `float`:
/// ftnInvalidArgument; events of two contexts: ftnDeviceMismatch. An event
/// never recorded: ftnInvalidArgument on the emulator, ftnBackendError (the
/// driver's error) on CUDA.
#[no_mangle]
pub unsafe extern "C" fn ftn_event_elapsed_ms(
    start: ftnEvent_t,
    end: ftnEvent_t,
    ms: *mut f32,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contracts.
        let (a, b) = unsafe { (get(op, "start", start)?, get(op, "end", end)?) };
        check_out(op, "ms", ms)?;
        a.event
            .device()
            .check_same_as(op, "end", b.event.device(), "`start`")?;
        let v = a.event.elapsed_ms(&b.event)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(op, "ms", ms, v) }
    })
}

fn stream_dev(s: &ftnStream) -> Device {
    s.stream.device().clone()
}

/// Enqueues a copy of `bytes` bytes from host memory `src` to device memory
/// `dst`. `src` is staged before the call returns.
///
/// Bad input (at the call, nothing enqueued): `stream` NULL, stale or of
/// another kind; `src` or `dst` NULL with `bytes > 0` (both may be NULL
/// when `bytes` is 0, a no-op); `bytes` past the end of the `ftn_malloc`
/// allocation `dst` points into, or more than `isize` can hold:
/// ftnInvalidArgument; a staging buffer that cannot be allocated:
/// ftnBackendError (never an abort). No alignment is required. Memory the
/// library did not allocate is trusted for `bytes`; faults on the device
/// come at synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_memcpy_htod(
    stream: ftnStream_t,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let s = unsafe { get(op, "stream", stream)? };
        if src.is_null() && bytes > 0 {
            return Err(invalid(
                op,
                "src",
                format!("a non-NULL host pointer to {bytes} bytes"),
                "NULL",
            ));
        }
        // SAFETY: pointer contracts (valid for `bytes` bytes).
        let mut d = unsafe { view::<u8>(&stream_dev(s), op, "dst", dst, bytes)? };
        check_extent(op, "bytes", s, dst, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: src is non-NULL and valid for `bytes` bytes by the contract.
        let host = unsafe { std::slice::from_raw_parts(src as *const u8, bytes) };
        s.stream.copy_from_host(host, &mut d)
    })
}

/// Copies `bytes` bytes from device memory `src` to host memory `dst` after
/// the stream's earlier work (blocks the caller).
///
/// Bad input (at the call, nothing copied): `stream` NULL, stale or of
/// another kind; `dst` or `src` NULL with `bytes > 0` (both may be NULL
/// when `bytes` is 0, a no-op); `bytes` past the end of the `ftn_malloc`
/// allocation `src` points into, or more than `isize` can hold:
/// ftnInvalidArgument. No alignment is required. Failures of the stream's
/// earlier work are reported here (as by `ftn_stream_synchronize`). Memory
/// the library did not allocate is trusted for `bytes`.
#[no_mangle]
pub unsafe extern "C" fn ftn_memcpy_dtoh(
    stream: ftnStream_t,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let s = unsafe { get(op, "stream", stream)? };
        if dst.is_null() && bytes > 0 {
            return Err(invalid(
                op,
                "dst",
                format!("a non-NULL host pointer to {bytes} bytes"),
                "NULL",
            ));
        }
        // SAFETY: pointer contracts.
        let v = unsafe { view::<u8>(&stream_dev(s), op, "src", src, bytes)? };
        check_extent(op, "bytes", s, src, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: dst is non-NULL and valid for `bytes` bytes by the contract.
        let host = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, bytes) };
        s.stream.copy_to_host(&v, host)
    })
}

/// Enqueues a device-to-device copy of `bytes` bytes (ranges may overlap).
///
/// Bad input (at the call, nothing enqueued): `stream` NULL, stale or of
/// another kind; `src` or `dst` NULL with `bytes > 0` (`bytes` 0 is a
/// no-op, NULL allowed); `bytes` past the end of the `ftn_malloc`
/// allocation `src` or `dst` points into, or more than `isize` can hold:
/// ftnInvalidArgument. No alignment is required. Memory the library did not
/// allocate is trusted for `bytes`; faults on the device come at
/// synchronize.
#[no_mangle]
pub unsafe extern "C" fn ftn_memcpy_dtod(
    stream: ftnStream_t,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let s = unsafe { get(op, "stream", stream)? };
        let dev = stream_dev(s);
        // SAFETY: pointer contracts.
        let (v, mut d) = unsafe {
            (
                view::<u8>(&dev, op, "src", src, bytes)?,
                view::<u8>(&dev, op, "dst", dst, bytes)?,
            )
        };
        check_extent(op, "bytes", s, src, bytes)?;
        check_extent(op, "bytes", s, dst, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        s.stream.copy_device(&v, &mut d)
    })
}

/// Enqueues setting `bytes` bytes of device memory to `value` (0..=255;
/// 0xFF makes float buffers NaN).
///
/// Bad input (at the call, nothing enqueued): `stream` NULL, stale or of
/// another kind; `value` outside 0..=255; `dst` NULL with `bytes > 0`
/// (`bytes` 0 is a no-op, NULL allowed); `bytes` past the end of the
/// `ftn_malloc` allocation `dst` points into: ftnInvalidArgument. No
/// alignment is required; memory the library did not allocate is trusted.
#[no_mangle]
pub unsafe extern "C" fn ftn_memset(
    stream: ftnStream_t,
    dst: *mut c_void,
    value: c_int,
    bytes: usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let s = unsafe { get(op, "stream", stream)? };
        let byte = u8::try_from(value)
            .map_err(|_| invalid(op, "value", "a byte value in 0..=255", value))?;
        // SAFETY: pointer contract.
        let mut d = unsafe { view::<u8>(&stream_dev(s), op, "dst", dst, bytes)? };
        check_extent(op, "bytes", s, dst, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        s.stream.fill_bytes(&mut d, byte)
    })
}
