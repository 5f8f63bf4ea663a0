//! Data parallelism (docs/data-parallel.md): Megatron-Core's contiguous
//! parameter and gradient buffers ([`buffers`]), bucketed gradient
//! reduction overlapped with backward ([`reducer`]) and the distributed
//! optimizer (ZeRO-1, [`dist_opt`]). The layout arithmetic is the `no_std`
//! [`crate::core::ddp_layout`].

mod buckets;
pub mod buffers;
#[cfg(feature = "checkpoint")]
pub mod checkpoint;
pub mod dist_opt;
pub mod reducer;

pub use crate::core::ddp_layout::{bytes_per_param, default_bucket_size, BytesPerParam};
pub use buffers::{
    BucketId, BufferView, ParamAndGradBuffers, ParamId, ParamInfo, ParamKind, ParamRegistry,
    MAX_PARAM_DIMS,
};
#[cfg(feature = "checkpoint")]
pub use checkpoint::{load_checkpoint, save_checkpoint, CHECKPOINT_FORMAT};
pub use dist_opt::{DistOptConfig, DistributedOptimizer};
pub use reducer::{DdpConfig, DistributedDataParallel, GradAveraging};
