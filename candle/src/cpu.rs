//! Running ferrotron ops on candle's CPU storage: the shared emulator
//! device, contiguous slices of a storage, the dtype dispatch and errors.

use std::sync::OnceLock;

use candle_core::{CpuStorage, Layout, Result, WithDType};
use ferrotron::{Device, HostScope, Stream};

/// The process's emulator device and the stream every op runs on.
struct Emu {
    device: Device,
    stream: std::result::Result<Stream, String>,
}

fn emu() -> Result<(&'static Device, &'static Stream)> {
    static EMU: OnceLock<Emu> = OnceLock::new();
    let e = EMU.get_or_init(|| {
        let device = Device::emu();
        let stream = device.new_stream().map_err(|e| e.to_string());
        Emu { device, stream }
    });
    match &e.stream {
        Ok(s) => Ok((&e.device, s)),
        Err(m) => Err(candle_core::Error::Msg(format!(
            "ferrotron emulator stream: {m}"
        ))),
    }
}

/// A ferrotron error as a candle error (message kept).
pub(crate) fn ft(e: ferrotron::Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// Runs `f` with a host scope (views over candle's storage) and the
/// emulator's stream, then waits for the stream: when this returns, the
/// kernels have finished reading and writing the borrowed memory.
pub(crate) fn run<'env, R>(
    f: impl for<'scope> FnOnce(&'scope HostScope<'scope, 'env>, &Stream) -> ferrotron::Result<R>,
) -> Result<R> {
    let (device, stream) = emu()?;
    device
        .host_scope(|scope| {
            let r = f(scope, stream)?;
            stream.synchronize()?;
            Ok(r)
        })
        .map_err(ft)
}

/// The elements of a contiguous tensor, borrowed from its storage (zero
/// copies); a strided layout is an error naming `arg`.
pub(crate) fn slice<'a, T: WithDType>(
    op: &str,
    arg: &str,
    storage: &'a CpuStorage,
    layout: &Layout,
) -> Result<&'a [T]> {
    let all = storage.as_slice::<T>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&all[start..end]),
        None => Err(candle_core::Error::Msg(format!(
            "{op}: `{arg}` must be contiguous (call .contiguous() first), got strides {:?}",
            layout.stride()
        ))),
    }
}

/// The size of the last dimension (the row length the ops work on).
pub(crate) fn last_dim(op: &str, arg: &str, layout: &Layout) -> Result<usize> {
    layout.dims().last().copied().ok_or_else(|| {
        candle_core::Error::Msg(format!("{op}: `{arg}` must have at least one dimension"))
    })
}

/// Checks that `arg` holds exactly `n` elements.
pub(crate) fn expect_len(op: &str, arg: &str, layout: &Layout, n: usize) -> Result<()> {
    let got = layout.shape().elem_count();
    if got != n {
        return Err(candle_core::Error::Msg(format!(
            "{op}: `{arg}` must hold {n} elements, got shape {:?}",
            layout.dims()
        )));
    }
    Ok(())
}

/// `rows` of `cols` elements in `n` (0 rows when `cols` is 0).
pub(crate) fn rows(n: usize, cols: usize) -> usize {
    n.checked_div(cols).unwrap_or(0)
}

/// `with_float!(op, dtype, T => body)`: `body` with `T` the fp32, fp16 or
/// bf16 element type of `dtype`; other dtypes are an error naming `op`.
macro_rules! with_float {
    ($op:expr, $dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $t = f32;
                $body
            }
            candle_core::DType::F16 => {
                type $t = half::f16;
                $body
            }
            candle_core::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            d => Err(candle_core::Error::Msg(format!(
                "{}: dtype {d:?} is not supported (f32, f16 or bf16)",
                $op
            ))),
        }
    };
}
pub(crate) use with_float;

/// A zeroed vector of `n` elements.
pub(crate) fn zeros<T: bytemuck::Zeroable + Clone>(n: usize) -> Vec<T> {
    vec![T::zeroed(); n]
}
