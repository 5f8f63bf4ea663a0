//! Megatron-style tensor parallelism behind the C ABI: the layers and
//! blocks (opaque handles), the mapping primitives, vocab-parallel
//! embedding and cross-entropy, and host-side sharding; and pipeline
//! schedules with their simulator ([`pipeline`]). Built on the
//! communicators of [`crate::comm`].

pub(crate) mod blocks;
pub(crate) mod common;
pub(crate) mod ddp;
pub(crate) mod linear;
pub(crate) mod mappings;
pub(crate) mod pipeline;
pub(crate) mod shard;
pub(crate) mod vocab;
