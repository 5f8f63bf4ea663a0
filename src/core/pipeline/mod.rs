//! Pipeline parallelism, the `no_std` part: schedules as pure functions from
//! a configuration to an ordered list of operations per pipeline rank
//! ([`mod@schedule`]), and a simulator that turns a schedule and per-operation
//! costs into per-rank timelines, the makespan, the bubble and the peak of
//! in-flight activations ([`mod@simulate`]), and stage layouts: which of the
//! model's layers each stage holds, checked or split evenly as Megatron
//! does ([`layout`]).
//!
//! Model: the network is cut into `pp · vp` consecutive *stages*; pipeline
//! rank `r` holds the `vp` stages `r, r + pp, r + 2·pp, …` (its *chunks*
//! `0..vp`; `vp = 1` except for the interleaved schedule). A micro-batch's
//! forward runs stage 0 → last; its backward runs last → 0. Between stages
//! on different ranks, activations travel forward and gradients backward as
//! point-to-point messages, matched per (sender, receiver) pair in the
//! order they were posted, as NCCL matches them.

pub mod groups;
pub mod layout;
pub mod render;
pub mod schedule;
pub mod simulate;

pub use groups::{check_grouped, grouped_transfers, P2pGroup};
pub use layout::{transformer_layers, EvenSplit, StageLayout};
pub use schedule::{forward_only, schedule, PipelineConfig, ScheduleKind};
pub use simulate::{simulate, Costs, Simulation, Span};

/// The computation an operation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// Forward of one micro-batch through one stage.
    Forward,
    /// The whole backward (input gradient and weight gradient together).
    Backward,
    /// Zero-bubble schedules: the input gradient only (`B`), what the
    /// previous stage waits for.
    BackwardInput,
    /// Zero-bubble schedules: the weight gradient only (`W`), deferrable.
    BackwardWeight,
}

/// What travels between stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Payload {
    /// The output activation of `stage`'s forward, to `stage + 1`.
    Activation,
    /// The input gradient of `stage`'s backward, to `stage - 1`.
    Gradient,
}

/// One point-to-point message an operation receives before it runs or
/// sends after it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Message {
    /// The other pipeline rank.
    pub peer: usize,
    pub payload: Payload,
    pub microbatch: usize,
    /// The stage that produced the message (its sender's stage).
    pub from_stage: usize,
}

/// One operation of a rank's schedule, in execution order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    pub pass: Pass,
    pub microbatch: usize,
    /// The rank's virtual stage (chunk) index, `0..vp`.
    pub chunk: usize,
    /// The global stage, `chunk · pp + rank`.
    pub stage: usize,
    /// Received (and waited for) before the computation, if any.
    pub recv: Option<Message>,
    /// Sent after the computation, if any.
    pub send: Option<Message>,
}
