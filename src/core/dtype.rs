//! Element types a device buffer can hold, and the one way to go from a
//! runtime [`DType`] to a Rust element type: [`with_dtype!`](crate::with_dtype).

pub use half::{bf16, f16};

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

    /// Every dtype, in the C ABI's `ftnDataType_t` order.
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::U8,
        DType::I32,
        DType::I64,
    ];

    /// The C ABI's `ftnDataType_t` value (`ftnFloat32` = 0 ... `ftnInt64` = 5).
    pub const fn to_c(self) -> i32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::U8 => 3,
            DType::I32 => 4,
            DType::I64 => 5,
        }
    }

    /// The dtype of an `ftnDataType_t` value; `None` outside 0..=5.
    pub const fn from_c(v: i32) -> Option<DType> {
        if v >= 0 && (v as usize) < DType::ALL.len() {
            Some(DType::ALL[v as usize])
        } else {
            None
        }
    }
}

/// The Rust element type of a `DType` variant name (used by [`with_dtype!`]).
///
/// [`with_dtype!`]: crate::with_dtype
#[doc(hidden)]
#[macro_export]
macro_rules! __dtype_rust_type {
    (F32) => {
        f32
    };
    (F16) => {
        $crate::core::dtype::f16
    };
    (BF16) => {
        $crate::core::dtype::bf16
    };
    (U8) => {
        u8
    };
    (I32) => {
        i32
    };
    (I64) => {
        i64
    };
}

/// Runs generic code for a dtype known only at run time: the crate's one
/// dispatch from [`DType`] to an element type.
///
/// * `with_dtype!(d, T => body)`: every dtype; `T` names `d`'s element type.
/// * `with_dtype!(d, [F32, F16, BF16], T => body, else other => fallback)`:
///   only the listed dtypes; any other value of `d` is bound to `other` and
///   `fallback` runs (typically a clear error naming the argument).
///
/// ```
/// use ferrotron::{with_dtype, DType, Element};
/// fn size_of_elem(d: DType) -> Result<usize, String> {
///     with_dtype!(d, [F32, F16, BF16], T => Ok(std::mem::size_of::<T>()),
///         else other => Err(format!("a float dtype, not {other}")))
/// }
/// assert_eq!(size_of_elem(DType::BF16), Ok(2));
/// assert!(size_of_elem(DType::I32).is_err());
/// ```
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, [$($v:ident),+ $(,)?], $T:ident => $body:expr, else $other:ident => $fallback:expr) => {
        match $dtype {
            $(
                $crate::DType::$v => {
                    #[allow(dead_code)]
                    type $T = $crate::__dtype_rust_type!($v);
                    $body
                }
            )+
            #[allow(unreachable_patterns)]
            $other => $fallback,
        }
    };
    ($dtype:expr, $T:ident => $body:expr) => {
        $crate::with_dtype!($dtype, [F32, F16, BF16, U8, I32, I64], $T => $body,
            else _unreachable => unreachable!("with_dtype! lists every DType"))
    };
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

    #[test]
    fn c_codes_round_trip_and_reject_the_rest() {
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(d.to_c(), i as i32);
            assert_eq!(DType::from_c(i as i32), Some(*d));
        }
        assert_eq!(DType::from_c(-1), None);
        assert_eq!(DType::from_c(6), None);
    }

    #[test]
    fn with_dtype_binds_the_matching_type() {
        for d in DType::ALL {
            let (dt, size) =
                crate::with_dtype!(d, T => (<T as Element>::DTYPE, core::mem::size_of::<T>()));
            assert_eq!((dt, size), (d, d.size()));
        }
        let floats_only = |d: DType| -> Option<DType> {
            crate::with_dtype!(d, [F32, F16, BF16], T => Some(<T as Element>::DTYPE), else _x => None)
        };
        assert_eq!(floats_only(DType::F16), Some(DType::F16));
        assert_eq!(floats_only(DType::U8), None);
    }
}
