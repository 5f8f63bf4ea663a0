//! The strided 2-D copy (`ferrotron::ops::copy`).

use std::ffi::{c_int, c_void};

use ferrotron::ops::copy::{copy_2d, Block2d};
use ferrotron::{Element, Result};

use crate::abi::args::dim;
use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::dtype::dispatch_dtype;
use crate::abi::handles::get;
use crate::abi::views::view;
use crate::runtime::{ftnStream, ftnStream_t};

/// Where a `[rows, cols]` block lives in a row-major matrix.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnBlock2d_t {
    /// Index of the block's first element.
    pub offset: i64,
    /// Elements between the starts of consecutive rows (`>= cols`).
    pub pitch: i64,
}

/// Elements from the buffer's start to the block's end, checked to fit in
/// `isize` bytes of `T`: an overflow names the block, `rows` and `cols`
/// (what it comes from), not the pointer.
fn extent<T: Element>(
    op: &'static str,
    arg: &'static str,
    b: Block2d,
    rows: usize,
    cols: usize,
) -> Result<usize> {
    b.extent(rows, cols)
        .filter(|n| {
            n.checked_mul(T::DTYPE.size())
                .is_some_and(|bytes| bytes <= isize::MAX as usize)
        })
        .ok_or_else(|| {
            invalid(
                op,
                arg,
                format!(
                    "a block whose extent ((rows - 1) * pitch + offset + cols elements of {}) fits in isize bytes",
                    T::DTYPE.name()
                ),
                format!(
                    "an overflow: rows {rows}, cols {cols}, offset {}, pitch {}",
                    b.offset, b.pitch
                ),
            )
        })
}

unsafe fn copy_t<T: Element>(
    op: &'static str,
    s: &ftnStream,
    (src, src_at): (*const c_void, Block2d),
    (dst, dst_at): (*mut c_void, Block2d),
    rows: usize,
    cols: usize,
) -> Result<()> {
    let dev = s.stream.device().clone();
    let ns = extent::<T>(op, "src_block", src_at, rows, cols)?;
    let nd = extent::<T>(op, "dst_block", dst_at, rows, cols)?;
    // SAFETY: pointer contracts: each buffer holds its block.
    let (x, mut y) = unsafe {
        (
            view::<T>(&dev, op, "src", src, ns)?,
            view::<T>(&dev, op, "dst", dst, nd)?,
        )
    };
    copy_2d(&s.stream, &x, src_at, &mut y, dst_at, rows, cols)
}

fn block(op: &'static str, arg: &'static str, b: ftnBlock2d_t) -> Result<Block2d> {
    let offset =
        usize::try_from(b.offset).map_err(|_| invalid(op, arg, "offset >= 0", b.offset))?;
    let pitch = usize::try_from(b.pitch).map_err(|_| invalid(op, arg, "pitch >= 0", b.pitch))?;
    Ok(Block2d { offset, pitch })
}

/// Copies the `[rows, cols]` block `src_block` of `src` to `dst_block` of
/// `dst` on `stream` (`datatype` any ftnDataType_t; the blocks must not
/// overlap). Each pointer must hold its block: `(rows-1)*pitch + offset +
/// cols` elements.
///
/// Bad input (ftnInvalidArgument at the call, nothing enqueued): `stream`
/// NULL, stale or of another kind; `datatype` outside `ftnDataType_t`;
/// blocks that share an element (the same buffer with disjoint, e.g.
/// interleaved column, blocks is fine), a pitch below `cols` (for `rows >
/// 1`), negative offsets, pitches or dims, extents that overflow, `src` /
/// `dst` NULL for a non-empty block or not aligned to the element size.
/// `rows` or `cols` 0 is a no-op. Buffer lengths are trusted; faults on the
/// device come at synchronize.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ftn_copy_2d(
    stream: ftnStream_t,
    datatype: c_int,
    src: *const c_void,
    src_block: ftnBlock2d_t,
    dst: *mut c_void,
    dst_block: ftnBlock2d_t,
    rows: i64,
    cols: i64,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle contract.
        let s = unsafe { get::<ftnStream>(op, "stream", stream)? };
        let (r, c) = (dim(op, "rows", rows)?, dim(op, "cols", cols)?);
        let sa = block(op, "src_block", src_block)?;
        let da = block(op, "dst_block", dst_block)?;
        // SAFETY: pointer contracts.
        dispatch_dtype!(op, "datatype", datatype, T => unsafe { copy_t::<T>(op, s, (src, sa), (dst, da), r, c) })
    })
}
