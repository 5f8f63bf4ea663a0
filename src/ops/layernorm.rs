//! LayerNorm and RMSNorm, forward and backward (kernels: `cuda/layernorm.cu`,
//! oracle: [`crate::reference::layernorm`]).
//!
//! Both normalise every row of a row-major `[rows, hidden]` matrix over its
//! `hidden` columns, with fp32 statistics and arithmetic for fp32, fp16 and
//! bf16 storage. Any `hidden >= 1` works (a warp-per-row path up to 1024, a
//! block-per-row path up to 12288, or 16384 for the forward of 16-bit rows
//! with 128-bit access, a path through global memory beyond).
//!
//! * LayerNorm: `y = (x - mean) * rsqrt(var + eps) * g + beta`, biased
//!   variance (divide by `hidden`), computed two-pass (never
//!   `E[x^2] - E[x]^2`).
//! * RMSNorm: `y = x * rsqrt(mean(x^2) + eps) * g`.
//!
//! `g` is `gamma`, or `gamma + 1` with `zero_centered_gamma`, or 1 when no
//! gamma is given; a missing beta is 0. The forward saves `mean` (LayerNorm)
//! and `rstd = rsqrt(var + eps)` per row, fp32, for the backward.
//! The backward gives `dx` and, if asked, `dgamma` (gradient of the stored
//! gamma, so the same with zero-centred gamma) and `dbeta`. Those two are
//! reduced over rows without float atomics, in a fixed order: bitwise
//! identical across runs for a given shape.
//!
//! `eps` must be finite and `> 0` (with `eps = 0` a constant row would give
//! an infinite rstd).
//!
//! ```no_run
//! use ferrotron::{Device, ops::LayerNorm};
//! let dev = Device::emu();
//! let stream = dev.new_stream()?;
//! let x = dev.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 7.0])?;
//! let gamma = dev.upload(&[1.0f32, 1.0, 2.0])?;
//! let mut y = dev.alloc_zeros::<f32>(6)?;
//! let mut mean = dev.alloc_zeros::<f32>(2)?;
//! let mut rstd = dev.alloc_zeros::<f32>(2)?;
//! LayerNorm::new(2, 3).forward(&stream, &x, Some(&gamma), None, &mut y, &mut mean, &mut rstd)?;
//! println!("{:?}", y.to_host()?);
//! # Ok::<(), ferrotron::Error>(())
//! ```

use super::{all_aligned16, check_buffer};
use crate::backend::{DeviceRead, DeviceWrite, Stream};
use crate::core::dtype::FloatElement;
use crate::core::plan::layernorm::{self as plan, RowPath};
use crate::core::{validate, DType, Result};
use crate::kernel_params::{
    FtnLayerNormBwdParams, FtnLayerNormColumnSumParams, FtnLayerNormFwdParams,
    FtnLayerNormParamGradParams, FTN_NORM_LAYER, FTN_NORM_RMS,
};
use crate::kernels::{self, Kernel};
use crate::Error;

/// The default `eps` (Megatron, Apex, PyTorch).
pub const DEFAULT_EPS: f32 = 1e-5;

/// LayerNorm over the last dimension of a `[rows, hidden]` matrix.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerNorm {
    pub rows: usize,
    pub hidden: usize,
    /// Added to the variance; finite and `> 0`. Default [`DEFAULT_EPS`].
    pub eps: f32,
    /// Scale by `gamma + 1` (gamma stored centred on zero).
    pub zero_centered_gamma: bool,
    /// Use 128-bit accesses where the data allows (default). `false` forces
    /// the scalar path: for comparisons in benches and tests.
    pub vectorize: bool,
}

/// RMSNorm over the last dimension of a `[rows, hidden]` matrix.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNorm {
    pub rows: usize,
    pub hidden: usize,
    /// Added to `mean(x^2)`; finite and `> 0`. Default [`DEFAULT_EPS`].
    pub eps: f32,
    /// Scale by `gamma + 1` (gamma stored centred on zero).
    pub zero_centered_gamma: bool,
    /// As [`LayerNorm::vectorize`].
    pub vectorize: bool,
}

const LN_FWD: &str = "layer_norm_forward";
const LN_BWD: &str = "layer_norm_backward";
const RMS_FWD: &str = "rms_norm_forward";
const RMS_BWD: &str = "rms_norm_backward";

/// The kernel of a row path for dtype `d`, vector width `vec` (1: the
/// scalar build of the warp and block kernels; the global kernels take both).
fn fwd_kernel(d: DType, path: RowPath, vec: u32) -> Result<&'static Kernel<FtnLayerNormFwdParams>> {
    match (path, vec == 1) {
        (RowPath::Warp, false) => kernels::LAYERNORM_FWD_WARP.for_dtype(d),
        (RowPath::Warp, true) => kernels::LAYERNORM_FWD_WARP_SCALAR.for_dtype(d),
        (RowPath::Block, false) => kernels::LAYERNORM_FWD_BLOCK.for_dtype(d),
        (RowPath::Block, true) => kernels::LAYERNORM_FWD_BLOCK_SCALAR.for_dtype(d),
        (RowPath::Global, _) => kernels::LAYERNORM_FWD_GLOBAL.for_dtype(d),
    }
}

fn bwd_kernel(d: DType, path: RowPath, vec: u32) -> Result<&'static Kernel<FtnLayerNormBwdParams>> {
    match (path, vec == 1) {
        (RowPath::Warp, false) => kernels::LAYERNORM_BWD_WARP.for_dtype(d),
        (RowPath::Warp, true) => kernels::LAYERNORM_BWD_WARP_SCALAR.for_dtype(d),
        (RowPath::Block, false) => kernels::LAYERNORM_BWD_BLOCK.for_dtype(d),
        (RowPath::Block, true) => kernels::LAYERNORM_BWD_BLOCK_SCALAR.for_dtype(d),
        (RowPath::Global, _) => kernels::LAYERNORM_BWD_GLOBAL.for_dtype(d),
    }
}

/// The fused backward kernel (dx and the parameter-gradient partials) of a
/// row path that has one.
fn fused_bwd_kernel(
    d: DType,
    path: RowPath,
    vec: u32,
    pipelined: bool,
    cluster: u32,
) -> Result<&'static Kernel<FtnLayerNormBwdParams>> {
    match path {
        _ if cluster > 1 => kernels::LAYERNORM_BWD_FUSED_CLUSTER.variant(cluster, d),
        RowPath::Block if pipelined => kernels::LAYERNORM_BWD_FUSED_PIPE.for_dtype(d),
        RowPath::Global if pipelined => kernels::LAYERNORM_BWD_FUSED_PIPE_WIDE.for_dtype(d),
        RowPath::Warp if vec == 1 => kernels::LAYERNORM_BWD_FUSED_WARP_SCALAR.for_dtype(d),
        RowPath::Warp => kernels::LAYERNORM_BWD_FUSED_WARP.for_dtype(d),
        RowPath::Block if vec == 1 => kernels::LAYERNORM_BWD_FUSED_BLOCK_SCALAR.for_dtype(d),
        RowPath::Block => kernels::LAYERNORM_BWD_FUSED_BLOCK.for_dtype(d),
        RowPath::Global => Err(Error::invalid(
            LN_BWD,
            "path",
            "a row path with a fused backward",
            "global",
        )),
    }
}

/// What LayerNorm and RMSNorm share.
#[derive(Clone, Copy)]
struct Norm {
    rows: usize,
    hidden: usize,
    eps: f32,
    zero_centered_gamma: bool,
    vectorize: bool,
    rms: bool,
}

impl Norm {
    fn kind(&self) -> u32 {
        if self.rms {
            FTN_NORM_RMS
        } else {
            FTN_NORM_LAYER
        }
    }

    /// Checks the shape and eps; returns `rows * hidden`.
    fn check_shape(&self, op: &'static str, check_eps: bool) -> Result<usize> {
        validate::positive(op, "hidden", self.hidden)?;
        let n = validate::elements(op, self.rows, self.hidden)?;
        let bytes_ok = n
            .checked_mul(4)
            .is_some_and(|b| b <= isize::MAX as usize && n <= i64::MAX as usize);
        if !bytes_ok {
            return Err(Error::invalid(
                op,
                "rows * hidden",
                "a matrix whose fp32 size fits in isize",
                n,
            ));
        }
        if check_eps && !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(Error::invalid(op, "eps", "a finite value > 0", self.eps));
        }
        Ok(n)
    }

    #[allow(clippy::too_many_arguments)]
    fn forward<T: FloatElement>(
        &self,
        op: &'static str,
        stream: &Stream,
        x: &dyn DeviceRead<T>,
        gamma: Option<&dyn DeviceRead<T>>,
        beta: Option<&dyn DeviceRead<T>>,
        y: &mut dyn DeviceWrite<T>,
        mean: Option<&mut dyn DeviceWrite<f32>>,
        rstd: &mut dyn DeviceWrite<f32>,
    ) -> Result<()> {
        let n = self.check_shape(op, true)?;
        check_buffer(op, "x", stream, x, n)?;
        check_buffer(op, "y", stream, y, n)?;
        if let Some(g) = gamma {
            check_buffer(op, "gamma", stream, g, self.hidden)?;
        }
        if let Some(b) = beta {
            check_buffer(op, "beta", stream, b, self.hidden)?;
        }
        if let Some(m) = mean.as_deref() {
            check_buffer(op, "mean", stream, m, self.rows)?;
        }
        check_buffer(op, "rstd", stream, rstd, self.rows)?;
        let bytes = n * T::DTYPE.size();
        crate::core::validate::disjoint(op, "y", (y.addr(), bytes), "x", (x.addr(), bytes))?;
        if n == 0 {
            return Ok(());
        }
        let gamma_addr = gamma.map_or(0, |b| b.addr());
        let beta_addr = beta.map_or(0, |b| b.addr());
        let p = plan::forward(
            self.rows as u64,
            self.hidden as u64,
            T::DTYPE.size(),
            self.vectorize && all_aligned16(&[x.addr(), y.addr(), gamma_addr, beta_addr]),
        );
        let params = FtnLayerNormFwdParams {
            y: y.addr() as *mut _,
            x: x.addr() as *const _,
            gamma: gamma_addr as *const _,
            beta: beta_addr as *const _,
            mean: mean.map_or(0, |m| m.addr()) as *mut f32,
            rstd: rstd.addr() as *mut f32,
            rows: self.rows as i64,
            cols: self.hidden as i64,
            eps: self.eps,
            kind: self.kind(),
            zero_centered_gamma: self.zero_centered_gamma as u32,
            vec: p.vec,
        };
        stream.launch(fwd_kernel(T::DTYPE, p.path, p.vec)?, p.cfg, params)
    }

    #[allow(clippy::too_many_arguments)]
    fn backward<T: FloatElement>(
        &self,
        op: &'static str,
        stream: &Stream,
        dy: &dyn DeviceRead<T>,
        x: &dyn DeviceRead<T>,
        mean: Option<&dyn DeviceRead<f32>>,
        rstd: &dyn DeviceRead<f32>,
        gamma: Option<&dyn DeviceRead<T>>,
        dx: &mut dyn DeviceWrite<T>,
        dgamma: Option<&mut dyn DeviceWrite<T>>,
        dbeta: Option<&mut dyn DeviceWrite<T>>,
    ) -> Result<()> {
        let n = self.check_shape(op, false)?;
        check_buffer(op, "dy", stream, dy, n)?;
        check_buffer(op, "x", stream, x, n)?;
        check_buffer(op, "dx", stream, dx, n)?;
        if let Some(m) = mean {
            check_buffer(op, "mean", stream, m, self.rows)?;
        }
        check_buffer(op, "rstd", stream, rstd, self.rows)?;
        if let Some(g) = gamma {
            check_buffer(op, "gamma", stream, g, self.hidden)?;
        }
        if let Some(g) = dgamma.as_deref() {
            check_buffer(op, "dgamma", stream, g, self.hidden)?;
        }
        if let Some(b) = dbeta.as_deref() {
            check_buffer(op, "dbeta", stream, b, self.hidden)?;
        }
        if n == 0 {
            // No rows: the parameter gradients are zero.
            if let Some(g) = dgamma {
                stream.fill_bytes(g, 0)?;
            }
            if let Some(b) = dbeta {
                stream.fill_bytes(b, 0)?;
            }
            return Ok(());
        }
        let mean_addr = mean.map_or(0, |b| b.addr());
        let gamma_addr = gamma.map_or(0, |b| b.addr());
        let aligned = all_aligned16(&[dy.addr(), x.addr(), dx.addr(), gamma_addr]);
        let (rows, hidden, es) = (self.rows as u64, self.hidden as u64, T::DTYPE.size());
        let vectorize = self.vectorize && aligned;
        let with_beta = dbeta.is_some();
        let sums = ColumnSums {
            dgamma: dgamma.map_or(0, |g| g.addr()),
            dbeta: dbeta.map_or(0, |b| b.addr()),
        };
        let mut params = FtnLayerNormBwdParams {
            dx: dx.addr() as *mut _,
            dy: dy.addr() as *const _,
            x: x.addr() as *const _,
            gamma: gamma_addr as *const _,
            mean: mean_addr as *const f32,
            rstd: rstd.addr() as *const f32,
            rows: self.rows as i64,
            cols: self.hidden as i64,
            kind: self.kind(),
            zero_centered_gamma: self.zero_centered_gamma as u32,
            vec: 1,
            reserved: 0,
            partial_gamma: core::ptr::null_mut(),
            partial_beta: core::ptr::null_mut(),
            rows_per_chunk: 1,
        };
        if !sums.wanted() {
            let p = plan::rows(rows, hidden, es, vectorize);
            params.vec = p.vec;
            return stream.launch(bwd_kernel(T::DTYPE, p.path, p.vec)?, p.cfg, params);
        }

        // dx and the chunks' partials in one pass over dy and x, then the
        // fixed-order sum of the chunks.
        let limits = stream.device().limits();
        if let Some(f) = plan::fused_backward_within(rows, hidden, es, vectorize, with_beta, limits)
        {
            let (pg, pb) = self.partials(op, stream, f.chunks, with_beta)?;
            params.vec = f.vec;
            params.partial_gamma = pg as *mut f32;
            params.partial_beta = pb as *mut f32;
            params.rows_per_chunk = f.rows_per_chunk as i64;
            let kernel = fused_bwd_kernel(T::DTYPE, f.path, f.vec, f.pipelined, f.cluster)?;
            stream.launch(kernel, f.cfg, params)?;
            return sums.launch::<T>(stream, (pg, pb), f.chunks, hidden, f.reduce_cfg);
        }

        // No fused kernel for this row path: the parameter gradients re-read
        // dy and x column-wise (stage one), then dx.
        let pg = plan::param_grads(rows, hidden, es, vectorize, with_beta);
        let (wg, wb) = self.partials(op, stream, pg.chunks, with_beta)?;
        let stage_one = FtnLayerNormParamGradParams {
            partial_gamma: wg as *mut f32,
            partial_beta: wb as *mut f32,
            dy: dy.addr() as *const _,
            x: x.addr() as *const _,
            mean: mean_addr as *const f32,
            rstd: rstd.addr() as *const f32,
            rows: self.rows as i64,
            cols: self.hidden as i64,
            rows_per_chunk: pg.rows_per_chunk as i64,
            kind: self.kind(),
            vec: pg.vec,
        };
        stream.launch(
            kernels::LAYERNORM_PARAM_GRAD.for_dtype(T::DTYPE)?,
            pg.cfg,
            stage_one,
        )?;
        sums.launch::<T>(stream, (wg, wb), pg.chunks, hidden, pg.reduce_cfg)?;
        let p = plan::rows(rows, hidden, es, vectorize);
        params.vec = p.vec;
        stream.launch(bwd_kernel(T::DTYPE, p.path, p.vec)?, p.cfg, params)
    }

    /// The fp32 partials of `chunks` chunks in the stream's workspace:
    /// (gamma, beta) addresses, beta 0 unless `with_beta`.
    fn partials(
        &self,
        op: &'static str,
        stream: &Stream,
        chunks: u64,
        with_beta: bool,
    ) -> Result<(u64, u64)> {
        let part = validate::elements(op, chunks as usize, self.hidden)?;
        let count = if with_beta { 2 } else { 1 };
        let bytes = part
            .checked_mul(4 * count)
            .ok_or_else(|| Error::invalid(op, "hidden", "a workspace that fits", self.hidden))?;
        let ws = stream.workspace(bytes)?;
        Ok((ws, if with_beta { ws + part as u64 * 4 } else { 0 }))
    }
}

/// The parameter-gradient outputs (0: not wanted) and stage two, the
/// fixed-order sum of the chunks' partials into them.
struct ColumnSums {
    dgamma: u64,
    dbeta: u64,
}

impl ColumnSums {
    fn wanted(&self) -> bool {
        self.dgamma != 0 || self.dbeta != 0
    }

    fn launch<T: FloatElement>(
        &self,
        stream: &Stream,
        (partial_gamma, partial_beta): (u64, u64),
        chunks: u64,
        hidden: u64,
        cfg: crate::core::launch::LaunchConfig,
    ) -> Result<()> {
        let sum = FtnLayerNormColumnSumParams {
            dgamma: self.dgamma as *mut _,
            dbeta: self.dbeta as *mut _,
            partial_gamma: partial_gamma as *const f32,
            partial_beta: partial_beta as *const f32,
            chunks: chunks as i64,
            cols: hidden as i64,
        };
        stream.launch(kernels::LAYERNORM_COLUMN_SUM.for_dtype(T::DTYPE)?, cfg, sum)
    }
}

impl LayerNorm {
    /// `[rows, hidden]`, eps 1e-5, plain gamma, vectorised.
    pub fn new(rows: usize, hidden: usize) -> Self {
        LayerNorm {
            rows,
            hidden,
            eps: DEFAULT_EPS,
            zero_centered_gamma: false,
            vectorize: true,
        }
    }

    pub fn with_eps(self, eps: f32) -> Self {
        LayerNorm { eps, ..self }
    }

    pub fn with_zero_centered_gamma(self, zero_centered_gamma: bool) -> Self {
        LayerNorm {
            zero_centered_gamma,
            ..self
        }
    }

    pub fn with_vectorize(self, vectorize: bool) -> Self {
        LayerNorm { vectorize, ..self }
    }

    fn norm(&self) -> Norm {
        Norm {
            rows: self.rows,
            hidden: self.hidden,
            eps: self.eps,
            zero_centered_gamma: self.zero_centered_gamma,
            vectorize: self.vectorize,
            rms: false,
        }
    }

    /// `y = (x - mean) * rstd * g + beta`; writes `mean[rows]` and
    /// `rstd[rows]` (fp32) for [`LayerNorm::backward`].
    #[allow(clippy::too_many_arguments)]
    pub fn forward<T: FloatElement>(
        &self,
        stream: &Stream,
        x: &dyn DeviceRead<T>,
        gamma: Option<&dyn DeviceRead<T>>,
        beta: Option<&dyn DeviceRead<T>>,
        y: &mut dyn DeviceWrite<T>,
        mean: &mut dyn DeviceWrite<f32>,
        rstd: &mut dyn DeviceWrite<f32>,
    ) -> Result<()> {
        self.norm()
            .forward(LN_FWD, stream, x, gamma, beta, y, Some(mean), rstd)
    }

    /// `dx`, and if given `dgamma = sum_rows dy * xhat`, `dbeta = sum_rows dy`
    /// (deterministic). `mean`, `rstd` come from the forward on the same `x`;
    /// `gamma` is the forward's.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: FloatElement>(
        &self,
        stream: &Stream,
        dy: &dyn DeviceRead<T>,
        x: &dyn DeviceRead<T>,
        mean: &dyn DeviceRead<f32>,
        rstd: &dyn DeviceRead<f32>,
        gamma: Option<&dyn DeviceRead<T>>,
        dx: &mut dyn DeviceWrite<T>,
        dgamma: Option<&mut dyn DeviceWrite<T>>,
        dbeta: Option<&mut dyn DeviceWrite<T>>,
    ) -> Result<()> {
        self.norm().backward(
            LN_BWD,
            stream,
            dy,
            x,
            Some(mean),
            rstd,
            gamma,
            dx,
            dgamma,
            dbeta,
        )
    }
}

impl RmsNorm {
    /// `[rows, hidden]`, eps 1e-5, plain gamma, vectorised.
    pub fn new(rows: usize, hidden: usize) -> Self {
        RmsNorm {
            rows,
            hidden,
            eps: DEFAULT_EPS,
            zero_centered_gamma: false,
            vectorize: true,
        }
    }

    pub fn with_eps(self, eps: f32) -> Self {
        RmsNorm { eps, ..self }
    }

    pub fn with_zero_centered_gamma(self, zero_centered_gamma: bool) -> Self {
        RmsNorm {
            zero_centered_gamma,
            ..self
        }
    }

    pub fn with_vectorize(self, vectorize: bool) -> Self {
        RmsNorm { vectorize, ..self }
    }

    fn norm(&self) -> Norm {
        Norm {
            rows: self.rows,
            hidden: self.hidden,
            eps: self.eps,
            zero_centered_gamma: self.zero_centered_gamma,
            vectorize: self.vectorize,
            rms: true,
        }
    }

    /// `y = x * rstd * g`; writes `rstd[rows]` (fp32) for
    /// [`RmsNorm::backward`].
    pub fn forward<T: FloatElement>(
        &self,
        stream: &Stream,
        x: &dyn DeviceRead<T>,
        gamma: Option<&dyn DeviceRead<T>>,
        y: &mut dyn DeviceWrite<T>,
        rstd: &mut dyn DeviceWrite<f32>,
    ) -> Result<()> {
        self.norm()
            .forward(RMS_FWD, stream, x, gamma, None, y, None, rstd)
    }

    /// `dx`, and if given `dgamma = sum_rows dy * x * rstd` (deterministic).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: FloatElement>(
        &self,
        stream: &Stream,
        dy: &dyn DeviceRead<T>,
        x: &dyn DeviceRead<T>,
        rstd: &dyn DeviceRead<f32>,
        gamma: Option<&dyn DeviceRead<T>>,
        dx: &mut dyn DeviceWrite<T>,
        dgamma: Option<&mut dyn DeviceWrite<T>>,
    ) -> Result<()> {
        self.norm()
            .backward(RMS_BWD, stream, dy, x, None, rstd, gamma, dx, dgamma, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row path has a stamped forward and backward kernel per dtype.
    #[test]
    fn every_path_has_a_stamped_kernel() {
        for d in [DType::F32, DType::F16, DType::BF16] {
            for vec in [1, 16 / d.size() as u32] {
                for path in [RowPath::Warp, RowPath::Block, RowPath::Global] {
                    fwd_kernel(d, path, vec).unwrap();
                    bwd_kernel(d, path, vec).unwrap();
                }
                fused_bwd_kernel(d, RowPath::Warp, vec, false, 1).unwrap();
                fused_bwd_kernel(d, RowPath::Block, vec, false, 1).unwrap();
                assert!(fused_bwd_kernel(d, RowPath::Global, vec, false, 1).is_err());
            }
            // The pipelined fused backward (its wide build, its cluster
            // builds): 16-bit storage only.
            let v = 16 / d.size() as u32;
            for (path, cluster) in [
                (RowPath::Block, 1),
                (RowPath::Global, 1),
                (RowPath::Global, 2),
                (RowPath::Global, 4),
                (RowPath::Global, 8),
            ] {
                let pipe = fused_bwd_kernel(d, path, v, true, cluster);
                assert_eq!(pipe.is_ok(), d.size() == 2);
                if let Ok(k) = pipe {
                    assert_eq!(k.cluster, cluster, "{}", k.name);
                }
            }
            assert!(fused_bwd_kernel(DType::BF16, RowPath::Global, 8, true, 16).is_err());
            // The warp and block paths have a separate scalar build.
            assert_ne!(
                fwd_kernel(d, RowPath::Block, 1).unwrap().name,
                fwd_kernel(d, RowPath::Block, 16 / d.size() as u32)
                    .unwrap()
                    .name
            );
            kernels::LAYERNORM_PARAM_GRAD.for_dtype(d).unwrap();
            kernels::LAYERNORM_COLUMN_SUM.for_dtype(d).unwrap();
        }
    }
}
