//! Fused scale + mask + softmax, forward and backward (kernels:
//! `cuda/softmax.cu`, plan: [`crate::core::plan::softmax`], oracle:
//! [`crate::reference::softmax`]).
//!
//! Logits `[batch, heads, sq, sk]`; `y = softmax(scale * x)` over the last
//! dimension in fp32 for fp32/fp16/bf16 storage, any `sk >= 1`.
//!
//! Masks ([`SoftmaxMask`]): a padding mask (uint8 `[batch or 1, 1, sq, sk]`,
//! 1 = masked) *replaces* the scaled logit by -10000.0; causal (`sq == sk`)
//! keeps columns `<= i` in row `i` and writes exact zeros after it.
//! A row whose columns are all padding-masked is written as **zeros** with a
//! zero gradient, as the Apex / Transformer Engine fused kernels do. PyTorch's
//! unfused `masked_fill(-10000) + softmax` would give the uniform `1/sk` there.
//!
//! ```no_run
//! use ferrotron::{Device, ops::softmax::{ScaleMaskSoftmax, SoftmaxMask}};
//! let dev = Device::emu();
//! let stream = dev.new_stream()?;
//! let x = dev.upload(&[0.5f32, -1.0, 2.0, 0.0, 1.0, -2.0])?;
//! let mut y = dev.alloc_zeros::<f32>(6)?;
//! // batch 1, heads 1, sq 2, sk 3
//! ScaleMaskSoftmax::new(1, 1, 2, 3, 0.125).forward(&stream, &x, SoftmaxMask::None, &mut y)?;
//! println!("{:?}", y.to_host()?);
//! # Ok::<(), ferrotron::Error>(())
//! ```
//!
//! # Attention dropout
//! [`ScaleMaskSoftmax::with_dropout`] sets a drop probability `p`;
//! [`ScaleMaskSoftmax::forward_dropout`] writes the probabilities `y` (kept
//! for backward) and `dropout(y, p)` in one pass, and
//! [`ScaleMaskSoftmax::backward_dropout`] takes the gradient of the dropped
//! probabilities and regenerates the same mask from the same
//! [`PhiloxState`](crate::core::rng::PhiloxState): element `i` (row-major in `[batch, heads, sq, sk]`) is
//! kept iff random value `offset + i` of the stream is `>=`
//! [`philox::drop_threshold`]`(p)`, exactly the rule of
//! [`crate::ops::BiasDropoutAdd`]; kept values are scaled by `1/(1-p)`.
//! The plain [`forward`](ScaleMaskSoftmax::forward) and
//! [`backward`](ScaleMaskSoftmax::backward) never drop. In a tensor-parallel
//! model the heads are sharded, so draw the state from the model-parallel
//! stream ([`crate::core::rng::MODEL_PARALLEL_STREAM`]), as Megatron does.
//!
//! ```no_run
//! use ferrotron::{Device, core::rng::{RngTracker, MODEL_PARALLEL_STREAM}};
//! use ferrotron::ops::{DropoutMode, softmax::{ScaleMaskSoftmax, SoftmaxMask}};
//! let dev = Device::emu();
//! let stream = dev.new_stream()?;
//! let mut rng = RngTracker::megatron(1234, 0);
//! let x = dev.upload(&[0.5f32, -1.0, 2.0, 0.0])?;
//! let (mut y, mut yd) = (dev.alloc_zeros::<f32>(4)?, dev.alloc_zeros::<f32>(4)?);
//! let sm = ScaleMaskSoftmax::new(1, 1, 2, 2, 0.5).with_dropout(0.1);
//! let mode = DropoutMode::Train(rng.next(MODEL_PARALLEL_STREAM, sm.random_values())?);
//! sm.forward_dropout(&stream, &x, SoftmaxMask::Causal, &mut y, &mut yd, mode)?;
//! let dyd = dev.upload(&[1.0f32, 0.0, 0.5, -0.5])?;
//! let mut dx = dev.alloc_zeros::<f32>(4)?;
//! sm.backward_dropout(&stream, &y, &dyd, &mut dx, mode)?; // same `mode`
//! # Ok::<(), ferrotron::Error>(())
//! ```

use super::{all_aligned16, check_buffer};
use crate::backend::{DeviceRead, DeviceWrite, Stream};
use crate::core::dtype::FloatElement;
pub use crate::core::plan::softmax::SoftmaxPath;
use crate::core::plan::softmax::{self as plan, Plan};
use crate::core::{philox, DType, Result};
use crate::kernel_params::{
    FtnSoftmaxBwdParams, FtnSoftmaxFwdParams, FTN_SOFTMAX_MASK_CAUSAL, FTN_SOFTMAX_MASK_NONE,
    FTN_SOFTMAX_MASK_PADDING,
};
use crate::kernels::{self, Kernel};
use crate::ops::dropout::DropoutMode;
use crate::Error;

/// The mask of a forward pass.
#[derive(Clone, Copy, Debug)]
pub enum SoftmaxMask<'a> {
    /// No mask.
    None,
    /// uint8 `[batch, 1, sq, sk]` or `[1, 1, sq, sk]` (broadcast over the
    /// batch); nonzero = masked (the scaled logit becomes -10000.0).
    Padding(&'a dyn DeviceRead<u8>),
    /// Upper-triangular mask, `sq == sk`: row `i` keeps columns `<= i`.
    Causal,
}

/// Scale + mask + softmax over logits `[batch, heads, sq, sk]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleMaskSoftmax {
    pub batch: usize,
    pub heads: usize,
    pub sq: usize,
    pub sk: usize,
    /// Multiplies the logits before masking (e.g. `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Use 128-bit accesses where the data allows (default). `false` forces
    /// the scalar path: for comparisons in tests and benches.
    pub vectorize: bool,
    /// Run this path instead of the one the plan picks from `sk` (tests and
    /// benches); it must be able to hold a row.
    pub path: Option<SoftmaxPath>,
    /// Attention-dropout probability in `[0, 1)` (default 0), used by
    /// [`ScaleMaskSoftmax::forward_dropout`] and
    /// [`ScaleMaskSoftmax::backward_dropout`] only.
    pub dropout: f32,
}

/// What the kernels receive for a dropout mode.
#[derive(Clone, Copy)]
struct DropArgs {
    seed: u64,
    offset: u64,
    threshold: u32,
    scale: f32,
}

const NO_DROP: DropArgs = DropArgs {
    seed: 0,
    offset: 0,
    threshold: 0,
    scale: 1.0,
};

const FWD: &str = "scale_mask_softmax_forward";
const BWD: &str = "scale_mask_softmax_backward";

/// The kernel of the plan's path (and values per lane) for dtype `d`; the
/// block path's vector rows without dropout have their own kernel (fewer
/// registers than the scalar and dropout paths need: more blocks per SM).
fn fwd_kernel(d: DType, p: &Plan, dropout: bool) -> Result<&'static Kernel<FtnSoftmaxFwdParams>> {
    match p.path {
        SoftmaxPath::Warp => kernels::SOFTMAX_FWD_WARP.variant(p.per_lane, d),
        SoftmaxPath::Block if p.vec > 1 && !dropout => kernels::SOFTMAX_FWD_BLOCK_VEC.for_dtype(d),
        SoftmaxPath::Block => kernels::SOFTMAX_FWD_BLOCK.for_dtype(d),
        SoftmaxPath::Long => kernels::SOFTMAX_FWD_LONG.for_dtype(d),
    }
}

/// The backward kernel; with attention dropout (`dropout`), rows are streamed
/// rather than held in registers: the warp path's by a warp per row, the
/// block path's by the long kernel (same launch: any block of whole warps).
fn bwd_kernel(d: DType, p: &Plan, dropout: bool) -> Result<&'static Kernel<FtnSoftmaxBwdParams>> {
    match (p.path, dropout) {
        (SoftmaxPath::Warp, false) => kernels::SOFTMAX_BWD_WARP.variant(p.per_lane, d),
        (SoftmaxPath::Warp, true) => kernels::SOFTMAX_BWD_DROPOUT_WARP.for_dtype(d),
        (SoftmaxPath::Block, false) => kernels::SOFTMAX_BWD_BLOCK.for_dtype(d),
        (SoftmaxPath::Block, true) | (SoftmaxPath::Long, _) => {
            kernels::SOFTMAX_BWD_LONG.for_dtype(d)
        }
    }
}

/// Checked sizes of one call.
struct Sizes {
    rows: usize,
    /// rows * sk
    elements: usize,
    /// sq * sk
    matrix: usize,
}

impl ScaleMaskSoftmax {
    /// Logits `[batch, heads, sq, sk]`, vectorised, path chosen from `sk`.
    pub fn new(batch: usize, heads: usize, sq: usize, sk: usize, scale: f32) -> Self {
        ScaleMaskSoftmax {
            batch,
            heads,
            sq,
            sk,
            scale,
            vectorize: true,
            path: None,
            dropout: 0.0,
        }
    }

    /// Sets the attention-dropout probability (checked, `[0, 1)`, when a
    /// dropout call runs).
    pub fn with_dropout(self, p: f32) -> Self {
        ScaleMaskSoftmax { dropout: p, ..self }
    }

    /// Random values one training call consumes from its stream before
    /// rounding: `batch * heads * sq * sk` (pass it to
    /// [`crate::core::rng::RngTracker::next`]).
    pub fn random_values(&self) -> u64 {
        [self.heads, self.sq, self.sk]
            .iter()
            .fold(self.batch as u64, |a, &b| a.saturating_mul(b as u64))
    }

    fn drop_args(&self, op: &'static str, mode: DropoutMode, n: usize) -> Result<DropArgs> {
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::invalid(
                op,
                "dropout",
                "a probability in [0, 1)",
                self.dropout,
            ));
        }
        Ok(match mode {
            DropoutMode::Eval => NO_DROP,
            DropoutMode::Train(st) => {
                if st.offset.checked_add(n as u64).is_none() {
                    return Err(Error::invalid(
                        op,
                        "offset",
                        "offset + batch*heads*sq*sk within the stream's 2^64 values",
                        format!("{} + {n}", st.offset),
                    ));
                }
                DropArgs {
                    seed: st.seed,
                    offset: st.offset,
                    threshold: philox::drop_threshold(self.dropout),
                    scale: (1.0 / (1.0 - self.dropout as f64)) as f32,
                }
            }
        })
    }

    pub fn with_vectorize(self, vectorize: bool) -> Self {
        ScaleMaskSoftmax { vectorize, ..self }
    }

    /// Forces a path (`None`: the plan's choice).
    pub fn with_path(self, path: Option<SoftmaxPath>) -> Self {
        ScaleMaskSoftmax { path, ..self }
    }

    /// The path the plan runs for this shape (`path` if forced).
    pub fn chosen_path(&self) -> SoftmaxPath {
        self.path.unwrap_or(plan::path_for(self.sk as u64))
    }

    fn sizes(&self, op: &'static str) -> Result<Sizes> {
        if self.sk == 0 {
            return Err(Error::invalid(op, "sk", ">= 1", 0));
        }
        if !self.scale.is_finite() {
            return Err(Error::invalid(op, "scale", "a finite number", self.scale));
        }
        let overflow = |what: &'static str| {
            Error::invalid(
                op,
                what,
                "a product of at most i64::MAX",
                format!(
                    "batch {} x heads {} x sq {} x sk {} (overflows)",
                    self.batch, self.heads, self.sq, self.sk
                ),
            )
        };
        let rows = self
            .batch
            .checked_mul(self.heads)
            .and_then(|v| v.checked_mul(self.sq))
            .ok_or_else(|| overflow("batch * heads * sq"))?;
        let elements = rows
            .checked_mul(self.sk)
            .filter(|&n| n <= i64::MAX as usize)
            .ok_or_else(|| overflow("batch * heads * sq * sk"))?;
        let matrix = self
            .sq
            .checked_mul(self.sk)
            .ok_or_else(|| overflow("sq * sk"))?;
        if let Some(path) = self.path {
            if !plan::path_supports(path, self.sk as u64) {
                return Err(Error::invalid(
                    op,
                    "path",
                    format!("a path that holds rows of {} columns", self.sk),
                    format!("{path:?}"),
                ));
            }
        }
        Ok(Sizes {
            rows,
            elements,
            matrix,
        })
    }

    /// `y = softmax(mask(scale * x))`.
    pub fn forward<T: FloatElement>(
        &self,
        stream: &Stream,
        x: &dyn DeviceRead<T>,
        mask: SoftmaxMask<'_>,
        y: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        let s = self.sizes(FWD)?;
        check_buffer(FWD, "x", stream, x, s.elements)?;
        check_buffer(FWD, "y", stream, y, s.elements)?;
        self.forward_unchecked::<T>(stream, x.addr(), mask, y.addr(), None, &s)
    }

    /// Attention dropout: `y = softmax(mask(scale * x))` (the undropped
    /// probabilities, what [`ScaleMaskSoftmax::backward_dropout`] needs) and
    /// `dropped = dropout(y, self.dropout)` (kept values scaled by
    /// `1/(1-p)`), the mask drawn from `mode`'s [`PhiloxState`](crate::core::rng::PhiloxState).
    /// [`DropoutMode::Eval`] (or `p = 0`) writes `dropped = y`.
    pub fn forward_dropout<T: FloatElement>(
        &self,
        stream: &Stream,
        x: &dyn DeviceRead<T>,
        mask: SoftmaxMask<'_>,
        y: &mut dyn DeviceWrite<T>,
        dropped: &mut dyn DeviceWrite<T>,
        mode: DropoutMode,
    ) -> Result<()> {
        let s = self.sizes(FWD)?;
        check_buffer(FWD, "x", stream, x, s.elements)?;
        check_buffer(FWD, "y", stream, y, s.elements)?;
        check_buffer(FWD, "dropped", stream, dropped, s.elements)?;
        let d = self.drop_args(FWD, mode, s.elements)?;
        self.forward_unchecked::<T>(
            stream,
            x.addr(),
            mask,
            y.addr(),
            Some((dropped.addr(), d)),
            &s,
        )
    }

    /// `x = softmax(mask(scale * x))` in place.
    pub fn forward_in_place<T: FloatElement>(
        &self,
        stream: &Stream,
        x: &mut dyn DeviceWrite<T>,
        mask: SoftmaxMask<'_>,
    ) -> Result<()> {
        let s = self.sizes(FWD)?;
        check_buffer(FWD, "x", stream, x, s.elements)?;
        self.forward_unchecked::<T>(stream, x.addr(), mask, x.addr(), None, &s)
    }

    /// Checks a forward's mask against the shape (a causal mask needs
    /// `sq == sk`; a padding mask `[batch, 1, sq, sk]` or `[1, 1, sq, sk]`
    /// elements on the stream's device) without enqueueing anything: for
    /// callers that must reject a call before they do any work.
    pub fn check_mask(&self, stream: &Stream, mask: SoftmaxMask<'_>) -> Result<()> {
        let s = self.sizes(FWD)?;
        self.mask_args(stream, mask, &s).map(|_| ())
    }

    /// The kernel's mask mode, mask address and per-batch mask stride.
    fn mask_args(
        &self,
        stream: &Stream,
        mask: SoftmaxMask<'_>,
        s: &Sizes,
    ) -> Result<(u32, u64, usize)> {
        Ok(match mask {
            SoftmaxMask::None => (FTN_SOFTMAX_MASK_NONE, 0, 0),
            SoftmaxMask::Causal => {
                if self.sq != self.sk {
                    return Err(Error::invalid(
                        FWD,
                        "mask",
                        "a causal mask only with sq == sk",
                        format!("sq = {}, sk = {}", self.sq, self.sk),
                    ));
                }
                (FTN_SOFTMAX_MASK_CAUSAL, 0, 0)
            }
            SoftmaxMask::Padding(m) => {
                stream.device().check_same(FWD, "mask", m.device())?;
                let per_batch = s.matrix.checked_mul(self.batch);
                let stride = if per_batch == Some(m.len()) {
                    s.matrix
                } else if m.len() == s.matrix {
                    0
                } else {
                    return Err(Error::invalid(
                        FWD,
                        "mask",
                        format!(
                            "batch*sq*sk = {} ([batch, 1, sq, sk]) or sq*sk = {} ([1, 1, sq, sk]) elements",
                            per_batch.map_or_else(|| "overflow".to_string(), |n| n.to_string()),
                            s.matrix
                        ),
                        format!("a buffer of {} elements", m.len()),
                    ));
                };
                (FTN_SOFTMAX_MASK_PADDING, m.addr(), stride)
            }
        })
    }

    fn forward_unchecked<T: FloatElement>(
        &self,
        stream: &Stream,
        x: u64,
        mask: SoftmaxMask<'_>,
        y: u64,
        dropped: Option<(u64, DropArgs)>,
        s: &Sizes,
    ) -> Result<()> {
        let (mode, mask_addr, mask_batch_stride) = self.mask_args(stream, mask, s)?;
        if s.rows == 0 {
            return Ok(());
        }
        let (yd, d) = dropped.unwrap_or((0, NO_DROP));
        let p = self.plan::<T>(FWD, s, &[x, y, mask_addr, yd])?;
        let params = FtnSoftmaxFwdParams {
            y: y as *mut _,
            x: x as *const _,
            mask: mask_addr as *const u8,
            rows: s.rows as i64,
            sk: self.sk as i64,
            sq: self.sq as i64,
            rows_per_batch: (self.heads * self.sq) as i64,
            mask_batch_stride: mask_batch_stride as i64,
            scale: self.scale,
            mask_mode: mode,
            vec: p.vec,
            y_dropped: yd as *mut _,
            seed: d.seed,
            offset: d.offset,
            drop_threshold: d.threshold,
            drop_scale: d.scale,
        };
        stream.launch(fwd_kernel(T::DTYPE, &p, yd != 0)?, p.cfg, params)
    }

    /// `dx = scale * (dy*y - y * sum(dy*y))` per row, with `y` the forward
    /// output (the mask is already in `y`: masked columns have zero gradient).
    pub fn backward<T: FloatElement>(
        &self,
        stream: &Stream,
        y: &dyn DeviceRead<T>,
        dy: &dyn DeviceRead<T>,
        dx: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        let s = self.sizes(BWD)?;
        check_buffer(BWD, "y", stream, y, s.elements)?;
        check_buffer(BWD, "dy", stream, dy, s.elements)?;
        check_buffer(BWD, "dx", stream, dx, s.elements)?;
        self.backward_unchecked::<T>(stream, y.addr(), dy.addr(), dx.addr(), NO_DROP, &s)
    }

    /// Backward of [`ScaleMaskSoftmax::forward_dropout`]: `y` the undropped
    /// probabilities, `dy` the gradient of the dropped ones, `mode` the
    /// forward's (the mask is regenerated, not read). Per row,
    /// `g = keep * dy / (1-p)`, `dx = scale * (g*y - y * sum(g*y))`.
    pub fn backward_dropout<T: FloatElement>(
        &self,
        stream: &Stream,
        y: &dyn DeviceRead<T>,
        dy: &dyn DeviceRead<T>,
        dx: &mut dyn DeviceWrite<T>,
        mode: DropoutMode,
    ) -> Result<()> {
        let s = self.sizes(BWD)?;
        check_buffer(BWD, "y", stream, y, s.elements)?;
        check_buffer(BWD, "dy", stream, dy, s.elements)?;
        check_buffer(BWD, "dx", stream, dx, s.elements)?;
        let d = self.drop_args(BWD, mode, s.elements)?;
        self.backward_unchecked::<T>(stream, y.addr(), dy.addr(), dx.addr(), d, &s)
    }

    /// As [`ScaleMaskSoftmax::backward_dropout`], overwriting `grad` (the
    /// gradient of the dropped probabilities on entry) with dx.
    pub fn backward_dropout_in_place<T: FloatElement>(
        &self,
        stream: &Stream,
        y: &dyn DeviceRead<T>,
        grad: &mut dyn DeviceWrite<T>,
        mode: DropoutMode,
    ) -> Result<()> {
        let s = self.sizes(BWD)?;
        check_buffer(BWD, "y", stream, y, s.elements)?;
        check_buffer(BWD, "grad", stream, grad, s.elements)?;
        let d = self.drop_args(BWD, mode, s.elements)?;
        self.backward_unchecked::<T>(stream, y.addr(), grad.addr(), grad.addr(), d, &s)
    }

    /// As [`ScaleMaskSoftmax::backward`], overwriting `grad` (dy on entry)
    /// with dx.
    pub fn backward_in_place<T: FloatElement>(
        &self,
        stream: &Stream,
        y: &dyn DeviceRead<T>,
        grad: &mut dyn DeviceWrite<T>,
    ) -> Result<()> {
        let s = self.sizes(BWD)?;
        check_buffer(BWD, "y", stream, y, s.elements)?;
        check_buffer(BWD, "grad", stream, grad, s.elements)?;
        self.backward_unchecked::<T>(stream, y.addr(), grad.addr(), grad.addr(), NO_DROP, &s)
    }

    fn backward_unchecked<T: FloatElement>(
        &self,
        stream: &Stream,
        y: u64,
        dy: u64,
        dx: u64,
        d: DropArgs,
        s: &Sizes,
    ) -> Result<()> {
        if s.rows == 0 {
            return Ok(());
        }
        let p = self.plan::<T>(BWD, s, &[y, dy, dx])?;
        let params = FtnSoftmaxBwdParams {
            dx: dx as *mut _,
            y: y as *const _,
            dy: dy as *const _,
            rows: s.rows as i64,
            sk: self.sk as i64,
            scale: self.scale,
            vec: p.vec,
            seed: d.seed,
            offset: d.offset,
            drop_threshold: d.threshold,
            drop_scale: d.scale,
        };
        stream.launch(bwd_kernel(T::DTYPE, &p, d.threshold != 0)?, p.cfg, params)
    }

    fn plan<T: FloatElement>(&self, op: &'static str, s: &Sizes, addrs: &[u64]) -> Result<Plan> {
        plan::plan(
            s.rows as u64,
            self.sk as u64,
            T::DTYPE.size(),
            self.vectorize && all_aligned16(addrs),
            self.path,
        )
        .ok_or_else(|| {
            Error::invalid(
                op,
                "path",
                format!("a path that holds rows of {} columns", self.sk),
                format!("{:?}", self.path),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every plan the planner can produce names a kernel a `.cu` stamp made:
    /// a variant added to the plan but not stamped (or the reverse) fails here.
    #[test]
    fn every_plan_has_a_stamped_kernel() {
        let paths = [SoftmaxPath::Warp, SoftmaxPath::Block, SoftmaxPath::Long];
        for d in [DType::F32, DType::F16, DType::BF16] {
            for sk in (1..=plan::WARP_MAX_COLS).chain([4096, plan::BLOCK_MAX_COLS, 1 << 20]) {
                for forced in paths.iter().map(|&p| Some(p)).chain([None]) {
                    for aligned in [true, false] {
                        let Some(p) = plan::plan(8, sk, d.size(), aligned, forced) else {
                            continue;
                        };
                        fwd_kernel(d, &p, false).unwrap();
                        fwd_kernel(d, &p, true).unwrap();
                        bwd_kernel(d, &p, false).unwrap();
                        bwd_kernel(d, &p, true).unwrap();
                    }
                }
            }
        }
    }
}
