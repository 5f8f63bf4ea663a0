//! Scalar arguments: counts and dimensions as `usize`, checked products,
//! sizes back to `int64_t`.

use ferrotron::Result;

use crate::abi::boundary::invalid;

/// A caller-given count (`int64_t` dims, `size_t` counts) as `usize`.
pub(crate) fn dim(op: &'static str, arg: &'static str, v: i64) -> Result<usize> {
    usize::try_from(v).map_err(|_| invalid(op, arg, "a dimension >= 0", v))
}

/// `a * b` with overflow reported against `arg`.
pub(crate) fn mul(op: &'static str, arg: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .filter(|&n| n <= i64::MAX as usize)
        .ok_or_else(|| {
            invalid(
                op,
                arg,
                "a product that fits in int64_t",
                format!("{a} * {b} (overflows)"),
            )
        })
}

/// A size as `int64_t` for an out-parameter.
pub(crate) fn to_i64(op: &'static str, arg: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| invalid(op, arg, "a result that fits in int64_t", v))
}

/// An empty vector with room for `n` entries of `arg`, or an error (never
/// an abort) when the host allocation fails.
pub(crate) fn try_vec<T>(op: &'static str, arg: &'static str, n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| ferrotron::Error::Backend {
            backend: "host",
            message: format!("{op}: cannot allocate host memory for {n} entries of `{arg}`"),
        })?;
    Ok(v)
}
