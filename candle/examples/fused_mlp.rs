//! A small candle MLP (`linear -> gelu -> linear`, bf16 weights) run twice:
//! with candle's own `matmul + bias + gelu`, and with the first linear and
//! the GeLU swapped for ferrotron's fused GEMM + bias + GeLU (one kernel on
//! ferrotron's emulator, reading candle's tensors in place). Prints both
//! outputs' agreement and fails if they differ beyond bf16 tolerance.
//!
//! `cargo run -p ferrotron-candle --example fused_mlp`

use candle_core::{DType, Device, Result, Tensor};
use ferrotron_candle::{linear_bias_gelu, Gelu};

/// `y = x w^T + b`, candle's `Linear`.
fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    x.matmul(&w.t()?)?.broadcast_add(b)
}

struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl Mlp {
    fn new(hidden: usize, ffn: usize, dev: &Device) -> Result<Mlp> {
        let init = |shape: &[usize], fan_in: usize| -> Result<Tensor> {
            (Tensor::randn(0f32, 1.0, shape, dev)? / (fan_in as f64).sqrt())?.to_dtype(DType::BF16)
        };
        Ok(Mlp {
            w1: init(&[ffn, hidden], hidden)?,
            b1: init(&[ffn], hidden)?,
            w2: init(&[hidden, ffn], ffn)?,
            b2: init(&[hidden], ffn)?,
        })
    }

    /// candle only: `linear -> gelu -> linear`.
    fn forward_candle(&self, x: &Tensor) -> Result<Tensor> {
        let h = linear(x, &self.w1, &self.b1)?.gelu()?;
        linear(&h, &self.w2, &self.b2)
    }

    /// The first `linear -> gelu` as one ferrotron kernel.
    fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        let h = linear_bias_gelu(x, &self.w1, &self.b1, Gelu::Tanh)?;
        linear(&h, &self.w2, &self.b2)
    }
}

fn main() -> Result<()> {
    let dev = Device::Cpu;
    let (tokens, hidden, ffn) = (32, 64, 256);
    let mlp = Mlp::new(hidden, ffn, &dev)?;
    let x = Tensor::randn(0f32, 1.0, (tokens, hidden), &dev)?.to_dtype(DType::BF16)?;

    let reference = mlp.forward_candle(&x)?.to_dtype(DType::F32)?;
    let fused = mlp.forward_fused(&x)?.to_dtype(DType::F32)?;

    let diff = (&fused - &reference)?;
    let max_abs = diff.abs()?.max_all()?.to_scalar::<f32>()?;
    let rel = (diff.sqr()?.sum_all()?.sqrt()? / reference.sqr()?.sum_all()?.sqrt()?)?
        .to_scalar::<f32>()?;
    println!(
        "MLP [{tokens} x {hidden}] -> {ffn} -> {hidden}, bf16: candle linear+gelu vs ferrotron fused GEMM+bias+GeLU"
    );
    println!(
        "  max |difference| {max_abs:.3e}, relative L2 difference {rel:.3e} (bf16 tolerance 1e-2)"
    );
    println!(
        "  first outputs (candle) {:?}",
        &reference.flatten_all()?.to_vec1::<f32>()?[..4]
    );
    println!(
        "  first outputs (fused)  {:?}",
        &fused.flatten_all()?.to_vec1::<f32>()?[..4]
    );
    if rel > 1e-2 {
        candle_core::bail!("the fused MLP disagrees with candle's: relative difference {rel}");
    }
    println!("  agree");
    Ok(())
}
