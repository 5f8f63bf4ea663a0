//! The candle custom ops. Each forward borrows candle's contiguous input
//! storage and the new output vector as emulator views and runs one
//! ferrotron op on them. A backward that needs several gradients runs one
//! ferrotron backward op writing them packed into one vector (`[dx, dgamma,
//! ...]`), which `bwd` splits with `narrow` (a candle custom op has one
//! output).

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, WithDType,
};
use ferrotron::ops::{
    Aux, BiasGelu, Epilogue, Gelu, Gemm, GemmInputs, LayerNorm, RmsNorm, ScaleMaskSoftmax,
    SoftmaxMask,
};

use crate::cpu::{expect_len, last_dim, rows, run, slice, with_float, zeros};

/// The packed output of a backward op, split: the first `x.elem_count()`
/// elements shaped as `x`, then each of `rest` (element counts) shaped as
/// the matching tensor.
fn unpack(packed: &Tensor, x: &Tensor, rest: &[&Tensor]) -> Result<Vec<Tensor>> {
    let mut out = vec![packed.narrow(0, 0, x.elem_count())?.reshape(x.shape())?];
    let mut at = x.elem_count();
    for t in rest {
        out.push(packed.narrow(0, at, t.elem_count())?.reshape(t.shape())?);
        at += t.elem_count();
    }
    Ok(out)
}

fn owned<T: WithDType>(v: Vec<T>, shape: Shape) -> Result<(CpuStorage, Shape)> {
    Ok((T::to_cpu_storage_owned(v), shape))
}

/// `gelu(x + bias)`, bias over the last dimension ([`crate::bias_gelu`]).
#[derive(Clone, Copy, Debug)]
pub struct BiasGeluOp {
    pub gelu: Gelu,
}

impl CustomOp2 for BiasGeluOp {
    fn name(&self) -> &'static str {
        "ferrotron-bias-gelu"
    }

    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let cols = last_dim(op, "x", lx)?;
        expect_len(op, "bias", lb, cols)?;
        with_float!(op, sx.dtype(), T => {
            let (x, b) = (slice::<T>(op, "x", sx, lx)?, slice::<T>(op, "bias", sb, lb)?);
            let mut y = zeros::<T>(x.len());
            let fused = BiasGelu::new(rows(x.len(), cols), cols).with_gelu(self.gelu);
            let out = &mut y[..];
            run(move |s, st| {
                let (xv, bv, mut yv) = (s.slice(x)?, s.slice(b)?, s.slice_mut(out)?);
                fused.forward(st, &xv, Some(&bv), &mut yv)
            })?;
            owned(y, lx.shape().clone())
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        bias: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let packed =
            grad.contiguous()?
                .apply_op3_no_bwd(x, bias, &BiasGeluBackward { gelu: self.gelu })?;
        let mut g = unpack(&packed, x, &[bias])?.into_iter();
        Ok((g.next(), g.next()))
    }
}

/// Backward of [`BiasGeluOp`]: `(dy, x, bias)` to `[dx (as x), dbias]`
/// packed in one 1-D tensor (ferrotron's deterministic column sums).
#[derive(Clone, Copy, Debug)]
pub struct BiasGeluBackward {
    pub gelu: Gelu,
}

impl CustomOp3 for BiasGeluBackward {
    fn name(&self) -> &'static str {
        "ferrotron-bias-gelu-backward"
    }

    fn cpu_fwd(
        &self,
        sdy: &CpuStorage,
        ldy: &Layout,
        sx: &CpuStorage,
        lx: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let cols = last_dim(op, "x", lx)?;
        expect_len(op, "bias", lb, cols)?;
        expect_len(op, "dy", ldy, lx.shape().elem_count())?;
        with_float!(op, sx.dtype(), T => {
            let dy = slice::<T>(op, "dy", sdy, ldy)?;
            let (x, b) = (slice::<T>(op, "x", sx, lx)?, slice::<T>(op, "bias", sb, lb)?);
            let n = x.len();
            let mut packed = zeros::<T>(n + cols);
            let fused = BiasGelu::new(rows(n, cols), cols).with_gelu(self.gelu);
            let (dx, db) = packed.split_at_mut(n);
            run(move |s, st| {
                let (dyv, xv, bv) = (s.slice(dy)?, s.slice(x)?, s.slice(b)?);
                let (mut dxv, mut dbv) = (s.slice_mut(dx)?, s.slice_mut(db)?);
                fused.backward(st, &dyv, &xv, Some(&bv), &mut dxv, Some(&mut dbv))
            })?;
            owned(packed, Shape::from(n + cols))
        })
    }
}

/// The `[batch, 1, sq, sk]` view ferrotron's softmax takes of `[.., sq, sk]`.
fn softmax_op(op: &str, l: &Layout, scale: f32) -> Result<ScaleMaskSoftmax> {
    let d = l.dims();
    if d.len() < 2 {
        candle_core::bail!("{op}: `x` must be [.., sq, sk], got shape {d:?}");
    }
    let (sq, sk) = (d[d.len() - 2], d[d.len() - 1]);
    let batch = d[..d.len() - 2].iter().product();
    Ok(ScaleMaskSoftmax::new(batch, 1, sq, sk, scale))
}

fn mask(causal: bool) -> SoftmaxMask<'static> {
    if causal {
        SoftmaxMask::Causal
    } else {
        SoftmaxMask::None
    }
}

/// `softmax(scale * x)` over the last dimension, optionally causal
/// ([`crate::scale_mask_softmax`]).
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxOp {
    pub scale: f32,
    pub causal: bool,
}

impl CustomOp1 for SoftmaxOp {
    fn name(&self) -> &'static str {
        "ferrotron-scale-mask-softmax"
    }

    fn cpu_fwd(&self, sx: &CpuStorage, lx: &Layout) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let fused = softmax_op(op, lx, self.scale)?;
        let m = mask(self.causal);
        with_float!(op, sx.dtype(), T => {
            let x = slice::<T>(op, "x", sx, lx)?;
            let mut y = zeros::<T>(x.len());
            let out = &mut y[..];
            run(move |s, st| {
                let (xv, mut yv) = (s.slice(x)?, s.slice_mut(out)?);
                fused.forward(st, &xv, m, &mut yv)
            })?;
            owned(y, lx.shape().clone())
        })
    }

    fn bwd(&self, _x: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let dx = grad
            .contiguous()?
            .apply_op2_no_bwd(res, &SoftmaxBackward { scale: self.scale })?;
        Ok(Some(dx))
    }
}

/// Backward of [`SoftmaxOp`]: `(dy, y)` to `dx = scale * y * (dy - sum(dy * y))`.
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxBackward {
    pub scale: f32,
}

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "ferrotron-scale-mask-softmax-backward"
    }

    fn cpu_fwd(
        &self,
        sdy: &CpuStorage,
        ldy: &Layout,
        sy: &CpuStorage,
        ly: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let fused = softmax_op(op, ly, self.scale)?;
        expect_len(op, "dy", ldy, ly.shape().elem_count())?;
        with_float!(op, sy.dtype(), T => {
            let (dy, y) = (slice::<T>(op, "dy", sdy, ldy)?, slice::<T>(op, "y", sy, ly)?);
            let mut dx = zeros::<T>(y.len());
            let out = &mut dx[..];
            run(move |s, st| {
                let (dyv, yv, mut dxv) = (s.slice(dy)?, s.slice(y)?, s.slice_mut(out)?);
                fused.backward(st, &yv, &dyv, &mut dxv)
            })?;
            owned(dx, ly.shape().clone())
        })
    }
}

/// LayerNorm over the last dimension ([`crate::layer_norm`]).
#[derive(Clone, Copy, Debug)]
pub struct LayerNormOp {
    pub eps: f32,
}

impl CustomOp3 for LayerNormOp {
    fn name(&self) -> &'static str {
        "ferrotron-layer-norm"
    }

    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sg: &CpuStorage,
        lg: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let h = last_dim(op, "x", lx)?;
        expect_len(op, "gamma", lg, h)?;
        expect_len(op, "beta", lb, h)?;
        with_float!(op, sx.dtype(), T => {
            let x = slice::<T>(op, "x", sx, lx)?;
            let (g, b) = (slice::<T>(op, "gamma", sg, lg)?, slice::<T>(op, "beta", sb, lb)?);
            let r = rows(x.len(), h);
            let mut y = zeros::<T>(x.len());
            let (mut mean, mut rstd) = (zeros::<f32>(r), zeros::<f32>(r));
            let ln = LayerNorm::new(r, h).with_eps(self.eps);
            let (out, mo, ro) = (&mut y[..], &mut mean[..], &mut rstd[..]);
            run(move |s, st| {
                let (xv, gv, bv) = (s.slice(x)?, s.slice(g)?, s.slice(b)?);
                let (mut yv, mut mv, mut rv) = (s.slice_mut(out)?, s.slice_mut(mo)?, s.slice_mut(ro)?);
                ln.forward(st, &xv, Some(&gv), Some(&bv), &mut yv, &mut mv, &mut rv)
            })?;
            owned(y, lx.shape().clone())
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let packed =
            grad.contiguous()?
                .apply_op3_no_bwd(x, gamma, &LayerNormBackward { eps: self.eps })?;
        let mut g = unpack(&packed, x, &[gamma, beta])?.into_iter();
        Ok((g.next(), g.next(), g.next()))
    }
}

/// Backward of [`LayerNormOp`]: `(dy, x, gamma)` to `[dx, dgamma, dbeta]`
/// packed; mean and rstd are recomputed (one forward pass).
#[derive(Clone, Copy, Debug)]
pub struct LayerNormBackward {
    pub eps: f32,
}

impl CustomOp3 for LayerNormBackward {
    fn name(&self) -> &'static str {
        "ferrotron-layer-norm-backward"
    }

    fn cpu_fwd(
        &self,
        sdy: &CpuStorage,
        ldy: &Layout,
        sx: &CpuStorage,
        lx: &Layout,
        sg: &CpuStorage,
        lg: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let h = last_dim(op, "x", lx)?;
        expect_len(op, "gamma", lg, h)?;
        expect_len(op, "dy", ldy, lx.shape().elem_count())?;
        with_float!(op, sx.dtype(), T => {
            let (dy, x) = (slice::<T>(op, "dy", sdy, ldy)?, slice::<T>(op, "x", sx, lx)?);
            let g = slice::<T>(op, "gamma", sg, lg)?;
            let (n, r) = (x.len(), rows(x.len(), h));
            let mut scratch = zeros::<T>(n);
            let (mut mean, mut rstd) = (zeros::<f32>(r), zeros::<f32>(r));
            let mut packed = zeros::<T>(n + 2 * h);
            let ln = LayerNorm::new(r, h).with_eps(self.eps);
            let (dx, rest) = packed.split_at_mut(n);
            let (dg, db) = rest.split_at_mut(h);
            let (yo, mo, ro) = (&mut scratch[..], &mut mean[..], &mut rstd[..]);
            run(move |s, st| {
                let (dyv, xv, gv) = (s.slice(dy)?, s.slice(x)?, s.slice(g)?);
                let (mut yv, mut mv, mut rv) = (s.slice_mut(yo)?, s.slice_mut(mo)?, s.slice_mut(ro)?);
                ln.forward(st, &xv, None, None, &mut yv, &mut mv, &mut rv)?;
                let (mut dxv, mut dgv, mut dbv) = (s.slice_mut(dx)?, s.slice_mut(dg)?, s.slice_mut(db)?);
                ln.backward(st, &dyv, &xv, &mv, &rv, Some(&gv), &mut dxv, Some(&mut dgv), Some(&mut dbv))
            })?;
            owned(packed, Shape::from(n + 2 * h))
        })
    }
}

/// RMSNorm over the last dimension ([`crate::rms_norm`]).
#[derive(Clone, Copy, Debug)]
pub struct RmsNormOp {
    pub eps: f32,
}

impl CustomOp2 for RmsNormOp {
    fn name(&self) -> &'static str {
        "ferrotron-rms-norm"
    }

    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sg: &CpuStorage,
        lg: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let h = last_dim(op, "x", lx)?;
        expect_len(op, "gamma", lg, h)?;
        with_float!(op, sx.dtype(), T => {
            let (x, g) = (slice::<T>(op, "x", sx, lx)?, slice::<T>(op, "gamma", sg, lg)?);
            let r = rows(x.len(), h);
            let (mut y, mut rstd) = (zeros::<T>(x.len()), zeros::<f32>(r));
            let rms = RmsNorm::new(r, h).with_eps(self.eps);
            let (out, ro) = (&mut y[..], &mut rstd[..]);
            run(move |s, st| {
                let (xv, gv) = (s.slice(x)?, s.slice(g)?);
                let (mut yv, mut rv) = (s.slice_mut(out)?, s.slice_mut(ro)?);
                rms.forward(st, &xv, Some(&gv), &mut yv, &mut rv)
            })?;
            owned(y, lx.shape().clone())
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let packed =
            grad.contiguous()?
                .apply_op3_no_bwd(x, gamma, &RmsNormBackward { eps: self.eps })?;
        let mut g = unpack(&packed, x, &[gamma])?.into_iter();
        Ok((g.next(), g.next()))
    }
}

/// Backward of [`RmsNormOp`]: `(dy, x, gamma)` to `[dx, dgamma]` packed;
/// rstd is recomputed.
#[derive(Clone, Copy, Debug)]
pub struct RmsNormBackward {
    pub eps: f32,
}

impl CustomOp3 for RmsNormBackward {
    fn name(&self) -> &'static str {
        "ferrotron-rms-norm-backward"
    }

    fn cpu_fwd(
        &self,
        sdy: &CpuStorage,
        ldy: &Layout,
        sx: &CpuStorage,
        lx: &Layout,
        sg: &CpuStorage,
        lg: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let h = last_dim(op, "x", lx)?;
        expect_len(op, "gamma", lg, h)?;
        expect_len(op, "dy", ldy, lx.shape().elem_count())?;
        with_float!(op, sx.dtype(), T => {
            let (dy, x) = (slice::<T>(op, "dy", sdy, ldy)?, slice::<T>(op, "x", sx, lx)?);
            let g = slice::<T>(op, "gamma", sg, lg)?;
            let (n, r) = (x.len(), rows(x.len(), h));
            let (mut scratch, mut rstd) = (zeros::<T>(n), zeros::<f32>(r));
            let mut packed = zeros::<T>(n + h);
            let rms = RmsNorm::new(r, h).with_eps(self.eps);
            let (dx, dg) = packed.split_at_mut(n);
            let (yo, ro) = (&mut scratch[..], &mut rstd[..]);
            run(move |s, st| {
                let (dyv, xv, gv) = (s.slice(dy)?, s.slice(x)?, s.slice(g)?);
                let (mut yv, mut rv) = (s.slice_mut(yo)?, s.slice_mut(ro)?);
                rms.forward(st, &xv, None, &mut yv, &mut rv)?;
                let (mut dxv, mut dgv) = (s.slice_mut(dx)?, s.slice_mut(dg)?);
                rms.backward(st, &dyv, &xv, &rv, Some(&gv), &mut dxv, Some(&mut dgv))
            })?;
            owned(packed, Shape::from(n + h))
        })
    }
}

/// `gelu(x w^T + b)` as one GEMM with the bias + GeLU epilogue
/// ([`crate::linear_bias_gelu`]); fp16 or bf16.
#[derive(Clone, Copy, Debug)]
pub struct LinearBiasGeluOp {
    pub gelu: Gelu,
}

impl CustomOp3 for LinearBiasGeluOp {
    fn name(&self) -> &'static str {
        "ferrotron-linear-bias-gelu"
    }

    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let k = last_dim(op, "x", lx)?;
        let (n, wk) = match lw.dims() {
            &[n, wk] => (n, wk),
            d => candle_core::bail!("{op}: `w` must be [out, in], got shape {d:?}"),
        };
        if wk != k {
            candle_core::bail!(
                "{op}: `w` must be [out, {k}] for x's last dimension {k}, got [{n}, {wk}]"
            );
        }
        expect_len(op, "b", lb, n)?;
        let mut dims = lx.dims().to_vec();
        *dims.last_mut().unwrap_or(&mut 0) = n;
        let gemm_of = |m: usize| {
            Gemm::new(m, n, k)
                .trans_b(true)
                .epilogue(Epilogue::BiasGelu(self.gelu))
        };
        match sx.dtype() {
            candle_core::DType::F32 => candle_core::bail!(
                "{op}: dtype F32 is not supported: the GEMM takes f16 or bf16 (fp32 accumulation)"
            ),
            d => with_float!(op, d, T => {
                let x = slice::<T>(op, "x", sx, lx)?;
                let (w, b) = (slice::<T>(op, "w", sw, lw)?, slice::<T>(op, "b", sb, lb)?);
                let m = rows(x.len(), k);
                let gemm = gemm_of(m);
                let mut y = zeros::<T>(m * n);
                let out = &mut y[..];
                run(move |s, st| {
                    let (xv, wv, bv, mut yv) = (s.slice(x)?, s.slice(w)?, s.slice(b)?, s.slice_mut(out)?);
                    let inputs = GemmInputs { a: &xv, b: &wv, bias: Some(&bv), c: None };
                    gemm.run(st, inputs, Aux::None, &mut yv)
                })?;
                owned(y, Shape::from(dims))
            }),
        }
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // Recompute the pre-activation with candle's matmul, take the GeLU
        // gradient (and the bias gradient) with ferrotron's fused backward,
        // then the two GEMM gradients with candle's matmul.
        let (k, n) = (w.dim(1)?, w.dim(0)?);
        let m = x.elem_count() / k.max(1);
        let x2 = x.reshape((m, k))?;
        let pre = x2.matmul(&w.t()?)?.broadcast_add(b)?;
        let dy = grad.contiguous()?.reshape((m, n))?;
        let packed = dy.apply_op3_no_bwd(
            &pre,
            &b.zeros_like()?,
            &BiasGeluBackward { gelu: self.gelu },
        )?;
        let g = unpack(&packed, &pre, &[b])?;
        let (dpre, db) = (&g[0], g[1].clone());
        let dx = dpre.matmul(w)?.reshape(x.shape())?;
        let dw = dpre.t()?.matmul(&x2)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}
