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
}
