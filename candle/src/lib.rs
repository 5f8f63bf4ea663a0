//! # ferrotron-candle
//!
//! ferrotron's fused kernels as candle custom ops: bias + GeLU,
//! scale + mask + softmax, LayerNorm / RMSNorm and GEMM + bias + GeLU,
//! forward and backward. On candle's CPU device they run through ferrotron's CUDA
//! emulator with zero copies: the kernels read candle's contiguous storage
//! in place and write the new tensor's vector directly, through
//! [`ferrotron::HostScope`] views.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ferrotron_candle::{bias_gelu, Gelu};
//!
//! let x = Tensor::randn(0f32, 1.0, (4, 64), &Device::Cpu)?;
//! let b = Tensor::randn(0f32, 1.0, 64, &Device::Cpu)?;
//! let fused = bias_gelu(&x, &b, Gelu::Tanh)?;
//! let unfused = x.broadcast_add(&b)?.gelu()?; // candle's tanh GeLU
//! let err = (fused - unfused)?.abs()?.max_all()?.to_scalar::<f32>()?;
//! assert!(err < 1e-5);
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! The README's example, GEMM + bias + GeLU in one kernel:
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use ferrotron_candle::{linear_bias_gelu, Gelu};
//!
//! let dev = Device::Cpu;
//! let x = Tensor::randn(0f32, 1.0, (32, 64), &dev)?.to_dtype(DType::BF16)?;
//! let w = Tensor::randn(0f32, 0.1, (256, 64), &dev)?.to_dtype(DType::BF16)?;
//! let b = Tensor::zeros(256, DType::BF16, &dev)?;
//! let h = linear_bias_gelu(&x, &w, &b, Gelu::Tanh)?; // = (x.matmul(&w.t()?)? + b)?.gelu()?, one kernel
//! let unfused = x.matmul(&w.t()?)?.broadcast_add(&b)?.gelu()?;
//! let diff = (h.to_dtype(DType::F32)? - unfused.to_dtype(DType::F32)?)?.abs()?.max_all()?;
//! assert!(diff.to_scalar::<f32>()? < 0.05);
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! Inputs must be fp32, fp16 or bf16 (GEMM: fp16 or bf16) and are made
//! contiguous first (candle's own copy, only when a tensor is strided).
//! The CUDA side (`cuda_fwd`) is not provided: candle's `cuda` feature
//! cannot be built together with ferrotron's (docs/interop.md, "candle").

mod cpu;
mod ops;

pub use ferrotron::ops::Gelu;
pub use ops::{
    BiasGeluBackward, BiasGeluOp, LayerNormBackward, LayerNormOp, LinearBiasGeluOp,
    RmsNormBackward, RmsNormOp, SoftmaxBackward, SoftmaxOp,
};

use candle_core::{Result, Tensor};

/// `gelu(x + bias)` over the last dimension of `x` (`bias` of that size).
/// Differentiable (dx and dbias).
pub fn bias_gelu(x: &Tensor, bias: &Tensor, gelu: Gelu) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2(&bias.contiguous()?, BiasGeluOp { gelu })
}

/// `softmax(scale * x)` over the last dimension of `x` (`[.., sq, sk]`),
/// with the causal mask (row `i` keeps columns `<= i`, needs `sq == sk`)
/// when `causal`. Differentiable.
pub fn scale_mask_softmax(x: &Tensor, scale: f32, causal: bool) -> Result<Tensor> {
    x.contiguous()?.apply_op1(SoftmaxOp { scale, causal })
}

/// LayerNorm over the last dimension: `(x - mean) * rstd * gamma + beta`.
/// Differentiable (dx, dgamma, dbeta).
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
    x.contiguous()?.apply_op3(
        &gamma.contiguous()?,
        &beta.contiguous()?,
        LayerNormOp { eps },
    )
}

/// RMSNorm over the last dimension: `x * rsqrt(mean(x^2) + eps) * gamma`.
/// Differentiable (dx, dgamma).
pub fn rms_norm(x: &Tensor, gamma: &Tensor, eps: f32) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2(&gamma.contiguous()?, RmsNormOp { eps })
}

/// `gelu(x w^T + b)`: candle's `Linear` (weight `[out, in]`) followed by a
/// GeLU, as one ferrotron GEMM with the bias + GeLU epilogue. `x` is
/// `[.., in]`, fp16 or bf16 like `w` and `b`; fp32 accumulation.
/// Differentiable (dx, dw, db; the backward uses candle's matmul).
pub fn linear_bias_gelu(x: &Tensor, w: &Tensor, b: &Tensor, gelu: Gelu) -> Result<Tensor> {
    x.contiguous()?.apply_op3(
        &w.contiguous()?,
        &b.contiguous()?,
        LinearBiasGeluOp { gelu },
    )
}
