//! (in progress: issue 4) Typed GEMM family for cuda/gemm.cu.
