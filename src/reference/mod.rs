//! float64 CPU oracles for every op: the definitions tests and benches check
//! the kernels against (REFERENCE.md semantics, computed in f64).

pub mod bias_gelu;
pub mod gemm;
pub mod layernorm;
pub mod multi_tensor;
pub mod softmax;
pub mod vocab_parallel;
