//! Megatron-Core's tensor-parallel mapping primitives
//! (`ferrotron::parallel::mappings`) and the strided 2-D copy they are built
//! from (`ferrotron::ops::copy`).

use std::ffi::{c_int, c_void};

use ferrotron::comm::CommElement;
use ferrotron::parallel::mappings::Mapping;
use ferrotron::Result;

use crate::abi::args::{dim, mul, to_i64};
use crate::abi::boundary::{export, ftnResult_t};
use crate::abi::dtype::dispatch_dtype;
use crate::abi::enums::{c_enum, parse_enum};
use crate::abi::handles::{check_out, write_out};
use crate::abi::views::view;
use crate::comm::{call, ftnComm_t, Call};
use crate::parallel::common::tp_size;
use crate::runtime::ftnStream_t;

/// A mapping primitive: forward and backward are each other's duals.
/// Tensors are row-major `[rows, cols]`; "last dim" is `cols`, the
/// sequence-parallel "first dim" is `rows`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnMapping_t {
    /// Forward identity, backward all-reduce.
    ftnCopyToTp = 0,
    /// Forward all-reduce, backward identity.
    ftnReduceFromTp = 1,
    /// Forward split last dim, backward all-gather last dim.
    ftnScatterToTp = 2,
    /// Forward all-gather last dim, backward split last dim.
    ftnGatherFromTp = 3,
    /// Forward split first dim, backward all-gather first dim.
    ftnScatterToSp = 4,
    /// Forward all-gather first dim, backward reduce-scatter first dim.
    ftnGatherFromSp = 5,
    /// Forward reduce-scatter first dim, backward all-gather first dim.
    ftnReduceScatterToSp = 6,
}
c_enum!(
    ftnMapping_t: ftnCopyToTp,
    ftnReduceFromTp,
    ftnScatterToTp,
    ftnGatherFromTp,
    ftnScatterToSp,
    ftnGatherFromSp,
    ftnReduceScatterToSp,
);

fn mapping_of(op: &'static str, v: c_int) -> Result<Mapping> {
    use ftnMapping_t::*;
    Ok(match parse_enum(op, "mapping", v)? {
        ftnCopyToTp => Mapping::CopyToTp,
        ftnReduceFromTp => Mapping::ReduceFromTp,
        ftnScatterToTp => Mapping::ScatterToTp,
        ftnGatherFromTp => Mapping::GatherFromTp,
        ftnScatterToSp => Mapping::ScatterToSp,
        ftnGatherFromSp => Mapping::GatherFromSp,
        ftnReduceScatterToSp => Mapping::ReduceScatterToSp,
    })
}

/// Which direction of a mapping a call runs.
#[derive(Clone, Copy)]
enum Direction {
    Forward,
    Backward,
}

impl Direction {
    fn shape(self, m: Mapping, rows: usize, cols: usize, tp: usize) -> Result<(usize, usize)> {
        match self {
            Direction::Forward => m.forward_shape(rows, cols, tp),
            Direction::Backward => m.backward_shape(rows, cols, tp),
        }
    }

    /// The C names of the input and output pointers of this direction.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Direction::Forward => ("input", "output"),
            Direction::Backward => ("grad_output", "grad_input"),
        }
    }
}

/// Output shape of `mapping`'s forward (`backward == 0`) or backward
/// (non-zero) for an input of `[rows, cols]` on `tp` ranks.
///
/// Bad input (ftnInvalidArgument, nothing written): a split dimension that
/// is not a multiple of `tp` (e.g. a scatter of 7 columns over 2 ranks;
/// never truncated), `tp < 1`, negative dims, `rows * cols` or a gathered
/// dimension that overflows `int64_t`, `mapping` outside `ftnMapping_t`,
/// `out_rows` or `out_cols` NULL or misaligned. A shape with no element
/// is fine (its output shape is written).
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_mapping_shape(
    mapping: c_int,
    backward: c_int,
    rows: i64,
    cols: i64,
    tp: c_int,
    out_rows: *mut i64,
    out_cols: *mut i64,
) -> ftnResult_t {
    export!(|op| {
        let m = mapping_of(op, mapping)?;
        let (r, c) = (dim(op, "rows", rows)?, dim(op, "cols", cols)?);
        // A shape of more elements than int64_t counts describes no tensor.
        mul(op, "rows * cols", r, c)?;
        let tp = tp_size(op, tp)?;
        let dir = if backward != 0 {
            Direction::Backward
        } else {
            Direction::Forward
        };
        check_out(op, "out_rows", out_rows)?;
        check_out(op, "out_cols", out_cols)?;
        let (orows, ocols) = dir.shape(m, r, c, tp)?;
        let (orows, ocols) = (to_i64(op, "rows", orows)?, to_i64(op, "cols", ocols)?);
        // SAFETY: out-pointer contracts.
        unsafe {
            write_out(op, "out_rows", out_rows, orows)?;
            write_out(op, "out_cols", out_cols, ocols)
        }
    })
}

unsafe fn mapping_t<T: CommElement>(
    op: &'static str,
    c: &Call,
    (m, dir): (Mapping, Direction),
    input: *const c_void,
    output: *mut c_void,
    (rows, cols): (usize, usize),
) -> Result<()> {
    let tp = c.comm.size();
    let (in_name, out_name) = dir.names();
    let nin = mul(op, "rows * cols", rows, cols)?;
    let (orows, ocols) = dir.shape(m, rows, cols, tp)?;
    let nout = mul(op, out_name, orows, ocols)?;
    // SAFETY: pointer contracts: `[rows, cols]` in, the mapping's shape out.
    let (x, mut y) = unsafe {
        (
            view::<T>(&c.dev, op, in_name, input, nin)?,
            view::<T>(&c.dev, op, out_name, output, nout)?,
        )
    };
    match dir {
        Direction::Forward => m.forward(c.comm, c.stream, &x, &mut y, (rows, cols)),
        Direction::Backward => m.backward(c.comm, c.stream, &x, &mut y, (rows, cols)),
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn run_mapping(
    op: &'static str,
    dir: Direction,
    mapping_: c_int,
    input: *const c_void,
    output: *mut c_void,
    rows: i64,
    cols: i64,
    datatype: c_int,
    comm: ftnComm_t,
    stream: ftnStream_t,
) -> Result<()> {
    let m = mapping_of(op, mapping_)?;
    let c = call(op, comm, stream)?;
    let shape = (dim(op, "rows", rows)?, dim(op, "cols", cols)?);
    // SAFETY: pointer contracts.
    dispatch_dtype!(op, "datatype", datatype, T => unsafe { mapping_t::<T>(op, &c, (m, dir), input, output, shape) })
}

/// Forward of `mapping` on `stream`: `output = f(input)`, `input` `[rows,
/// cols]` on this rank, `output` of the shape `ftn_tp_mapping_shape` gives
/// (`input` and `output` must not overlap). Every rank of `comm` calls it.
///
/// Bad input (ftnInvalidArgument at the call, nothing enqueued): `input`
/// or `output` NULL with a non-empty shape (NULL is allowed only when the
/// shape has no element), misaligned, overlapping each other (`input ==
/// output` included), a split dimension that is not a multiple of the
/// communicator's size; NULL, stale or wrong-kind `comm` / `stream`;
/// `mapping` outside `ftnMapping_t`, `datatype` outside `ftnDataType_t`,
/// negative dims; `stream` of another device than `comm` is
/// ftnDeviceMismatch; a broken communicator is ftnBackendError. A shape
/// with no element still takes part in the mapping's collective, if any.
/// At synchronize, ftnBackendError: peers that never arrive (the
/// communicator's timeout) or are gone, ranks that disagree on the shape.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_mapping_forward(
    mapping: c_int,
    input: *const c_void,
    output: *mut c_void,
    rows: i64,
    cols: i64,
    datatype: c_int,
    comm: ftnComm_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: forwarded contracts.
        unsafe {
            run_mapping(
                op,
                Direction::Forward,
                mapping,
                input,
                output,
                rows,
                cols,
                datatype,
                comm,
                stream,
            )
        }
    })
}

/// Backward of `mapping` on `stream`: `grad_input = f'(grad_output)`,
/// `grad_output` `[rows, cols]` (shaped like the forward's output),
/// `grad_input` shaped like the forward's input. Bad input as for
/// `ftn_tp_mapping_forward`, reported against `grad_output` / `grad_input`.
#[no_mangle]
pub unsafe extern "C" fn ftn_tp_mapping_backward(
    mapping: c_int,
    grad_output: *const c_void,
    grad_input: *mut c_void,
    rows: i64,
    cols: i64,
    datatype: c_int,
    comm: ftnComm_t,
    stream: ftnStream_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: forwarded contracts.
        unsafe {
            run_mapping(
                op,
                Direction::Backward,
                mapping,
                grad_output,
                grad_input,
                rows,
                cols,
                datatype,
                comm,
                stream,
            )
        }
    })
}
