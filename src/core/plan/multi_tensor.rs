//! (in progress: issue 3) Launch plans for cuda/multi_tensor.cu.
