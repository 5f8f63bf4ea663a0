//! Multi-tensor ops over lists of gradients of mixed dtypes, each ONE launch
//! (kernels: `cuda/multi_tensor.cu`, oracle: [`crate::reference::multi_tensor`]):
//! loss unscaling with a device found_inf flag, the global L2 norm, and
//! clipping by it; plus [`DeviceGradScaler`], Megatron's `DynamicGradScaler`
//! stepped on the device so a training step never waits for the host.
//!
//! ```no_run
//! use ferrotron::Device;
//! use ferrotron::core::loss_scaler::GradScalerConfig;
//! use ferrotron::ops::multi_tensor::{DeviceGradScaler, GradRef, MultiTensor};
//! use half::bf16;
//! let dev = Device::emu();
//! let stream = dev.new_stream()?;
//! let mut w = dev.upload(&[1.0f32, 2.0, 3.0])?;
//! let mut b = dev.upload(&[bf16::from_f32(4.0)])?;
//! let mut found_inf = dev.alloc_zeros::<f32>(1)?;
//! let mut norm = dev.alloc_zeros::<f32>(1)?;
//! let mut scaler = DeviceGradScaler::new(&dev, GradScalerConfig::default())?;
//! let mut mt = MultiTensor::new();
//! let mut grads = [GradRef::from(&mut w), GradRef::from(&mut b)];
//! mt.unscale_with_scaler(&stream, &mut grads, &scaler, &mut found_inf)?;
//! mt.clip_grad_norm(&stream, &mut grads, 1.0, &mut norm)?;
//! scaler.update(&stream, &mut found_inf, true)?; // also clears found_inf
//! # Ok::<(), ferrotron::Error>(())
//! ```

use half::{bf16, f16};

use super::{all_aligned16, check_buffer};
use crate::backend::{
    Device, DeviceBuffer, DeviceRead, DeviceSlice, DeviceSliceMut, DeviceWrite, Stream,
};
use crate::core::loss_scaler::{DynamicGradScaler, GradScalerConfig};
use crate::core::plan::multi_tensor as plan;
use crate::core::{DType, Error, Result};
use crate::kernel_params::{
    FtnGradScalerUpdateParams, FtnMultiTensorClipParams, FtnMultiTensorL2NormFinalParams,
    FtnMultiTensorL2NormParams, FtnMultiTensorUnscaleParams, FTN_MT_BF16, FTN_MT_F16, FTN_MT_F32,
};
use crate::kernels;

const UNSCALE: &str = "multi_tensor_unscale";
const L2NORM: &str = "multi_tensor_l2_norm";
const CLIP: &str = "multi_tensor_clip";
const SCALER: &str = "DeviceGradScaler";

/// Megatron's clip epsilon: `coeff = max_norm / (norm + 1e-6)`.
pub const CLIP_EPS: f64 = 1e-6;

/// One gradient of a list that is modified in place.
#[derive(Debug)]
pub enum GradRef<'a> {
    F32(&'a mut dyn DeviceWrite<f32>),
    F16(&'a mut dyn DeviceWrite<f16>),
    BF16(&'a mut dyn DeviceWrite<bf16>),
}

/// One tensor of a list that is only read.
#[derive(Clone, Copy, Debug)]
pub enum TensorRef<'a> {
    F32(&'a dyn DeviceRead<f32>),
    F16(&'a dyn DeviceRead<f16>),
    BF16(&'a dyn DeviceRead<bf16>),
}

macro_rules! conversions {
    ($t:ty, $v:ident) => {
        impl<'a> From<&'a mut DeviceBuffer<$t>> for GradRef<'a> {
            fn from(b: &'a mut DeviceBuffer<$t>) -> Self {
                GradRef::$v(b)
            }
        }
        impl<'a> From<&'a DeviceBuffer<$t>> for TensorRef<'a> {
            fn from(b: &'a DeviceBuffer<$t>) -> Self {
                TensorRef::$v(b)
            }
        }
        impl<'a, 'b> From<&'a mut DeviceSliceMut<'b, $t>> for GradRef<'a> {
            fn from(b: &'a mut DeviceSliceMut<'b, $t>) -> Self {
                GradRef::$v(b)
            }
        }
        impl<'a, 'b> From<&'a DeviceSlice<'b, $t>> for TensorRef<'a> {
            fn from(b: &'a DeviceSlice<'b, $t>) -> Self {
                TensorRef::$v(b)
            }
        }
    };
}
conversions!(f32, F32);
conversions!(f16, F16);
conversions!(bf16, BF16);

impl GradRef<'_> {
    /// A read-only view of the same tensor.
    pub fn as_tensor(&self) -> TensorRef<'_> {
        match self {
            GradRef::F32(b) => TensorRef::F32(b.as_read()),
            GradRef::F16(b) => TensorRef::F16(b.as_read()),
            GradRef::BF16(b) => TensorRef::BF16(b.as_read()),
        }
    }
}

impl TensorRef<'_> {
    pub fn dtype(&self) -> DType {
        match self {
            TensorRef::F32(_) => DType::F32,
            TensorRef::F16(_) => DType::F16,
            TensorRef::BF16(_) => DType::BF16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            TensorRef::F32(b) => b.len(),
            TensorRef::F16(b) => b.len(),
            TensorRef::BF16(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn addr(&self) -> u64 {
        match self {
            TensorRef::F32(b) => b.addr(),
            TensorRef::F16(b) => b.addr(),
            TensorRef::BF16(b) => b.addr(),
        }
    }

    pub(crate) fn device(&self) -> &Device {
        match self {
            TensorRef::F32(b) => b.device(),
            TensorRef::F16(b) => b.device(),
            TensorRef::BF16(b) => b.device(),
        }
    }
}

/// Device tables (tensor descriptors, then chunks) for one list, uploaded
/// once and reused while the list (addresses, sizes, dtypes) is unchanged.
struct Tables {
    device: Device,
    key: Vec<u64>,
    words: DeviceBuffer<i64>,
    num_tensors: usize,
    num_chunks: usize,
    cfg: Option<crate::core::LaunchConfig>,
}

impl Tables {
    fn tensors_addr(&self) -> u64 {
        self.words.addr()
    }
    fn chunks_addr(&self) -> u64 {
        self.words.addr() + 24 * self.num_tensors as u64
    }
}

/// How many lists [`MultiTensor`] keeps tables for.
const CACHED_LISTS: usize = 8;

/// The multi-tensor ops. Holds the device tables of the last few lists it
/// saw (8), so a training loop that passes the same gradients every step
/// uploads nothing after the first step. Uploading a new list's tables waits
/// for that copy (the tables are immutable afterwards, so any stream may use
/// them); evicting one waits for the device, like any free.
///
/// Every op checks that each tensor lives on the stream's device and that
/// scalars are valid, and returns [`Error::InvalidArgument`] naming the
/// argument otherwise. Empty tensors and empty lists are fine.
#[derive(Default)]
pub struct MultiTensor {
    cache: Vec<Tables>,
}

impl std::fmt::Debug for MultiTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MultiTensor({} cached lists)", self.cache.len())
    }
}

/// The kernels' `FTN_MT_*` code of a list entry (float tensors only, by
/// construction of [`TensorRef`]).
pub(crate) fn dtype_code(t: &TensorRef<'_>) -> u32 {
    match t {
        TensorRef::F32(_) => FTN_MT_F32,
        TensorRef::F16(_) => FTN_MT_F16,
        TensorRef::BF16(_) => FTN_MT_BF16,
    }
}

impl MultiTensor {
    pub fn new() -> Self {
        MultiTensor::default()
    }

    /// Validates the list and returns its (possibly cached) tables.
    fn tables(
        &mut self,
        op: &'static str,
        stream: &Stream,
        tensors: &[TensorRef<'_>],
    ) -> Result<&Tables> {
        let mut key = Vec::with_capacity(3 * tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if !stream.device().same(t.device()) {
                return Err(Error::invalid(
                    op,
                    "tensors",
                    format!(
                        "every tensor on the stream's device ({:?})",
                        stream.device()
                    ),
                    format!("tensor {i} on {:?}", t.device()),
                ));
            }
            let vec = all_aligned16(&[t.addr()]) as u64;
            key.extend([t.addr(), t.len() as u64, dtype_code(t) as u64 | vec << 32]);
        }
        let hit = self
            .cache
            .iter()
            .position(|c| c.key == key && c.device.same(stream.device()));
        let idx = match hit {
            Some(i) => i,
            None => {
                let numels: Vec<u64> = tensors.iter().map(|t| t.len() as u64).collect();
                let p = plan::plan(op, &numels)?;
                // Tensor descriptors (3 words: data, numel, dtype | vec << 32)
                // then chunk descriptors (1 word: tensor | chunk << 32), the
                // layouts of FtnTensorDesc and FtnChunkDesc.
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
                    key,
                    words: stream.device().upload(&words)?,
                    num_tensors: tensors.len(),
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

    /// Unscales every gradient in place, `g <- g * inv_scale` with
    /// `inv_scale = (1 / scale as f64) as f32` (Megatron), in one launch, and
    /// sets `found_inf[0] = 1.0` if any input or result is not finite.
    /// `found_inf` is only ever set, never cleared: zero it before the first
    /// list of a step (or let [`DeviceGradScaler::update`] reset it).
    pub fn unscale(
        &mut self,
        stream: &Stream,
        grads: &mut [GradRef<'_>],
        scale: f32,
        found_inf: &mut dyn DeviceWrite<f32>,
    ) -> Result<()> {
        let inv = (1.0 / scale as f64) as f32;
        if !(scale.is_finite() && scale > 0.0 && inv.is_finite()) {
            return Err(Error::invalid(
                UNSCALE,
                "scale",
                "a finite value > 0 whose reciprocal is finite in fp32",
                format!("{scale:?}"),
            ));
        }
        self.unscale_impl(stream, grads, inv, 0, found_inf)
    }

    /// As [`MultiTensor::unscale`] with the scale read on the device from
    /// `scaler` (no host synchronisation).
    pub fn unscale_with_scaler(
        &mut self,
        stream: &Stream,
        grads: &mut [GradRef<'_>],
        scaler: &DeviceGradScaler,
        found_inf: &mut dyn DeviceWrite<f32>,
    ) -> Result<()> {
        stream
            .device()
            .check_same(UNSCALE, "scaler", scaler.state.device())?;
        self.unscale_impl(stream, grads, 1.0, scaler.state.addr(), found_inf)
    }

    fn unscale_impl(
        &mut self,
        stream: &Stream,
        grads: &mut [GradRef<'_>],
        inv_scale: f32,
        scaler: u64,
        found_inf: &mut dyn DeviceWrite<f32>,
    ) -> Result<()> {
        check_buffer(UNSCALE, "found_inf", stream, found_inf, 1)?;
        let views: Vec<TensorRef<'_>> = grads.iter().map(GradRef::as_tensor).collect();
        let t = self.tables(UNSCALE, stream, &views)?;
        let Some(cfg) = t.cfg else { return Ok(()) };
        let params = FtnMultiTensorUnscaleParams {
            tensors: t.tensors_addr() as *const _,
            chunks: t.chunks_addr() as *const _,
            found_inf: found_inf.addr() as *mut f32,
            scaler: scaler as *const _,
            inv_scale,
            reserved: 0,
            num_chunks: t.num_chunks as i64,
            chunk_size: plan::CHUNK_SIZE as i64,
        };
        stream.launch(&kernels::FTN_MULTI_TENSOR_UNSCALE, cfg, params)
    }

    /// `norm[0] = sqrt(sum of x^2 over every element of every tensor)`:
    /// fp32 sums of squares per chunk of 16384 elements, then an fp64 sum of
    /// the chunks in list order. Deterministic: bitwise identical for the
    /// same list and values. 0 for an empty list.
    pub fn l2_norm(
        &mut self,
        stream: &Stream,
        tensors: &[TensorRef<'_>],
        norm: &mut dyn DeviceWrite<f32>,
    ) -> Result<()> {
        check_buffer(L2NORM, "norm", stream, norm, 1)?;
        let t = self.tables(L2NORM, stream, tensors)?;
        let partial = match t.cfg {
            Some(cfg) => {
                let ws = stream.workspace(4 * t.num_chunks)?;
                let params = FtnMultiTensorL2NormParams {
                    tensors: t.tensors_addr() as *const _,
                    chunks: t.chunks_addr() as *const _,
                    partial: ws as *mut f32,
                    num_chunks: t.num_chunks as i64,
                    chunk_size: plan::CHUNK_SIZE as i64,
                };
                stream.launch(&kernels::FTN_MULTI_TENSOR_L2NORM_PARTIAL, cfg, params)?;
                ws
            }
            None => 0,
        };
        let fin = FtnMultiTensorL2NormFinalParams {
            norm: norm.addr() as *mut f32,
            partial: partial as *const f32,
            num_partials: t.num_chunks as i64,
        };
        stream.launch(
            &kernels::FTN_MULTI_TENSOR_L2NORM_FINAL,
            plan::final_reduce(),
            fin,
        )
    }

    /// Clips by a norm already on the device: `coeff = max_norm / (norm[0] +
    /// 1e-6)` in fp64 (as Megatron), and when `coeff < 1` every gradient is
    /// multiplied by `coeff as f32`; otherwise nothing is written. A NaN norm
    /// clips nothing; an infinite one multiplies by 0 (as Megatron).
    pub fn clip_by_norm(
        &mut self,
        stream: &Stream,
        grads: &mut [GradRef<'_>],
        norm: &dyn DeviceRead<f32>,
        max_norm: f64,
    ) -> Result<()> {
        if !(max_norm.is_finite() && max_norm > 0.0) {
            return Err(Error::invalid(
                CLIP,
                "max_norm",
                "a finite value > 0",
                format!("{max_norm:?}"),
            ));
        }
        check_buffer(CLIP, "norm", stream, norm, 1)?;
        let views: Vec<TensorRef<'_>> = grads.iter().map(GradRef::as_tensor).collect();
        let t = self.tables(CLIP, stream, &views)?;
        let Some(cfg) = t.cfg else { return Ok(()) };
        let params = FtnMultiTensorClipParams {
            tensors: t.tensors_addr() as *const _,
            chunks: t.chunks_addr() as *const _,
            norm: norm.addr() as *const f32,
            max_norm,
            eps: CLIP_EPS,
            num_chunks: t.num_chunks as i64,
            chunk_size: plan::CHUNK_SIZE as i64,
        };
        stream.launch(&kernels::FTN_MULTI_TENSOR_CLIP, cfg, params)
    }

    /// Megatron's `clip_grad_norm` (L2): writes the total norm to `norm` and
    /// clips every gradient by it, three launches, no host synchronisation.
    pub fn clip_grad_norm(
        &mut self,
        stream: &Stream,
        grads: &mut [GradRef<'_>],
        max_norm: f64,
        norm: &mut dyn DeviceWrite<f32>,
    ) -> Result<()> {
        if !(max_norm.is_finite() && max_norm > 0.0) {
            return Err(Error::invalid(
                CLIP,
                "max_norm",
                "a finite value > 0",
                format!("{max_norm:?}"),
            ));
        }
        let views: Vec<TensorRef<'_>> = grads.iter().map(GradRef::as_tensor).collect();
        self.l2_norm(stream, &views, norm)?;
        drop(views);
        self.clip_by_norm(stream, grads, norm, max_norm)
    }
}

/// [`DynamicGradScaler`] with its state in device memory, stepped by a
/// one-thread kernel that reads the device found_inf flag: a training step
/// needs no host synchronisation. Bit-for-bit the host state machine.
pub struct DeviceGradScaler {
    config: GradScalerConfig,
    /// `FtnGradScalerState`: scale bits, growth, hysteresis, reserved.
    state: DeviceBuffer<i32>,
}

impl std::fmt::Debug for DeviceGradScaler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceGradScaler({:?})", self.config)
    }
}

impl DeviceGradScaler {
    /// A fresh scaler on `device` (validates `config`).
    pub fn new(device: &Device, config: GradScalerConfig) -> Result<Self> {
        Self::from_host(device, &DynamicGradScaler::new(config)?)
    }

    /// A device copy of a host scaler's state and config.
    pub fn from_host(device: &Device, s: &DynamicGradScaler) -> Result<Self> {
        let words = [
            s.scale().to_bits() as i32,
            s.growth_tracker(),
            s.hysteresis_tracker(),
            0,
        ];
        Ok(DeviceGradScaler {
            config: *s.config(),
            state: device.upload(&words)?,
        })
    }

    pub fn config(&self) -> &GradScalerConfig {
        &self.config
    }

    /// The device state (`FtnGradScalerState`, 4 words), for kernels that
    /// read the scale on the device (the fused Adam's unscale).
    pub(crate) fn state(&self) -> &DeviceBuffer<i32> {
        &self.state
    }

    /// Enqueues one `update(found_inf[0] > 0)` on `stream`; then, if
    /// `reset_found_inf`, sets `found_inf[0] = 0` for the next step.
    pub fn update(
        &mut self,
        stream: &Stream,
        found_inf: &mut dyn DeviceWrite<f32>,
        reset_found_inf: bool,
    ) -> Result<()> {
        stream
            .device()
            .check_same(SCALER, "self", self.state.device())?;
        check_buffer(SCALER, "found_inf", stream, found_inf, 1)?;
        let c = &self.config;
        let params = FtnGradScalerUpdateParams {
            state: self.state.addr() as *mut _,
            found_inf: found_inf.addr() as *mut f32,
            min_scale: c.min_scale,
            growth_factor: c.growth_factor,
            backoff_factor: c.backoff_factor,
            growth_interval: c.growth_interval as i32,
            hysteresis: c.hysteresis as i32,
            reset_found_inf: reset_found_inf as u32,
        };
        stream.launch(
            &kernels::FTN_GRAD_SCALER_UPDATE,
            plan::scaler_update(),
            params,
        )
    }

    /// Waits for the device and returns the state as a host scaler.
    pub fn to_host(&self) -> Result<DynamicGradScaler> {
        let w = self.state.to_host()?;
        Ok(DynamicGradScaler {
            scale: f32::from_bits(w[0] as u32),
            growth_tracker: w[1],
            hysteresis_tracker: w[2],
            config: self.config,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_params::{FtnChunkDesc, FtnTensorDesc};

    #[test]
    fn table_layouts_match_the_header() {
        assert_eq!(core::mem::size_of::<FtnTensorDesc>(), 24);
        assert_eq!(core::mem::offset_of!(FtnTensorDesc, numel), 8);
        assert_eq!(core::mem::offset_of!(FtnTensorDesc, dtype), 16);
        assert_eq!(core::mem::offset_of!(FtnTensorDesc, vec), 20);
        assert_eq!(core::mem::size_of::<FtnChunkDesc>(), 8);
        assert_eq!(core::mem::offset_of!(FtnChunkDesc, chunk), 4);
        assert_eq!(
            core::mem::size_of::<crate::kernel_params::FtnGradScalerState>(),
            16
        );
        assert_eq!(plan::THREADS, crate::kernel_params::FTN_MT_THREADS);
        // The word packing assumes a little-endian host, like the GPU.
        assert_eq!(1u64.to_le_bytes(), 1u64.to_ne_bytes());
    }

    #[test]
    fn tables_are_cached_per_list() {
        let dev = Device::emu();
        let stream = dev.new_stream().unwrap();
        let a = dev.upload(&[1.0f32; 5]).unwrap();
        let b = dev.upload(&[half::bf16::ONE; 3]).unwrap();
        let mut mt = MultiTensor::new();
        let l1 = [TensorRef::from(&a), TensorRef::from(&b)];
        let addr1 = mt.tables("t", &stream, &l1).unwrap().words.addr();
        let l2 = [TensorRef::from(&b)];
        mt.tables("t", &stream, &l2).unwrap();
        assert_eq!(mt.cache.len(), 2);
        assert_eq!(mt.tables("t", &stream, &l1).unwrap().words.addr(), addr1);
        assert_eq!(mt.cache.len(), 2);
        for i in 0..20 {
            let c = dev.alloc_zeros::<f32>(i + 1).unwrap();
            mt.tables("t", &stream, &[TensorRef::from(&c)]).unwrap();
        }
        assert_eq!(mt.cache.len(), CACHED_LISTS);
    }
}
