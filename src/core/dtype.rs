//! Element types a device buffer can hold.

use half::{bf16, f16};

/// Runtime tag of an element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    U8,
    I32,
    I64,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
            DType::I64 => 8,
        }
    }

    /// The suffix kernel names use (`ftn_{op}_{variant}_{dtype}`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// True for the floating-point storage types kernels compute on.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
}

impl core::fmt::Display for DType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can live in a device buffer.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: DType;
}

/// A floating-point element that kernels compute on in fp32.
pub trait FloatElement: Element {
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    };
}
element!(f32, F32);
element!(f16, F16);
element!(bf16, BF16);
element!(u8, U8);
element!(i32, I32);
element!(i64, I64);

impl FloatElement for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
impl FloatElement for f16 {
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl FloatElement for bf16 {
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F32.size(), core::mem::size_of::<f32>());
        assert_eq!(DType::F16.size(), core::mem::size_of::<f16>());
        assert_eq!(DType::BF16.size(), core::mem::size_of::<bf16>());
        assert_eq!(DType::U8.size(), 1);
        assert_eq!(DType::I32.size(), 4);
        assert_eq!(DType::I64.size(), 8);
        assert_eq!(<bf16 as Element>::DTYPE.name(), "bf16");
    }
}
