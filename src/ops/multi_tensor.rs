//! (in progress: issue 3) Typed op for cuda/multi_tensor.cu.
