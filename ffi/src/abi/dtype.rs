//! `ftnDataType_t` and the one way from a C dtype value to a Rust element
//! type: [`parse_dtype`] (a clear error naming the argument and the allowed
//! C names) then the core's `ferrotron::with_dtype!`, composed by
//! [`dispatch_dtype!`].

use ferrotron::{DType, Result};

use crate::abi::boundary::invalid;
use crate::abi::enums::{c_enum, from_value};

/// Element types.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnDataType_t {
    ftnFloat32 = 0,
    ftnFloat16 = 1,
    ftnBfloat16 = 2,
    ftnUint8 = 3,
    ftnInt32 = 4,
    ftnInt64 = 5,
}
c_enum!(ftnDataType_t: ftnFloat32, ftnFloat16, ftnBfloat16, ftnUint8, ftnInt32, ftnInt64);

/// The float element types of the kernels.
pub(crate) const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
/// The 16-bit inputs of the tensor-core GEMM (and the parallel layers).
pub(crate) const HALVES: [DType; 2] = [DType::F16, DType::BF16];

/// The dtype of C value `v` if it is one of `allowed`.
pub(crate) fn dtype_in(v: i32, allowed: &[DType]) -> Option<DType> {
    DType::from_c(v).filter(|d| allowed.contains(d))
}

/// `"ftnFloat16 (1) or ftnBfloat16 (2)"`: the C names of `allowed`.
pub(crate) fn dtype_names(allowed: &[DType]) -> String {
    let c: Vec<ftnDataType_t> = allowed
        .iter()
        .filter_map(|d| from_value(d.to_c()))
        .collect();
    crate::abi::enums::names(&c)
}

/// `op`'s argument `arg` (an `ftnDataType_t` value `v`) as a [`DType`] of
/// `allowed`, or an error naming the allowed C enum names.
pub(crate) fn parse_dtype(
    op: &'static str,
    arg: &'static str,
    v: i32,
    allowed: &[DType],
) -> Result<DType> {
    dtype_in(v, allowed).ok_or_else(|| invalid(op, arg, dtype_names(allowed), v))
}

/// `dispatch_dtype!(op, arg, v, [F32, F16, BF16], T => body)`: `body` (a
/// `Result`) with `T` the element type of the `ftnDataType_t` value `v`,
/// which must be one of the listed dtypes ([`parse_dtype`]'s error
/// otherwise); `dispatch_dtype!(op, arg, v, T => body)` admits all six.
macro_rules! dispatch_dtype {
    ($op:expr, $arg:expr, $v:expr, [$($d:ident),+ $(,)?], $T:ident => $body:expr) => {
        match $crate::abi::dtype::parse_dtype($op, $arg, $v, &[$(::ferrotron::DType::$d),+]) {
            Err(e) => Err(e),
            Ok(d) => ::ferrotron::with_dtype!(d, [$($d),+], $T => $body,
                else other => unreachable!("parse_dtype admitted the unlisted {other}")),
        }
    };
    ($op:expr, $arg:expr, $v:expr, $T:ident => $body:expr) => {
        match $crate::abi::dtype::parse_dtype($op, $arg, $v, &::ferrotron::DType::ALL) {
            Err(e) => Err(e),
            Ok(d) => ::ferrotron::with_dtype!(d, $T => $body),
        }
    };
}
pub(crate) use dispatch_dtype;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::enums::CEnum;

    #[test]
    fn c_values_are_the_core_dtypes() {
        for d in DType::ALL {
            let c = from_value::<ftnDataType_t>(d.to_c()).unwrap();
            assert_eq!(c.value(), d.to_c());
        }
        assert_eq!(
            dtype_names(&FLOATS),
            "ftnFloat32 (0), ftnFloat16 (1) or ftnBfloat16 (2)"
        );
        assert_eq!(
            parse_dtype("op", "desc.dtype", 2, &HALVES).unwrap(),
            DType::BF16
        );
        let e = parse_dtype("op", "desc.dtype", 0, &HALVES)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("desc.dtype")
                && e.contains("ftnFloat16 (1) or ftnBfloat16 (2)")
                && e.contains("got 0"),
            "{e}"
        );
        let r: Result<usize> =
            dispatch_dtype!("op", "datatype", 5, T => Ok(std::mem::size_of::<T>()));
        assert_eq!(r.unwrap(), 8);
        let r: Result<usize> = dispatch_dtype!("op", "datatype", 3, [F32, F16, BF16], T => Ok(std::mem::size_of::<T>()));
        assert!(r.unwrap_err().to_string().contains("got 3"));
    }
}
