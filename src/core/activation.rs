//! The activation choices shared by the ops, the C ABI and the float64
//! oracles (which must not depend on the op layer): which GeLU, and what a
//! GEMM's epilogue applies.

/// Which GeLU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Gelu {
    /// `0.5x(1 + tanh(0.79788456 x (1 + 0.044715 x^2)))` — Megatron's fused form.
    #[default]
    Tanh,
    /// `0.5x(1 + erf(x / sqrt 2))` — PyTorch's `F.gelu` default.
    Erf,
}

impl Gelu {
    /// The kernels' `FTN_GELU_*` code.
    pub const fn code(self) -> u32 {
        match self {
            Gelu::Tanh => crate::kernel_params::FTN_GELU_TANH,
            Gelu::Erf => crate::kernel_params::FTN_GELU_ERF,
        }
    }
}

/// What the kernel does to `v = alpha * op(A) op(B) [+ beta * C]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// `D = v`.
    #[default]
    None,
    /// `D = v + bias[n]` (bias required).
    Bias,
    /// `D = gelu(v + bias[n])` (bias optional); `Aux::Store` saves `v + bias`.
    BiasGelu(Gelu),
    /// `D = v * gelu'(pre)` with `pre` the saved pre-activation
    /// (`Aux::PreActivation`, required): the backward of `BiasGelu`.
    DGelu(Gelu),
}
