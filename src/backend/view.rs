//! Borrowed device memory: [`DeviceSlice`] / [`DeviceSliceMut`] views, the
//! [`DeviceRead`] / [`DeviceWrite`] traits every op takes its buffers
//! through, and [`HostScope`], which lends host slices to the emulator.
//!
//! A view is an address, a length and the device it lives on, borrowed for
//! `'a` from what owns the memory: a [`DeviceBuffer`] (`buf.slice(..)`),
//! another framework (the unsafe [`DeviceSlice::from_raw`], cudarc
//! conversions), or host memory on the emulator ([`Device::host_scope`]).
//! Ops read through `&dyn DeviceRead<T>` and write through
//! `&mut dyn DeviceWrite<T>`; both traits are sealed, so only these three
//! types (whose addresses are valid by construction or by an `unsafe`
//! promise) reach a kernel. A `DeviceSliceMut` never hands out a
//! `&mut DeviceBuffer` (a `mem::swap` would let the borrow escape).
//!
//! The contracts (what is checked, what the caller promises):
//! `docs/interop.md`, "Borrowed views".

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use super::{BackendKind, Device, DeviceBuffer, DeviceImpl, Stream};
use crate::core::{Element, Error, Result};

mod sealed {
    /// Only the crate's own buffer and view types implement the traits.
    pub trait Sealed {}
}

/// Device memory an op may read: a [`DeviceBuffer`], a [`DeviceSlice`] or a
/// [`DeviceSliceMut`]. Sealed.
pub trait DeviceRead<T: Element>: sealed::Sealed {
    /// Elements of `T`.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The device the memory lives on.
    fn device(&self) -> &Device;
    /// The device address of element 0 (a host address on the emulator).
    fn addr(&self) -> u64;
    /// The whole memory as a shared view, borrowed from `self`.
    fn view(&self) -> DeviceSlice<'_, T>;

    /// Elements `range` as a shared view; a range past the end, or
    /// reversed, is an `InvalidArgument` naming `range`.
    fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>>
    where
        Self: Sized,
    {
        let (start, end) = sub_range("DeviceRead::slice", self.len(), range)?;
        let mut v = self.view();
        v.raw = v.raw.sub::<T>(start, end);
        Ok(v)
    }

    /// A host copy, after the work enqueued so far on every stream of the
    /// device (as [`DeviceBuffer::to_host`]).
    fn to_host(&self) -> Result<Vec<T>> {
        super::buffer::download(self.device(), self.addr(), self.len())
    }
}

/// Device memory an op may write: a [`DeviceBuffer`] or a
/// [`DeviceSliceMut`]. Sealed.
pub trait DeviceWrite<T: Element>: DeviceRead<T> {
    /// The whole memory as an exclusive view, borrowed from `self`.
    fn view_mut(&mut self) -> DeviceSliceMut<'_, T>;
    /// `self` as a reader (what trait upcasting does on newer compilers).
    fn as_read(&self) -> &dyn DeviceRead<T>;

    /// Elements `range` as an exclusive view (bounds as [`DeviceRead::slice`]).
    fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>>
    where
        Self: Sized,
    {
        let (start, end) = sub_range("DeviceWrite::slice_mut", self.len(), range)?;
        let mut v = self.view_mut();
        v.raw = v.raw.sub::<T>(start, end);
        Ok(v)
    }
}

/// What both views hold.
#[derive(Clone)]
struct Raw {
    device: Device,
    addr: u64,
    len: usize,
    /// The stream the creator promised ordering on (raw and cudarc views).
    stream: Option<Stream>,
}

impl Raw {
    /// Elements `start..end` (already checked against `len`).
    fn sub<T: Element>(self, start: usize, end: usize) -> Raw {
        Raw {
            addr: self.addr + (start * T::DTYPE.size()) as u64,
            len: end - start,
            ..self
        }
    }

    /// Checks a caller's raw parts: the stream's device, a byte size that
    /// fits, a non-null address aligned for `T`.
    fn checked<T: Element>(
        op: &'static str,
        device: &Device,
        addr: u64,
        len: usize,
        stream: Option<&Stream>,
    ) -> Result<Raw> {
        if let Some(s) = stream {
            device.check_same_as(op, "stream", s.device(), "`device`")?;
        }
        super::buffer::check_raw_parts::<T>(op, addr, len)?;
        Ok(Raw {
            device: device.clone(),
            addr,
            len,
            stream: stream.cloned(),
        })
    }
}

/// `range` resolved against `len`, or an error naming it.
fn sub_range(
    op: &'static str,
    len: usize,
    range: impl RangeBounds<usize>,
) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok((s, e)),
        _ => Err(Error::invalid(
            op,
            "range",
            format!("a range within 0..{len}"),
            format!("{:?}, {:?}", range.start_bound(), range.end_bound()),
        )),
    }
}

/// A shared, borrowed view of `len` elements of `T` in device memory (host
/// memory on the emulator), valid for `'a`. Ops read it wherever they read a
/// [`DeviceBuffer`].
///
/// A view cannot outlive what it borrows:
///
/// ```compile_fail,E0597
/// use ferrotron::{Device, DeviceRead};
/// let dev = Device::emu();
/// let view = {
///     let buf = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
///     buf.slice(1..).unwrap() // `buf` is dropped here while borrowed
/// };
/// assert_eq!(view.len(), 2);
/// ```
#[derive(Clone)]
pub struct DeviceSlice<'a, T: Element> {
    raw: Raw,
    _borrow: PhantomData<&'a [T]>,
}

/// An exclusive, borrowed view of `len` elements of `T` in device memory,
/// valid for `'a`. Ops read and write it wherever they take a
/// [`DeviceBuffer`]; it never hands out a `&mut DeviceBuffer`.
pub struct DeviceSliceMut<'a, T: Element> {
    raw: Raw,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<T: Element> std::fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceSlice<{}>[{}] at {:#x} on {:?}",
            T::DTYPE,
            self.raw.len,
            self.raw.addr,
            self.raw.device
        )
    }
}

impl<T: Element> std::fmt::Debug for DeviceSliceMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceSliceMut<{}>[{}] at {:#x} on {:?}",
            T::DTYPE,
            self.raw.len,
            self.raw.addr,
            self.raw.device
        )
    }
}

impl<'a, T: Element> DeviceSlice<'a, T> {
    fn new(raw: Raw) -> Self {
        DeviceSlice {
            raw,
            _borrow: PhantomData,
        }
    }

    /// A view of `len` elements at device address `addr` on `device`, memory
    /// another framework owns.
    ///
    /// Checked (named errors): `stream` belongs to `device`
    /// (`DeviceMismatch`, arg `stream`), `addr` non-null when `len > 0` and
    /// aligned for `T`, `len` elements fit in `isize` bytes.
    ///
    /// # Safety
    /// For all of `'a`: `addr .. addr + len * size_of::<T>()` lies in one
    /// live allocation on `device` (a host allocation on the emulator) and
    /// nobody writes it; the producer's writes are ordered before any work
    /// enqueued on `stream` after this call (for another ferrotron stream,
    /// order it after `stream` with an event first), and the memory stays
    /// allocated until the work enqueued through the view has finished (wait
    /// for its stream before freeing). A length past the allocation cannot be
    /// detected.
    pub unsafe fn from_raw(
        device: &Device,
        addr: u64,
        len: usize,
        stream: &Stream,
    ) -> Result<Self> {
        Raw::checked::<T>("DeviceSlice::from_raw", device, addr, len, Some(stream)).map(Self::new)
    }

    /// The stream the creator promised ordering on, for raw and cudarc
    /// views; `None` for views of ferrotron buffers and host scopes.
    pub fn ordered_on(&self) -> Option<&Stream> {
        self.raw.stream.as_ref()
    }

    /// Splits at element `mid` (`mid > len` is an error naming `mid`).
    pub fn split_at(self, mid: usize) -> Result<(DeviceSlice<'a, T>, DeviceSlice<'a, T>)> {
        let (a, b) = split::<T>(self.raw, mid, "DeviceSlice::split_at")?;
        Ok((Self::new(a), Self::new(b)))
    }
}

impl<'a, T: Element> DeviceSliceMut<'a, T> {
    fn new(raw: Raw) -> Self {
        DeviceSliceMut {
            raw,
            _borrow: PhantomData,
        }
    }

    /// An exclusive view of `len` elements at device address `addr` on
    /// `device`, memory another framework owns. Checked as
    /// [`DeviceSlice::from_raw`].
    ///
    /// # Safety
    /// As [`DeviceSlice::from_raw`], and for all of `'a` nothing else reads
    /// or writes the memory except through this view.
    pub unsafe fn from_raw(
        device: &Device,
        addr: u64,
        len: usize,
        stream: &Stream,
    ) -> Result<Self> {
        Raw::checked::<T>("DeviceSliceMut::from_raw", device, addr, len, Some(stream))
            .map(Self::new)
    }

    /// As [`DeviceSlice::ordered_on`].
    pub fn ordered_on(&self) -> Option<&Stream> {
        self.raw.stream.as_ref()
    }

    /// The view as a shared one for the rest of `'a`.
    pub fn into_shared(self) -> DeviceSlice<'a, T> {
        DeviceSlice::new(self.raw)
    }

    /// Splits into two disjoint exclusive views at element `mid`.
    pub fn split_at_mut(
        self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'a, T>, DeviceSliceMut<'a, T>)> {
        let (a, b) = split::<T>(self.raw, mid, "DeviceSliceMut::split_at_mut")?;
        Ok((Self::new(a), Self::new(b)))
    }
}

fn split<T: Element>(raw: Raw, mid: usize, op: &'static str) -> Result<(Raw, Raw)> {
    let len = raw.len;
    if mid > len {
        return Err(Error::invalid(
            op,
            "mid",
            format!("at most {len} (the view's length)"),
            mid,
        ));
    }
    Ok((raw.clone().sub::<T>(0, mid), raw.sub::<T>(mid, len)))
}

impl<T: Element> sealed::Sealed for DeviceBuffer<T> {}
impl<T: Element> sealed::Sealed for DeviceSlice<'_, T> {}
impl<T: Element> sealed::Sealed for DeviceSliceMut<'_, T> {}

impl<T: Element> DeviceRead<T> for DeviceBuffer<T> {
    fn len(&self) -> usize {
        DeviceBuffer::len(self)
    }
    fn device(&self) -> &Device {
        DeviceBuffer::device(self)
    }
    fn addr(&self) -> u64 {
        DeviceBuffer::addr(self)
    }
    fn view(&self) -> DeviceSlice<'_, T> {
        DeviceSlice::new(Raw {
            device: self.device().clone(),
            addr: self.addr(),
            len: self.len(),
            stream: None,
        })
    }
}

impl<T: Element> DeviceWrite<T> for DeviceBuffer<T> {
    fn as_read(&self) -> &dyn DeviceRead<T> {
        self
    }
    fn view_mut(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut::new(Raw {
            device: self.device().clone(),
            addr: self.addr(),
            len: self.len(),
            stream: None,
        })
    }
}

/// The read half both views share.
macro_rules! view_read {
    ($ty:ident) => {
        impl<T: Element> DeviceRead<T> for $ty<'_, T> {
            fn len(&self) -> usize {
                self.raw.len
            }
            fn device(&self) -> &Device {
                &self.raw.device
            }
            fn addr(&self) -> u64 {
                self.raw.addr
            }
            fn view(&self) -> DeviceSlice<'_, T> {
                DeviceSlice::new(self.raw.clone())
            }
        }
    };
}
view_read!(DeviceSlice);
view_read!(DeviceSliceMut);

impl<T: Element> DeviceWrite<T> for DeviceSliceMut<'_, T> {
    fn as_read(&self) -> &dyn DeviceRead<T> {
        self
    }
    fn view_mut(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut::new(self.raw.clone())
    }
}

/// The data-parallel gradient views (a non-owning `DeviceBuffer` inside)
/// read and write like the buffer they wrap.
impl<T: Element> sealed::Sealed for crate::parallel::ddp::BufferView<'_, T> {}

impl<T: Element> DeviceRead<T> for crate::parallel::ddp::BufferView<'_, T> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn device(&self) -> &Device {
        (**self).device()
    }
    fn addr(&self) -> u64 {
        (**self).addr()
    }
    fn view(&self) -> DeviceSlice<'_, T> {
        DeviceRead::view(&**self)
    }
}

impl<T: Element> DeviceWrite<T> for crate::parallel::ddp::BufferView<'_, T> {
    fn view_mut(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceWrite::view_mut(self.inner_mut())
    }
    fn as_read(&self) -> &dyn DeviceRead<T> {
        self
    }
}

/// Lends host slices to the emulator as views for the duration of a
/// [`Device::host_scope`] call (host memory is device memory there).
///
/// Why a scope and not a plain constructor from `&'a [T]`: ops are
/// asynchronous, so a kernel may still read or write the memory after the
/// view is dropped; a view's `Drop` cannot be relied on to wait (it may be
/// leaked with `mem::forget`, and safe code may do that). The scope waits
/// for every stream of the device when its closure returns (or panics), and
/// views cannot leave the closure:
///
/// ```compile_fail,E0521
/// use ferrotron::Device;
/// let dev = Device::emu();
/// let mut data = vec![1.0f32; 4];
/// let mut escaped = None;
/// dev.host_scope(|s| {
///     escaped = Some(s.slice_mut(&mut data)?); // the view cannot leave the scope
///     Ok(())
/// })
/// .unwrap();
/// ```
pub struct HostScope<'scope, 'env: 'scope> {
    device: Device,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'scope, 'env> HostScope<'scope, 'env> {
    fn check_emu(&self, op: &'static str) -> Result<()> {
        if self.device.kind() == BackendKind::Emu {
            Ok(())
        } else {
            Err(Error::invalid(
                op,
                "device",
                "the emulator (host memory is device memory only there)",
                "a CUDA device",
            ))
        }
    }

    fn raw<T: Element>(&self, op: &'static str, data: &[T]) -> Result<Raw> {
        self.check_emu(op)?;
        Ok(Raw {
            device: self.device.clone(),
            addr: data.as_ptr() as u64,
            len: data.len(),
            stream: None,
        })
    }

    /// `data` as a shared view on the scope's (emulator) device; a CUDA
    /// device is an `InvalidArgument` naming `device`.
    pub fn slice<T: Element>(&'scope self, data: &'env [T]) -> Result<DeviceSlice<'scope, T>> {
        self.raw("HostScope::slice", data).map(DeviceSlice::new)
    }

    /// `data` as an exclusive view (as [`slice`](Self::slice)).
    pub fn slice_mut<T: Element>(
        &'scope self,
        data: &'env mut [T],
    ) -> Result<DeviceSliceMut<'scope, T>> {
        self.raw("HostScope::slice_mut", data)
            .map(DeviceSliceMut::new)
    }

    /// The scope's device.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

/// Waits for the device's streams when the scope ends, even by a panic.
struct WaitOnDrop<'d>(&'d Device);

impl Drop for WaitOnDrop<'_> {
    fn drop(&mut self) {
        match &self.0.inner.imp {
            DeviceImpl::Emu(e) => e.wait_idle(),
            #[cfg(feature = "cuda")]
            DeviceImpl::Cuda(_) => {}
        }
    }
}

impl Device {
    /// Runs `f` with a [`HostScope`] that turns host slices borrowed from
    /// the caller's environment into views on this (emulator) device, then
    /// waits for the work enqueued so far on every stream of the device
    /// (errors stay with their streams). Returns what `f` returns.
    ///
    /// ```
    /// use ferrotron::{ops::BiasGelu, Device, DeviceRead};
    /// let dev = Device::emu();
    /// let stream = dev.new_stream()?;
    /// let (x, bias) = (vec![0.5f32; 2 * 8], vec![0.1f32; 8]);
    /// let mut y = vec![0.0f32; 2 * 8];
    /// dev.host_scope(|s| {
    ///     let mut out = s.slice_mut(&mut y)?;
    ///     let (x, bias) = (s.slice(&x)?, s.slice(&bias)?);
    ///     BiasGelu::new(2, 8).forward(&stream, &x, Some(&bias), &mut out)?;
    ///     stream.synchronize()
    /// })?;
    /// assert!((y[0] - 0.4354).abs() < 1e-3); // gelu(0.6), written in place
    /// # Ok::<(), ferrotron::Error>(())
    /// ```
    pub fn host_scope<'env, F, R>(&self, f: F) -> Result<R>
    where
        F: for<'scope> FnOnce(&'scope HostScope<'scope, 'env>) -> Result<R>,
    {
        let scope = HostScope {
            device: self.clone(),
            _scope: PhantomData,
            _env: PhantomData,
        };
        let _wait = WaitOnDrop(self);
        f(&scope)
    }
}

impl<T: Element> std::fmt::Debug for dyn DeviceRead<T> + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceRead<{}>[{}] at {:#x}",
            T::DTYPE,
            self.len(),
            self.addr()
        )
    }
}

impl<T: Element> std::fmt::Debug for dyn DeviceWrite<T> + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceWrite<{}>[{}] at {:#x}",
            T::DTYPE,
            self.len(),
            self.addr()
        )
    }
}
