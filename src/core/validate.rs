//! Argument checks shared by every typed op: overflow-checked sizes, buffer
//! lengths, alignment. Each returns [`Error::InvalidArgument`] naming the op
//! and the argument.

use alloc::format;

use super::error::{Error, Result};

/// `rows * cols` without overflow, as `usize`.
pub fn elements(op: &'static str, rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols).ok_or_else(|| {
        Error::invalid(
            op,
            "rows * cols",
            "a product that fits in usize",
            format!("{rows} * {cols} (overflows)"),
        )
    })
}

/// `value >= 1`.
pub fn positive(op: &'static str, arg: &'static str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(Error::invalid(op, arg, ">= 1", 0));
    }
    Ok(())
}

/// A buffer holds at least `needed` elements (it may be longer).
pub fn len_at_least(op: &'static str, arg: &'static str, len: usize, needed: usize) -> Result<()> {
    if len < needed {
        return Err(Error::invalid(
            op,
            arg,
            format!("at least {needed} elements"),
            format!("a buffer of {len} elements"),
        ));
    }
    Ok(())
}

/// An output's bytes `out = (address, bytes)` share none with an input's
/// `inp` (empty ranges never overlap): else an error naming the output.
pub fn disjoint(
    op: &'static str,
    out_arg: &'static str,
    out: (u64, usize),
    in_arg: &'static str,
    inp: (u64, usize),
) -> Result<()> {
    let end = |(a, n): (u64, usize)| a.saturating_add(n as u64);
    if out.1 > 0 && inp.1 > 0 && out.0 < end(inp) && inp.0 < end(out) {
        return Err(Error::invalid(
            op,
            out_arg,
            format!("a buffer that does not overlap `{in_arg}`"),
            format!(
                "bytes {:#x}..{:#x} overlapping {in_arg}'s {:#x}..{:#x}",
                out.0,
                end(out),
                inp.0,
                end(inp)
            ),
        ));
    }
    Ok(())
}

/// True when `addr` is a multiple of `align` (a power of two).
pub const fn is_aligned(addr: usize, align: usize) -> bool {
    addr & (align - 1) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_fail_with_names() {
        assert_eq!(elements("op", 3, 5).unwrap(), 15);
        let e = elements("op", usize::MAX, 2).unwrap_err();
        assert!(format!("{e}").contains("overflows"));
        assert!(positive("op", "cols", 0).is_err());
        assert!(positive("op", "cols", 1).is_ok());
        let e = len_at_least("op", "out", 9, 10).unwrap_err();
        assert!(format!("{e}").contains("`out`") && format!("{e}").contains("at least 10"));
        assert!(len_at_least("op", "out", 10, 10).is_ok());
        assert!(is_aligned(64, 16) && !is_aligned(66, 16));
    }

    #[test]
    fn disjoint_refuses_any_shared_byte_and_names_the_output() {
        let e = disjoint("op", "y", (100, 8), "x", (104, 8)).unwrap_err();
        let e = format!("{e}");
        assert!(e.contains("`y`") && e.contains("overlap `x`"), "{e}");
        assert!(disjoint("op", "y", (100, 8), "x", (100, 8)).is_err()); // in place
        assert!(disjoint("op", "y", (100, 8), "x", (96, 5)).is_err());
        assert!(disjoint("op", "y", (100, 8), "x", (108, 8)).is_ok()); // adjacent
        assert!(disjoint("op", "y", (100, 8), "x", (92, 8)).is_ok());
        assert!(disjoint("op", "y", (100, 0), "x", (100, 8)).is_ok()); // empty
        assert!(disjoint("op", "y", (u64::MAX - 4, 8), "x", (0, 8)).is_ok());
    }
}
