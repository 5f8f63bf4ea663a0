//! Bias + GeLU forward and backward (kernels: `cuda/bias_gelu.cu`, oracle:
//! [`crate::reference::bias_gelu`]).
//!
//! ```no_run
//! use ferrotron::{Device, ops::{BiasGelu, Gelu}};
//! let dev = Device::emu();
//! let stream = dev.new_stream()?;
//! let x = dev.upload(&[0.5f32, -1.0, 2.0, 0.0, 1.0, -2.0])?;
//! let bias = dev.upload(&[0.1f32, 0.2, 0.3])?;
//! let mut y = dev.alloc_zeros::<f32>(6)?;
//! BiasGelu::new(2, 3).forward(&stream, &x, Some(&bias), &mut y)?;
//! println!("{:?}", y.to_host()?);
//! # Ok::<(), ferrotron::Error>(())
//! ```

use super::{all_aligned16, check_buffer};
use crate::backend::{DeviceRead, DeviceWrite, Stream};
use crate::core::dtype::FloatElement;
use crate::core::plan::bias_gelu as plan;
use crate::core::{validate, Result};
use crate::kernel_params::{FtnBiasGeluBwdParams, FtnBiasGeluFwdParams, FtnColumnSumParams};
use crate::kernels;

pub use crate::core::activation::Gelu;

/// Bias + GeLU over a row-major `[rows, cols]` matrix with a `[cols]` bias.
/// Any `rows, cols >= 0`; fp32, fp16 and bf16 storage, fp32 arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BiasGelu {
    pub rows: usize,
    pub cols: usize,
    pub gelu: Gelu,
    /// Use 128-bit accesses where the data allows (default). `false` forces
    /// the scalar path: for comparisons in benches and tests.
    pub vectorize: bool,
}

const FWD: &str = "bias_gelu_forward";
const BWD: &str = "bias_gelu_backward";

impl BiasGelu {
    /// `[rows, cols]` with Megatron's tanh GeLU.
    pub fn new(rows: usize, cols: usize) -> Self {
        BiasGelu {
            rows,
            cols,
            gelu: Gelu::Tanh,
            vectorize: true,
        }
    }

    pub fn with_gelu(self, gelu: Gelu) -> Self {
        BiasGelu { gelu, ..self }
    }

    pub fn with_vectorize(self, vectorize: bool) -> Self {
        BiasGelu { vectorize, ..self }
    }

    fn elements(&self, op: &'static str) -> Result<usize> {
        let n = validate::elements(op, self.rows, self.cols)?;
        if n > i64::MAX as usize {
            return Err(crate::Error::invalid(
                op,
                "rows * cols",
                "at most i64::MAX elements",
                n,
            ));
        }
        Ok(n)
    }

    /// `out = gelu(x + bias)`; `bias = None` gives plain GeLU.
    pub fn forward<T: FloatElement>(
        &self,
        stream: &Stream,
        x: &dyn DeviceRead<T>,
        bias: Option<&dyn DeviceRead<T>>,
        out: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        let n = self.elements(FWD)?;
        check_buffer(FWD, "x", stream, x, n)?;
        check_buffer(FWD, "out", stream, out, n)?;
        self.forward_unchecked(stream, x.addr(), bias, out.addr(), n)
    }

    /// `x = gelu(x + bias)` in place.
    pub fn forward_in_place<T: FloatElement>(
        &self,
        stream: &Stream,
        x: &mut dyn DeviceWrite<T>,
        bias: Option<&dyn DeviceRead<T>>,
    ) -> Result<()> {
        let n = self.elements(FWD)?;
        check_buffer(FWD, "x", stream, x, n)?;
        self.forward_unchecked(stream, x.addr(), bias, x.addr(), n)
    }

    fn forward_unchecked<T: FloatElement>(
        &self,
        stream: &Stream,
        x: u64,
        bias: Option<&dyn DeviceRead<T>>,
        out: u64,
        n: usize,
    ) -> Result<()> {
        if let Some(b) = bias {
            check_buffer(FWD, "bias", stream, b, self.cols)?;
        }
        if n == 0 {
            return Ok(());
        }
        let bias_addr = bias.map_or(0, |b| b.addr());
        let p = plan::forward(
            self.rows as u64,
            self.cols as u64,
            T::DTYPE.size(),
            self.vectorize && all_aligned16(&[x, out, bias_addr]),
        );
        let params = FtnBiasGeluFwdParams {
            out: out as *mut _,
            x: x as *const _,
            bias: bias_addr as *const _,
            rows: self.rows as i64,
            cols: self.cols as i64,
            gelu: self.gelu.code(),
            vec: p.vec,
        };
        stream.launch(kernels::BIAS_GELU_FWD.for_dtype(T::DTYPE)?, p.cfg, params)
    }

    /// `dx = dy * gelu'(x + bias)` and, if asked, `dbias` = column sums of
    /// `dx` (fp32 accumulation, deterministic: bitwise identical across runs).
    pub fn backward<T: FloatElement>(
        &self,
        stream: &Stream,
        dy: &dyn DeviceRead<T>,
        x: &dyn DeviceRead<T>,
        bias: Option<&dyn DeviceRead<T>>,
        dx: &mut dyn DeviceWrite<T>,
        dbias: Option<&mut dyn DeviceWrite<T>>,
    ) -> Result<()> {
        let n = self.elements(BWD)?;
        check_buffer(BWD, "dy", stream, dy, n)?;
        check_buffer(BWD, "dx", stream, dx, n)?;
        self.backward_unchecked(stream, dy.addr(), x, bias, dx.addr(), dbias, n)
    }

    /// As [`BiasGelu::backward`], overwriting `grad` (dy on entry) with dx.
    pub fn backward_in_place<T: FloatElement>(
        &self,
        stream: &Stream,
        grad: &mut dyn DeviceWrite<T>,
        x: &dyn DeviceRead<T>,
        bias: Option<&dyn DeviceRead<T>>,
        dbias: Option<&mut dyn DeviceWrite<T>>,
    ) -> Result<()> {
        let n = self.elements(BWD)?;
        check_buffer(BWD, "grad", stream, grad, n)?;
        self.backward_unchecked(stream, grad.addr(), x, bias, grad.addr(), dbias, n)
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_unchecked<T: FloatElement>(
        &self,
        stream: &Stream,
        dy: u64,
        x: &dyn DeviceRead<T>,
        bias: Option<&dyn DeviceRead<T>>,
        dx: u64,
        dbias: Option<&mut dyn DeviceWrite<T>>,
        n: usize,
    ) -> Result<()> {
        check_buffer(BWD, "x", stream, x, n)?;
        if let Some(b) = bias {
            check_buffer(BWD, "bias", stream, b, self.cols)?;
        }
        if let Some(db) = dbias.as_deref() {
            check_buffer(BWD, "dbias", stream, db, self.cols)?;
        }
        if n == 0 {
            // No rows: the bias gradient is zero.
            if let Some(db) = dbias {
                stream.fill_bytes(db, 0)?;
            }
            return Ok(());
        }
        let bias_addr = bias.map_or(0, |b| b.addr());
        let p = plan::backward(
            self.rows as u64,
            self.cols as u64,
            T::DTYPE.size(),
            self.vectorize && all_aligned16(&[dy, dx, x.addr(), bias_addr]),
        );
        let partial = match dbias.is_some() {
            true => {
                let bytes = validate::elements(BWD, p.chunks as usize, self.cols)?
                    .checked_mul(4)
                    .ok_or_else(|| {
                        crate::Error::invalid(
                            BWD,
                            "cols",
                            "a workspace that fits in memory",
                            self.cols,
                        )
                    })?;
                stream.workspace(bytes)?
            }
            false => 0,
        };
        let params = FtnBiasGeluBwdParams {
            dx: dx as *mut _,
            dy: dy as *const _,
            x: x.addr() as *const _,
            bias: bias_addr as *const _,
            dbias_partial: partial as *mut f32,
            rows: self.rows as i64,
            cols: self.cols as i64,
            rows_per_chunk: p.rows_per_chunk as i64,
            gelu: self.gelu.code(),
            vec: p.vec,
        };
        stream.launch(kernels::BIAS_GELU_BWD.for_dtype(T::DTYPE)?, p.cfg, params)?;
        if let Some(db) = dbias {
            let sum = FtnColumnSumParams {
                out: db.addr() as *mut _,
                partial: partial as *const f32,
                chunks: p.chunks as i64,
                cols: self.cols as i64,
            };
            stream.launch(
                kernels::COLUMN_SUM_PARTIALS.for_dtype(T::DTYPE)?,
                p.reduce_cfg,
                sum,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    /// A device-side assert fails the launch with the kernel name and the
    /// condition, is reported by synchronize, and the stream keeps working.
    #[test]
    fn device_assert_fails_the_launch_not_the_process() {
        let dev = Device::emu();
        let stream = dev.new_stream().unwrap();
        let x = dev.upload(&[1.0f32; 8]).unwrap();
        let mut y = dev.alloc_zeros::<f32>(8).unwrap();
        let bad = FtnBiasGeluFwdParams {
            out: y.addr() as *mut _,
            x: x.addr() as *const _,
            bias: core::ptr::null(),
            rows: 1,
            cols: 8,
            gelu: 0,
            vec: 3, // not 1 and not 16/sizeof(f32): the kernel asserts
        };
        stream
            .launch(
                kernels::BIAS_GELU_FWD.for_dtype(crate::DType::F32).unwrap(),
                crate::core::LaunchConfig::linear(1, 32),
                bad,
            )
            .unwrap();
        let err = stream.synchronize().unwrap_err().to_string();
        assert!(err.contains("ftn_bias_gelu_fwd_f32"), "{err}");
        assert!(err.contains("p.vec"), "{err}");
        BiasGelu::new(1, 8)
            .forward(&stream, &x, None, &mut y)
            .unwrap();
        stream.synchronize().unwrap();
        let v = y.to_host().unwrap();
        assert!((v[0] - 0.841192).abs() < 1e-5, "{v:?}");
    }
}
