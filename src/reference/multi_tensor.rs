//! (in progress: issue 3) float64 oracle for the multi_tensor ops.
