//! (in progress: issue 3) Launch plans for cuda/layernorm.cu.
