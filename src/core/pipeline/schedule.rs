//! Schedules: pure functions from a [`PipelineConfig`] to the ordered
//! operations of every pipeline rank (`result[rank]`, execution order).
//!
//! Notation: `pp` ranks, `m` micro-batches, `vp` chunks per rank
//! (`vp = 1` except for the interleaved schedule), `S = pp · vp` stages;
//! rank `r`'s chunk `c` is stage `c · pp + r`. `F`, `B`, `W` are
//! [`Pass::Forward`], [`Pass::Backward`] (or [`Pass::BackwardInput`]) and
//! [`Pass::BackwardWeight`].
//!
//! * [`ScheduleKind::NoPipelining`] (`pp = 1`): `F0 B0 F1 B1 …` — gradient
//!   accumulation, no messages.
//! * [`ScheduleKind::OneFOneB`] (Megatron's non-interleaved 1F1B): rank `r`
//!   runs `w = min(pp − r − 1, m)` warm-up forwards, then `m − w` steady
//!   pairs (`F` of micro-batch `w + i`, `B` of micro-batch `i`), then the
//!   `w` cool-down backwards. At most `pp − r` micro-batches are in flight
//!   (forward done, backward not) on rank `r`. Any `m ≥ 1`, also `m < pp`.
//! * [`ScheduleKind::Interleaved`] (Megatron's interleaved 1F1B with
//!   `microbatch_group_size_per_vp_stage = group`, default `pp`): the
//!   `m · vp` virtual micro-batches run in the order of Megatron's schedule
//!   table — micro-batches in groups of `group` (the last group takes the
//!   rest, `m mod group` of them when that is not 0); within a group all
//!   of chunk 0, then all of chunk 1, …, chunk `vp − 1`. The `k`-th forward
//!   is table entry `k`; the `k`-th backward is table entry `k` with the
//!   chunk mirrored (`vp − 1 − c`). Warm-up
//!   `w = min((pp − r − 1) · 2 + (vp − 1) · group, m · vp)` forwards, then
//!   `m · vp − w` steady (forward `w + k`, backward `k`) pairs, then `w`
//!   cool-down backwards. Rules: `vp ≥ 1`; `vp > 1` needs `pp ≥ 2`,
//!   `m ≥ pp`, `pp ≤ group ≤ m`, and `m mod group` either 0 or `≥ pp`;
//!   and `group = 2` when `pp = 2` (then both payloads travel between the
//!   same two ranks, matched in posting order, and only `group = pp` keeps
//!   rank 0's posting order of activations and gradients equal to rank
//!   1's receiving order; for `pp ≥ 3` each rank pair carries one payload
//!   per direction).
//!   `vp = 1` is exactly [`ScheduleKind::OneFOneB`] (`group` is then
//!   ignored).
//! * [`ScheduleKind::ZeroBubbleH1`] (ZB-H1, Qi et al., "Zero Bubble
//!   Pipeline Parallelism"): the 1F1B order of `F` and `B`
//!   (= [`Pass::BackwardInput`]: `w = min(pp − r − 1, m)` warm-up
//!   forwards, steady `F`, `B` pairs, cool-down `B`s), so the same
//!   activation memory (at most `pp − r` micro-batches between `F` and `B`
//!   on rank `r`); the weight gradients `W` are deferred: rank `r` keeps
//!   `r` of them pending — right after a `B` it runs `W`s (oldest first)
//!   until at most `r` are pending, and runs the last `r` at the end, so
//!   `r + 1` `W`s follow its last `B` (rank 0: `… B W B W`; the last rank
//!   `pp − 1`: `F B F B …` at first, then `F B W`, ending `B W … W`). The
//!   later ranks thereby pass on the last input gradients without waiting
//!   on `W`s, the backward chain of the last micro-batch runs unhindered,
//!   and every rank ends at the same time. With `F = B = W = 1` and no
//!   latency the makespan is `3m + pp − 1` for `m ≥ pp` (bubble
//!   `(pp − 1) / 3m` of the ideal `3m`, a third of 1F1B's); for `m < pp`
//!   it is `2m + 2·pp − 1` (the F and B chains of the last micro-batch
//!   dominate).
//!
//! Messages: a forward at stage `s > 0` receives stage `s − 1`'s
//! activation and, for `s < S − 1`, sends its activation to stage `s + 1`;
//! a backward (input gradient) at stage `s < S − 1` receives stage
//! `s + 1`'s gradient and, for `s > 0`, sends its gradient to stage
//! `s − 1`. `W` has no messages. Receives are matched with sends per
//! (sender, receiver) pair in posting order.

use alloc::format;
use alloc::vec::Vec;

use super::{Message, Op, Pass, Payload};
use crate::core::{Error, Result};

/// The `op` name of every error of this module.
const OP: &str = "pipeline schedule";

/// Which schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    /// `pp = 1`: forward and backward of every micro-batch in turn
    /// (gradient accumulation).
    NoPipelining,
    /// Megatron's non-interleaved 1F1B.
    OneFOneB,
    /// Megatron's interleaved 1F1B with `vp` virtual stages per rank and
    /// `microbatch_group_size_per_vp_stage` (`None`: `pp`).
    Interleaved { vp: usize, group: Option<usize> },
    /// Zero-bubble ZB-H1: backward split into B and W, W deferred.
    ZeroBubbleH1,
}

/// A pipeline: `pp` ranks, `microbatches` micro-batches, one schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    pub pp: usize,
    pub microbatches: usize,
    pub kind: ScheduleKind,
}

impl PipelineConfig {
    /// Chunks (virtual stages) per rank: `vp` for the interleaved schedule,
    /// 1 otherwise.
    pub fn vp(&self) -> usize {
        match self.kind {
            ScheduleKind::Interleaved { vp, .. } => vp,
            _ => 1,
        }
    }

    /// The number of stages, `pp · vp` (saturating).
    pub fn stages(&self) -> usize {
        self.pp.saturating_mul(self.vp())
    }

    /// Checks every rule of the schedule kind; the error names the
    /// argument and the rule.
    pub fn validate(&self) -> Result<()> {
        let (pp, m) = (self.pp, self.microbatches);
        if pp < 1 {
            return Err(Error::invalid(OP, "pp", ">= 1", pp));
        }
        if m < 1 {
            return Err(Error::invalid(OP, "microbatches", ">= 1", m));
        }
        match self.kind {
            ScheduleKind::NoPipelining => {
                if pp != 1 {
                    return Err(Error::invalid(
                        OP,
                        "pp",
                        "1 for NoPipelining (use OneFOneB, Interleaved or ZeroBubbleH1 for pp > 1)",
                        pp,
                    ));
                }
            }
            ScheduleKind::OneFOneB | ScheduleKind::ZeroBubbleH1 => {}
            ScheduleKind::Interleaved { vp, group } => {
                if vp < 1 {
                    return Err(Error::invalid(OP, "vp", ">= 1", vp));
                }
                if vp > 1 {
                    if pp < 2 {
                        return Err(Error::invalid(
                            OP,
                            "pp",
                            format!(">= 2 for the interleaved schedule with vp = {vp} > 1"),
                            pp,
                        ));
                    }
                    if m < pp {
                        return Err(Error::invalid(
                            OP,
                            "microbatches",
                            format!(">= pp = {pp} for the interleaved schedule with vp > 1"),
                            m,
                        ));
                    }
                    let group = group.unwrap_or(pp);
                    if group < pp {
                        return Err(Error::invalid(
                            OP,
                            "group",
                            format!(">= pp = {pp} (microbatch_group_size_per_vp_stage)"),
                            group,
                        ));
                    }
                    if group > m {
                        return Err(Error::invalid(
                            OP,
                            "group",
                            format!("<= microbatches = {m} (microbatch_group_size_per_vp_stage)"),
                            group,
                        ));
                    }
                    if pp == 2 && group != 2 {
                        return Err(Error::invalid(
                            OP,
                            "group",
                            "2 (= pp) when pp = 2 and vp > 1: activations and gradients then \
                             share one rank pair, and with a larger group the order rank 0 \
                             posts them in differs from the order rank 1 receives them in",
                            group,
                        ));
                    }
                    let rest = m % group;
                    if rest != 0 && rest < pp {
                        return Err(Error::invalid(
                            OP,
                            "microbatches",
                            format!(
                                "a multiple of group = {group} or a last group of >= pp = {pp} \
                                 micro-batches (microbatches % group == 0 or >= pp)"
                            ),
                            format!("{m} (microbatches % group = {rest})"),
                        ));
                    }
                }
            }
        }
        let ops = pp
            .checked_mul(self.vp())
            .and_then(|s| s.checked_mul(m))
            .and_then(|n| n.checked_mul(3));
        if ops.is_none() {
            return Err(Error::invalid(
                OP,
                "microbatches",
                "pp · vp · microbatches · 3 operations to fit in usize",
                m,
            ));
        }
        Ok(())
    }

    /// The number of warm-up forwards (forwards before the first backward)
    /// of `rank`.
    pub fn warmup_forwards(&self, rank: usize) -> Result<usize> {
        self.validate()?;
        let (pp, m) = (self.pp, self.microbatches);
        if rank >= pp {
            return Err(Error::invalid(OP, "rank", format!("< pp = {pp}"), rank));
        }
        Ok(match self.kind {
            ScheduleKind::NoPipelining => 0,
            ScheduleKind::OneFOneB | ScheduleKind::ZeroBubbleH1 => (pp - rank - 1).min(m),
            ScheduleKind::Interleaved { vp: 1, .. } => (pp - rank - 1).min(m),
            ScheduleKind::Interleaved { vp, group } => {
                let group = group.unwrap_or(pp);
                ((pp - rank - 1) * 2 + (vp - 1) * group).min(m * vp)
            }
        })
    }
}

/// Megatron's schedule table of the interleaved schedule: the
/// `(chunk, micro-batch)` of the `k`-th forward, for `k` in `0..m · vp`.
/// Micro-batches go in groups of `group` (the last group takes the rest);
/// within a group, chunk 0 of all its micro-batches first, then chunk 1, ….
/// The `k`-th backward is the `k`-th entry with the chunk mirrored.
pub fn interleaved_table(microbatches: usize, vp: usize, group: usize) -> Vec<(usize, usize)> {
    let group = group.max(1);
    let mut table = Vec::with_capacity(microbatches * vp);
    let mut first = 0;
    while first < microbatches {
        let end = if first + group >= microbatches {
            microbatches
        } else {
            first + group
        };
        for chunk in 0..vp {
            for mb in first..end {
                table.push((chunk, mb));
            }
        }
        first = end;
    }
    table
}

/// The operations of every rank, `result[rank]` in execution order.
pub fn schedule(cfg: &PipelineConfig) -> Result<Vec<Vec<Op>>> {
    cfg.validate()?;
    let (pp, m) = (cfg.pp, cfg.microbatches);
    // Host memory for the result: an error, never an abort, when it cannot
    // be had (validate() bounds the count by usize only). The per-rank probe
    // reserves one rank's worst case (3 passes per chunk and micro-batch).
    let per_rank = 3 * cfg.vp() * m;
    let no_memory = || {
        Error::invalid(
            OP,
            "microbatches",
            "a schedule whose operations fit in host memory",
            format!("{pp} ranks of up to {per_rank} operations"),
        )
    };
    let mut out = Vec::new();
    out.try_reserve_exact(pp).map_err(|_| no_memory())?;
    Vec::<Op>::new()
        .try_reserve_exact(per_rank.saturating_mul(pp))
        .map_err(|_| no_memory())?;
    for rank in 0..pp {
        let ops = match cfg.kind {
            ScheduleKind::NoPipelining => {
                let mut ops = Vec::with_capacity(2 * m);
                for mb in 0..m {
                    ops.push(op(Pass::Forward, mb, 0, rank, pp, 1));
                    ops.push(op(Pass::Backward, mb, 0, rank, pp, 1));
                }
                ops
            }
            ScheduleKind::OneFOneB | ScheduleKind::Interleaved { vp: 1, .. } => {
                let w = cfg.warmup_forwards(rank)?;
                one_f_one_b(m, w, |k| (0, k), |k| (0, k), rank, pp, 1)
            }
            ScheduleKind::Interleaved { vp, group } => {
                let w = cfg.warmup_forwards(rank)?;
                let table = interleaved_table(m, vp, group.unwrap_or(pp));
                one_f_one_b(
                    m * vp,
                    w,
                    |k| table[k],
                    |k| (vp - 1 - table[k].0, table[k].1),
                    rank,
                    pp,
                    vp,
                )
            }
            ScheduleKind::ZeroBubbleH1 => {
                let w = cfg.warmup_forwards(rank)?;
                zero_bubble_h1(m, w, rank, pp)
            }
        };
        out.push(ops);
    }
    Ok(out)
}

/// A forward-only run of `schedule` (evaluation, inference): each rank's
/// forwards in the order the full schedule runs them, with their activation
/// transfers, and nothing else. Deadlock-free wherever the full schedule
/// is: every receive of the result is a receive of the full schedule,
/// matched by the same send, and dropping a rank's backwards only lets its
/// forwards run earlier (checked for every configuration in
/// `tests/pipeline_schedules.rs`, for buffered sends and for the grouped
/// rendezvous plan).
pub fn forward_only(schedule: &[Vec<Op>]) -> Vec<Vec<Op>> {
    schedule
        .iter()
        .map(|ops| {
            ops.iter()
                .filter(|o| o.pass == Pass::Forward)
                .copied()
                .collect()
        })
        .collect()
}

/// 1F1B over `total` (virtual) micro-batches: `w` warm-up forwards, steady
/// (forward `w + k`, backward `k`) pairs, cool-down backwards. `fwd(k)` /
/// `bwd(k)`: the `(chunk, micro-batch)` of the `k`-th forward / backward.
fn one_f_one_b(
    total: usize,
    w: usize,
    fwd: impl Fn(usize) -> (usize, usize),
    bwd: impl Fn(usize) -> (usize, usize),
    rank: usize,
    pp: usize,
    vp: usize,
) -> Vec<Op> {
    let mut ops = Vec::with_capacity(2 * total);
    let f = |k: usize| {
        let (chunk, mb) = fwd(k);
        op(Pass::Forward, mb, chunk, rank, pp, vp)
    };
    let b = |k: usize| {
        let (chunk, mb) = bwd(k);
        op(Pass::Backward, mb, chunk, rank, pp, vp)
    };
    for k in 0..w {
        ops.push(f(k));
    }
    for k in 0..total - w {
        ops.push(f(w + k));
        ops.push(b(k));
    }
    for k in total - w..total {
        ops.push(b(k));
    }
    ops
}

/// ZB-H1 on one rank: the 1F1B order of F and B (input gradient), each B
/// followed by the W's (oldest first) that bring the pending W's down to
/// `rank`; the rest at the end.
fn zero_bubble_h1(m: usize, w: usize, rank: usize, pp: usize) -> Vec<Op> {
    let mut ops = Vec::with_capacity(3 * m);
    let keep = rank;
    let mut next_w = 0;
    let backward = |ops: &mut Vec<Op>, mb: usize, next_w: &mut usize| {
        ops.push(op(Pass::BackwardInput, mb, 0, rank, pp, 1));
        while mb + 1 - *next_w > keep {
            ops.push(op(Pass::BackwardWeight, *next_w, 0, rank, pp, 1));
            *next_w += 1;
        }
    };
    for mb in 0..w {
        ops.push(op(Pass::Forward, mb, 0, rank, pp, 1));
    }
    for k in 0..m - w {
        ops.push(op(Pass::Forward, w + k, 0, rank, pp, 1));
        backward(&mut ops, k, &mut next_w);
    }
    for k in m - w..m {
        backward(&mut ops, k, &mut next_w);
    }
    for mb in next_w..m {
        ops.push(op(Pass::BackwardWeight, mb, 0, rank, pp, 1));
    }
    ops
}

/// One operation with its messages (see the module docs).
fn op(pass: Pass, microbatch: usize, chunk: usize, rank: usize, pp: usize, vp: usize) -> Op {
    let stage = chunk * pp + rank;
    let last = pp * vp - 1;
    let msg = |payload, from_stage: usize, to_stage: usize| Message {
        peer: if from_stage == stage {
            to_stage % pp
        } else {
            from_stage % pp
        },
        payload,
        microbatch,
        from_stage,
    };
    let (recv, send) = match pass {
        Pass::Forward => (
            (stage > 0).then(|| msg(Payload::Activation, stage - 1, stage)),
            (stage < last).then(|| msg(Payload::Activation, stage, stage + 1)),
        ),
        Pass::Backward | Pass::BackwardInput => (
            (stage < last).then(|| msg(Payload::Gradient, stage + 1, stage)),
            (stage > 0).then(|| msg(Payload::Gradient, stage, stage - 1)),
        ),
        Pass::BackwardWeight => (None, None),
    };
    Op {
        pass,
        microbatch,
        chunk,
        stage,
        recv,
        send,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_too_big_for_memory_is_an_error_not_an_abort() {
        let cfg = PipelineConfig {
            pp: 1 << 20,
            microbatches: 1 << 40,
            kind: ScheduleKind::OneFOneB,
        };
        let e = schedule(&cfg).unwrap_err().to_string();
        assert!(e.contains("host memory"), "{e}");
    }

    fn kinds(pass: &[Op]) -> Vec<(char, usize, usize)> {
        pass.iter()
            .map(|o| {
                let c = match o.pass {
                    Pass::Forward => 'F',
                    Pass::Backward | Pass::BackwardInput => 'B',
                    Pass::BackwardWeight => 'W',
                };
                (c, o.chunk, o.microbatch)
            })
            .collect()
    }

    #[test]
    fn one_f_one_b_pp2_m3() {
        let cfg = PipelineConfig {
            pp: 2,
            microbatches: 3,
            kind: ScheduleKind::OneFOneB,
        };
        let s = schedule(&cfg).unwrap();
        let r0: Vec<_> = kinds(&s[0]).iter().map(|k| (k.0, k.2)).collect();
        assert_eq!(
            r0,
            [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
        );
        let r1: Vec<_> = kinds(&s[1]).iter().map(|k| (k.0, k.2)).collect();
        assert_eq!(
            r1,
            [('F', 0), ('B', 0), ('F', 1), ('B', 1), ('F', 2), ('B', 2)]
        );
        // Rank 0, stage 0: no receive for F, sends activation to rank 1.
        assert_eq!(s[0][0].recv, None);
        assert_eq!(
            s[0][0].send,
            Some(Message {
                peer: 1,
                payload: Payload::Activation,
                microbatch: 0,
                from_stage: 0
            })
        );
        // Rank 1's backward: last stage, no receive; sends its gradient.
        assert_eq!(s[1][1].recv, None);
        assert_eq!(s[1][1].send.unwrap().payload, Payload::Gradient);
        assert_eq!(s[1][1].send.unwrap().from_stage, 1);
    }

    #[test]
    fn interleaved_table_partial_group() {
        // m = 5, group = 3, vp = 2: groups {0,1,2} and {3,4}.
        let t = interleaved_table(5, 2, 3);
        assert_eq!(
            t,
            [
                (0, 0),
                (0, 1),
                (0, 2),
                (1, 0),
                (1, 1),
                (1, 2),
                (0, 3),
                (0, 4),
                (1, 3),
                (1, 4)
            ]
        );
    }

    #[test]
    fn zero_bubble_h1_pp2_m2() {
        let cfg = PipelineConfig {
            pp: 2,
            microbatches: 2,
            kind: ScheduleKind::ZeroBubbleH1,
        };
        let s = schedule(&cfg).unwrap();
        let r0: Vec<_> = kinds(&s[0]).iter().map(|k| (k.0, k.2)).collect();
        assert_eq!(
            r0,
            [('F', 0), ('F', 1), ('B', 0), ('W', 0), ('B', 1), ('W', 1)]
        );
        let r1: Vec<_> = kinds(&s[1]).iter().map(|k| (k.0, k.2)).collect();
        assert_eq!(
            r1,
            [('F', 0), ('B', 0), ('F', 1), ('B', 1), ('W', 0), ('W', 1)]
        );
    }

    #[test]
    fn named_errors() {
        let e = schedule(&PipelineConfig {
            pp: 0,
            microbatches: 1,
            kind: ScheduleKind::OneFOneB,
        })
        .unwrap_err();
        assert!(alloc::format!("{e}").contains("`pp`"));
    }
}
