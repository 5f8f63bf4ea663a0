//! (in progress: issue 4) GEMM tile plans.
