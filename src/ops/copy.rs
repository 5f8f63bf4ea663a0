//! Strided 2-D copies (kernel: `cuda/copy.cu`): a `[rows, cols]` block of
//! one row-major matrix into another, each with its own row pitch and
//! starting element. The tensor-parallel mappings split and gather along the
//! last dimension with it.

use super::all_aligned16;
use crate::backend::{DeviceRead, DeviceWrite, Stream};
use crate::core::plan::copy as plan;
use crate::core::{Element, Error, Result};
use crate::kernel_params::FtnCopy2dParams;
use crate::kernels;

/// Where a `[rows, cols]` block lives inside a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block2d {
    /// Index of the block's first element.
    pub offset: usize,
    /// Elements between the starts of consecutive rows (>= cols).
    pub pitch: usize,
}

impl Block2d {
    /// Elements from the buffer's start to the end of a `[rows, cols]` block
    /// here (0 for an empty block); `None` on overflow.
    pub fn extent(&self, rows: usize, cols: usize) -> Option<usize> {
        if rows == 0 || cols == 0 {
            return Some(0);
        }
        (rows - 1)
            .checked_mul(self.pitch)
            .and_then(|v| v.checked_add(self.offset))
            .and_then(|v| v.checked_add(cols))
    }
}

const OP: &str = "copy_2d";

fn check<T: Element>(
    arg: &'static str,
    pitch_arg: &'static str,
    buf: &dyn DeviceRead<T>,
    b: Block2d,
    rows: usize,
    cols: usize,
) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    if b.pitch < cols {
        return Err(Error::invalid(
            OP,
            pitch_arg,
            format!("a pitch >= cols = {cols}"),
            b.pitch,
        ));
    }
    let last = b.extent(rows, cols).ok_or_else(|| {
        Error::invalid(OP, arg, "a block whose extent fits in usize", "an overflow")
    })?;
    if last > buf.len() {
        return Err(Error::invalid(
            OP,
            arg,
            format!(
                "a buffer of at least {last} elements for {rows}x{cols} at offset {} pitch {}",
                b.offset, b.pitch
            ),
            format!("{} elements", buf.len()),
        ));
    }
    Ok(())
}

/// Rejects a copy whose source and destination blocks share a byte: rows
/// of `row_bytes` bytes at `start + i * pitch` (`pitch >= row_bytes`, so
/// each block's rows are sorted and disjoint; a merge walk finds any
/// overlap in `O(rows)`, after an `O(1)` test of the two spans).
fn check_disjoint(
    (s, sp): (u64, u64),
    (d, dp): (u64, u64),
    rows: u64,
    row_bytes: u64,
) -> Result<()> {
    let span = |start: u64, pitch: u64| start..start + (rows - 1) * pitch + row_bytes;
    let (a, b) = (span(s, sp), span(d, dp));
    if a.end <= b.start || b.end <= a.start {
        return Ok(());
    }
    let (mut i, mut k) = (0, 0);
    while i < rows && k < rows {
        let (x, y) = (s + i * sp, d + k * dp);
        if x + row_bytes <= y {
            i += 1;
        } else if y + row_bytes <= x {
            k += 1;
        } else {
            return Err(Error::invalid(
                OP,
                "dst",
                "a block that does not overlap the source block",
                format!("row {k} overlapping source row {i}"),
            ));
        }
    }
    Ok(())
}

/// Copies the `[rows, cols]` block at `src_block` in `src` to `dst_block` in `dst`
/// (the blocks must not overlap: an error otherwise).
pub fn copy_2d<T: Element>(
    stream: &Stream,
    src: &dyn DeviceRead<T>,
    src_block: Block2d,
    dst: &mut dyn DeviceWrite<T>,
    dst_block: Block2d,
    rows: usize,
    cols: usize,
) -> Result<()> {
    stream.device().check_same(OP, "src", src.device())?;
    stream.device().check_same(OP, "dst", dst.device())?;
    check("src", "src_block.pitch", src, src_block, rows, cols)?;
    check("dst", "dst_block.pitch", dst, dst_block, rows, cols)?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    // A single row never steps by its pitch, which may then be anything
    // >= cols (even near usize::MAX): use cols so the byte pitches below stay
    // within the buffers (for rows > 1 the checks bound (rows-1) * pitch).
    let (src_block, dst_block) = if rows == 1 {
        let tight = |b: Block2d| Block2d { pitch: cols, ..b };
        (tight(src_block), tight(dst_block))
    } else {
        (src_block, dst_block)
    };
    let es = T::DTYPE.size() as u64;
    check_disjoint(
        (
            src.addr() + src_block.offset as u64 * es,
            src_block.pitch as u64 * es,
        ),
        (
            dst.addr() + dst_block.offset as u64 * es,
            dst_block.pitch as u64 * es,
        ),
        rows as u64,
        cols as u64 * es,
    )?;
    let (s, d) = (
        src.addr() + src_block.offset as u64 * es,
        dst.addr() + dst_block.offset as u64 * es,
    );
    let (row_bytes, sp, dp) = (
        cols as u64 * es,
        src_block.pitch as u64 * es,
        dst_block.pitch as u64 * es,
    );
    let (vec, cfg) = plan::plan(
        rows as u64,
        row_bytes,
        all_aligned16(&[s, d, row_bytes, sp, dp]),
    );
    let params = FtnCopy2dParams {
        dst: d as *mut _,
        src: s as *const _,
        rows: rows as i64,
        row_bytes: row_bytes as i64,
        dst_pitch: dp as i64,
        src_pitch: sp as i64,
        vec,
        reserved: 0,
    };
    stream.launch(kernels::COPY_2D_BYTES.only()?, cfg, params)
}
