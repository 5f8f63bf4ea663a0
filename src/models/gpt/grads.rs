//! Adding a gradient in the model's type into an fp32 main gradient
//! (`main += g`), for the ops whose gradient output is not fused with an
//! fp32 accumulation (biases, LayerNorm gains): the GEMM's `beta = 1` fp32
//! epilogue with a `[1, 1]` matrix of one, `main[1, n] += 1 · g[1, n]` —
//! exact, since `1 · g` is.

use crate::backend::{Device, DeviceBuffer, DeviceWrite, Stream};
use crate::core::dtype::FloatElement;
use crate::core::Result;
use crate::ops::gemm::{Aux, Gemm, GemmInputs};

pub(crate) struct Accumulator<T: FloatElement> {
    one: DeviceBuffer<T>,
}

impl<T: FloatElement> Accumulator<T> {
    pub(crate) fn new(dev: &Device) -> Result<Self> {
        Ok(Accumulator {
            one: dev.upload(&[T::from_f64(1.0)])?,
        })
    }

    /// `main += g` (fp32), enqueued on `stream`; both `[n]`.
    pub(crate) fn add(
        &self,
        stream: &Stream,
        g: &DeviceBuffer<T>,
        main: &mut dyn DeviceWrite<f32>,
    ) -> Result<()> {
        Gemm::new(1, g.len(), 1).beta(1.0).run(
            stream,
            GemmInputs::<T, f32> {
                a: &self.one,
                b: g,
                bias: None,
                c: None,
            },
            Aux::None,
            main,
        )
    }
}
