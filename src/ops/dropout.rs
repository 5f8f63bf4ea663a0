//! Fused bias + dropout + residual add (Megatron's `bias_dropout_add`),
//! forward and backward (kernels: `cuda/dropout.cu`, oracle:
//! [`crate::reference::dropout`], RNG: [`crate::core::philox`], streams:
//! [`crate::core::rng::RngTracker`]).
//!
//! The keep-mask is never stored: it is a pure function of the call's
//! [`PhiloxState`] `(seed, offset)` and the element index, and the backward
//! regenerates it bit for bit from the same state.
//!
//! ```no_run
//! use ferrotron::{Device, core::rng::{RngTracker, DEFAULT_STREAM}};
//! use ferrotron::ops::{BiasDropoutAdd, DropoutMode};
//! let dev = Device::emu();
//! let stream = dev.new_stream()?;
//! let mut rng = RngTracker::megatron(1234, 0);
//! let x = dev.upload(&[0.5f32, -1.0, 2.0, 0.0, 1.0, -2.0])?;
//! let bias = dev.upload(&[0.1f32, 0.2, 0.3])?;
//! let residual = dev.upload(&[1.0f32; 6])?;
//! let mut y = dev.alloc_zeros::<f32>(6)?;
//! let op = BiasDropoutAdd::new(2, 3, 0.1);
//! let state = rng.next(DEFAULT_STREAM, op.random_values())?;
//! op.forward(&stream, &x, Some(&bias), &residual, &mut y, DropoutMode::Train(state))?;
//! // Backward: the same `state` regenerates the mask.
//! # Ok::<(), ferrotron::Error>(())
//! ```

use super::{all_aligned16, check_buffer};
use crate::backend::{DeviceRead, DeviceWrite, Stream};
use crate::core::dtype::FloatElement;
use crate::core::plan::bias_gelu as plan;
use crate::core::{philox, validate, Error, LaunchConfig, Result};
use crate::kernel_params::{
    FtnBiasDropoutAddBwdParams, FtnBiasDropoutAddFwdParams, FtnColumnSumParams, FtnPhiloxFillParams,
};
use crate::kernels;

pub use crate::core::rng::PhiloxState;

/// Training (dropout with the call's Philox position) or evaluation (no
/// dropout: `out = residual + x + bias`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropoutMode {
    Train(PhiloxState),
    Eval,
}

/// `out = residual + dropout(x + bias, p)` over a row-major `[rows, cols]`
/// matrix with a `[cols]` bias; kept elements are scaled by `1/(1-p)`.
/// Any `rows, cols >= 0`; fp32, fp16 and bf16 storage, fp32 arithmetic.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BiasDropoutAdd {
    pub rows: usize,
    pub cols: usize,
    /// Drop probability, in `[0, 1)`.
    pub p: f32,
    /// Use 128-bit accesses where the data allows (default). `false` forces
    /// the scalar path: for comparisons in benches and tests.
    pub vectorize: bool,
}

const FWD: &str = "bias_dropout_add_forward";
const BWD: &str = "bias_dropout_add_backward";
const FILL: &str = "philox_fill";

/// What the kernels receive for a mode: `(seed, offset, drop_threshold, scale)`.
struct MaskArgs {
    seed: u64,
    offset: u64,
    threshold: u32,
    scale: f32,
}

impl BiasDropoutAdd {
    pub fn new(rows: usize, cols: usize, p: f32) -> Self {
        BiasDropoutAdd {
            rows,
            cols,
            p,
            vectorize: true,
        }
    }

    pub fn with_vectorize(self, vectorize: bool) -> Self {
        BiasDropoutAdd { vectorize, ..self }
    }

    /// Random values one training call consumes from its stream before
    /// rounding: `rows * cols` (pass it to [`crate::core::rng::RngTracker::next`]).
    pub fn random_values(&self) -> u64 {
        (self.rows as u64).saturating_mul(self.cols as u64)
    }

    fn elements(&self, op: &'static str) -> Result<usize> {
        let n = validate::elements(op, self.rows, self.cols)?;
        if n > i64::MAX as usize {
            return Err(Error::invalid(
                op,
                "rows * cols",
                "at most i64::MAX elements",
                n,
            ));
        }
        Ok(n)
    }

    fn mask_args(&self, op: &'static str, mode: DropoutMode, n: usize) -> Result<MaskArgs> {
        if !(0.0..1.0).contains(&self.p) {
            return Err(Error::invalid(op, "p", "a probability in [0, 1)", self.p));
        }
        Ok(match mode {
            DropoutMode::Eval => MaskArgs {
                seed: 0,
                offset: 0,
                threshold: 0,
                scale: 1.0,
            },
            DropoutMode::Train(s) => {
                if s.offset.checked_add(n as u64).is_none() {
                    return Err(Error::invalid(
                        op,
                        "offset",
                        "offset + rows * cols within the stream's 2^64 values",
                        alloc::format!("{} + {n}", s.offset),
                    ));
                }
                MaskArgs {
                    seed: s.seed,
                    offset: s.offset,
                    threshold: philox::drop_threshold(self.p),
                    scale: (1.0 / (1.0 - self.p as f64)) as f32,
                }
            }
        })
    }

    /// `out = residual + keep * (x + bias) / (1 - p)`; `bias = None` drops
    /// the bias, [`DropoutMode::Eval`] the dropout.
    pub fn forward<T: FloatElement>(
        &self,
        stream: &Stream,
        x: &dyn DeviceRead<T>,
        bias: Option<&dyn DeviceRead<T>>,
        residual: &dyn DeviceRead<T>,
        out: &mut dyn DeviceWrite<T>,
        mode: DropoutMode,
    ) -> Result<()> {
        let n = self.elements(FWD)?;
        check_buffer(FWD, "x", stream, x, n)?;
        check_buffer(FWD, "residual", stream, residual, n)?;
        check_buffer(FWD, "out", stream, out, n)?;
        if let Some(b) = bias {
            check_buffer(FWD, "bias", stream, b, self.cols)?;
        }
        let m = self.mask_args(FWD, mode, n)?;
        if n == 0 {
            return Ok(());
        }
        let bias_addr = bias.map_or(0, |b| b.addr());
        let p = plan::elementwise(
            self.rows as u64,
            self.cols as u64,
            T::DTYPE.size(),
            self.vectorize && all_aligned16(&[x.addr(), residual.addr(), out.addr(), bias_addr]),
            1,
        );
        let params = FtnBiasDropoutAddFwdParams {
            out: out.addr() as *mut _,
            x: x.addr() as *const _,
            bias: bias_addr as *const _,
            residual: residual.addr() as *const _,
            rows: self.rows as i64,
            cols: self.cols as i64,
            seed: m.seed,
            offset: m.offset,
            drop_threshold: m.threshold,
            scale: m.scale,
            vec: p.vec,
        };
        stream.launch(
            kernels::BIAS_DROPOUT_ADD_FWD.for_dtype(T::DTYPE)?,
            p.cfg,
            params,
        )
    }

    /// `dx = keep * d_out / (1 - p)` with the forward's mask (pass the same
    /// `mode`); `d_residual = d_out` (written only when asked: it is `d_out`
    /// itself); `dbias` = column sums of `dx` (fp32 accumulation,
    /// deterministic: bitwise identical across runs).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: FloatElement>(
        &self,
        stream: &Stream,
        d_out: &dyn DeviceRead<T>,
        dx: &mut dyn DeviceWrite<T>,
        d_residual: Option<&mut dyn DeviceWrite<T>>,
        dbias: Option<&mut dyn DeviceWrite<T>>,
        mode: DropoutMode,
    ) -> Result<()> {
        let n = self.elements(BWD)?;
        check_buffer(BWD, "d_out", stream, d_out, n)?;
        check_buffer(BWD, "dx", stream, dx, n)?;
        if let Some(dr) = d_residual.as_deref() {
            check_buffer(BWD, "d_residual", stream, dr, n)?;
        }
        if let Some(db) = dbias.as_deref() {
            check_buffer(BWD, "dbias", stream, db, self.cols)?;
        }
        let m = self.mask_args(BWD, mode, n)?;
        if n == 0 {
            if let Some(db) = dbias {
                stream.fill_bytes(db, 0)?;
            }
            return Ok(());
        }
        let dres_addr = d_residual.map_or(0, |b| b.addr());
        let p = plan::backward(
            self.rows as u64,
            self.cols as u64,
            T::DTYPE.size(),
            self.vectorize && all_aligned16(&[d_out.addr(), dx.addr(), dres_addr]),
        );
        let partial = match dbias.is_some() {
            true => {
                let bytes = validate::elements(BWD, p.chunks as usize, self.cols)?
                    .checked_mul(4)
                    .ok_or_else(|| {
                        Error::invalid(BWD, "cols", "a workspace that fits in memory", self.cols)
                    })?;
                stream.workspace(bytes)?
            }
            false => 0,
        };
        let params = FtnBiasDropoutAddBwdParams {
            dx: dx.addr() as *mut _,
            d_residual: dres_addr as *mut _,
            dy: d_out.addr() as *const _,
            dbias_partial: partial as *mut f32,
            rows: self.rows as i64,
            cols: self.cols as i64,
            rows_per_chunk: p.rows_per_chunk as i64,
            seed: m.seed,
            offset: m.offset,
            drop_threshold: m.threshold,
            scale: m.scale,
            vec: p.vec,
        };
        stream.launch(
            kernels::BIAS_DROPOUT_ADD_BWD.for_dtype(T::DTYPE)?,
            p.cfg,
            params,
        )?;
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

/// Writes random values `offset .. offset + out.len()` of Philox stream
/// `seed` (raw bits, as `i32`) with the device's Philox: the twin of
/// [`crate::core::philox::value`], for tests.
pub fn philox_fill(
    stream: &Stream,
    state: PhiloxState,
    out: &mut dyn DeviceWrite<i32>,
) -> Result<()> {
    stream.device().check_same(FILL, "out", out.device())?;
    let n = out.len();
    if n == 0 {
        return Ok(());
    }
    let blocks = n.div_ceil(256).min(1024) as u32;
    let params = FtnPhiloxFillParams {
        out: out.addr() as *mut i32,
        n: n as i64,
        seed: state.seed,
        offset: state.offset,
    };
    stream.launch(
        kernels::PHILOX_FILL.for_dtype(crate::DType::I32)?,
        LaunchConfig::linear(blocks, 256),
        params,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn every_plan_has_a_stamped_kernel() {
        for d in [DType::F32, DType::F16, DType::BF16] {
            kernels::BIAS_DROPOUT_ADD_FWD.for_dtype(d).unwrap();
            kernels::BIAS_DROPOUT_ADD_BWD.for_dtype(d).unwrap();
            kernels::COLUMN_SUM_PARTIALS.for_dtype(d).unwrap();
        }
        kernels::PHILOX_FILL.for_dtype(DType::I32).unwrap();
    }
}
