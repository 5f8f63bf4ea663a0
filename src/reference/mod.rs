//! float64 CPU oracles for every op: the definitions tests and benches check
//! the kernels against (docs/semantics.md, computed in f64; see docs/testing.md).

pub mod bias_gelu;
pub mod dropout;
pub mod gemm;
pub mod layernorm;
pub mod multi_tensor;
pub mod softmax;
pub mod vocab_parallel;
