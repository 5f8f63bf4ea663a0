//! C enums: an `int` argument or field becomes its `#[repr(C)]` enum by
//! value, never by matching bare literals; a bad value gets an error that
//! lists the enum's names and values.

use std::fmt::Debug;

use ferrotron::Result;

use crate::abi::boundary::invalid;

/// A fieldless `#[repr(C)]` enum of the header (implemented by [`c_enum!`]).
pub(crate) trait CEnum: Copy + Debug + 'static {
    /// Every variant, in declaration order.
    const ALL: &'static [Self];
    /// The variant's C value.
    fn value(self) -> i32;
}

/// `c_enum!(ftnGelu_t: ftnGeluTanh, ftnGeluErf)`: implements [`CEnum`]. The
/// enum itself stays written out where it is (cbindgen reads it there);
/// a test checks the list is complete.
macro_rules! c_enum {
    ($t:ident: $($v:ident),+ $(,)?) => {
        impl $crate::abi::enums::CEnum for $t {
            const ALL: &'static [Self] = &[$($t::$v),+];
            fn value(self) -> i32 {
                self as i32
            }
        }
    };
}
pub(crate) use c_enum;

/// The variant with C value `v`, if any.
pub(crate) fn from_value<E: CEnum>(v: i32) -> Option<E> {
    E::ALL.iter().copied().find(|e| e.value() == v)
}

/// `"ftnGeluTanh (0) or ftnGeluErf (1)"`: names and values for an error.
pub(crate) fn names<E: CEnum>(list: &[E]) -> String {
    let each: Vec<String> = list
        .iter()
        .map(|e| format!("{e:?} ({})", e.value()))
        .collect();
    match each.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// `op`'s argument `arg` (value `v`) as the enum `E`, or an error naming
/// every allowed value.
pub(crate) fn parse_enum<E: CEnum>(op: &'static str, arg: &'static str, v: i32) -> Result<E> {
    from_value(v).ok_or_else(|| invalid(op, arg, names(E::ALL), v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;

    /// Every variant is listed (values 0..N without gaps, or the bits of
    /// ftnAxis_t), and names read as the tests of the C consumers expect.
    #[test]
    fn lists_are_complete() {
        fn dense<E: CEnum>(n: i32) {
            let v: Vec<i32> = E::ALL.iter().map(|e| e.value()).collect();
            assert_eq!(v, (0..n).collect::<Vec<_>>(), "{:?}", E::ALL);
            assert!(from_value::<E>(n).is_none() && from_value::<E>(-1).is_none());
        }
        dense::<ftnResult_t>(8);
        dense::<ftnDataType_t>(6);
        dense::<ftnBackend_t>(3);
        dense::<ftnGelu_t>(2);
        dense::<ftnSoftmaxMask_t>(3);
        dense::<ftnGemmEpilogue_t>(4);
        dense::<ftnRedOp_t>(4);
        dense::<ftnActivation_t>(3);
        dense::<ftnWeightGradMode_t>(2);
        dense::<ftnMapping_t>(7);
        dense::<ftnRankOrder_t>(2);
        dense::<ftnPipelineSchedule_t>(4);
        dense::<ftnPipelinePass_t>(4);
        dense::<ftnPipelinePayload_t>(2);
        dense::<ftnAdamMode_t>(2);
        dense::<ftnGradAveraging_t>(3);
        let bits: Vec<i32> = ftnAxis_t::ALL.iter().map(|e| e.value()).collect();
        assert_eq!(bits, [1, 2, 4, 8]);
        assert_eq!(names(ftnGelu_t::ALL), "ftnGeluTanh (0) or ftnGeluErf (1)");
        assert_eq!(
            names(ftnRedOp_t::ALL),
            "ftnSum (0), ftnMax (1), ftnMin (2) or ftnAvg (3)"
        );
        let e = parse_enum::<ftnGelu_t>("op", "desc.gelu", 7)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("desc.gelu") && e.contains("ftnGeluErf (1)") && e.contains("got 7"),
            "{e}"
        );
    }
}
