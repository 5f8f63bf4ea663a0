//! Typed ops: validate every argument, pick a plan from [`crate::core::plan`],
//! fill the kernel's parameter struct, enqueue it on a stream.

pub mod adam;
pub mod bias_gelu;
pub mod copy;
pub mod dropout;
pub mod gemm;
pub mod gemm_provider;
pub mod gemm_sm90;
pub mod layernorm;
pub mod multi_tensor;
pub mod softmax;
pub mod vocab_parallel;

pub use adam::{AdamW, FusedAdam};
pub use bias_gelu::{BiasGelu, Gelu};
pub use dropout::{BiasDropoutAdd, DropoutMode};
pub use gemm::{Aux, BiasGrad, Epilogue, Gemm, GemmInputs};
pub use gemm_provider::GemmProvider;
pub use layernorm::{LayerNorm, RmsNorm};
pub use softmax::{ScaleMaskSoftmax, SoftmaxMask};

use crate::backend::{DeviceRead, Stream};
use crate::core::{validate, Element, Result};

/// Checks that `buf` lives on the stream's device and holds exactly `len`
/// elements.
pub(crate) fn check_buffer<T: Element>(
    op: &'static str,
    arg: &'static str,
    stream: &Stream,
    buf: &dyn DeviceRead<T>,
    len: usize,
) -> Result<()> {
    stream.device().check_same(op, arg, buf.device())?;
    if buf.len() != len {
        return Err(crate::Error::invalid(
            op,
            arg,
            format!("exactly {len} elements"),
            format!("a buffer of {} elements", buf.len()),
        ));
    }
    Ok(())
}

/// True when every address is 16-byte aligned (128-bit access is legal).
pub(crate) fn all_aligned16(addrs: &[u64]) -> bool {
    addrs.iter().all(|&a| validate::is_aligned(a as usize, 16))
}
