//! Fused multi-tensor AdamW (kernels: `cuda/adam.cu`): one launch updates
//! fp32 master weights and their moments over a whole list of tensors,
//! unscales the gradients on the fly and writes an optional bf16 / fp16 model
//! copy in the same pass. Capturable: lr, the step counter, the unscale
//! factor and the found_inf flag live in device memory, so an overflowing
//! step is skipped on the device with no host synchronisation.
//!
//! The launch plan is the multi-tensor one (`core::plan::multi_tensor`: the
//! same chunk table and grid); the float64 oracle lives in `tests/adam.rs`;
//! what the op computes is in `docs/semantics.md` ("Fused AdamW").
//!
//! ```no_run
//! use ferrotron::Device;
//! use ferrotron::ops::adam::{AdamConfig, AdamScalars, AdamTensors, FusedAdam, Unscale};
//! use ferrotron::ops::multi_tensor::TensorRef;
//! use half::bf16;
//! let dev = Device::emu();
//! let stream = dev.new_stream()?;
//! let mut p = dev.upload(&[1.0f32, 2.0, 3.0])?;
//! let mut m = dev.alloc_zeros::<f32>(3)?;
//! let mut v = dev.alloc_zeros::<f32>(3)?;
//! let g = dev.upload(&[0.1f32, -0.2, 0.3])?;
//! let mut model = dev.alloc_zeros::<bf16>(3)?;
//! let found_inf = dev.alloc_zeros::<f32>(1)?;
//! let mut scalars = AdamScalars::new(&stream, 1e-3)?;
//! let mut adam = FusedAdam::new(AdamConfig::default())?;
//! let wd = ferrotron::ops::adam::default_weight_decay(&[&[3]], 0.01);
//! let (mut ps, mut ms, mut vs) = ([&mut p], [&mut m], [&mut v]);
//! let gs = [TensorRef::from(&g)];
//! let mut models = [(&mut model).into()];
//! let mut tensors = AdamTensors {
//!     params: &mut ps,
//!     exp_avg: &mut ms,
//!     exp_avg_sq: &mut vs,
//!     grads: &gs,
//!     model: Some(&mut models),
//!     weight_decay: &wd,
//! };
//! adam.step(&stream, &mut tensors, &mut scalars, Some(&found_inf), Unscale::None)?;
//! # Ok::<(), ferrotron::Error>(())
//! ```

use super::check_buffer;
use super::multi_tensor::{dtype_code, DeviceGradScaler, GradRef, TensorRef};
use crate::backend::{Device, DeviceBuffer, DeviceRead, DeviceWrite, Stream};
use crate::core::plan::multi_tensor as plan;
use crate::core::{Error, Result};
use crate::kernel_params::{
    FtnAdamParams, FtnAdamStepAdvanceParams, FTN_ADAM_DECOUPLED, FTN_ADAM_L2,
};
use crate::kernels;

const OP: &str = "FusedAdam";

/// How weight decay enters the update.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightDecayMode {
    /// AdamW: `p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)`.
    #[default]
    Decoupled,
    /// Adam with L2 regularisation: `g += wd * p` before the moments.
    L2,
}

/// The hyper-parameters fixed for the optimizer's life. `lr` is not here: it
/// lives on the device ([`AdamScalars`]) and has no default.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// `(beta1, beta2)`, each in `[0, 1)`. Default `(0.9, 0.999)`.
    pub betas: (f32, f32),
    /// `> 0`, finite. Default `1e-8`.
    pub eps: f32,
    pub mode: WeightDecayMode,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            betas: (0.9, 0.999),
            eps: 1e-8,
            mode: WeightDecayMode::Decoupled,
        }
    }
}

/// The default weight decay: Megatron's and the usual AdamW default.
pub const DEFAULT_WEIGHT_DECAY: f32 = 0.01;

/// The per-tensor weight decay of the usual recipe: `0` for tensors of at most
/// one dimension (biases, norm gains), `wd` for every other tensor.
pub fn default_weight_decay(shapes: &[&[usize]], wd: f32) -> Vec<f32> {
    shapes
        .iter()
        .map(|s| if s.len() <= 1 { 0.0 } else { wd })
        .collect()
}

/// The device scalars of the optimizer: `lr` (`f32`) and the number of steps
/// taken so far (`i32`; the next step uses `t = step + 1` in its bias
/// corrections). [`FusedAdam::step`] reads both on the device and advances
/// `step` on the device unless the step overflowed.
pub struct AdamScalars {
    lr: DeviceBuffer<f32>,
    step: DeviceBuffer<i32>,
}

impl std::fmt::Debug for AdamScalars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AdamScalars({:?})", self.lr.device())
    }
}

fn check_lr(lr: f32) -> Result<()> {
    if !lr.is_finite() {
        return Err(Error::invalid(
            OP,
            "lr",
            "a finite value",
            format!("{lr:?}"),
        ));
    }
    Ok(())
}

impl AdamScalars {
    /// Device scalars with `lr` and step 0, written on `stream`.
    pub fn new(stream: &Stream, lr: f32) -> Result<Self> {
        check_lr(lr)?;
        let dev = stream.device();
        let mut s = AdamScalars {
            lr: dev.alloc_zeros(1)?,
            step: dev.alloc_zeros(1)?,
        };
        s.set_lr(stream, lr)?;
        Ok(s)
    }

    /// Scalars over existing device memory (`[1]` f32 lr, `[1]` i32 step
    /// count), e.g. non-owning views of a C caller's pointers: the step
    /// reads and advances them in place. Errors: a length other than 1,
    /// buffers of two devices.
    pub fn from_buffers(lr: DeviceBuffer<f32>, step: DeviceBuffer<i32>) -> Result<Self> {
        for (arg, len) in [("lr", lr.len()), ("step", step.len())] {
            if len != 1 {
                return Err(Error::invalid(OP, arg, "a buffer of 1 element", len));
            }
        }
        lr.device()
            .check_same_as(OP, "step", step.device(), "`lr`")?;
        Ok(AdamScalars { lr, step })
    }

    /// Enqueues a new `lr` on `stream` (the schedule's value for the next step).
    pub fn set_lr(&mut self, stream: &Stream, lr: f32) -> Result<()> {
        check_lr(lr)?;
        stream.copy_from_host(&[lr], &mut self.lr)
    }

    /// Enqueues a new step count on `stream` (e.g. when resuming).
    pub fn set_step(&mut self, stream: &Stream, step: i32) -> Result<()> {
        if step < 0 {
            return Err(Error::invalid(OP, "step", "a count >= 0", step));
        }
        stream.copy_from_host(&[step], &mut self.step)
    }

    /// Waits for the device and returns the number of steps taken.
    pub fn step(&self) -> Result<i32> {
        Ok(self.step.to_host()?[0])
    }

    /// The device buffer holding lr (`[1]` f32), for callers that write it
    /// from another kernel.
    pub fn lr_buffer(&mut self) -> &mut DeviceBuffer<f32> {
        &mut self.lr
    }

    fn device(&self) -> &Device {
        self.lr.device()
    }
}

/// Where the gradients' unscale factor comes from.
#[derive(Clone, Copy, Debug, Default)]
pub enum Unscale<'a> {
    /// The gradients are already unscaled (factor 1).
    #[default]
    None,
    /// `inv_scale[0]` (`[1]` f32 on the device).
    Device(&'a dyn DeviceRead<f32>),
    /// `(1 / scale as f64) as f32` of the scaler's device state, as
    /// [`super::multi_tensor::MultiTensor::unscale_with_scaler`].
    Scaler(&'a DeviceGradScaler),
}

/// The lists of one step, all of the same length `n`, tensor `i` of each
/// list holding the same number of elements: fp32 master params, fp32 first
/// and second moments, gradients (fp32, fp16 or bf16), an optional model copy
/// written with the new params (bf16, fp16 or fp32), and the weight decay of
/// each tensor ([`default_weight_decay`]).
///
/// `P` is what the three fp32 lists hold: `DeviceBuffer<f32>` by default,
/// `DeviceSliceMut<f32>` for borrowed views, `dyn DeviceWrite<f32>` to mix.
pub struct AdamTensors<'s, 'a, P: DeviceWrite<f32> + ?Sized = DeviceBuffer<f32>> {
    pub params: &'s mut [&'a mut P],
    pub exp_avg: &'s mut [&'a mut P],
    pub exp_avg_sq: &'s mut [&'a mut P],
    pub grads: &'s [TensorRef<'a>],
    pub model: Option<&'s mut [GradRef<'a>]>,
    pub weight_decay: &'s [f32],
}

/// Device tables for one list (tensor descriptors, then chunks).
struct Tables {
    device: Device,
    key: Vec<u64>,
    words: DeviceBuffer<i64>,
    num_tensors: usize,
    num_chunks: usize,
    cfg: Option<crate::core::LaunchConfig>,
}

/// How many lists [`FusedAdam`] keeps tables for.
const CACHED_LISTS: usize = 8;
/// Words (8 bytes) of one `FtnAdamTensorDesc`.
const DESC_WORDS: usize = 8;

/// The fused AdamW optimizer step. Holds the config and the device tables
/// of the last few lists it saw, so a training loop passing the same tensors
/// every step uploads nothing after the first step.
pub struct FusedAdam {
    config: AdamConfig,
    cache: Vec<Tables>,
}

impl std::fmt::Debug for FusedAdam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FusedAdam({:?}, {} cached lists)",
            self.config,
            self.cache.len()
        )
    }
}

/// The AdamW optimizer: [`FusedAdam`] in its default (decoupled) mode.
pub type AdamW = FusedAdam;

impl FusedAdam {
    /// Validates `config`: betas in `[0, 1)`, eps finite and `> 0`.
    pub fn new(config: AdamConfig) -> Result<Self> {
        let (b1, b2) = config.betas;
        for (arg, b) in [("beta1", b1), ("beta2", b2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(Error::invalid(
                    OP,
                    arg,
                    "a value in [0, 1)",
                    format!("{b:?}"),
                ));
            }
        }
        if !(config.eps.is_finite() && config.eps > 0.0) {
            return Err(Error::invalid(
                OP,
                "eps",
                "a finite value > 0",
                format!("{:?}", config.eps),
            ));
        }
        Ok(FusedAdam {
            config,
            cache: Vec::new(),
        })
    }

    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// Validates the lists and returns the tensor-table key (8 words per
    /// tensor, the layout of `FtnAdamTensorDesc`) and the element counts.
    fn describe<P: DeviceWrite<f32> + ?Sized>(
        stream: &Stream,
        t: &AdamTensors<'_, '_, P>,
    ) -> Result<(Vec<u64>, Vec<u64>)> {
        let n = t.params.len();
        let lists = [
            ("exp_avg", t.exp_avg.len()),
            ("exp_avg_sq", t.exp_avg_sq.len()),
            ("grads", t.grads.len()),
            ("weight_decay", t.weight_decay.len()),
            ("model", t.model.as_ref().map_or(n, |m| m.len())),
        ];
        for (arg, len) in lists {
            if len != n {
                return Err(Error::invalid(
                    OP,
                    arg,
                    format!("a list of {n} entries (one per param)"),
                    format!("{len} entries"),
                ));
            }
        }
        let dev = stream.device();
        let mut key = Vec::with_capacity(DESC_WORDS * n);
        let mut numels = Vec::with_capacity(n);
        for i in 0..n {
            let len = t.params[i].len();
            dev.check_same(OP, "params", t.params[i].device())?;
            dev.check_same(OP, "exp_avg", t.exp_avg[i].device())?;
            dev.check_same(OP, "exp_avg_sq", t.exp_avg_sq[i].device())?;
            dev.check_same(OP, "grads", t.grads[i].device())?;
            let model = t.model.as_ref().map(|m| m[i].as_tensor());
            let mut lens = vec![
                ("exp_avg", t.exp_avg[i].len()),
                ("exp_avg_sq", t.exp_avg_sq[i].len()),
                ("grads", t.grads[i].len()),
            ];
            if let Some(m) = &model {
                dev.check_same(OP, "model", m.device())?;
                lens.push(("model", m.len()));
            }
            for (arg, l) in lens {
                if l != len {
                    return Err(Error::invalid(
                        OP,
                        arg,
                        format!("tensor {i} of {len} elements (as params[{i}])"),
                        format!("{l} elements"),
                    ));
                }
            }
            let wd = t.weight_decay[i];
            if !(wd.is_finite() && wd >= 0.0) {
                return Err(Error::invalid(
                    OP,
                    "weight_decay",
                    "finite values >= 0",
                    format!("{wd:?} for tensor {i}"),
                ));
            }
            let (model_addr, model_dtype) = model
                .as_ref()
                .map_or((0, 0), |m| (m.addr(), dtype_code(m) as u64));
            key.extend([
                t.params[i].addr(),
                t.exp_avg[i].addr(),
                t.exp_avg_sq[i].addr(),
                t.grads[i].addr(),
                model_addr,
                len as u64,
                wd.to_bits() as u64 | (dtype_code(&t.grads[i]) as u64) << 32,
                model_dtype,
            ]);
            numels.push(len as u64);
        }
        Ok((key, numels))
    }

    /// The (possibly cached) tables for a validated list.
    fn tables(&mut self, stream: &Stream, key: Vec<u64>, numels: &[u64]) -> Result<&Tables> {
        let hit = self
            .cache
            .iter()
            .position(|c| c.key == key && c.device.same(stream.device()));
        let idx = match hit {
            Some(i) => i,
            None => {
                let p = plan::plan(OP, numels)?;
                let mut words: Vec<i64> = key.iter().map(|&w| w as i64).collect();
                words.extend(
                    p.chunks
                        .iter()
                        .map(|c| (c.tensor as u64 | (c.chunk as u64) << 32) as i64),
                );
                if words.is_empty() {
                    words.push(0); // never read; keeps the buffer non-empty
                }
                let t = Tables {
                    device: stream.device().clone(),
                    num_tensors: numels.len(),
                    key,
                    words: stream.device().upload(&words)?,
                    num_chunks: p.chunks.len(),
                    cfg: p.cfg,
                };
                if self.cache.len() == CACHED_LISTS {
                    self.cache.remove(0);
                }
                self.cache.push(t);
                self.cache.len() - 1
            }
        };
        Ok(&self.cache[idx])
    }

    /// Enqueues one AdamW step over the lists on `stream` (two launches: the
    /// update, then the step counter), with `lr` and the step count read from
    /// `scalars` on the device. When `found_inf` is given and
    /// `found_inf[0] > 0` (as set by
    /// [`super::multi_tensor::MultiTensor::unscale`]; the predicate of
    /// [`DeviceGradScaler::update`]) nothing is written: params, moments and
    /// model copies keep their bits and the step count is not advanced. The
    /// gradients are read only, multiplied by the factor of `unscale`.
    /// Empty tensors and lists are fine (only the step count moves).
    pub fn step<P: DeviceWrite<f32> + ?Sized>(
        &mut self,
        stream: &Stream,
        tensors: &mut AdamTensors<'_, '_, P>,
        scalars: &mut AdamScalars,
        found_inf: Option<&dyn DeviceRead<f32>>,
        unscale: Unscale<'_>,
    ) -> Result<()> {
        stream
            .device()
            .check_same(OP, "scalars", scalars.device())?;
        if let Some(f) = found_inf {
            check_buffer(OP, "found_inf", stream, f, 1)?;
        }
        let (inv_scale, scaler) = match unscale {
            Unscale::None => (0, 0),
            Unscale::Device(b) => {
                check_buffer(OP, "inv_scale", stream, b, 1)?;
                (b.addr(), 0)
            }
            Unscale::Scaler(s) => {
                stream
                    .device()
                    .check_same(OP, "scaler", s.state().device())?;
                (0, s.state().addr())
            }
        };
        let (key, numels) = Self::describe(stream, tensors)?;
        let found = found_inf.map_or(0, |f| f.addr());
        let c = self.config;
        let t = self.tables(stream, key, &numels)?;
        if let Some(cfg) = t.cfg {
            let params = FtnAdamParams {
                tensors: t.words.addr() as *const _,
                chunks: (t.words.addr() + 8 * (DESC_WORDS * t.num_tensors) as u64) as *const _,
                lr: scalars.lr.addr() as *const f32,
                step: scalars.step.addr() as *const i32,
                found_inf: found as *const f32,
                inv_scale: inv_scale as *const f32,
                scaler: scaler as *const _,
                beta1: c.betas.0,
                beta2: c.betas.1,
                eps: c.eps,
                mode: match c.mode {
                    WeightDecayMode::Decoupled => FTN_ADAM_DECOUPLED,
                    WeightDecayMode::L2 => FTN_ADAM_L2,
                },
                num_chunks: t.num_chunks as i64,
                chunk_size: plan::CHUNK_SIZE as i64,
            };
            stream.launch(&kernels::FTN_ADAM, cfg, params)?;
        }
        let advance = FtnAdamStepAdvanceParams {
            step: scalars.step.addr() as *mut i32,
            found_inf: found as *const f32,
        };
        stream.launch(
            &kernels::FTN_ADAM_STEP_ADVANCE,
            plan::scaler_update(),
            advance,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_params::FtnAdamTensorDesc;

    #[test]
    fn table_layout_matches_the_header() {
        assert_eq!(core::mem::size_of::<FtnAdamTensorDesc>(), 8 * DESC_WORDS);
        assert_eq!(core::mem::offset_of!(FtnAdamTensorDesc, model), 32);
        assert_eq!(core::mem::offset_of!(FtnAdamTensorDesc, numel), 40);
        assert_eq!(core::mem::offset_of!(FtnAdamTensorDesc, weight_decay), 48);
        assert_eq!(core::mem::offset_of!(FtnAdamTensorDesc, g_dtype), 52);
        assert_eq!(core::mem::offset_of!(FtnAdamTensorDesc, model_dtype), 56);
    }

    #[test]
    fn default_weight_decay_skips_1d_tensors() {
        let wd = default_weight_decay(&[&[4, 3], &[3], &[], &[2, 2, 2]], 0.1);
        assert_eq!(wd, vec![0.1, 0.0, 0.0, 0.1]);
    }
}
