//! A GPT trained with tensor, pipeline and data parallelism from
//! ferrotron's parts: the vocab-parallel embedding (+ learned positions),
//! pre-LayerNorm layers (LayerNorm → [`TpAttention`] → bias-dropout-add →
//! LayerNorm → [`TpMlp`] → bias-dropout-add), a final LayerNorm, an output
//! layer tied to the word embedding and the vocab-parallel cross-entropy;
//! layers split over pipeline stages (the executor's 1F1B or interleaved
//! schedule), gradients reduced in contiguous buckets, the distributed
//! optimizer (ZeRO-1) with global-norm clipping over every rank, bf16 or
//! fp16 with dynamic loss scaling, activation recomputation (selective or
//! full), dropout from counter-based Philox streams.
//!
//! * [`config`]: the model, the split and its checks.
//! * [`stage`]: one pipeline rank's layers as a [`PipelineStage`].
//! * [`trainer`]: one rank's step; [`world`]: a job of in-process ranks;
//!   [`process`]: a job of one process per GPU over NCCL (torchrun-style);
//!   [`mfu`]: model FLOPs utilisation against the device's peak.
//! * [`sample`]: text from the trained (unsharded) parameters.
//!
//! The guide: `docs/training.md`; the program: `examples/train_gpt.rs`.
//!
//! [`TpAttention`]: crate::parallel::attention::TpAttention
//! [`TpMlp`]: crate::parallel::mlp::TpMlp
//! [`PipelineStage`]: crate::parallel::pipeline::PipelineStage

#[cfg(feature = "checkpoint")]
mod checkpoint_dir;
pub mod config;
pub mod corpus;
mod grads;
pub mod init;
mod layer;
mod loss;
pub mod mfu;
mod norm_grads;
pub mod plot;
pub mod process;
#[cfg(feature = "checkpoint")]
mod reshard;
pub mod sample;
pub mod stage;
pub mod trainer;
pub mod world;

#[cfg(feature = "checkpoint")]
pub use checkpoint_dir::saved_layout;
pub use config::{GptConfig, ParallelConfig, Precision, Recompute, Schedule};
pub use corpus::CharCorpus;
pub use layer::{layer_param_replicated, LAYER_PARAMS};
pub use process::train_this_process;
pub use trainer::{GptTrainer, ParamShard, RankComms, StepStats, TrainConfig};
pub use world::{train_in_process, EvalOptions, JobOptions, StepReport, TrainSummary};
