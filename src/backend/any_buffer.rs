//! [`AnyBuffer`]: a device buffer whose element type is known only at run
//! time — what the C ABI, and tests and benches that sweep every dtype, hold.
//! Typed code gets its `DeviceBuffer<T>` back with [`AnyBuffer::as_typed`]
//! or dispatches with [`with_dtype!`](crate::with_dtype).

use std::any::Any;

use super::{Device, DeviceBuffer};
use crate::core::dtype::{bf16, f16};
use crate::core::{DType, Element, Error, Result};

/// A [`DeviceBuffer`] of any [`DType`].
#[derive(Debug)]
pub enum AnyBuffer {
    F32(DeviceBuffer<f32>),
    F16(DeviceBuffer<f16>),
    BF16(DeviceBuffer<bf16>),
    U8(DeviceBuffer<u8>),
    I32(DeviceBuffer<i32>),
    I64(DeviceBuffer<i64>),
}

/// `on_any!(buffer, b => expr)`: `expr` with `b` the typed buffer inside.
macro_rules! on_any {
    ($v:expr, $b:ident => $body:expr) => {
        match $v {
            AnyBuffer::F32($b) => $body,
            AnyBuffer::F16($b) => $body,
            AnyBuffer::BF16($b) => $body,
            AnyBuffer::U8($b) => $body,
            AnyBuffer::I32($b) => $body,
            AnyBuffer::I64($b) => $body,
        }
    };
}

impl AnyBuffer {
    /// `len` zeroed elements of `dtype` on `device`.
    pub fn zeros(device: &Device, dtype: DType, len: usize) -> Result<AnyBuffer> {
        crate::with_dtype!(dtype, T => DeviceBuffer::<T>::zeros(device, len).map(AnyBuffer::from))
    }

    /// A non-owning view of `len` elements of `dtype` at `addr` (see
    /// [`DeviceBuffer::from_raw_parts`]).
    ///
    /// # Safety
    /// As [`DeviceBuffer::from_raw_parts`], for elements of `dtype`.
    pub unsafe fn from_raw_parts(
        device: &Device,
        dtype: DType,
        addr: u64,
        len: usize,
    ) -> Result<AnyBuffer> {
        crate::with_dtype!(dtype, T => {
            // SAFETY: forwarded contract, for T = dtype's element type.
            unsafe { DeviceBuffer::<T>::from_raw_parts(device, addr, len) }.map(AnyBuffer::from)
        })
    }

    pub fn dtype(&self) -> DType {
        match self {
            AnyBuffer::F32(_) => DType::F32,
            AnyBuffer::F16(_) => DType::F16,
            AnyBuffer::BF16(_) => DType::BF16,
            AnyBuffer::U8(_) => DType::U8,
            AnyBuffer::I32(_) => DType::I32,
            AnyBuffer::I64(_) => DType::I64,
        }
    }

    pub fn len(&self) -> usize {
        on_any!(self, b => b.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn device(&self) -> &Device {
        on_any!(self, b => b.device())
    }

    /// The device address of element 0.
    pub fn addr(&self) -> u64 {
        on_any!(self, b => b.addr())
    }

    /// The typed buffer, if it holds `T`.
    pub fn as_typed<T: Element>(&self) -> Option<&DeviceBuffer<T>> {
        on_any!(self, b => (b as &dyn Any).downcast_ref::<DeviceBuffer<T>>())
    }

    /// The typed buffer, mutably, if it holds `T`.
    pub fn as_typed_mut<T: Element>(&mut self) -> Option<&mut DeviceBuffer<T>> {
        on_any!(self, b => (b as &mut dyn Any).downcast_mut::<DeviceBuffer<T>>())
    }

    /// The typed buffer, or a clear error naming `op` and `arg` when it holds
    /// another dtype.
    pub fn typed<T: Element>(
        &self,
        op: &'static str,
        arg: &'static str,
    ) -> Result<&DeviceBuffer<T>> {
        let d = self.dtype();
        self.as_typed::<T>()
            .ok_or_else(|| Error::invalid(op, arg, format!("a buffer of {}", T::DTYPE), d))
    }
}

macro_rules! from_typed {
    ($t:ty, $v:ident) => {
        impl From<DeviceBuffer<$t>> for AnyBuffer {
            fn from(b: DeviceBuffer<$t>) -> Self {
                AnyBuffer::$v(b)
            }
        }
    };
}
from_typed!(f32, F32);
from_typed!(f16, F16);
from_typed!(bf16, BF16);
from_typed!(u8, U8);
from_typed!(i32, I32);
from_typed!(i64, I64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_every_dtype_and_gives_the_typed_buffer_back() {
        let dev = Device::emu();
        for d in DType::ALL {
            let b = AnyBuffer::zeros(&dev, d, 7).unwrap();
            assert_eq!((b.dtype(), b.len()), (d, 7));
            assert_eq!(b.as_typed::<f32>().is_some(), d == DType::F32);
            assert_eq!(b.as_typed::<i64>().is_some(), d == DType::I64);
        }
        let b = AnyBuffer::from(dev.upload(&[1u8, 2, 3]).unwrap());
        let err = b.typed::<f32>("op", "x").unwrap_err().to_string();
        assert!(
            err.contains("x") && err.contains("f32") && err.contains("u8"),
            "{err}"
        );
    }
}
