//! Megatron-Core's tensor-parallel mapping primitives (`mappings.py`): small
//! named operations whose forward and backward communications are each
//! other's duals. Tensors are row-major `[rows, cols]`; "last dim" is `cols`,
//! the sequence-parallel "first dim" is `rows`. With one rank every mapping
//! is a copy.
//!
//! | mapping | forward | backward |
//! | --- | --- | --- |
//! | `CopyToTp` | identity | all-reduce |
//! | `ReduceFromTp` | all-reduce | identity |
//! | `ScatterToTp` | split last dim | all-gather last dim |
//! | `GatherFromTp` | all-gather last dim | split last dim |
//! | `ScatterToSp` | split first dim | all-gather first dim |
//! | `GatherFromSp` | all-gather first dim | reduce-scatter first dim |
//! | `ReduceScatterToSp` | reduce-scatter first dim | all-gather first dim |

use crate::backend::{DeviceBuffer, DeviceRead, DeviceWrite, Stream};
use crate::comm::{CommElement, Communicator, ReduceOp};
use crate::core::{Error, Result};
use crate::ops::copy::{copy_2d, Block2d};

/// One mapping primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mapping {
    CopyToTp,
    ReduceFromTp,
    ScatterToTp,
    GatherFromTp,
    ScatterToSp,
    GatherFromSp,
    ReduceScatterToSp,
}

/// What one direction of a mapping does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Identity,
    AllReduce,
    SplitLast,
    GatherLast,
    SplitFirst,
    GatherFirst,
    ReduceScatterFirst,
}

impl Step {
    /// `(rows, cols)` of the output for an input of `(rows, cols)` on `tp`
    /// ranks; an error (never a truncated shape) when a split dimension is
    /// not a multiple of `tp`, `tp` is 0, or a grown one overflows.
    fn out_shape(self, rows: usize, cols: usize, tp: usize) -> Result<(usize, usize)> {
        if tp == 0 {
            return Err(Error::invalid(OP, "tp", "a tensor-parallel size >= 1", 0));
        }
        let split = |arg: &'static str, v: usize| {
            if v % tp == 0 {
                Ok(v / tp)
            } else {
                Err(Error::invalid(
                    OP,
                    arg,
                    format!("a multiple of the tensor-parallel size {tp} for {self:?}"),
                    v,
                ))
            }
        };
        let grow = |arg: &'static str, v: usize| {
            v.checked_mul(tp).ok_or_else(|| {
                Error::invalid(
                    OP,
                    arg,
                    format!(
                        "a size whose product with the tensor-parallel size {tp} fits in usize"
                    ),
                    v,
                )
            })
        };
        Ok(match self {
            Step::Identity | Step::AllReduce => (rows, cols),
            Step::SplitLast => (rows, split("cols", cols)?),
            Step::GatherLast => (rows, grow("cols", cols)?),
            Step::SplitFirst | Step::ReduceScatterFirst => (split("rows", rows)?, cols),
            Step::GatherFirst => (grow("rows", rows)?, cols),
        })
    }
}

impl Mapping {
    fn steps(self) -> (Step, Step) {
        match self {
            Mapping::CopyToTp => (Step::Identity, Step::AllReduce),
            Mapping::ReduceFromTp => (Step::AllReduce, Step::Identity),
            Mapping::ScatterToTp => (Step::SplitLast, Step::GatherLast),
            Mapping::GatherFromTp => (Step::GatherLast, Step::SplitLast),
            Mapping::ScatterToSp => (Step::SplitFirst, Step::GatherFirst),
            Mapping::GatherFromSp => (Step::GatherFirst, Step::ReduceScatterFirst),
            Mapping::ReduceScatterToSp => (Step::ReduceScatterFirst, Step::GatherFirst),
        }
    }

    /// Output shape of the forward for an input `[rows, cols]`: an error
    /// when a split dimension is not a multiple of `tp` (never truncated),
    /// `tp` is 0, or a gathered dimension overflows.
    pub fn forward_shape(self, rows: usize, cols: usize, tp: usize) -> Result<(usize, usize)> {
        self.steps().0.out_shape(rows, cols, tp)
    }

    /// Output shape of the backward for a gradient `[rows, cols]` (shaped
    /// like the forward's output): the forward's input shape. Errors as
    /// [`forward_shape`](Self::forward_shape).
    pub fn backward_shape(self, rows: usize, cols: usize, tp: usize) -> Result<(usize, usize)> {
        self.steps().1.out_shape(rows, cols, tp)
    }

    /// Forward: `output = f(input)`, `input` is `[rows, cols]` on this rank.
    /// Every rank of `comm` must call it. Returns when enqueued on `stream`.
    pub fn forward<T: CommElement>(
        self,
        comm: &Communicator,
        stream: &Stream,
        input: &dyn DeviceRead<T>,
        output: &mut dyn DeviceWrite<T>,
        (rows, cols): (usize, usize),
    ) -> Result<()> {
        run(
            self.steps().0,
            ("input", "output"),
            comm,
            stream,
            input,
            output,
            rows,
            cols,
        )
    }

    /// Backward: `grad_input = f'(grad_output)`, `grad_output` shaped like the
    /// forward's output, `[rows, cols]` here.
    pub fn backward<T: CommElement>(
        self,
        comm: &Communicator,
        stream: &Stream,
        grad_output: &dyn DeviceRead<T>,
        grad_input: &mut dyn DeviceWrite<T>,
        (rows, cols): (usize, usize),
    ) -> Result<()> {
        run(
            self.steps().1,
            ("grad_output", "grad_input"),
            comm,
            stream,
            grad_output,
            grad_input,
            rows,
            cols,
        )
    }
}

const OP: &str = "tensor-parallel mapping";

#[allow(clippy::too_many_arguments)]
fn run<T: CommElement>(
    step: Step,
    (in_name, out_name): (&'static str, &'static str),
    comm: &Communicator,
    stream: &Stream,
    input: &dyn DeviceRead<T>,
    output: &mut dyn DeviceWrite<T>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    comm.device()
        .check_same_as(OP, "stream", stream.device(), "the communicator")?;
    let tp = comm.size();
    let n = rows.checked_mul(cols).ok_or_else(|| {
        Error::invalid(
            OP,
            "rows * cols",
            "a product that fits in usize",
            "an overflow",
        )
    })?;
    if input.len() != n {
        return Err(Error::invalid(
            OP,
            in_name,
            format!("exactly {rows}x{cols} = {n} elements"),
            input.len(),
        ));
    }
    let (orows, ocols) = step.out_shape(rows, cols, tp)?;
    let on = orows
        .checked_mul(ocols)
        .ok_or_else(|| Error::invalid(OP, out_name, "a size that fits in usize", "an overflow"))?;
    if output.len() != on {
        return Err(Error::invalid(
            OP,
            out_name,
            format!("exactly {orows}x{ocols} = {on} elements ({step:?} on {tp} ranks)"),
            output.len(),
        ));
    }
    let bytes = |b: &dyn DeviceRead<T>| b.addr()..b.addr() + (b.len() * T::DTYPE.size()) as u64;
    let (bi, bo) = (bytes(input), bytes(output.as_read()));
    if n > 0 && on > 0 && bi.start < bo.end && bo.start < bi.end {
        return Err(Error::invalid(
            OP,
            out_name,
            format!("a buffer that does not overlap `{in_name}`"),
            format!(
                "bytes {:#x}..{:#x} overlapping {in_name}'s {:#x}..{:#x}",
                bo.start, bo.end, bi.start, bi.end
            ),
        ));
    }
    let r = comm.rank();
    let whole = |pitch| Block2d { offset: 0, pitch };
    match step {
        Step::Identity => stream.copy_device(input, output),
        Step::AllReduce => comm
            .all_reduce(stream, input, output, ReduceOp::Sum)
            .map(drop),
        Step::SplitLast => copy_2d(
            stream,
            input,
            Block2d {
                offset: r * ocols,
                pitch: cols,
            },
            output,
            whole(ocols),
            rows,
            ocols,
        ),
        Step::SplitFirst => copy_2d(
            stream,
            input,
            Block2d {
                offset: r * orows * cols,
                pitch: cols,
            },
            output,
            whole(cols),
            orows,
            cols,
        ),
        Step::GatherFirst => comm.all_gather(stream, input, output).map(drop),
        Step::ReduceScatterFirst => comm
            .reduce_scatter(stream, input, output, ReduceOp::Sum)
            .map(drop),
        Step::GatherLast => {
            if tp == 1 {
                return stream.copy_device(input, output);
            }
            // All-gather into the stream's scratch memory as [tp, rows, cols],
            // then interleave into [rows, tp*cols]; all in stream order.
            let bytes = on * T::DTYPE.size();
            // SAFETY: the workspace holds `bytes` bytes (256-byte aligned) and
            // is used only by work on this stream, in order; the view frees
            // nothing.
            let mut staged = unsafe {
                DeviceBuffer::<T>::from_raw_parts(stream.device(), stream.workspace(bytes)?, on)?
            };
            comm.all_gather(stream, input, &mut staged)?;
            for k in 0..tp {
                copy_2d(
                    stream,
                    &staged,
                    Block2d {
                        offset: k * n,
                        pitch: cols,
                    },
                    output,
                    Block2d {
                        offset: k * cols,
                        pitch: ocols,
                    },
                    rows,
                    cols,
                )?;
            }
            Ok(())
        }
    }
}
