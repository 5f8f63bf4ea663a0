//! Kernel ops: `size`-prefixed descriptors, raw pointers, a stream; and
//! what the op families share (the GeLU enum, 2-D shapes, the stream).

pub(crate) mod adam;
pub(crate) mod bias_gelu;
pub(crate) mod copy;
pub(crate) mod gemm;
pub(crate) mod grad_scaler;
pub(crate) mod layernorm;
pub(crate) mod multi_tensor;
pub(crate) mod softmax;

use ferrotron::ops::Gelu;
use ferrotron::{Device, Result};

use crate::abi::args::{dim, mul};
use crate::abi::enums::{c_enum, parse_enum};
use crate::abi::handles::get;
use crate::runtime::{ftnStream, ftnStream_t};

/// GeLU flavours (`ftnBiasGeluDesc_t.gelu`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnGelu_t {
    /// Megatron's tanh approximation.
    ftnGeluTanh = 0,
    /// Exact: `0.5 x (1 + erf(x / sqrt 2))` (PyTorch's default).
    ftnGeluErf = 1,
}
c_enum!(ftnGelu_t: ftnGeluTanh, ftnGeluErf);

pub(crate) fn gelu_of(op: &'static str, g: i32) -> Result<Gelu> {
    Ok(match parse_enum(op, "desc.gelu", g)? {
        ftnGelu_t::ftnGeluTanh => Gelu::Tanh,
        ftnGelu_t::ftnGeluErf => Gelu::Erf,
    })
}

struct Shape {
    rows: usize,
    cols: usize,
    n: usize,
}

fn shape(op: &'static str, rows: i64, cols: i64, cols_name: &'static str) -> Result<Shape> {
    let rows_u = dim(op, "desc.rows", rows)?;
    let cols_u = dim(op, cols_name, cols)?;
    let n = mul(op, "desc.rows * cols", rows_u, cols_u)?;
    Ok(Shape {
        rows: rows_u,
        cols: cols_u,
        n,
    })
}

pub(crate) fn stream_of<'a>(
    op: &'static str,
    stream: ftnStream_t,
) -> Result<(&'a ftnStream, Device)> {
    // SAFETY: handle contract of every exported function.
    let s = unsafe { get::<ftnStream>(op, "stream", stream)? };
    let dev = s.stream.device().clone();
    Ok((s, dev))
}
