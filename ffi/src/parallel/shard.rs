//! Host-side sharding of full parameters, as the layers do it themselves:
//! `ferrotron::parallel::linear::{shard_rows, shard_cols}` and
//! `ferrotron::parallel::vocab::shard_vocab_rows` (e.g. the embedding table
//! a vocab-parallel embedding takes per rank).

use std::ffi::{c_int, c_void};

use ferrotron::parallel::linear::{shard_cols, shard_rows};
use ferrotron::parallel::vocab::{shard_vocab_rows, vocab_range};
use ferrotron::{Element, Result};

use crate::abi::args::{dim, mul};
use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::dtype::dispatch_dtype;
use crate::abi::views::{check_ptr, host_slice};
use crate::parallel::common::tp_size;

/// Which sharding a call does.
#[derive(Clone, Copy)]
enum Split {
    Rows,
    Cols,
    VocabRows,
}

fn rank_of(op: &'static str, tp: c_int, rank: c_int) -> Result<(usize, usize)> {
    let t = tp_size(op, tp)?;
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < t)
        .ok_or_else(|| invalid(op, "rank", format!("a rank in 0..{t}"), rank))?;
    Ok((t, r))
}

/// # Safety
/// `full` holds `rows * cols` elements; `out` has room for the shard.
#[allow(clippy::too_many_arguments)]
unsafe fn shard_t<T: Element>(
    op: &'static str,
    split: Split,
    full: *const c_void,
    (rows, cols): (usize, usize),
    (tp, rank): (usize, usize),
    out: *mut c_void,
    out_count: usize,
) -> Result<()> {
    // The shard's length, checked against `out_count` before anything is
    // allocated (a padded vocabulary shard can be larger than `full`).
    let want = match split {
        Split::Rows => mul(op, "cols", rows / tp, cols)?,
        Split::Cols => mul(op, "rows", rows, cols / tp)?,
        Split::VocabRows => {
            let (_, r) = vocab_range(rows, tp, rank)
                .ok_or_else(|| invalid(op, "vocab", "a size whose padding fits in size_t", rows))?;
            mul(op, "hidden", r, cols)?
        }
    };
    if out_count < want {
        return Err(invalid(
            op,
            "out_count",
            format!("room for the shard's {want} elements"),
            out_count,
        ));
    }
    check_ptr::<T>(op, "out", out, want)?;
    // SAFETY: host pointer contract.
    let whole = match split {
        Split::VocabRows => "vocab * hidden",
        Split::Rows | Split::Cols => "rows * cols",
    };
    let src = unsafe { host_slice::<T>(op, "full", full, mul(op, whole, rows, cols)?)? };
    let shard = match split {
        Split::Rows => shard_rows(src, rows, cols, tp, rank)?,
        Split::Cols => shard_cols(src, rows, cols, tp, rank)?,
        Split::VocabRows => shard_vocab_rows(src, rows, cols, tp, rank)?,
    };
    debug_assert_eq!(shard.len(), want);
    // SAFETY: `out` has room for `out_count >= shard.len()` elements (the
    // caller's contract), checked non-NULL and aligned; host memory.
    unsafe { std::ptr::copy_nonoverlapping(shard.as_ptr(), out as *mut T, shard.len()) };
    Ok(())
}

#[allow(clippy::too_many_arguments)]
unsafe fn shard(
    op: &'static str,
    split: Split,
    datatype: c_int,
    full: *const c_void,
    (rows, cols): (i64, i64),
    (tp, rank): (c_int, c_int),
    out: *mut c_void,
    out_count: usize,
) -> Result<()> {
    // The C names of the two dimensions (`ftn_vocab_shard_rows` calls them
    // `vocab` and `hidden`).
    let (rname, cname) = match split {
        Split::VocabRows => ("vocab", "hidden"),
        Split::Rows | Split::Cols => ("rows", "cols"),
    };
    let shape = (dim(op, rname, rows)?, dim(op, cname, cols)?);
    let ranks = rank_of(op, tp, rank)?;
    // SAFETY: forwarded contracts.
    dispatch_dtype!(op, "datatype", datatype, T => unsafe { shard_t::<T>(op, split, full, shape, ranks, out, out_count) })
}

/// Rows `[rank*rows/tp, (rank+1)*rows/tp)` of the row-major `[rows, cols]`
/// host matrix `full` into `out` (host, room for `out_count >= rows/tp *
/// cols` elements): a column-parallel weight or bias shard. `rows` must be
/// a multiple of `tp`.
///
/// Bad input (ftnInvalidArgument, nothing written; host memory, no stream):
/// `datatype` outside `ftnDataType_t`; negative `rows` / `cols`; `tp` < 1
/// or `rank` outside `0..tp`; `rows` not a multiple of `tp`; `out_count`
/// below the shard's size; `full` or `out` NULL when they describe
/// elements, or not aligned to the element size. An empty shard writes
/// nothing. `full` is trusted for `rows * cols` elements.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ftn_shard_rows(
    datatype: c_int,
    full: *const c_void,
    rows: i64,
    cols: i64,
    tp: c_int,
    rank: c_int,
    out: *mut c_void,
    out_count: usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: forwarded contracts.
        unsafe {
            shard(
                op,
                Split::Rows,
                datatype,
                full,
                (rows, cols),
                (tp, rank),
                out,
                out_count,
            )
        }
    })
}

/// Columns `[rank*cols/tp, (rank+1)*cols/tp)` of the row-major `[rows,
/// cols]` host matrix `full` into `out` (host, room for `rows * cols/tp`
/// elements): a row-parallel weight shard. `cols` must be a multiple of `tp`.
///
/// Bad input (ftnInvalidArgument, nothing written; host memory, no stream):
/// `datatype` outside `ftnDataType_t`; negative `rows` / `cols`; `tp` < 1
/// or `rank` outside `0..tp`; `cols` not a multiple of `tp`; `out_count`
/// below the shard's size; `full` or `out` NULL when they describe
/// elements, or not aligned to the element size. An empty shard writes
/// nothing. `full` is trusted for `rows * cols` elements.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ftn_shard_cols(
    datatype: c_int,
    full: *const c_void,
    rows: i64,
    cols: i64,
    tp: c_int,
    rank: c_int,
    out: *mut c_void,
    out_count: usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: forwarded contracts.
        unsafe {
            shard(
                op,
                Split::Cols,
                datatype,
                full,
                (rows, cols),
                (tp, rank),
                out,
                out_count,
            )
        }
    })
}

/// Rank `rank`'s rows of the padded vocabulary (`ftn_vocab_range`) from the
/// full `[vocab, hidden]` host embedding table `full`, padding rows zero,
/// into `out` (host, room for the range's `rows * hidden` elements): the
/// `weight_shard` of `ftn_vocab_parallel_embedding_forward`.
///
/// Bad input (ftnInvalidArgument, nothing written; host memory, no stream):
/// `datatype` outside `ftnDataType_t`; negative `vocab` / `hidden`; `tp` <
/// 1 or `rank` outside `0..tp`; a padded size that overflows; `out_count`
/// below the range's `rows * hidden`; `full` or `out` NULL when they
/// describe elements, or not aligned to the element size. `vocab` need not
/// be a multiple of `tp` (padding rows are zero).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ftn_vocab_shard_rows(
    datatype: c_int,
    full: *const c_void,
    vocab: i64,
    hidden: i64,
    tp: c_int,
    rank: c_int,
    out: *mut c_void,
    out_count: usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: forwarded contracts.
        unsafe {
            shard(
                op,
                Split::VocabRows,
                datatype,
                full,
                (vocab, hidden),
                (tp, rank),
                out,
                out_count,
            )
        }
    })
}
