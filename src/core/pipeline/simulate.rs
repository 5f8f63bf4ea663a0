//! The simulator: to be written (see the module docs of `core::pipeline`).

use alloc::vec::Vec;

use super::Op;
use crate::core::Result;

/// Per-operation costs (any time unit). Per-stage costs scale the pass
/// costs by `stage_scale[stage]` when given.
#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    pub forward: f64,
    /// The whole backward (`Pass::Backward`).
    pub backward: f64,
    pub backward_input: f64,
    pub backward_weight: f64,
    /// From a send's end to the matching receive being satisfied.
    pub p2p_latency: f64,
    /// Multiplies every pass cost of a stage; empty = all 1.
    pub stage_scale: Vec<f64>,
}

/// One operation placed in time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub op: Op,
    pub start: f64,
    pub end: f64,
}

/// A simulated run.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    /// `timeline[rank]`, in execution order.
    pub timeline: Vec<Vec<Span>>,
    pub makespan: f64,
}

pub fn simulate(_ops: &[Vec<Op>], _costs: &Costs) -> Result<Simulation> {
    Ok(Simulation {
        timeline: Vec::new(),
        makespan: 0.0,
    })
}
