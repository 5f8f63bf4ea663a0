//! The simulator: turns a schedule (the ordered operations of every pipeline
//! rank, see [`super::schedule()`]) and per-operation [`Costs`] into per-rank
//! timelines ([`Span`]s), the makespan, the busy time of every rank, the
//! bubble fraction and the peak of in-flight activations per rank.
//!
//! Rules:
//! * every rank runs its operations in order, one at a time;
//! * an operation starts at the later of its rank's previous operation's end
//!   and, when it receives a message, the arrival of that message: the end
//!   of the sending operation plus [`Costs::p2p_latency`];
//! * sends are asynchronous: the sender never waits for the receiver;
//! * messages are matched per (sender, receiver) pair in the order they were
//!   posted (the `k`-th receive on `r` from `s` takes the `k`-th send from
//!   `s` to `r`), as NCCL matches them; the matched pair must agree on the
//!   payload, the micro-batch and the producing stage.
//!
//! A schedule that cannot complete — a receive whose send never happens, a
//! cycle of ranks waiting on each other, a send nobody receives, mismatched
//! messages, a peer that is not a rank — is reported as an
//! [`Error::InvalidArgument`] naming the operations involved; the simulator
//! never hangs or panics.

use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt::Write;

use super::{Message, Op, Pass};
use crate::core::{Error, Result};

const OP: &str = "pipeline::simulate";

/// Per-operation costs (any time unit). Per-stage costs scale the pass
/// costs by `stage_scale[stage]` when given.
#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    pub forward: f64,
    /// The whole backward (`Pass::Backward`).
    pub backward: f64,
    /// The input-gradient half of a split backward (`Pass::BackwardInput`).
    pub backward_input: f64,
    /// The weight-gradient half of a split backward (`Pass::BackwardWeight`).
    pub backward_weight: f64,
    /// From a send's end to the matching receive being satisfied.
    pub p2p_latency: f64,
    /// Multiplies every pass cost of a stage; empty = all 1. When not empty
    /// it must have an entry for every stage the schedule uses.
    pub stage_scale: Vec<f64>,
}

impl Default for Costs {
    /// The textbook unit costs: `F = 1`, full backward `= 2`, `B = W = 1`,
    /// no latency, every stage alike.
    fn default() -> Self {
        Costs::new(1.0, 2.0, 1.0, 1.0)
    }
}

impl Costs {
    /// Costs of the four passes, no latency, every stage alike.
    pub fn new(forward: f64, backward: f64, backward_input: f64, backward_weight: f64) -> Self {
        Costs {
            forward,
            backward,
            backward_input,
            backward_weight,
            p2p_latency: 0.0,
            stage_scale: Vec::new(),
        }
    }

    /// The same costs with every pass cost (not the latency) multiplied by
    /// `factor`: e.g. `1 / vp` for the chunks of an interleaved schedule
    /// when the costs describe a rank's whole share of the layers.
    pub fn scaled(&self, factor: f64) -> Self {
        Costs {
            forward: self.forward * factor,
            backward: self.backward * factor,
            backward_input: self.backward_input * factor,
            backward_weight: self.backward_weight * factor,
            p2p_latency: self.p2p_latency,
            stage_scale: self.stage_scale.clone(),
        }
    }

    /// The same costs with a point-to-point latency.
    pub fn with_latency(mut self, p2p_latency: f64) -> Self {
        self.p2p_latency = p2p_latency;
        self
    }

    /// The same costs with per-stage multipliers.
    pub fn with_stage_scale(mut self, stage_scale: Vec<f64>) -> Self {
        self.stage_scale = stage_scale;
        self
    }

    /// The pass cost alone, before any per-stage scaling.
    pub fn pass_cost(&self, pass: Pass) -> f64 {
        match pass {
            Pass::Forward => self.forward,
            Pass::Backward => self.backward,
            Pass::BackwardInput => self.backward_input,
            Pass::BackwardWeight => self.backward_weight,
        }
    }

    /// The duration of `pass` on `stage` (`None`: `stage_scale` is not empty
    /// and has no entry for `stage`).
    pub fn cost(&self, pass: Pass, stage: usize) -> Option<f64> {
        let scale = if self.stage_scale.is_empty() {
            1.0
        } else {
            *self.stage_scale.get(stage)?
        };
        Some(self.pass_cost(pass) * scale)
    }

    fn validate(&self) -> Result<()> {
        let named = [
            ("forward", self.forward),
            ("backward", self.backward),
            ("backward_input", self.backward_input),
            ("backward_weight", self.backward_weight),
            ("p2p_latency", self.p2p_latency),
        ];
        for (name, v) in named {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::invalid(
                    OP,
                    "costs",
                    "finite, non-negative costs",
                    format!("{name} = {v}"),
                ));
            }
        }
        for (stage, &v) in self.stage_scale.iter().enumerate() {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::invalid(
                    OP,
                    "costs",
                    "finite, non-negative stage scales",
                    format!("stage_scale[{stage}] = {v}"),
                ));
            }
        }
        Ok(())
    }
}

/// One operation placed in time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub op: Op,
    pub start: f64,
    pub end: f64,
}

impl Span {
    /// `end - start`.
    pub fn duration(&self) -> f64 {
        self.end - self.start
    }
}

/// A simulated run.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    /// `timeline[rank]`, in execution order.
    pub timeline: Vec<Vec<Span>>,
    /// The end of the last operation (0 for an empty schedule).
    pub makespan: f64,
    /// `busy[rank]`: the total compute time of the rank.
    pub busy: Vec<f64>,
    /// The busiest rank's total compute: the makespan of a pipeline without
    /// bubbles.
    pub ideal: f64,
    /// `(makespan − ideal) / ideal` (0 when `ideal` is 0). With equal costs
    /// and no latency: `(p − 1) / m` for 1F1B, `(p − 1) / (v·m)` for
    /// interleaved, `(p − 1) / (3m)` for ZB-H1 with `F = B = W`.
    pub bubble_fraction: f64,
    /// `peak_in_flight[rank]`: the most (stage, micro-batch) activations the
    /// rank held at once: +1 at a `Forward`, −1 at the `Backward` or
    /// `BackwardInput` of the same (stage, micro-batch).
    pub peak_in_flight: Vec<usize>,
}

impl Simulation {
    /// The number of pipeline ranks.
    pub fn ranks(&self) -> usize {
        self.timeline.len()
    }

    /// The number of chunks (virtual stages) per rank: one more than the
    /// largest chunk index in the timeline (1 for an empty one).
    pub fn chunks(&self) -> usize {
        self.timeline
            .iter()
            .flatten()
            .map(|s| s.op.chunk + 1)
            .max()
            .unwrap_or(1)
    }

    /// The number of operations of every rank.
    pub fn ops_per_rank(&self) -> Vec<usize> {
        self.timeline.iter().map(Vec::len).collect()
    }
}

fn describe_op(out: &mut String, rank: usize, index: usize, op: &Op) {
    let _ = write!(
        out,
        "rank {rank} op #{index} ({:?} micro-batch {} stage {})",
        op.pass, op.microbatch, op.stage
    );
}

fn describe_msg(out: &mut String, m: &Message) {
    let _ = write!(
        out,
        "{:?} of micro-batch {} from stage {}",
        m.payload, m.microbatch, m.from_stage
    );
}

/// Simulates `ops` (`ops[rank]` in execution order) under `costs`.
pub fn simulate(ops: &[Vec<Op>], costs: &Costs) -> Result<Simulation> {
    costs.validate()?;
    let pp = ops.len();

    // Every op's duration and every peer, checked up front.
    let mut durations: Vec<Vec<f64>> = Vec::with_capacity(pp);
    for (rank, rank_ops) in ops.iter().enumerate() {
        let mut d = Vec::with_capacity(rank_ops.len());
        for (i, op) in rank_ops.iter().enumerate() {
            let Some(c) = costs.cost(op.pass, op.stage) else {
                let mut got = String::new();
                describe_op(&mut got, rank, i, op);
                let _ = write!(got, ", but stage_scale has {}", costs.stage_scale.len());
                return Err(Error::invalid(
                    OP,
                    "costs",
                    "a stage_scale entry for every stage",
                    got,
                ));
            };
            for m in op.recv.iter().chain(op.send.iter()) {
                if m.peer >= pp {
                    let mut got = String::new();
                    describe_op(&mut got, rank, i, op);
                    let _ = write!(got, " names peer {}", m.peer);
                    return Err(Error::invalid(
                        OP,
                        "ops",
                        format!("peers below the number of ranks ({pp})"),
                        got,
                    ));
                }
            }
            d.push(c);
        }
        durations.push(d);
    }

    // sent[s * pp + r]: the messages s posted to r, with their arrival time.
    let mut sent: Vec<Vec<(Message, f64)>> = vec![Vec::new(); pp * pp];
    // received[s * pp + r]: how many of them r has taken.
    let mut received: Vec<usize> = vec![0; pp * pp];
    let mut next = vec![0usize; pp];
    let mut clock = vec![0.0f64; pp];
    let mut timeline: Vec<Vec<Span>> = ops.iter().map(|o| Vec::with_capacity(o.len())).collect();

    loop {
        let mut progressed = false;
        for rank in 0..pp {
            while let Some(op) = ops[rank].get(next[rank]) {
                let mut start = clock[rank];
                if let Some(want) = op.recv {
                    let pair = want.peer * pp + rank;
                    let k = received[pair];
                    let Some(&(posted, arrival)) = sent[pair].get(k) else {
                        break; // blocked: the send has not happened (yet)
                    };
                    if (posted.payload, posted.microbatch, posted.from_stage)
                        != (want.payload, want.microbatch, want.from_stage)
                    {
                        let mut got = String::new();
                        describe_op(&mut got, rank, next[rank], op);
                        got.push_str(" expects ");
                        describe_msg(&mut got, &want);
                        let _ = write!(
                            got,
                            " as message #{k} from rank {}, but that message is ",
                            want.peer
                        );
                        describe_msg(&mut got, &posted);
                        return Err(Error::invalid(
                            OP,
                            "ops",
                            "sends and receives of every rank pair in the same order",
                            got,
                        ));
                    }
                    received[pair] = k + 1;
                    start = start.max(arrival);
                }
                let end = start + durations[rank][next[rank]];
                if let Some(m) = op.send {
                    let mut posted = m;
                    posted.peer = rank;
                    sent[rank * pp + m.peer].push((posted, end + costs.p2p_latency));
                }
                timeline[rank].push(Span {
                    op: *op,
                    start,
                    end,
                });
                clock[rank] = end;
                next[rank] += 1;
                progressed = true;
            }
        }
        if (0..pp).all(|r| next[r] == ops[r].len()) {
            break;
        }
        if !progressed {
            return Err(deadlock(ops, &next, &sent, &received));
        }
    }

    // Sends nobody received would block the sender for ever in NCCL.
    for s in 0..pp {
        for r in 0..pp {
            let pair = s * pp + r;
            if let Some((m, _)) = sent[pair].get(received[pair]) {
                let mut got = String::new();
                let _ = write!(got, "rank {s} sends ");
                describe_msg(&mut got, m);
                let _ = write!(
                    got,
                    " to rank {r} ({} unreceived message(s) on that pair)",
                    sent[pair].len() - received[pair]
                );
                return Err(Error::invalid(
                    OP,
                    "ops",
                    "a matching receive for every send",
                    got,
                ));
            }
        }
    }

    let makespan = timeline
        .iter()
        .filter_map(|t| t.last())
        .map(|s| s.end)
        .fold(0.0, f64::max);
    let busy: Vec<f64> = durations.iter().map(|d| d.iter().sum()).collect();
    let ideal = busy.iter().copied().fold(0.0, f64::max);
    let bubble_fraction = if ideal > 0.0 {
        (makespan - ideal) / ideal
    } else {
        0.0
    };
    let peak_in_flight = ops
        .iter()
        .map(|rank_ops| {
            let mut open = BTreeSet::new();
            let mut peak = 0;
            for op in rank_ops {
                match op.pass {
                    Pass::Forward => {
                        open.insert((op.stage, op.microbatch));
                        peak = peak.max(open.len());
                    }
                    Pass::Backward | Pass::BackwardInput => {
                        open.remove(&(op.stage, op.microbatch));
                    }
                    Pass::BackwardWeight => {}
                }
            }
            peak
        })
        .collect();

    Ok(Simulation {
        timeline,
        makespan,
        busy,
        ideal,
        bubble_fraction,
        peak_in_flight,
    })
}

/// The error for a schedule where no rank can make progress: which ranks
/// wait for what, and whether the sender is done (the send never happens)
/// or itself waiting (a wait cycle).
fn deadlock(
    ops: &[Vec<Op>],
    next: &[usize],
    sent: &[Vec<(Message, f64)>],
    received: &[usize],
) -> Error {
    let pp = ops.len();
    let mut got = String::new();
    let blocked: Vec<usize> = (0..pp).filter(|&r| next[r] < ops[r].len()).collect();
    for (shown, &rank) in blocked.iter().enumerate() {
        if shown == 4 {
            let _ = write!(got, "; and {} more blocked rank(s)", blocked.len() - shown);
            break;
        }
        let op = &ops[rank][next[rank]];
        if shown > 0 {
            got.push_str("; ");
        }
        describe_op(&mut got, rank, next[rank], op);
        if let Some(want) = op.recv {
            let pair = want.peer * pp + rank;
            got.push_str(" waits for ");
            describe_msg(&mut got, &want);
            let _ = write!(got, " (message #{} from rank {}", received[pair], want.peer);
            if next[want.peer] == ops[want.peer].len() {
                let _ = write!(
                    got,
                    ", which finished after sending {} to it: never sent)",
                    sent[pair].len()
                );
            } else {
                got.push_str(", itself blocked: a wait cycle)");
            }
        }
    }
    Error::invalid(
        OP,
        "ops",
        "a schedule that can complete (every receive matched by a send, no wait cycle)",
        got,
    )
}
