//! Pipeline parallelism behind the C ABI: the schedule generator and the
//! simulator of `ferrotron::core::pipeline`, so that a C/C++ framework can
//! drive its own stages in the order (and with the point-to-point messages)
//! a schedule prescribes, and compare schedules before running them.
//!
//! Host-only and synchronous: no context, stream or communicator.

use std::ffi::c_int;

use ferrotron::core::pipeline::{
    schedule, simulate, Costs, Message, Op, Pass, Payload, PipelineConfig, ScheduleKind,
};
use ferrotron::{Error, Result};

use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{read_desc, Desc};
use crate::abi::enums::{c_enum, parse_enum};
use crate::abi::handles::{check_out, write_out};

/// The most pipeline ranks (`ftnPipelineDesc_t.pp`) the schedule and
/// simulator functions accept.
pub const FTN_PIPELINE_MAX_RANKS: c_int = 1024;
/// The most operations a schedule may have over all its ranks:
/// `pp * vp * microbatches * (3 for ftnPipelineScheduleZBH1, else 2)`.
pub const FTN_PIPELINE_MAX_OPS: c_int = 1 << 20;

/// Pipeline schedules (`ftnPipelineDesc_t.schedule`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnPipelineSchedule_t {
    /// `pp = 1`: forward and backward of every micro-batch in turn
    /// (gradient accumulation), no messages.
    ftnPipelineScheduleNone = 0,
    /// Megatron's non-interleaved 1F1B: rank `r` runs
    /// `min(pp - r - 1, microbatches)` warm-up forwards, then
    /// forward/backward pairs, then the cool-down backwards.
    ftnPipelineSchedule1F1B = 1,
    /// Megatron's interleaved 1F1B: `vp` chunks (virtual stages) per rank,
    /// micro-batches in groups of `group` (0: `pp`). Rules: `vp >= 1`;
    /// `vp > 1` needs `pp >= 2`, `microbatches >= pp`,
    /// `pp <= group <= microbatches`, `microbatches % group` 0 or `>= pp`,
    /// and `group = 2` when `pp = 2`.
    ftnPipelineScheduleInterleaved = 2,
    /// Zero-bubble ZB-H1: the backward split into the input gradient
    /// (`ftnPipelineBackwardInput`) and the deferred weight gradient
    /// (`ftnPipelineBackwardWeight`), with 1F1B's activation memory.
    ftnPipelineScheduleZBH1 = 3,
}
c_enum!(
    ftnPipelineSchedule_t: ftnPipelineScheduleNone,
    ftnPipelineSchedule1F1B,
    ftnPipelineScheduleInterleaved,
    ftnPipelineScheduleZBH1,
);

/// The computation of a pipeline operation (`ftnPipelineOp_t.pass`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnPipelinePass_t {
    /// Forward of one micro-batch through one stage.
    ftnPipelineForward = 0,
    /// The whole backward (input and weight gradients together).
    ftnPipelineBackward = 1,
    /// Zero-bubble schedules: the input gradient only, what the previous
    /// stage waits for.
    ftnPipelineBackwardInput = 2,
    /// Zero-bubble schedules: the weight gradient only (no messages).
    ftnPipelineBackwardWeight = 3,
}
c_enum!(
    ftnPipelinePass_t: ftnPipelineForward,
    ftnPipelineBackward,
    ftnPipelineBackwardInput,
    ftnPipelineBackwardWeight,
);

/// What a pipeline message carries (`ftnPipelineOp_t.recv_payload`,
/// `send_payload`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnPipelinePayload_t {
    /// The output activation of stage `from_stage`'s forward, to the next stage.
    ftnPipelineActivation = 0,
    /// The input gradient of stage `from_stage`'s backward, to the previous stage.
    ftnPipelineGradient = 1,
}
c_enum!(ftnPipelinePayload_t: ftnPipelineActivation, ftnPipelineGradient);

/// A pipeline: `pp` ranks, `microbatches` micro-batches, one schedule. The
/// network is cut into `pp * vp` consecutive stages; rank `r` holds stages
/// `r, r + pp, r + 2*pp, ...` (its chunks `0..vp`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnPipelineDesc_t {
    /// `sizeof(ftnPipelineDesc_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnPipelineSchedule_t`.
    pub schedule: i32,
    /// Pipeline ranks, `1..=FTN_PIPELINE_MAX_RANKS` (1 for
    /// `ftnPipelineScheduleNone`).
    pub pp: i32,
    /// Chunks (virtual stages) per rank: `>= 1` for
    /// `ftnPipelineScheduleInterleaved`; 0 or 1 for the other schedules.
    pub vp: i32,
    /// `ftnPipelineScheduleInterleaved`: micro-batches per group
    /// (Megatron's `microbatch_group_size_per_vp_stage`), 0 = `pp`; 0 for
    /// the other schedules.
    pub group: i32,
    /// `>= 1`.
    pub microbatches: i32,
    /// Must be 0.
    pub reserved: i32,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnPipelineDesc_t {
    const NAME: &'static str = "ftnPipelineDesc_t";
    const V1_SIZE: usize = 32;
}

/// Per-operation costs of the simulator, in any time unit (finite, `>= 0`).
/// For the interleaved schedule they are per chunk: divide a rank's whole
/// share by `vp`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnPipelineCosts_t {
    /// `sizeof(ftnPipelineCosts_t)` as the caller compiled it.
    pub size: usize,
    /// `ftnPipelineForward`.
    pub forward: f64,
    /// `ftnPipelineBackward` (the whole backward).
    pub backward: f64,
    /// `ftnPipelineBackwardInput`.
    pub backward_input: f64,
    /// `ftnPipelineBackwardWeight`.
    pub backward_weight: f64,
    /// From a send's end to the matching receive being satisfied.
    pub p2p_latency: f64,
}
// SAFETY: repr(C), size_t first, float fields, no implicit padding.
unsafe impl Desc for ftnPipelineCosts_t {
    const NAME: &'static str = "ftnPipelineCosts_t";
    const V1_SIZE: usize = 48;
}

/// One operation of a rank's schedule, in execution order. The message
/// fields of an absent receive (`has_recv = 0`) or send (`has_send = 0`)
/// are 0. Messages are matched per (sender, receiver) rank pair in the
/// order they are posted, as NCCL matches them: post them in this order.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ftnPipelineOp_t {
    /// `ftnPipelinePass_t`.
    pub pass: i32,
    pub microbatch: i32,
    /// The rank's chunk (virtual stage), `0..vp`.
    pub chunk: i32,
    /// The global stage, `chunk * pp + rank`.
    pub stage: i32,
    /// 1: receive (and wait for) a message before the computation.
    pub has_recv: i32,
    /// The rank the message comes from.
    pub recv_peer: i32,
    /// `ftnPipelinePayload_t`.
    pub recv_payload: i32,
    pub recv_microbatch: i32,
    /// The stage that produced the message.
    pub recv_from_stage: i32,
    /// 1: send a message after the computation.
    pub has_send: i32,
    /// The rank the message goes to.
    pub send_peer: i32,
    /// `ftnPipelinePayload_t`.
    pub send_payload: i32,
    pub send_microbatch: i32,
    /// The stage that produced the message (this operation's `stage`).
    pub send_from_stage: i32,
}
const _: () = assert!(std::mem::size_of::<ftnPipelineOp_t>() == 56);
const _: () = assert!(std::mem::align_of::<ftnPipelineOp_t>() == 4);

/// One simulated operation placed in time.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ftnPipelineSpan_t {
    /// The pipeline rank that runs it.
    pub rank: i32,
    /// Its position in the rank's schedule (`ftn_pipeline_schedule`'s order).
    pub index: i32,
    /// `ftnPipelinePass_t`.
    pub pass: i32,
    pub microbatch: i32,
    pub chunk: i32,
    pub stage: i32,
    pub start: f64,
    pub end: f64,
}
const _: () = assert!(std::mem::size_of::<ftnPipelineSpan_t>() == 40);
const _: () = assert!(std::mem::align_of::<ftnPipelineSpan_t>() == 8);
const _: () = assert!(std::mem::size_of::<ftnPipelineDesc_t>() == ftnPipelineDesc_t::V1_SIZE);
const _: () = assert!(std::mem::size_of::<ftnPipelineCosts_t>() == ftnPipelineCosts_t::V1_SIZE);

/// A count or index below `FTN_PIPELINE_MAX_OPS` (every value a schedule
/// holds once the descriptor passed [`config`]) as an `int32_t`.
fn c32(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// Rewrites an error of `ferrotron::core::pipeline` to name `op` and the
/// descriptor field (`desc.pp`, not `pp`).
fn renamed(op: &'static str, e: Error) -> Error {
    match e {
        Error::InvalidArgument {
            arg, expected, got, ..
        } => {
            let arg = match arg {
                "pp" => "desc.pp",
                "vp" => "desc.vp",
                "group" => "desc.group",
                "microbatches" => "desc.microbatches",
                other => other,
            };
            invalid(op, arg, expected, got)
        }
        other => other,
    }
}

/// The descriptor as a validated configuration.
///
/// # Safety
/// `desc` is NULL or a valid descriptor.
unsafe fn config(op: &'static str, desc: *const ftnPipelineDesc_t) -> Result<PipelineConfig> {
    // SAFETY: descriptor contract.
    let d = unsafe { read_desc(op, "desc", desc)? };
    if d.reserved != 0 {
        return Err(invalid(op, "desc.reserved", "0", d.reserved));
    }
    let kind: ftnPipelineSchedule_t = parse_enum(op, "desc.schedule", d.schedule)?;
    if !(1..=FTN_PIPELINE_MAX_RANKS).contains(&d.pp) {
        return Err(invalid(
            op,
            "desc.pp",
            format!("1..={FTN_PIPELINE_MAX_RANKS} (FTN_PIPELINE_MAX_RANKS)"),
            d.pp,
        ));
    }
    if d.microbatches < 1 {
        return Err(invalid(op, "desc.microbatches", ">= 1", d.microbatches));
    }
    let interleaved = kind == ftnPipelineSchedule_t::ftnPipelineScheduleInterleaved;
    if interleaved {
        if d.vp < 1 {
            return Err(invalid(
                op,
                "desc.vp",
                ">= 1 (chunks per rank) for ftnPipelineScheduleInterleaved",
                d.vp,
            ));
        }
        if d.group < 0 {
            return Err(invalid(
                op,
                "desc.group",
                ">= 0 (0: pp) for ftnPipelineScheduleInterleaved",
                d.group,
            ));
        }
    } else {
        if !(0..=1).contains(&d.vp) {
            return Err(invalid(
                op,
                "desc.vp",
                format!("0 or 1 for {kind:?} (only ftnPipelineScheduleInterleaved has more chunks per rank)"),
                d.vp,
            ));
        }
        if d.group != 0 {
            return Err(invalid(
                op,
                "desc.group",
                format!(
                    "0 for {kind:?} (only ftnPipelineScheduleInterleaved groups micro-batches)"
                ),
                d.group,
            ));
        }
    }
    // Every value is a positive i32 here: the product fits in u128.
    let (pp, m) = (d.pp as usize, d.microbatches as usize);
    let vp = if interleaved { d.vp as usize } else { 1 };
    let passes = if kind == ftnPipelineSchedule_t::ftnPipelineScheduleZBH1 {
        3
    } else {
        2
    };
    let ops = pp as u128 * vp as u128 * m as u128 * passes;
    if ops > FTN_PIPELINE_MAX_OPS as u128 {
        return Err(invalid(
            op,
            "desc",
            format!(
                "pp * vp * microbatches * {passes} operations <= {FTN_PIPELINE_MAX_OPS} (FTN_PIPELINE_MAX_OPS)"
            ),
            format!("{pp} * {vp} * {m} * {passes} = {ops}"),
        ));
    }
    let kind = match kind {
        ftnPipelineSchedule_t::ftnPipelineScheduleNone => ScheduleKind::NoPipelining,
        ftnPipelineSchedule_t::ftnPipelineSchedule1F1B => ScheduleKind::OneFOneB,
        ftnPipelineSchedule_t::ftnPipelineScheduleInterleaved => ScheduleKind::Interleaved {
            vp,
            group: (d.group != 0).then_some(d.group as usize),
        },
        ftnPipelineSchedule_t::ftnPipelineScheduleZBH1 => ScheduleKind::ZeroBubbleH1,
    };
    let cfg = PipelineConfig {
        pp,
        microbatches: m,
        kind,
    };
    cfg.validate().map_err(|e| renamed(op, e))?;
    Ok(cfg)
}

fn pass_of(p: Pass) -> ftnPipelinePass_t {
    match p {
        Pass::Forward => ftnPipelinePass_t::ftnPipelineForward,
        Pass::Backward => ftnPipelinePass_t::ftnPipelineBackward,
        Pass::BackwardInput => ftnPipelinePass_t::ftnPipelineBackwardInput,
        Pass::BackwardWeight => ftnPipelinePass_t::ftnPipelineBackwardWeight,
    }
}

/// `(has, peer, payload, microbatch, from_stage)` of an optional message.
fn message(m: Option<Message>) -> (i32, i32, i32, i32, i32) {
    match m {
        None => (0, 0, 0, 0, 0),
        Some(m) => {
            let payload = match m.payload {
                Payload::Activation => ftnPipelinePayload_t::ftnPipelineActivation,
                Payload::Gradient => ftnPipelinePayload_t::ftnPipelineGradient,
            };
            (
                1,
                c32(m.peer),
                payload as i32,
                c32(m.microbatch),
                c32(m.from_stage),
            )
        }
    }
}

fn op_of(o: &Op) -> ftnPipelineOp_t {
    let (has_recv, recv_peer, recv_payload, recv_microbatch, recv_from_stage) = message(o.recv);
    let (has_send, send_peer, send_payload, send_microbatch, send_from_stage) = message(o.send);
    ftnPipelineOp_t {
        pass: pass_of(o.pass) as i32,
        microbatch: c32(o.microbatch),
        chunk: c32(o.chunk),
        stage: c32(o.stage),
        has_recv,
        recv_peer,
        recv_payload,
        recv_microbatch,
        recv_from_stage,
        has_send,
        send_peer,
        send_payload,
        send_microbatch,
        send_from_stage,
    }
}

/// Writes `n` items to a caller array `out` with room for `capacity`:
/// `out = NULL, capacity = 0` writes nothing (a size query); otherwise
/// `capacity >= n` and an aligned, non-NULL `out` are required.
fn check_array<T>(
    op: &'static str,
    arg: &'static str,
    out: *mut T,
    capacity: usize,
    n: usize,
    (ty, what): (&str, &str),
) -> Result<bool> {
    if out.is_null() && capacity == 0 {
        return Ok(false);
    }
    check_out(op, arg, out)?;
    if (out as usize) % std::mem::align_of::<T>() != 0 {
        return Err(invalid(
            op,
            arg,
            format!("a pointer aligned for {ty}"),
            format!("{out:p}"),
        ));
    }
    if capacity < n {
        return Err(invalid(
            op,
            "capacity",
            format!("room for the {n} {what} (*count is set to {n})"),
            capacity,
        ));
    }
    Ok(true)
}

/// Writes rank `rank`'s operations of the pipeline `desc`, in execution
/// order, to `ops` (room for `capacity` entries) and their number to
/// `*count`. `*count` is set whenever `desc` and `rank` are valid, also
/// when `capacity` is too small (an error): call with `ops = NULL,
/// capacity = 0` to ask for the size. `0 <= rank < desc->pp`.
///
/// Bad input (ftnInvalidArgument; host only, synchronous): `desc` NULL,
/// misaligned, a bad `desc->size`, non-zero bytes past the known fields or
/// a non-zero `reserved`; `schedule` outside `ftnPipelineSchedule_t`; `pp`
/// outside `1..=FTN_PIPELINE_MAX_RANKS`; `microbatches` < 1; `vp` / `group`
/// breaking the schedule's rules (see `ftnPipelineSchedule_t`); more than
/// `FTN_PIPELINE_MAX_OPS` operations; `count` NULL or misaligned; `rank`
/// outside `0..pp`: nothing written. After `*count` is written: `ops` NULL
/// with `capacity > 0`, misaligned, or `capacity` below the count: an error
/// with only `*count` set.
#[no_mangle]
pub unsafe extern "C" fn ftn_pipeline_schedule(
    desc: *const ftnPipelineDesc_t,
    rank: c_int,
    ops: *mut ftnPipelineOp_t,
    capacity: usize,
    count: *mut usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contract.
        let cfg = unsafe { config(op, desc)? };
        check_out(op, "count", count)?;
        let r = usize::try_from(rank)
            .ok()
            .filter(|&r| r < cfg.pp)
            .ok_or_else(|| invalid(op, "rank", format!("0..{} (desc.pp)", cfg.pp), rank))?;
        let all = schedule(&cfg).map_err(|e| renamed(op, e))?;
        let mine = &all[r];
        // SAFETY: checked non-NULL; out-pointer contract.
        unsafe { write_out(op, "count", count, mine.len())? };
        if check_array(
            op,
            "ops",
            ops,
            capacity,
            mine.len(),
            ("ftnPipelineOp_t", "operations of the rank"),
        )? {
            for (i, o) in mine.iter().enumerate() {
                // SAFETY: `ops` is aligned and has room for `capacity >= len` entries.
                unsafe { ops.add(i).write(op_of(o)) };
            }
        }
        Ok(())
    })
}

/// Simulates the pipeline `desc` under `costs`: every rank runs its
/// operations in order; an operation with a receive starts no earlier than
/// the matching send's end plus `p2p_latency`; sends never wait. Writes the
/// makespan, the bubble fraction `(makespan - ideal) / ideal` (`ideal`: the
/// busiest rank's compute; e.g. `(pp - 1) / microbatches` for 1F1B with
/// equal costs and no latency), and optionally: `peak_in_flight` (NULL or
/// room for `desc->pp`), the most micro-batch activations each rank holds
/// at once (forward done, backward not); `spans` (room for `capacity`),
/// every operation placed in time, rank 0's in order, then rank 1's, ...,
/// with their number (the sum of the ranks' `ftn_pipeline_schedule`
/// counts) in `*count`. `spans = NULL, capacity = 0` skips the spans (then
/// `count` may be NULL; if not, it receives the number). A `capacity` too
/// small is an error that still sets `*count`; on an error nothing else is
/// written.
///
/// Bad input (ftnInvalidArgument; host only, synchronous; nothing written
/// unless said): `desc` bad as for `ftn_pipeline_schedule`; `costs` NULL,
/// misaligned, a bad `size` or non-zero bytes past the known fields; a cost
/// that is negative, NaN or infinite; `makespan` or `bubble_fraction` NULL
/// or misaligned; a non-NULL `peak_in_flight` not 4-byte aligned (it is
/// trusted to hold `pp` entries); `count` NULL or misaligned when spans are
/// asked for (or misaligned when given). `spans` NULL with `capacity > 0`,
/// misaligned, or `capacity` below the count: an error after `*count` is
/// written.
#[no_mangle]
pub unsafe extern "C" fn ftn_pipeline_simulate(
    desc: *const ftnPipelineDesc_t,
    costs: *const ftnPipelineCosts_t,
    makespan: *mut f64,
    bubble_fraction: *mut f64,
    peak_in_flight: *mut i32,
    spans: *mut ftnPipelineSpan_t,
    capacity: usize,
    count: *mut usize,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contracts.
        let cfg = unsafe { config(op, desc)? };
        // SAFETY: descriptor contract.
        let c = unsafe { read_desc(op, "costs", costs)? };
        let named = [
            ("costs.forward", c.forward),
            ("costs.backward", c.backward),
            ("costs.backward_input", c.backward_input),
            ("costs.backward_weight", c.backward_weight),
            ("costs.p2p_latency", c.p2p_latency),
        ];
        for (arg, v) in named {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(op, arg, "a finite cost >= 0", v));
            }
        }
        check_out(op, "makespan", makespan)?;
        check_out(op, "bubble_fraction", bubble_fraction)?;
        if (peak_in_flight as usize) % std::mem::align_of::<i32>() != 0 {
            return Err(invalid(
                op,
                "peak_in_flight",
                "NULL or a pointer aligned for int32_t",
                format!("{peak_in_flight:p}"),
            ));
        }
        let wants_spans = !(spans.is_null() && capacity == 0);
        if wants_spans {
            check_out(op, "count", count)?;
        }
        let ops = schedule(&cfg).map_err(|e| renamed(op, e))?;
        let costs = Costs::new(c.forward, c.backward, c.backward_input, c.backward_weight)
            .with_latency(c.p2p_latency);
        let sim = simulate(&ops, &costs).map_err(|e| renamed(op, e))?;
        let n: usize = sim.timeline.iter().map(Vec::len).sum();
        if !count.is_null() {
            // SAFETY: non-NULL; out-pointer contract.
            unsafe { write_out(op, "count", count, n)? };
        }
        let write_spans = check_array(
            op,
            "spans",
            spans,
            capacity,
            n,
            ("ftnPipelineSpan_t", "operations of all ranks"),
        )?;
        // SAFETY (all writes below): checked non-NULL (and aligned);
        // out-pointer contracts: `peak_in_flight` has room for `pp`
        // entries, `spans` for `capacity >= n`.
        unsafe {
            makespan.write(sim.makespan);
            bubble_fraction.write(sim.bubble_fraction);
            if !peak_in_flight.is_null() {
                for (r, &p) in sim.peak_in_flight.iter().enumerate() {
                    peak_in_flight.add(r).write(c32(p));
                }
            }
            if write_spans {
                let all = sim.timeline.iter().enumerate().flat_map(|(r, t)| {
                    t.iter().enumerate().map(move |(i, s)| ftnPipelineSpan_t {
                        rank: c32(r),
                        index: c32(i),
                        pass: pass_of(s.op.pass) as i32,
                        microbatch: c32(s.op.microbatch),
                        chunk: c32(s.op.chunk),
                        stage: c32(s.op.stage),
                        start: s.start,
                        end: s.end,
                    })
                });
                for (k, s) in all.enumerate() {
                    spans.add(k).write(s);
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::boundary::last_error_ptr;
    use std::ptr::{null, null_mut};

    fn last() -> String {
        // SAFETY: a valid NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    fn desc(
        schedule: ftnPipelineSchedule_t,
        pp: i32,
        vp: i32,
        group: i32,
        m: i32,
    ) -> ftnPipelineDesc_t {
        ftnPipelineDesc_t {
            size: std::mem::size_of::<ftnPipelineDesc_t>(),
            schedule: schedule as i32,
            pp,
            vp,
            group,
            microbatches: m,
            reserved: 0,
        }
    }

    fn ops_of(d: &ftnPipelineDesc_t, rank: i32) -> Vec<ftnPipelineOp_t> {
        let mut n = 0;
        // SAFETY: valid descriptor and out-pointer; a size query.
        let r = unsafe { ftn_pipeline_schedule(d, rank, null_mut(), 0, &mut n) };
        assert_eq!(r, ftnResult_t::ftnSuccess, "{}", last());
        let mut v = vec![ftnPipelineOp_t::default(); n];
        let mut n2 = 0;
        // SAFETY: room for n entries.
        let r = unsafe { ftn_pipeline_schedule(d, rank, v.as_mut_ptr(), n, &mut n2) };
        assert_eq!(r, ftnResult_t::ftnSuccess, "{}", last());
        assert_eq!(n, n2);
        v
    }

    #[test]
    fn one_f_one_b_matches_the_core_schedule() {
        use ftnPipelineSchedule_t::*;
        let d = desc(ftnPipelineSchedule1F1B, 4, 0, 0, 8);
        for rank in 0..4 {
            let ops = ops_of(&d, rank);
            assert_eq!(ops.len(), 16);
            // Warm-up forwards, then the first steady pair's forward.
            let before_first_backward = ops.iter().take_while(|o| o.pass == 0).count();
            assert_eq!(before_first_backward, (3 - rank as usize).min(8) + 1);
        }
        let r0 = ops_of(&d, 0);
        assert_eq!(
            (
                r0[0].has_recv,
                r0[0].has_send,
                r0[0].send_peer,
                r0[0].send_payload
            ),
            (0, 1, 1, 0)
        );
        let mut mk = 0.0;
        let mut bubble = 0.0;
        let mut peak = [0i32; 4];
        let mut spans = vec![ftnPipelineSpan_t::default(); 64];
        let mut n = 0;
        let c = ftnPipelineCosts_t {
            size: 48,
            forward: 1.0,
            backward: 2.0,
            backward_input: 1.0,
            backward_weight: 1.0,
            p2p_latency: 0.0,
        };
        // SAFETY: valid pointers with the room they claim.
        let r = unsafe {
            ftn_pipeline_simulate(
                &d,
                &c,
                &mut mk,
                &mut bubble,
                peak.as_mut_ptr(),
                spans.as_mut_ptr(),
                64,
                &mut n,
            )
        };
        assert_eq!(r, ftnResult_t::ftnSuccess, "{}", last());
        assert_eq!(n, 64);
        assert!((bubble - 3.0 / 8.0).abs() < 1e-12, "{bubble}");
        assert_eq!(mk, 33.0);
        assert_eq!(peak, [4, 3, 2, 1]);
        assert_eq!((spans[16].rank, spans[16].index), (1, 0));
        // Interleaved and ZB-H1 run too.
        for d in [
            desc(ftnPipelineScheduleInterleaved, 4, 2, 0, 8),
            desc(ftnPipelineScheduleZBH1, 4, 1, 0, 8),
            desc(ftnPipelineScheduleNone, 1, 0, 0, 3),
        ] {
            // SAFETY: as above; spans skipped.
            let r = unsafe {
                ftn_pipeline_simulate(
                    &d,
                    &c,
                    &mut mk,
                    &mut bubble,
                    null_mut(),
                    null_mut(),
                    0,
                    null_mut(),
                )
            };
            assert_eq!(r, ftnResult_t::ftnSuccess, "{}", last());
        }
    }

    #[test]
    fn bad_input_names_the_argument() {
        use ftnPipelineSchedule_t::*;
        let mut n = 0usize;
        let mut ops = [ftnPipelineOp_t::default(); 4];
        let cases: [(ftnPipelineDesc_t, i32, &str); 9] = [
            (desc(ftnPipelineSchedule1F1B, 4, 0, 0, 8), 4, "`rank`"),
            (desc(ftnPipelineSchedule1F1B, 4, 0, 0, 8), -1, "`rank`"),
            (
                {
                    let mut d = desc(ftnPipelineSchedule1F1B, 4, 0, 0, 8);
                    d.schedule = 9;
                    d
                },
                0,
                "`desc.schedule`",
            ),
            (desc(ftnPipelineSchedule1F1B, 0, 0, 0, 8), 0, "`desc.pp`"),
            (desc(ftnPipelineScheduleNone, 2, 0, 0, 8), 0, "`desc.pp`"),
            (desc(ftnPipelineSchedule1F1B, 4, 2, 0, 8), 0, "`desc.vp`"),
            (
                desc(ftnPipelineScheduleInterleaved, 4, 2, 3, 8),
                0,
                "`desc.group`",
            ),
            (
                desc(ftnPipelineScheduleInterleaved, 1024, 1024, 0, 2048),
                0,
                "`desc`",
            ),
            (desc(ftnPipelineSchedule1F1B, 4, 0, 0, 8), 0, "`capacity`"),
        ];
        for (d, rank, want) in cases {
            n = 7;
            // SAFETY: valid pointers; `ops` has room for 4.
            let r = unsafe { ftn_pipeline_schedule(&d, rank, ops.as_mut_ptr(), 4, &mut n) };
            assert_eq!(r, ftnResult_t::ftnInvalidArgument, "{want}");
            let msg = last();
            assert!(
                msg.starts_with("ftn_pipeline_schedule: ") && msg.contains(want),
                "{msg}"
            );
        }
        assert_eq!(n, 16, "a capacity error still sets *count");
        // SAFETY: NULL descriptor rejected first.
        let r = unsafe { ftn_pipeline_schedule(null(), 0, null_mut(), 0, &mut n) };
        assert_eq!(r, ftnResult_t::ftnInvalidArgument);
        assert!(last().contains("`desc`"));
        let d = desc(ftnPipelineSchedule1F1B, 4, 0, 0, 8);
        // SAFETY: ops NULL with a capacity is rejected before any write.
        let r = unsafe { ftn_pipeline_schedule(&d, 0, null_mut(), 4, &mut n) };
        assert_eq!(r, ftnResult_t::ftnInvalidArgument);
        assert!(last().contains("`ops`"), "{}", last());
        let mut c = ftnPipelineCosts_t {
            size: 48,
            forward: f64::NAN,
            backward: 2.0,
            backward_input: 1.0,
            backward_weight: 1.0,
            p2p_latency: 0.0,
        };
        let (mut mk, mut b) = (0.0, 0.0);
        // SAFETY: valid pointers.
        let r = unsafe {
            ftn_pipeline_simulate(
                &d,
                &c,
                &mut mk,
                &mut b,
                null_mut(),
                null_mut(),
                0,
                null_mut(),
            )
        };
        assert_eq!(r, ftnResult_t::ftnInvalidArgument);
        assert!(last().contains("`costs.forward`"), "{}", last());
        c.forward = 1.0;
        c.size = 8;
        // SAFETY: as above.
        let r = unsafe {
            ftn_pipeline_simulate(
                &d,
                &c,
                &mut mk,
                &mut b,
                null_mut(),
                null_mut(),
                0,
                null_mut(),
            )
        };
        assert_eq!(r, ftnResult_t::ftnInvalidArgument);
        assert!(last().contains("costs.size"), "{}", last());
        c.size = 48;
        // SAFETY: as above; makespan NULL is rejected.
        let r = unsafe {
            ftn_pipeline_simulate(
                &d,
                &c,
                null_mut(),
                &mut b,
                null_mut(),
                null_mut(),
                0,
                null_mut(),
            )
        };
        assert_eq!(r, ftnResult_t::ftnInvalidArgument);
        assert!(last().contains("`makespan`"), "{}", last());
        let mut spans = [ftnPipelineSpan_t::default(); 4];
        // SAFETY: spans has room for 4.
        let r = unsafe {
            ftn_pipeline_simulate(
                &d,
                &c,
                &mut mk,
                &mut b,
                null_mut(),
                spans.as_mut_ptr(),
                4,
                &mut n,
            )
        };
        assert_eq!(r, ftnResult_t::ftnInvalidArgument);
        assert!(last().contains("`capacity`"), "{}", last());
        assert_eq!(n, 64);
    }
}
