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

use super::{all_aligned16, check_buffer};
use crate::backend::{DeviceBuffer, Stream};
use crate::core::dtype::FloatElement;
pub use crate::core::plan::softmax::SoftmaxPath;
use crate::core::plan::softmax::{self as plan, Plan};
use crate::core::{DType, Result};
use crate::kernel_params::{
    FtnSoftmaxBwdParams, FtnSoftmaxFwdParams, FTN_SOFTMAX_MASK_CAUSAL, FTN_SOFTMAX_MASK_NONE,
    FTN_SOFTMAX_MASK_PADDING,
};
use crate::kernels::{self, Kernel};
use crate::Error;

/// The mask of a forward pass.
#[derive(Clone, Copy, Debug)]
pub enum SoftmaxMask<'a> {
    /// No mask.
    None,
    /// uint8 `[batch, 1, sq, sk]` or `[1, 1, sq, sk]` (broadcast over the
    /// batch); nonzero = masked (the scaled logit becomes -10000.0).
    Padding(&'a DeviceBuffer<u8>),
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
}

const FWD: &str = "scale_mask_softmax_forward";
const BWD: &str = "scale_mask_softmax_backward";

/// The kernel of the plan's path (and values per lane) for dtype `d`.
fn fwd_kernel(d: DType, p: &Plan) -> Result<&'static Kernel<FtnSoftmaxFwdParams>> {
    match p.path {
        SoftmaxPath::Warp => kernels::SOFTMAX_FWD_WARP.variant(p.per_lane, d),
        SoftmaxPath::Block => kernels::SOFTMAX_FWD_BLOCK.for_dtype(d),
        SoftmaxPath::Long => kernels::SOFTMAX_FWD_LONG.for_dtype(d),
    }
}

fn bwd_kernel(d: DType, p: &Plan) -> Result<&'static Kernel<FtnSoftmaxBwdParams>> {
    match p.path {
        SoftmaxPath::Warp => kernels::SOFTMAX_BWD_WARP.variant(p.per_lane, d),
        SoftmaxPath::Block => kernels::SOFTMAX_BWD_BLOCK.for_dtype(d),
        SoftmaxPath::Long => kernels::SOFTMAX_BWD_LONG.for_dtype(d),
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
        }
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
        x: &DeviceBuffer<T>,
        mask: SoftmaxMask<'_>,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let s = self.sizes(FWD)?;
        check_buffer(FWD, "x", stream, x, s.elements)?;
        check_buffer(FWD, "y", stream, y, s.elements)?;
        self.forward_unchecked::<T>(stream, x.addr(), mask, y.addr(), &s)
    }

    /// `x = softmax(mask(scale * x))` in place.
    pub fn forward_in_place<T: FloatElement>(
        &self,
        stream: &Stream,
        x: &mut DeviceBuffer<T>,
        mask: SoftmaxMask<'_>,
    ) -> Result<()> {
        let s = self.sizes(FWD)?;
        check_buffer(FWD, "x", stream, x, s.elements)?;
        self.forward_unchecked::<T>(stream, x.addr(), mask, x.addr(), &s)
    }

    fn forward_unchecked<T: FloatElement>(
        &self,
        stream: &Stream,
        x: u64,
        mask: SoftmaxMask<'_>,
        y: u64,
        s: &Sizes,
    ) -> Result<()> {
        let (mode, mask_addr, mask_batch_stride) = match mask {
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
        };
        if s.rows == 0 {
            return Ok(());
        }
        let p = self.plan::<T>(FWD, s, &[x, y, mask_addr])?;
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
        };
        stream.launch(fwd_kernel(T::DTYPE, &p)?, p.cfg, params)
    }

    /// `dx = scale * (dy*y - y * sum(dy*y))` per row, with `y` the forward
    /// output (the mask is already in `y`: masked columns have zero gradient).
    pub fn backward<T: FloatElement>(
        &self,
        stream: &Stream,
        y: &DeviceBuffer<T>,
        dy: &DeviceBuffer<T>,
        dx: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let s = self.sizes(BWD)?;
        check_buffer(BWD, "y", stream, y, s.elements)?;
        check_buffer(BWD, "dy", stream, dy, s.elements)?;
        check_buffer(BWD, "dx", stream, dx, s.elements)?;
        self.backward_unchecked::<T>(stream, y.addr(), dy.addr(), dx.addr(), &s)
    }

    /// As [`ScaleMaskSoftmax::backward`], overwriting `grad` (dy on entry)
    /// with dx.
    pub fn backward_in_place<T: FloatElement>(
        &self,
        stream: &Stream,
        y: &DeviceBuffer<T>,
        grad: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let s = self.sizes(BWD)?;
        check_buffer(BWD, "y", stream, y, s.elements)?;
        check_buffer(BWD, "grad", stream, grad, s.elements)?;
        self.backward_unchecked::<T>(stream, y.addr(), grad.addr(), grad.addr(), &s)
    }

    fn backward_unchecked<T: FloatElement>(
        &self,
        stream: &Stream,
        y: u64,
        dy: u64,
        dx: u64,
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
        };
        stream.launch(bwd_kernel(T::DTYPE, &p)?, p.cfg, params)
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
                        fwd_kernel(d, &p).unwrap();
                        bwd_kernel(d, &p).unwrap();
                    }
                }
            }
        }
    }
}
