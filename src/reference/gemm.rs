//! (in progress: issue 4) float64 oracle for the GEMM family.
