//! [`PipelineExecutor`]: one rank's run of a schedule (see the module
//! documentation of [`super`]).

use std::collections::HashMap;
use std::time::Duration;

use super::pool::Pool;
use super::{PipelineData, PipelineStage};
use crate::backend::{DeviceBuffer, Stream};
use crate::comm::{CommElement, CommHandle, Communicator, DEFAULT_TIMEOUT};
use crate::core::pipeline::{schedule, Message, Op, Pass, PipelineConfig};
use crate::core::{Error, Result};

/// One pipeline rank's executor.
pub struct PipelineExecutor<'c> {
    comm: &'c Communicator,
    cfg: PipelineConfig,
    activation_len: usize,
    timeout: Duration,
    ops: Vec<Op>,
}

impl std::fmt::Debug for PipelineExecutor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PipelineExecutor(rank {} of {}, {:?}, {} ops)",
            self.comm.rank(),
            self.comm.size(),
            self.cfg,
            self.ops.len()
        )
    }
}

const OP: &str = "PipelineExecutor::new";

impl<'c> PipelineExecutor<'c> {
    /// Checks the configuration against the pipeline group `comm` (its size
    /// must be `cfg.pp`) and builds this rank's operations.
    pub fn new(comm: &'c Communicator, cfg: PipelineConfig, activation_len: usize) -> Result<Self> {
        if cfg.pp != comm.size() {
            return Err(Error::invalid(
                OP,
                "cfg.pp",
                format!(
                    "the pipeline communicator's size {} (one rank per pipeline stage group)",
                    comm.size()
                ),
                cfg.pp,
            ));
        }
        if activation_len == 0 {
            return Err(Error::invalid(OP, "activation_len", ">= 1", 0));
        }
        let mut all = schedule(&cfg)?;
        let ops = all.swap_remove(comm.rank());
        Ok(PipelineExecutor {
            comm,
            cfg,
            activation_len,
            timeout: DEFAULT_TIMEOUT,
            ops,
        })
    }

    /// The host-side timeout of every wait for a transfer.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// This rank's operations in execution order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    pub fn config(&self) -> &PipelineConfig {
        &self.cfg
    }

    /// Runs every operation of this rank for one batch (`cfg.microbatches`
    /// micro-batches), computing on `stream`; returns once the computation
    /// and every transfer are done. Weight gradients are whatever the stage
    /// accumulated.
    pub fn run<T, S, D>(&mut self, stream: &Stream, stage: &mut S, data: &mut D) -> Result<()>
    where
        T: CommElement,
        S: PipelineStage<T> + ?Sized,
        D: PipelineData<T> + ?Sized,
    {
        let rank = self.comm.rank();
        let last_stage = self.cfg.stages() - 1;
        // Outputs of the last stage's forwards, until their backward.
        let mut outputs: HashMap<(usize, usize), DeviceBuffer<T>> = HashMap::new();
        let mut pool: Pool<T> = Pool { free: Vec::new() };
        let first_recv = self.ops.first().and_then(|o| o.recv);
        let mut received: Option<DeviceBuffer<T>> = match first_recv {
            Some(m) => Some(
                self.receive(stream, m, &mut pool)
                    .map_err(|e| self.fail(&self.ops[0], "receiving its input", e))?,
            ),
            None => None,
        };
        // One send stream per peer: sends to a peer complete in posting
        // order, and a send waiting for its receiver blocks neither the
        // receives nor the sends to the other peer (the buffered sends the
        // schedules are checked against).
        let mut send_streams: HashMap<usize, Stream> = HashMap::new();
        let mut pending: Vec<(CommHandle, DeviceBuffer<T>, Op)> = Vec::new();
        for (i, op) in self.ops.iter().enumerate() {
            let (chunk, mb) = (op.chunk, op.microbatch);
            let fail = |what: &str, e: Error| self.fail(op, what, e);
            let mut take_received = || {
                received.take().ok_or_else(|| {
                    fail(
                        "internal",
                        Error::Backend {
                            backend: "pipeline executor",
                            message: "no received buffer for an operation with a receive".into(),
                        },
                    )
                })
            };
            let produced: Option<DeviceBuffer<T>> = match op.pass {
                Pass::Forward => {
                    let input = match op.recv {
                        Some(_) => take_received()?,
                        None => data
                            .input(stream, mb)
                            .map_err(|e| fail("the data's input", e))?,
                    };
                    let mut out = pool
                        .take(self.comm, self.activation_len, stream)
                        .map_err(|e| fail("allocating", e))?;
                    stage
                        .forward(stream, chunk, mb, &input, &mut out)
                        .map_err(|e| fail("the stage", e))?;
                    pool.put_after(input, stream)
                        .map_err(|e| fail("releasing its input", e))?;
                    if op.stage == last_stage {
                        outputs.insert((chunk, mb), out);
                        None
                    } else {
                        Some(out)
                    }
                }
                Pass::Backward | Pass::BackwardInput => {
                    let grad_out = match op.recv {
                        Some(_) => take_received()?,
                        None => {
                            let y = outputs.remove(&(chunk, mb)).ok_or_else(|| {
                                fail(
                                    "internal",
                                    Error::Backend {
                                        backend: "pipeline executor",
                                        message: "backward of the last stage before its forward"
                                            .into(),
                                    },
                                )
                            })?;
                            let g = data
                                .loss_grad(stream, mb, &y)
                                .map_err(|e| fail("the data's loss", e))?;
                            pool.put_after(y, stream)
                                .map_err(|e| fail("releasing its output", e))?;
                            g
                        }
                    };
                    let mut grad_in = pool
                        .take(self.comm, self.activation_len, stream)
                        .map_err(|e| fail("allocating", e))?;
                    stage
                        .backward_input(stream, chunk, mb, &grad_out, &mut grad_in)
                        .map_err(|e| fail("the stage's backward_input", e))?;
                    pool.put_after(grad_out, stream)
                        .map_err(|e| fail("releasing its output gradient", e))?;
                    if op.pass == Pass::Backward {
                        stage
                            .backward_weight(stream, chunk, mb)
                            .map_err(|e| fail("the stage's backward_weight", e))?;
                    }
                    if op.stage > 0 {
                        Some(grad_in)
                    } else {
                        pool.put_after(grad_in, stream)
                            .map_err(|e| fail("releasing its input gradient", e))?;
                        None
                    }
                }
                Pass::BackwardWeight => {
                    stage
                        .backward_weight(stream, chunk, mb)
                        .map_err(|e| fail("the stage's backward_weight", e))?;
                    None
                }
            };
            let send = match (op.send, produced) {
                (Some(m), Some(b)) => Some((m, b)),
                (None, _) => None,
                (Some(_), None) => {
                    return Err(fail(
                        "internal",
                        Error::Backend {
                            backend: "pipeline executor",
                            message: "an operation that sends produced nothing".into(),
                        },
                    ))
                }
            };
            if let Some((m, buf)) = send {
                let ss = match send_streams.get(&m.peer) {
                    Some(ss) => ss,
                    None => {
                        let ss = self
                            .comm
                            .device()
                            .new_stream()
                            .map_err(|e| fail("creating a send stream", e))?;
                        send_streams.entry(m.peer).or_insert(ss)
                    }
                };
                let handle = self
                    .post_send(stream, ss, m, &buf)
                    .map_err(|e| fail("sending its result", e))?;
                pending.push((handle, buf, *op));
            }
            // Release the outputs whose send completed (deallocate_output_tensor).
            let mut still = Vec::with_capacity(pending.len());
            for (h, b, o) in pending.drain(..) {
                if h.event()
                    .is_complete()
                    .map_err(|e| self.fail(&o, "sending", e))?
                {
                    pool.free.push((b, None));
                } else {
                    still.push((h, b, o));
                }
            }
            pending = still;
            if let Some(n) = self.ops.get(i + 1) {
                if let Some(m) = n.recv {
                    received = Some(
                        self.receive(stream, m, &mut pool)
                            .map_err(|e| self.fail(n, "receiving its input", e))?,
                    );
                }
            }
        }
        for (h, b, o) in pending.drain(..) {
            self.comm
                .wait(&h, self.timeout)
                .map_err(|e| self.fail(&o, "sending its result", e))?;
            pool.free.push((b, None));
        }
        for (peer, ss) in &send_streams {
            ss.synchronize().map_err(|e| Error::Backend {
                backend: "pipeline executor",
                message: format!("pipeline rank {rank}: a send to rank {peer} failed: {e}"),
            })?;
        }
        stream.synchronize().map_err(|e| Error::Backend {
            backend: "pipeline executor",
            message: format!("pipeline rank {rank}: the compute stream failed: {e}"),
        })?;
        if let Some((chunk, mb)) = outputs.keys().next() {
            return Err(Error::Backend {
                backend: "pipeline executor",
                message: format!(
                    "pipeline rank {rank}: the last stage's output of micro-batch {mb} \
                     (chunk {chunk}) never had its backward"
                ),
            });
        }
        Ok(())
    }

    fn fail(&self, op: &Op, what: &str, e: Error) -> Error {
        Error::Backend {
            backend: "pipeline executor",
            message: format!(
                "pipeline rank {}: {:?} of micro-batch {} (stage {}, chunk {}): {what}: {e}",
                self.comm.rank(),
                op.pass,
                op.microbatch,
                op.stage,
                op.chunk
            ),
        }
    }

    /// Sends `buf` to `m.peer` on `send_stream` once the computation on
    /// `stream` so far is done.
    fn post_send<T: CommElement>(
        &self,
        stream: &Stream,
        send_stream: &Stream,
        m: Message,
        buf: &DeviceBuffer<T>,
    ) -> Result<CommHandle> {
        send_stream.wait_event(&stream.record_event()?)?;
        self.comm.send(send_stream, buf, m.peer)
    }

    /// Receives `m` on the communicator's stream, waits for it with the
    /// timeout and makes `stream` wait for it.
    fn receive<T: CommElement>(
        &self,
        stream: &Stream,
        m: Message,
        pool: &mut Pool<T>,
    ) -> Result<DeviceBuffer<T>> {
        let cs = self.comm.stream();
        let mut buf = pool.take(self.comm, self.activation_len, cs)?;
        let handle = self.comm.recv(cs, &mut buf, m.peer)?;
        self.comm.wait(&handle, self.timeout)?;
        // A transfer that failed (e.g. timed out in-process) still completes
        // its event; the stream reports the failure.
        cs.synchronize()?;
        handle.wait_on(stream)?;
        Ok(buf)
    }
}
