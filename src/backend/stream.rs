//! Public streams and events, dispatching to the backend.

use std::sync::{Arc, Mutex};

use super::buffer::{copy_device_on, copy_from_host_on, copy_to_host_on, fill_bytes_on};
use super::{emu, Device, DeviceBuffer, DeviceImpl, DeviceRead, DeviceWrite};
use crate::core::{Element, Error, LaunchConfig, Result};
use crate::kernels::{Kernel, KernelParams};

pub(crate) enum StreamImpl {
    Emu(emu::EmuStream),
    #[cfg(feature = "cuda")]
    Cuda(super::cuda::CudaStreamHandle),
}

/// An in-order queue of work on a device. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct Stream {
    device: Device,
    pub(crate) imp: Arc<StreamImpl>,
    /// Scratch memory for ops (e.g. partial sums); used only by this stream's
    /// work, in order, so one allocation serves every op. Dropped after `imp`.
    workspace: Arc<Mutex<Option<DeviceBuffer<u8>>>>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({:?})", self.device)
    }
}

impl Stream {
    pub(crate) fn new(device: &Device) -> Result<Stream> {
        let imp = match &device.inner.imp {
            DeviceImpl::Emu(e) => StreamImpl::Emu(e.new_stream()),
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(c) => StreamImpl::Cuda(c.new_stream()?),
        };
        Ok(Stream::from_impl(device, imp))
    }

    /// A stream of `device` around a backend stream.
    pub(crate) fn from_impl(device: &Device, imp: StreamImpl) -> Stream {
        Stream {
            device: device.clone(),
            imp: Arc::new(imp),
            workspace: Arc::new(Mutex::new(None)),
        }
    }

    /// The address of at least `bytes` bytes of scratch memory that work on
    /// this stream may use until the next call (it grows on demand; the old
    /// one is freed in this stream's order, waiting for nothing else).
    pub(crate) fn workspace(&self, bytes: usize) -> Result<u64> {
        let mut ws = self.workspace.lock().unwrap_or_else(|p| p.into_inner());
        if ws.as_ref().is_none_or(|b| b.len() < bytes) {
            if let Some(old) = ws.take() {
                old.free_on(self)?;
            }
            *ws = Some(DeviceBuffer::zeros(
                &self.device,
                bytes.next_power_of_two(),
            )?);
        }
        Ok(ws.as_ref().map_or(0, DeviceBuffer::addr))
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Waits for all work enqueued so far; reports the first kernel failure
    /// since the last synchronize.
    pub fn synchronize(&self) -> Result<()> {
        match &*self.imp {
            StreamImpl::Emu(s) => s.synchronize(),
            #[cfg(feature = "cuda")]
            StreamImpl::Cuda(s) => s.synchronize(),
        }
    }

    /// Records a new event at the current end of this stream.
    pub fn record_event(&self) -> Result<Event> {
        let ev = Event::new(&self.device)?;
        self.record(&ev)?;
        Ok(ev)
    }

    /// Records `event` at the current end of this stream.
    pub fn record(&self, event: &Event) -> Result<()> {
        self.device
            .check_same("Stream::record", "event", &event.device)?;
        match (&*self.imp, &event.imp) {
            (StreamImpl::Emu(s), EventImpl::Emu(e)) => {
                s.record(e);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (StreamImpl::Cuda(s), EventImpl::Cuda(e)) => s.record(e),
            #[cfg(feature = "cuda")]
            _ => Err(Error::DeviceMismatch {
                op: "Stream::record",
                arg: "event",
                than: "the stream",
            }),
        }
    }

    /// Makes all later work on this stream wait until `event`'s most recent
    /// record (as of this call) has been reached by its stream.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.device
            .check_same("Stream::wait_event", "event", &event.device)?;
        match (&*self.imp, &event.imp) {
            (StreamImpl::Emu(s), EventImpl::Emu(e)) => {
                s.wait(e);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (StreamImpl::Cuda(s), EventImpl::Cuda(e)) => s.wait(e),
            #[cfg(feature = "cuda")]
            _ => Err(Error::DeviceMismatch {
                op: "Stream::wait_event",
                arg: "event",
                than: "the stream",
            }),
        }
    }

    /// Enqueues a copy of `src` into `dst[..src.len()]`. `src` is staged
    /// before this returns, so the caller may reuse it at once.
    pub fn copy_from_host<T: Element>(
        &self,
        src: &[T],
        dst: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        self.device
            .check_same("Stream::copy_from_host", "dst", dst.device())?;
        crate::core::validate::len_at_least("Stream::copy_from_host", "dst", dst.len(), src.len())?;
        copy_from_host_on(self, dst.addr(), bytemuck::cast_slice(src))
    }

    /// Copies `src[..dst.len()]` to the host, after all work enqueued on this
    /// stream so far (blocks the caller).
    pub fn copy_to_host<T: Element>(&self, src: &dyn DeviceRead<T>, dst: &mut [T]) -> Result<()> {
        self.device
            .check_same("Stream::copy_to_host", "src", src.device())?;
        crate::core::validate::len_at_least("Stream::copy_to_host", "src", src.len(), dst.len())?;
        copy_to_host_on(self, src.addr(), bytemuck::cast_slice_mut(dst))
    }

    /// Enqueues a device-to-device copy of all of `src` into `dst`.
    pub fn copy_device<T: Element>(
        &self,
        src: &dyn DeviceRead<T>,
        dst: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        self.device
            .check_same("Stream::copy_device", "src", src.device())?;
        self.device
            .check_same("Stream::copy_device", "dst", dst.device())?;
        crate::core::validate::len_at_least("Stream::copy_device", "dst", dst.len(), src.len())?;
        copy_device_on(self, dst.addr(), src.addr(), src.len() * T::DTYPE.size())
    }

    /// Enqueues filling every byte of `buf` with `byte` (0xFF poisons float
    /// buffers with NaN).
    pub fn fill_bytes<T: Element>(&self, buf: &mut dyn DeviceWrite<T>, byte: u8) -> Result<()> {
        self.device
            .check_same("Stream::fill_bytes", "buf", buf.device())?;
        fill_bytes_on(self, buf.addr(), buf.len() * T::DTYPE.size(), byte)
    }

    /// Enqueues a host function that runs in stream order (after earlier
    /// work, before later work), like `cudaLaunchHostFunc`. It must not
    /// enqueue work itself or wait on this stream. A panic in it is caught and
    /// reported by the next `synchronize`. On CUDA the host functions of
    /// every stream run one at a time (measured on an H200): one that blocks
    /// delays all the others.
    pub fn launch_host_fn<F: FnOnce() + Send + 'static>(&self, f: F) -> Result<()> {
        let guarded = move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| Error::Backend {
                backend: "host",
                message: "a host function enqueued with launch_host_fn panicked".into(),
            })
        };
        match &*self.imp {
            StreamImpl::Emu(s) => {
                s.enqueue(Box::new(guarded));
                Ok(())
            }
            #[cfg(feature = "cuda")]
            StreamImpl::Cuda(s) => s.launch_host_fn(Box::new(move || {
                let _ = guarded();
            })),
        }
    }

    /// The raw CUDA stream with its context made current on this thread
    /// (library calls such as cuBLASLt), if this is a CUDA stream.
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda_bound_raw(&self) -> Result<Option<cudarc::driver::sys::CUstream>> {
        match &*self.imp {
            StreamImpl::Cuda(s) => {
                s.bind()?;
                Ok(Some(s.raw()))
            }
            StreamImpl::Emu(_) => Ok(None),
        }
    }

    /// The raw CUDA stream (NCCL calls), if this is a CUDA stream.
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda_raw(&self) -> Option<cudarc::driver::sys::CUstream> {
        match &*self.imp {
            StreamImpl::Cuda(s) => Some(s.raw()),
            StreamImpl::Emu(_) => None,
        }
    }

    /// Enqueues a host task that runs in stream order and may fail (the
    /// in-process communicator's operations). Emulator streams only.
    pub(crate) fn enqueue_task(&self, task: emu::Task) -> Result<()> {
        match &*self.imp {
            StreamImpl::Emu(s) => {
                s.enqueue(task);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            StreamImpl::Cuda(_) => Err(Error::invalid(
                "in-process collective",
                "stream",
                "an emulator stream",
                "a CUDA stream (use an NCCL communicator on GPUs)",
            )),
        }
    }

    /// Enqueues `kernel` with `params` after checking `cfg` against the
    /// device limits. Callers (the typed ops) validate `params` first.
    pub(crate) fn launch<P: KernelParams>(
        &self,
        kernel: &'static Kernel<P>,
        cfg: LaunchConfig,
        params: P,
    ) -> Result<()> {
        let limits = self.device.limits();
        limits.check(kernel.name, &cfg)?;
        limits.check_cluster(kernel.name, kernel.cluster, &cfg)?;
        match (&*self.imp, &self.device.inner.imp) {
            (StreamImpl::Emu(s), _) => emu::launch(s, kernel, cfg, params),
            #[cfg(feature = "cuda")]
            (StreamImpl::Cuda(s), DeviceImpl::Cuda(d)) => d.launch(s, kernel, cfg, params),
            #[cfg(feature = "cuda")]
            _ => Err(Error::DeviceMismatch {
                op: "Stream::launch",
                arg: "stream",
                than: "the device it was created on",
            }),
        }
    }
}

pub(crate) enum EventImpl {
    Emu(emu::EmuEvent),
    #[cfg(feature = "cuda")]
    Cuda(super::cuda::CudaEventHandle),
}

/// A marker in a stream's queue that other streams and the host can wait on.
pub struct Event {
    device: Device,
    imp: EventImpl,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({:?})", self.device)
    }
}

impl Event {
    /// A new, not yet recorded event (waiting on it returns at once).
    pub fn new(device: &Device) -> Result<Event> {
        let imp = match &device.inner.imp {
            DeviceImpl::Emu(_) => EventImpl::Emu(emu::EmuEvent::default()),
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(c) => EventImpl::Cuda(c.new_event()?),
        };
        Ok(Event {
            device: device.clone(),
            imp,
        })
    }

    /// Blocks the host until the event's latest record has been reached.
    pub fn synchronize(&self) -> Result<()> {
        match &self.imp {
            EventImpl::Emu(e) => {
                e.synchronize();
                Ok(())
            }
            #[cfg(feature = "cuda")]
            EventImpl::Cuda(e) => e.synchronize(),
        }
    }

    /// True once the latest record has been reached (or it was never recorded).
    pub fn is_complete(&self) -> Result<bool> {
        match &self.imp {
            EventImpl::Emu(e) => Ok(e.is_complete()),
            #[cfg(feature = "cuda")]
            EventImpl::Cuda(e) => e.is_complete(),
        }
    }

    /// Blocks the host until the latest record has been reached or
    /// `deadline` passes; `Ok(true)` when it was reached. The emulator
    /// sleeps until the event completes; CUDA polls the event.
    pub(crate) fn synchronize_until(&self, deadline: std::time::Instant) -> Result<bool> {
        match &self.imp {
            EventImpl::Emu(e) => Ok(e.synchronize_until(deadline)),
            #[cfg(feature = "cuda")]
            EventImpl::Cuda(e) => {
                while !e.is_complete()? {
                    if std::time::Instant::now() >= deadline {
                        return Ok(false);
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                Ok(true)
            }
        }
    }

    /// The device this event belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Milliseconds between this event and `later`, both completed.
    pub fn elapsed_ms(&self, later: &Event) -> Result<f32> {
        match (&self.imp, &later.imp) {
            (EventImpl::Emu(a), EventImpl::Emu(b)) => {
                a.synchronize();
                b.synchronize();
                match (a.completed_at(), b.completed_at()) {
                    (Some(t0), Some(t1)) => {
                        Ok(t1.saturating_duration_since(t0).as_secs_f32() * 1e3)
                    }
                    _ => Err(Error::invalid(
                        "Event::elapsed_ms",
                        "event",
                        "two recorded events",
                        "an event that was never recorded",
                    )),
                }
            }
            #[cfg(feature = "cuda")]
            (EventImpl::Cuda(a), EventImpl::Cuda(b)) => a.elapsed_ms(b),
            #[cfg(feature = "cuda")]
            _ => Err(Error::DeviceMismatch {
                op: "Event::elapsed_ms",
                arg: "later",
                than: "the earlier event",
            }),
        }
    }
}
