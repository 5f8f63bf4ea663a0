//! (in progress: issue 3) float64 oracle for the layernorm ops.
