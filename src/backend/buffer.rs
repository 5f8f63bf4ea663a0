//! Typed device buffers.

use std::marker::PhantomData;

use super::stream::{Stream, StreamImpl};
use super::{emu, Device, DeviceImpl};
use crate::core::{Element, Error, Result};

pub(crate) enum Memory {
    /// Memory someone else owns (C callers' pointers): never freed here.
    Borrowed(u64),
    Emu(emu::EmuMemory),
    #[cfg(feature = "cuda")]
    Cuda(super::cuda::CudaMemory),
}

/// `len` elements of `T` in device memory (host memory under the emulator).
pub struct DeviceBuffer<T: Element> {
    device: Device,
    mem: Option<Memory>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>[{}] on {:?}",
            T::DTYPE,
            self.len,
            self.device
        )
    }
}

fn byte_len<T: Element>(op: &'static str, len: usize) -> Result<usize> {
    len.checked_mul(T::DTYPE.size())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::invalid(
                op,
                "len",
                "a size in bytes that fits in isize",
                format!("{len} elements of {}", T::DTYPE),
            )
        })
}

impl<T: Element> DeviceBuffer<T> {
    /// `len` zeroed elements.
    pub fn zeros(device: &Device, len: usize) -> Result<Self> {
        let bytes = byte_len::<T>("DeviceBuffer::zeros", len)?;
        let mem = match &device.inner.imp {
            DeviceImpl::Emu(_) => Memory::Emu(emu::EmuMemory::zeroed(bytes)?),
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(c) => Memory::Cuda(c.alloc_zeroed(bytes)?),
        };
        Ok(DeviceBuffer {
            device: device.clone(),
            mem: Some(mem),
            len,
            _t: PhantomData,
        })
    }

    /// A non-owning view of `len` elements at device address `addr` (a host
    /// address under the emulator), for memory allocated elsewhere — C
    /// callers, other frameworks. Dropping it frees nothing and waits for
    /// nothing. Every typed op validates it like any other buffer.
    ///
    /// # Safety
    /// `addr` must be valid for reads and writes of `len` elements of `T` on
    /// `device`, aligned for `T`, for as long as any work using the view is
    /// pending; it must not be 0 unless `len` is 0.
    pub unsafe fn from_raw_parts(device: &Device, addr: u64, len: usize) -> Result<Self> {
        check_raw_parts::<T>("DeviceBuffer::from_raw_parts", addr, len)?;
        Ok(DeviceBuffer {
            device: device.clone(),
            mem: Some(Memory::Borrowed(addr)),
            len,
            _t: PhantomData,
        })
    }

    /// A buffer holding a copy of `data`, usable on every stream when this
    /// returns. On CUDA the copy goes through pinned staging on a private
    /// stream; no other stream is waited for.
    pub fn from_host(device: &Device, data: &[T]) -> Result<Self> {
        let bytes = byte_len::<T>("DeviceBuffer::from_host", data.len())?;
        let src: &[u8] = bytemuck::cast_slice(data);
        let mem = match &device.inner.imp {
            DeviceImpl::Emu(_) => {
                let m = emu::EmuMemory::zeroed(bytes)?;
                // SAFETY: a fresh allocation of `bytes` == src.len() bytes
                // that no stream knows yet.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), m.addr() as *mut u8, bytes) };
                Memory::Emu(m)
            }
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(c) => Memory::Cuda(c.upload(src)?),
        };
        Ok(DeviceBuffer {
            device: device.clone(),
            mem: Some(mem),
            len: data.len(),
            _t: PhantomData,
        })
    }

    /// Copies the buffer to the host after the work enqueued so far on every
    /// stream of its device. Only that work is waited for (not later work,
    /// not the whole device), and kernel errors stay with their streams; use
    /// [`Stream::copy_to_host`] to order after one stream only.
    pub fn to_host(&self) -> Result<Vec<T>> {
        download(&self.device, self.addr(), self.len)
    }

    /// Frees the memory in `stream`'s order: after the work enqueued on
    /// `stream` so far, without waiting for other streams (a plain drop
    /// waits, on the device, for every stream's work). The caller promises
    /// no other stream's pending work uses the buffer. The host never waits.
    pub fn free_on(mut self, stream: &Stream) -> Result<()> {
        self.device
            .check_same("DeviceBuffer::free_on", "stream", stream.device())?;
        match (self.mem.take(), &*stream.imp, &self.device.inner.imp) {
            (None | Some(Memory::Borrowed(_)), _, _) => {}
            (Some(Memory::Emu(m)), StreamImpl::Emu(s), _) => s.enqueue(Box::new(move || {
                drop(m);
                Ok(())
            })),
            #[cfg(feature = "cuda")]
            (Some(Memory::Cuda(m)), StreamImpl::Cuda(s), DeviceImpl::Cuda(c)) => c.free_on(m, s),
            #[cfg(feature = "cuda")]
            (Some(m), _, _) => self.mem = Some(m),
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device address of element 0 (a host address under the emulator).
    /// This is what kernel parameter structs and the C ABI carry.
    pub fn addr(&self) -> u64 {
        match self.mem.as_ref() {
            Some(Memory::Borrowed(a)) => *a,
            Some(Memory::Emu(m)) => m.addr(),
            #[cfg(feature = "cuda")]
            Some(Memory::Cuda(m)) => m.addr(),
            None => 0,
        }
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // Stream-ordered: the memory is released once every stream has done
        // the work enqueued before this drop (which may still use it); the
        // host does not wait. Errors stay with their streams.
        match (&self.device.inner.imp, self.mem.take()) {
            (_, Some(Memory::Borrowed(_))) | (_, None) => {}
            (DeviceImpl::Emu(e), Some(Memory::Emu(m))) => e.release(m),
            #[cfg(feature = "cuda")]
            (DeviceImpl::Cuda(c), Some(Memory::Cuda(m))) => c.free(m),
            #[cfg(feature = "cuda")]
            _ => {}
        }
    }
}

/// The error of a host allocation that failed (reported, never an abort).
fn host_alloc_failed(op: &'static str, bytes: usize) -> Error {
    Error::Backend {
        backend: "host",
        message: format!("{op}: cannot allocate {bytes} bytes of host memory"),
    }
}

/// `len` zeroed elements in a new host vector, or an error when the host
/// allocation fails (instead of the abort of `vec![..]`).
pub(crate) fn try_host_zeroed<T: Element>(op: &'static str, len: usize) -> Result<Vec<T>> {
    let bytes = len.saturating_mul(T::DTYPE.size());
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| host_alloc_failed(op, bytes))?;
    v.resize(len, T::zeroed());
    Ok(v)
}

/// A host copy of `src`, or an error when the host allocation fails.
pub(crate) fn try_host_copy(op: &'static str, src: &[u8]) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(src.len())
        .map_err(|_| host_alloc_failed(op, src.len()))?;
    v.extend_from_slice(src);
    Ok(v)
}

pub(crate) fn copy_from_host_on(stream: &Stream, dst: u64, src: &[u8]) -> Result<()> {
    match &*stream.imp {
        StreamImpl::Emu(s) => {
            let staged = try_host_copy("Stream::copy_from_host", src)?;
            let dst = emu::SendCell(dst as *mut u8);
            s.enqueue(Box::new(move || {
                let dst = dst;
                // SAFETY: dst holds at least staged.len() bytes (checked
                // by the caller) and outlives the stream's work (drop waits).
                unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), dst.0, staged.len()) };
                Ok(())
            }));
            Ok(())
        }
        #[cfg(feature = "cuda")]
        StreamImpl::Cuda(s) => s.copy_htod(dst, src),
    }
}

/// (Buffers and views alike: callers checked the sizes and devices.)
pub(crate) fn copy_to_host_on(stream: &Stream, src: u64, dst: &mut [u8]) -> Result<()> {
    match &*stream.imp {
        StreamImpl::Emu(s) => {
            s.synchronize()?;
            // SAFETY: the buffer holds at least dst.len() bytes (checked by
            // the caller) and the stream's earlier work has finished.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
            Ok(())
        }
        #[cfg(feature = "cuda")]
        StreamImpl::Cuda(s) => s.copy_dtoh(src, dst),
    }
}

pub(crate) fn copy_device_on(stream: &Stream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    match &*stream.imp {
        StreamImpl::Emu(s) => {
            let cell = emu::SendCell((src as *const u8, dst as *mut u8));
            s.enqueue(Box::new(move || {
                let cell = cell;
                // SAFETY: both ranges are live buffers of >= bytes
                // (checked by the caller); copy handles overlap.
                unsafe { std::ptr::copy(cell.0 .0, cell.0 .1, bytes) };
                Ok(())
            }));
            Ok(())
        }
        #[cfg(feature = "cuda")]
        StreamImpl::Cuda(s) => s.copy_dtod(dst, src, bytes),
    }
}

pub(crate) fn fill_bytes_on(stream: &Stream, dst: u64, bytes: usize, byte: u8) -> Result<()> {
    match &*stream.imp {
        StreamImpl::Emu(s) => {
            let dst = emu::SendCell(dst as *mut u8);
            s.enqueue(Box::new(move || {
                let dst = dst;
                // SAFETY: dst is this buffer, `bytes` long, alive until
                // the stream's work is done (drop waits).
                unsafe { std::ptr::write_bytes(dst.0, byte, bytes) };
                Ok(())
            }));
            Ok(())
        }
        #[cfg(feature = "cuda")]
        StreamImpl::Cuda(s) => s.memset(dst, byte, bytes),
    }
}

/// The checks of a caller's raw parts: a byte size that fits in `isize`, a
/// non-null address when there are elements, aligned for `T`.
pub(crate) fn check_raw_parts<T: Element>(op: &'static str, addr: u64, len: usize) -> Result<()> {
    byte_len::<T>(op, len)?;
    if addr == 0 && len > 0 {
        return Err(Error::invalid(op, "addr", "a non-null address", "NULL"));
    }
    if addr % std::mem::align_of::<T>() as u64 != 0 {
        return Err(Error::invalid(
            op,
            "addr",
            format!(
                "an address aligned to {} bytes for {}",
                std::mem::align_of::<T>(),
                T::DTYPE
            ),
            format!("{addr:#x}"),
        ));
    }
    Ok(())
}

/// `len` elements at `addr` on `device`, copied to the host after the work
/// enqueued so far on every stream of the device.
pub(crate) fn download<T: Element>(device: &Device, addr: u64, len: usize) -> Result<Vec<T>> {
    let mut out = try_host_zeroed::<T>("DeviceBuffer::to_host", len)?;
    let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
    match &device.inner.imp {
        DeviceImpl::Emu(e) => {
            e.wait_idle();
            // SAFETY: the memory holds dst.len() bytes (the caller's buffer
            // or view) and the work enqueued before this call has finished.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len())
            };
        }
        #[cfg(feature = "cuda")]
        DeviceImpl::Cuda(c) => c.download(addr, dst)?,
    }
    Ok(out)
}
