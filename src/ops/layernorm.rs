//! (in progress: issue 3) Typed op for cuda/layernorm.cu.
