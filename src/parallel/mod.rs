//! Tensor-parallel building blocks over a [`Communicator`]: explicit forward
//! and backward functions on device buffers and streams (no autograd of our
//! own), for frameworks to wire into theirs.
//!
//! [`Communicator`]: crate::comm::Communicator

pub mod attention;
pub mod ddp;
pub mod linear;
pub mod mappings;
pub mod mlp;
pub mod pipeline;
pub mod vocab;
