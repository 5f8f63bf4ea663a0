//! (in progress: issue 3) Launch plans for cuda/softmax.cu.
