//! cudarc 0.19 interop (feature `cuda`): a [`Device`] on a caller's
//! `CudaContext`, a [`Stream`] around a caller's `CudaStream` (shared, never
//! destroyed by ferrotron while the caller holds it) and back, ferrotron
//! views of cudarc memory and cudarc views of ferrotron memory, and an NCCL
//! communicator from a cudarc NCCL id. Contracts: docs/interop.md, "cudarc".

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
};

use super::super::stream::StreamImpl;
use super::super::{
    Device, DeviceImpl, DeviceRead, DeviceSlice, DeviceSliceMut, DeviceWrite, Stream,
};
use crate::comm::Communicator;
use crate::core::{Element, Error, Result};

impl Device {
    /// A ferrotron device on a cudarc context (shared: the caller's work and
    /// ferrotron's run on the same context). ferrotron loads its kernels into
    /// it; dropping the device synchronizes the context and unloads them.
    /// cudarc's event tracking is left as the caller set it.
    pub fn from_cudarc(ctx: Arc<CudaContext>) -> Result<Device> {
        Ok(Device::wrap(DeviceImpl::Cuda(Box::new(
            super::CudaDevice::on_context(ctx)?,
        ))))
    }

    /// The cudarc context of a CUDA device (`None` on the emulator).
    pub fn cudarc_context(&self) -> Option<Arc<CudaContext>> {
        match &self.inner.imp {
            DeviceImpl::Cuda(c) => Some(c.context().clone()),
            DeviceImpl::Emu(_) => None,
        }
    }

    fn cuda_of(&self, op: &'static str) -> Result<&super::CudaDevice> {
        match &self.inner.imp {
            DeviceImpl::Cuda(c) => Ok(c),
            DeviceImpl::Emu(_) => Err(Error::invalid(
                op,
                "device",
                "a CUDA device",
                "the emulator",
            )),
        }
    }
}

impl Stream {
    /// A ferrotron stream around a cudarc stream of `device`'s context:
    /// work enqueued through either is ordered on the same `CUstream`. The
    /// stream is shared (an `Arc`), never destroyed while the caller holds
    /// it. A stream of another context is a `DeviceMismatch` naming
    /// `stream`; an emulator device an `InvalidArgument` naming `device`.
    pub fn from_cudarc(device: &Device, stream: Arc<CudaStream>) -> Result<Stream> {
        const OP: &str = "Stream::from_cudarc";
        let h = device.cuda_of(OP)?.wrap_stream(OP, stream)?;
        Ok(Stream::from_impl(device, StreamImpl::Cuda(h)))
    }

    /// The cudarc stream behind a CUDA stream (shared), `None` on the emulator.
    pub fn cudarc_stream(&self) -> Option<Arc<CudaStream>> {
        match &*self.imp {
            StreamImpl::Cuda(s) => Some(s.cudarc().clone()),
            StreamImpl::Emu(_) => None,
        }
    }

    fn cudarc_of(&self, op: &'static str) -> Result<Arc<CudaStream>> {
        self.cudarc_stream()
            .ok_or_else(|| Error::invalid(op, "stream", "a CUDA stream", "an emulator stream"))
    }

    /// Runs `f` with a ferrotron view of cudarc memory (a `CudaSlice`,
    /// `CudaView` or `CudaViewMut`), ordered by cudarc's own rules: this
    /// stream first waits for the memory's earlier writes (cudarc's event
    /// tracking, when on), and the read is recorded after the work `f`
    /// enqueued on this stream.
    pub fn with_cudarc<T: Element, S: DevicePtr<T>, R>(
        &self,
        src: &S,
        f: impl FnOnce(&DeviceSlice<'_, T>) -> Result<R>,
    ) -> Result<R> {
        const OP: &str = "Stream::with_cudarc";
        let cs = self.cudarc_of(OP)?;
        let (ptr, _record_after) = src.device_ptr(&cs);
        // SAFETY: cudarc vouches for `ptr .. + len` on this context; the view
        // lives only during `f`, while `src` is borrowed, and the read is
        // recorded (by `_record_after`) after `f`'s work.
        let view = unsafe { DeviceSlice::from_raw(self.device(), ptr, src.len(), self)? };
        f(&view)
    }

    /// As [`with_cudarc`](Self::with_cudarc), writing: waits for earlier
    /// reads and writes, records the write after `f`'s work.
    pub fn with_cudarc_mut<T: Element, S: DevicePtrMut<T>, R>(
        &self,
        dst: &mut S,
        f: impl FnOnce(&mut DeviceSliceMut<'_, T>) -> Result<R>,
    ) -> Result<R> {
        const OP: &str = "Stream::with_cudarc_mut";
        let cs = self.cudarc_of(OP)?;
        let len = dst.len();
        let (ptr, _record_after) = dst.device_ptr_mut(&cs);
        // SAFETY: as in `with_cudarc`; `dst` is exclusively borrowed.
        let mut view = unsafe { DeviceSliceMut::from_raw(self.device(), ptr, len, self)? };
        f(&mut view)
    }

    /// Runs `f` with a cudarc `CudaView` of ferrotron memory, on this
    /// stream (cudarc work enqueued on `view.stream()` inside `f` is
    /// ordered with this stream's). The `CudaSlice` behind the view is
    /// never freed by cudarc (it is leaked back after `f`, and not dropped
    /// if `f` panics).
    pub fn as_cudarc<T: Element + cudarc::driver::DeviceRepr, R>(
        &self,
        src: &dyn DeviceRead<T>,
        f: impl FnOnce(&CudaView<'_, T>) -> R,
    ) -> Result<R> {
        const OP: &str = "Stream::as_cudarc";
        self.device().check_same(OP, "src", src.device())?;
        let cs = self.cudarc_of(OP)?;
        // SAFETY: `src` is live device memory of this context holding
        // `len` elements of `T`, borrowed for the call; the slice is
        // leaked, never freed.
        let slice = ManuallyDrop::new(unsafe { cs.upgrade_device_ptr::<T>(src.addr(), src.len()) });
        let r = f(&slice.as_view());
        ManuallyDrop::into_inner(slice).leak();
        Ok(r)
    }

    /// As [`as_cudarc`](Self::as_cudarc), with a `CudaViewMut`.
    pub fn as_cudarc_mut<T: Element + cudarc::driver::DeviceRepr, R>(
        &self,
        dst: &mut dyn DeviceWrite<T>,
        f: impl FnOnce(&mut CudaViewMut<'_, T>) -> R,
    ) -> Result<R> {
        const OP: &str = "Stream::as_cudarc_mut";
        self.device().check_same(OP, "dst", dst.device())?;
        let cs = self.cudarc_of(OP)?;
        // SAFETY: as in `as_cudarc`; `dst` is exclusively borrowed.
        let mut slice =
            ManuallyDrop::new(unsafe { cs.upgrade_device_ptr::<T>(dst.addr(), dst.len()) });
        let r = f(&mut slice.as_view_mut());
        ManuallyDrop::into_inner(slice).leak();
        Ok(r)
    }
}

/// The ferrotron stream must run on the slice's own cudarc stream.
fn check_own_stream(op: &'static str, stream: &Stream, own: &Arc<CudaStream>) -> Result<()> {
    match stream.cudarc_stream() {
        Some(s) if s.cu_stream() == own.cu_stream() => Ok(()),
        Some(_) => Err(Error::invalid(
            op,
            "stream",
            "a ferrotron stream around the CudaSlice's own stream (Stream::from_cudarc(dev, slice.stream().clone()))",
            "another stream",
        )),
        None => Err(Error::invalid(op, "stream", "a CUDA stream", "an emulator stream")),
    }
}

impl<'a, T: Element> DeviceSlice<'a, T> {
    /// A view of a cudarc `CudaSlice` for `'a`, used on `stream`, which must
    /// wrap the slice's own stream (checked: an `InvalidArgument` naming
    /// `stream`), so every cudarc and ferrotron use of the memory is
    /// ordered on one `CUstream`. cudarc's event tracking does not see
    /// ferrotron's work: for other streams, use [`Stream::with_cudarc`].
    pub fn from_cudarc(stream: &Stream, slice: &'a CudaSlice<T>) -> Result<Self> {
        const OP: &str = "DeviceSlice::from_cudarc";
        check_own_stream(OP, stream, slice.stream())?;
        let (ptr, _sync) = slice.device_ptr(slice.stream());
        // SAFETY: cudarc's allocation of `len` elements, borrowed for 'a;
        // ordered on its own stream (checked above).
        unsafe { DeviceSlice::from_raw(stream.device(), ptr, slice.len(), stream) }
    }
}

impl<'a, T: Element> DeviceSliceMut<'a, T> {
    /// An exclusive view of a cudarc `CudaSlice` (as
    /// [`DeviceSlice::from_cudarc`]).
    pub fn from_cudarc(stream: &Stream, slice: &'a mut CudaSlice<T>) -> Result<Self> {
        const OP: &str = "DeviceSliceMut::from_cudarc";
        let own = slice.stream().clone();
        check_own_stream(OP, stream, &own)?;
        let len = slice.len();
        let (ptr, _sync) = slice.device_ptr_mut(&own);
        // SAFETY: as in `DeviceSlice::from_cudarc`; exclusively borrowed.
        unsafe { DeviceSliceMut::from_raw(stream.device(), ptr, len, stream) }
    }
}

impl Communicator {
    /// An NCCL communicator (rank `rank` of `size`) from a cudarc NCCL
    /// unique id, as [`Communicator::nccl`]: every rank passes the same id.
    /// (cudarc 0.19's `Comm` keeps its `ncclComm_t` private, so an existing
    /// `Comm` cannot be adopted; make the ferrotron communicator from the
    /// id instead, or from a fresh `Id::new()` shared the same way.)
    pub fn nccl_from_cudarc_id(
        device: &Device,
        rank: usize,
        size: usize,
        id: &cudarc::nccl::Id,
    ) -> Result<Communicator> {
        let bytes: [u8; 128] = id.internal().map(|c| c as u8);
        Communicator::nccl(device, rank, size, &bytes)
    }
}
