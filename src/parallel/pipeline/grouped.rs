//! [`P2pMode::Grouped`]: the executor's transfers as one group of sends and
//! receives at a time on the communicator's stream, in the order
//! [`crate::core::pipeline::grouped_transfers`] planned (deadlock-free with
//! rendezvous transfers that never progress concurrently, as on NCCL).
//! Each group is completed (host wait with the timeout) before the
//! computation that follows it.
//!
//! Variable shapes: a receive must know its length when it is posted, and a
//! shape message in a group of its own before each data group would break
//! the plan (a rank stuck on a shape it cannot get yet holds back data its
//! peer needs first: the hang of shape exchanges with batched p2p). So every
//! message's length is agreed on before the run instead, in one forward
//! pass over the stages: the first stage's rank asks
//! [`PipelineData::input_len`] for every micro-batch, each stage's rank
//! applies [`PipelineStage::output_len`] and passes the `m` lengths on to
//! the next stage's rank (`pp · vp − 1` small messages in a chain, which
//! cannot deadlock). Gradients have their forward's input length.

use std::collections::HashMap;

use super::executor::RunState;
use super::transfer::{Transfers, RUN};
use super::{PipelineData, PipelineExecutor, PipelineStage, ShapeMode};
use crate::backend::{DeviceBuffer, Stream};
use crate::comm::{CommElement, P2p};
use crate::core::pipeline::{Message, P2pGroup, Payload};
use crate::core::{Error, Result};

impl PipelineExecutor<'_> {
    pub(super) fn run_grouped<T, S, D>(
        &self,
        stream: &Stream,
        stage: &mut S,
        data: &mut D,
        tr: &mut Transfers<'_, T>,
        groups: &[P2pGroup],
    ) -> Result<()>
    where
        T: CommElement,
        S: PipelineStage<T> + ?Sized,
        D: PipelineData<T> + ?Sized,
    {
        let rank = self.comm.rank();
        let planned =
            match self.shapes {
                ShapeMode::Static => None,
                ShapeMode::Variable { .. } => Some(self.agree_lengths(stage, data).map_err(
                    |e| Error::Backend {
                        backend: "pipeline executor",
                        message: format!("pipeline rank {rank}: agreeing on message lengths: {e}"),
                    },
                )?),
            };
        let mut state = RunState::default();
        // Inputs received (possibly ahead), by operation index.
        let mut received: HashMap<usize, DeviceBuffer<T>> = HashMap::new();
        // Outputs computed and not yet sent, by operation index.
        let mut outbox: HashMap<usize, DeviceBuffer<T>> = HashMap::new();
        let mut next = 0;
        for i in 0..=self.ops.len() {
            while let Some(g) = groups.get(next).filter(|g| g.before == i) {
                self.exchange(stream, tr, g, planned.as_ref(), &mut outbox, &mut received)
                    .map_err(|e| match self.ops.get(i) {
                        Some(op) => self.fail(op, "exchanging messages before it", e),
                        None => Error::Backend {
                            backend: "pipeline executor",
                            message: format!(
                                "pipeline rank {rank}: the last messages after the final operation: {e}"
                            ),
                        },
                    })?;
                next += 1;
            }
            let Some(op) = self.ops.get(i) else {
                break;
            };
            let input = match op.recv {
                Some(_) => Some(received.remove(&i).ok_or_else(|| {
                    self.fail(op, "internal", internal("no group received its input"))
                })?),
                None => None,
            };
            let out = self.compute(stream, stage, data, tr, &mut state, op, input)?;
            match (op.send, out) {
                (Some(_), Some(b)) => {
                    outbox.insert(i, b);
                }
                (None, _) => {}
                (Some(_), None) => {
                    return Err(self.fail(
                        op,
                        "internal",
                        internal("an operation that sends produced nothing"),
                    ))
                }
            }
        }
        if next != groups.len() || !outbox.is_empty() || !received.is_empty() {
            return Err(Error::Backend {
                backend: "pipeline executor",
                message: format!(
                    "pipeline rank {rank}: internal: {} of {} groups ran, {} outputs unsent, \
                     {} inputs unused",
                    next,
                    groups.len(),
                    outbox.len(),
                    received.len()
                ),
            });
        }
        stream.synchronize().map_err(|e| Error::Backend {
            backend: "pipeline executor",
            message: format!("pipeline rank {rank}: the compute stream failed: {e}"),
        })?;
        self.finish(&state)
    }

    /// Runs one group: after the computation so far, sends the outputs it
    /// names and receives its inputs (shapes first with variable shapes),
    /// waits for all of it, and orders `stream` after the receives.
    fn exchange<T: CommElement>(
        &self,
        stream: &Stream,
        tr: &mut Transfers<'_, T>,
        g: &P2pGroup,
        planned: Option<&Lengths>,
        outbox: &mut HashMap<usize, DeviceBuffer<T>>,
        received: &mut HashMap<usize, DeviceBuffer<T>>,
    ) -> Result<()> {
        let cs = self.comm.stream();
        cs.wait_event(&stream.record_event()?)?;
        let mut sends = Vec::with_capacity(g.sends.len());
        for (op, m) in &g.sends {
            let b = outbox
                .remove(op)
                .ok_or_else(|| internal("a group sends an output not computed yet"))?;
            let want = message_len(planned, m, self.activation_len)?;
            if b.len() != want {
                return Err(Error::invalid(
                    RUN,
                    "output_len",
                    format!(
                        "{want} elements for {:?} of micro-batch {} from stage {} (the length \
                         agreed before the run from PipelineData::input_len and \
                         PipelineStage::output_len)",
                        m.payload, m.microbatch, m.from_stage
                    ),
                    b.len(),
                ));
            }
            sends.push((m.peer, b));
        }
        let lens = g
            .recvs
            .iter()
            .map(|(_, m)| message_len(planned, m, self.activation_len))
            .collect::<Result<Vec<_>>>()?;
        let mut recvs = Vec::with_capacity(g.recvs.len());
        for ((op, m), len) in g.recvs.iter().zip(lens) {
            recvs.push((*op, m.peer, tr.pool.take(self.comm, len, cs)?));
        }
        let mut list: Vec<P2p<'_, T>> = sends
            .iter()
            .map(|(peer, b)| P2p::Send(b, *peer))
            .chain(recvs.iter_mut().map(|(_, peer, b)| P2p::Recv(b, *peer)))
            .collect();
        let h = self.comm.group_p2p(cs, &mut list)?;
        drop(list);
        tr.wait_recv(&h)?;
        h.wait_on(stream)?;
        for (_, b) in sends {
            tr.pool.free.push((b, None));
        }
        for (op, _, b) in recvs {
            received.insert(op, b);
        }
        Ok(())
    }

    /// Every stage's (input, output) length of every micro-batch, agreed
    /// on by all ranks in one forward pass over the stages.
    fn agree_lengths<T, S, D>(&self, stage: &mut S, data: &mut D) -> Result<Lengths>
    where
        T: CommElement,
        S: PipelineStage<T> + ?Sized,
        D: PipelineData<T> + ?Sized,
    {
        let (pp, m) = (self.cfg.pp, self.cfg.microbatches);
        let rank = self.comm.rank();
        let max_len = match self.shapes {
            ShapeMode::Variable { max_len } => max_len,
            ShapeMode::Static => self.activation_len,
        };
        let cs = self.comm.stream();
        let mut lens = Lengths::new();
        let mut carry: Vec<usize> = Vec::new();
        for s in 0..self.cfg.stages() {
            if s % pp != rank {
                continue;
            }
            let input: Vec<usize> = if s == 0 {
                (0..m)
                    .map(|mb| {
                        let n = data.input_len(mb).ok_or_else(|| {
                            Error::invalid(
                                RUN,
                                "PipelineData::input_len",
                                "every micro-batch's input length (variable shapes with \
                                 grouped transfers agree on lengths before the run)",
                                format!("None for micro-batch {mb}"),
                            )
                        })?;
                        self.check_len("input_len", n, "from PipelineData::input_len")?;
                        Ok(n)
                    })
                    .collect::<Result<_>>()?
            } else if (s - 1) % pp == rank {
                std::mem::take(&mut carry)
            } else {
                let mut buf = DeviceBuffer::<i64>::zeros(self.comm.device(), m)?;
                let h = self.comm.recv(cs, &mut buf, (s - 1) % pp)?;
                self.comm.wait(&h, self.timeout)?;
                cs.synchronize()?;
                let mut host = vec![0i64; m];
                cs.copy_to_host(&buf, &mut host)?;
                host.iter()
                    .map(|&n| {
                        usize::try_from(n)
                            .ok()
                            .filter(|l| (1..=max_len).contains(l))
                            .ok_or_else(|| {
                                Error::invalid(
                                    RUN,
                                    "shape message",
                                    format!(
                                        "an element count in 1..={max_len} (max_len) from rank {}",
                                        (s - 1) % pp
                                    ),
                                    n,
                                )
                            })
                    })
                    .collect::<Result<_>>()?
            };
            let chunk = s / pp;
            let mut output = Vec::with_capacity(m);
            for (mb, &n) in input.iter().enumerate() {
                let o = stage.output_len(chunk, mb, n);
                self.check_len("output_len", o, "from PipelineStage::output_len")?;
                lens.insert((s, mb), (n, o));
                output.push(o);
            }
            if s + 1 < self.cfg.stages() && (s + 1) % pp != rank {
                let host: Vec<i64> = output.iter().map(|&n| n as i64).collect();
                let buf = DeviceBuffer::from_host(self.comm.device(), &host)?;
                let h = self.comm.send(cs, &buf, (s + 1) % pp)?;
                self.comm.wait(&h, self.timeout)?;
                cs.synchronize()?;
            } else {
                carry = output;
            }
        }
        Ok(lens)
    }
}

/// `(stage, micro-batch)` → (input length, output length).
type Lengths = HashMap<(usize, usize), (usize, usize)>;

/// The length of message `m`: planned (variable shapes) or static. A rank
/// knows the lengths of its own stages: a message it sends comes from one;
/// one it receives goes to one (an activation from stage `s` is stage
/// `s + 1`'s input, a gradient from stage `s` is stage `s − 1`'s output).
fn message_len(planned: Option<&Lengths>, m: &Message, static_len: usize) -> Result<usize> {
    let Some(lens) = planned else {
        return Ok(static_len);
    };
    let own = lens
        .get(&(m.from_stage, m.microbatch))
        .map(|&(i, o)| match m.payload {
            Payload::Activation => o,
            Payload::Gradient => i,
        });
    let neighbour = || match m.payload {
        Payload::Activation => lens.get(&(m.from_stage + 1, m.microbatch)).map(|&(i, _)| i),
        Payload::Gradient => m
            .from_stage
            .checked_sub(1)
            .and_then(|s| lens.get(&(s, m.microbatch)))
            .map(|&(_, o)| o),
    };
    own.or_else(neighbour)
        .ok_or_else(|| internal("a message between stages whose lengths were not agreed on"))
}

fn internal(message: &str) -> Error {
    Error::Backend {
        backend: "pipeline executor",
        message: message.into(),
    }
}
