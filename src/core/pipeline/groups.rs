//! Grouped point-to-point transfers: the protocol that is safe on NCCL.
//!
//! NCCL gives no guarantee that two operations on one communicator progress
//! at the same time (issued on different streams, one may wait for the
//! other), and a send completes only when its receiver has posted the
//! matching receive (rendezvous). The executor's default transfers —
//! receives posted ahead on one stream, sends on one stream per peer —
//! assume buffered sends and independent progress, which only the
//! in-process backend provides. Grouped mode assumes neither: before an
//! operation's computation a rank issues at most **one group** (NCCL's
//! `ncclGroupStart/End`) holding the sends of the operations computed since
//! the last group and the operation's own receive, and waits for the whole
//! group before computing. Transfers inside a group progress together;
//! groups run strictly one after another. (Megatron's batched p2p, e.g.
//! `send_forward_recv_backward`, is this protocol.)
//!
//! [`grouped_transfers`] plans every rank's groups: first one group per
//! operation boundary (the previous operation's send, this operation's
//! receive), then, while the plan would deadlock, every stuck send-only
//! group is merged into the rank's next group (its send deferred until the
//! rank next receives — what Megatron's interleaved schedule does by
//! sending after each forward/backward pair). [`check_grouped`] runs a plan
//! under exactly the rules above and names the stuck ranks.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::{Message, Op, Payload};
use crate::core::{Error, Result};

/// One group of transfers, completed before the computation of operation
/// `before` (`before == ops.len()`: after the last computation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2pGroup {
    /// Index of the operation whose computation waits for this group.
    pub before: usize,
    /// Outputs of earlier operations, `(operation index, message)`, in
    /// operation order.
    pub sends: Vec<(usize, Message)>,
    /// Inputs, `(operation index, message)`: this operation's own and,
    /// received ahead, those of later operations (in each peer's order).
    pub recvs: Vec<(usize, Message)>,
}

/// A message's identity: sender, receiver, payload, micro-batch, stage.
type Key = (usize, usize, Payload, usize, usize);

fn key(from: usize, to: usize, m: &Message) -> Key {
    (from, to, m.payload, m.microbatch, m.from_stage)
}

/// One group per operation boundary: the previous operation's send and
/// this operation's receive (empty groups omitted).
fn per_boundary(ops: &[Op]) -> Vec<P2pGroup> {
    (0..=ops.len())
        .map(|i| P2pGroup {
            before: i,
            sends: i
                .checked_sub(1)
                .and_then(|p| ops[p].send.map(|m| (p, m)))
                .into_iter()
                .collect(),
            recvs: ops
                .get(i)
                .and_then(|o| o.recv.map(|m| (i, m)))
                .into_iter()
                .collect(),
        })
        .filter(|g| !g.sends.is_empty() || !g.recvs.is_empty())
        .collect()
}

/// The state of a run: each rank's current group, and every transfer some
/// rank has issued (its group reached).
struct Sim {
    at: Vec<usize>,
    issued: BTreeSet<(usize, Key)>,
}

impl Sim {
    fn new(plan: &[Vec<P2pGroup>]) -> Sim {
        let mut sim = Sim {
            at: alloc::vec![0; plan.len()],
            issued: BTreeSet::new(),
        };
        for r in 0..plan.len() {
            sim.issue(plan, r);
        }
        sim
    }

    /// Marks rank `r`'s current group as issued.
    fn issue(&mut self, plan: &[Vec<P2pGroup>], r: usize) {
        if let Some(g) = plan[r].get(self.at[r]) {
            for (_, m) in &g.sends {
                self.issued.insert((r, key(r, m.peer, m)));
            }
            for (_, m) in &g.recvs {
                self.issued.insert((r, key(m.peer, r, m)));
            }
        }
    }

    /// Completes groups until no rank can go on; `Err` holds every
    /// unfinished rank's current group index.
    fn run(&mut self, plan: &[Vec<P2pGroup>]) -> core::result::Result<(), Vec<(usize, usize)>> {
        loop {
            let mut progressed = false;
            for r in 0..plan.len() {
                while let Some(g) = plan[r].get(self.at[r]) {
                    let ready = |peer: usize, k: Key| self.issued.contains(&(peer, k));
                    let done = g
                        .sends
                        .iter()
                        .all(|(_, m)| ready(m.peer, key(r, m.peer, m)))
                        && g.recvs
                            .iter()
                            .all(|(_, m)| ready(m.peer, key(m.peer, r, m)));
                    if !done {
                        break;
                    }
                    self.at[r] += 1;
                    self.issue(plan, r);
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        let stuck: Vec<(usize, usize)> = (0..plan.len())
            .filter(|&r| self.at[r] < plan[r].len())
            .map(|r| (r, self.at[r]))
            .collect();
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(stuck)
        }
    }
}

fn deadlock(plan: &[Vec<P2pGroup>], stuck: &[(usize, usize)]) -> Error {
    let what: Vec<String> = stuck
        .iter()
        .map(|&(r, gi)| {
            let g = &plan[r][gi];
            format!(
                "rank {r} before op {} (sends {:?}, receives {:?})",
                g.before,
                g.sends.iter().map(|(_, m)| *m).collect::<Vec<_>>(),
                g.recvs.iter().map(|(_, m)| *m).collect::<Vec<_>>()
            )
        })
        .collect();
    Error::invalid(
        "pipeline grouped transfers",
        "schedule",
        "a schedule whose grouped transfers cannot deadlock",
        what.join("; "),
    )
}

/// Runs `plan` (every rank's groups) with rendezvous semantics: a transfer
/// completes once the sender's and the receiver's groups holding it have
/// both been issued; a rank issues its next group once every transfer of
/// the current one completed. `Err` names the stuck ranks and their groups.
pub fn check_grouped(plan: &[Vec<P2pGroup>]) -> Result<()> {
    Sim::new(plan)
        .run(plan)
        .map_err(|stuck| deadlock(plan, &stuck))
}

/// Every rank's groups for `schedule` (all ranks' operations, as
/// [`super::schedule()`] returns them), checked deadlock-free. Every rank
/// computes the same plan from the same schedule.
pub fn grouped_transfers(schedule: &[Vec<Op>]) -> Result<Vec<Vec<P2pGroup>>> {
    let mut plan: Vec<Vec<P2pGroup>> = schedule.iter().map(|ops| per_boundary(ops)).collect();
    // Repairs change only the stuck ranks' current and later groups, so the
    // run goes on from where it stopped. Each repair removes a group or
    // moves a receive to an earlier group, so the loop ends; the bound is a
    // guard against a logic error.
    let mut sim = Sim::new(&plan);
    let bound: usize = plan.iter().map(Vec::len).sum::<usize>() * 2 + 8;
    for _ in 0..bound {
        let stuck = match sim.run(&plan) {
            Ok(()) => return Ok(plan),
            Err(stuck) => stuck,
        };
        if !(pull_receives(&mut plan, &stuck) || defer_sends(&mut plan, &stuck)) {
            return Err(deadlock(&plan, &stuck));
        }
        for &(r, _) in &stuck {
            sim.issue(&plan, r);
        }
    }
    Err(Error::Backend {
        backend: "pipeline grouped transfers",
        message: "planning did not converge".into(),
    })
}

/// Repair 1: a stuck group sends to a peer that has not yet posted the
/// receive: the peer receives ahead — its receives from this rank, in its
/// order, up to the one needed, move into the peer's current group (each
/// pair's receive order, which is how NCCL matches, is kept).
fn pull_receives(plan: &mut [Vec<P2pGroup>], stuck: &[(usize, usize)]) -> bool {
    let at: BTreeMap<usize, usize> = stuck.iter().copied().collect();
    let mut moves: Vec<(usize, usize, usize, Key)> = Vec::new(); // (peer, from gi, sender, key)
    for &(r, gi) in stuck {
        for (_, m) in &plan[r][gi].sends {
            let Some(&peer_at) = at.get(&m.peer) else {
                continue;
            };
            let k = key(r, m.peer, m);
            let target = plan[m.peer]
                .iter()
                .position(|g| g.recvs.iter().any(|(_, x)| key(r, m.peer, x) == k));
            if let Some(t) = target.filter(|&t| t > peer_at) {
                moves.push((m.peer, peer_at, r, k));
                let _ = t;
            }
        }
    }
    let mut changed = false;
    for (p, into, sender, k) in moves {
        let groups = &mut plan[p];
        let mut pulled = Vec::new();
        'scan: for g in groups.iter_mut().skip(into + 1) {
            let mut i = 0;
            while i < g.recvs.len() {
                if g.recvs[i].1.peer == sender {
                    let (op, m) = g.recvs.remove(i);
                    let done = key(sender, p, &m) == k;
                    pulled.push((op, m));
                    if done {
                        break 'scan;
                    }
                } else {
                    i += 1;
                }
            }
        }
        if !pulled.is_empty() {
            groups[into].recvs.extend(pulled);
            changed = true;
        }
        groups.retain(|g| !g.sends.is_empty() || !g.recvs.is_empty());
    }
    changed
}

/// Repair 2: a stuck send-only group is merged into the rank's next group
/// (its sends deferred until the rank next receives).
fn defer_sends(plan: &mut [Vec<P2pGroup>], stuck: &[(usize, usize)]) -> bool {
    let mut changed = false;
    for &(r, gi) in stuck {
        let groups = &mut plan[r];
        if gi < groups.len() && groups[gi].recvs.is_empty() && gi + 1 < groups.len() {
            let g = groups.remove(gi);
            let mut sends = g.sends;
            sends.append(&mut groups[gi].sends);
            groups[gi].sends = sends;
            changed = true;
        }
    }
    changed
}
