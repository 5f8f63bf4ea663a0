//! `ftnDataType_t` and the one way from a C dtype value to a Rust element type.

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

macro_rules! float_dispatch {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            0 => {
                type $T = f32;
                $body
            }
            1 => {
                type $T = half::f16;
                $body
            }
            2 => {
                type $T = half::bf16;
                $body
            }
            other => Err($crate::abi::boundary::invalid(
                $op,
                "desc.dtype",
                "ftnFloat32 (0), ftnFloat16 (1) or ftnBfloat16 (2)",
                other,
            )),
        }
    };
}
pub(crate) use float_dispatch;
