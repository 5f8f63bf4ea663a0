//! The pipeline-parallel executor: runs one rank's share of a schedule from
//! [`crate::core::pipeline::schedule`] over a [`Communicator`] (the pipeline
//! group, `size == pp`), calling the user's stage code for every operation
//! and moving activations and gradients between ranks.
//!
//! * The user's model is a [`PipelineStage`]: forward, input-gradient
//!   (`backward_input`) and weight-gradient (`backward_weight`) functions of
//!   one chunk (virtual stage) and one micro-batch. [`Pass::Backward`] runs
//!   `backward_input` then `backward_weight`; the zero-bubble schedules call
//!   them separately ([`Pass::BackwardInput`], [`Pass::BackwardWeight`]).
//!   The stage keeps whatever it needs between a micro-batch's forward and
//!   its backward (its input, for instance); the executor keeps received
//!   activations and gradients only until the operation that consumes them,
//!   and the last stage's forward outputs until their backward.
//! * [`PipelineData`] supplies the first stage's input of a micro-batch and,
//!   on the last stage, computes the loss and returns `d loss / d output`.
//! * Messages: after an operation's computation, its send (if any) and the
//!   next operation's receive (if any) are posted as one
//!   [`Communicator::group_p2p`] on the communicator's stream (Megatron's
//!   `send_forward_recv_backward` and friends; with rendezvous sends, as
//!   NCCL's and the in-process backend's are, separate sends and receives on
//!   one stream deadlock in the 1F1B steady state). The communicator's stream
//!   waits for the computation (an event) before sending; the compute stream
//!   waits for the receive (an event) before consuming it. A sent output is
//!   released as soon as its send completed (Megatron's
//!   `deallocate_output_tensor`).
//! * Errors: every wait is [`Communicator::wait`] with a timeout
//!   ([`PipelineExecutor::with_timeout`], default
//!   [`crate::comm::DEFAULT_TIMEOUT`]; in-process transfers also fail after
//!   the communicator's own timeout), so a failed or diverged peer becomes
//!   an error, not a hang. A stage's error, a data error and a communication
//!   error are returned as [`Error::Backend`] whose message names the
//!   pipeline rank, the pass, the micro-batch and the stage.
//!
//! Not yet: overlap of communication with computation (the host waits for
//! each exchange before the next computation), variable activation shapes
//! (every message has `activation_len` elements), tied embeddings (no
//! gradient exchange between the first and last stage), and combination
//! with tensor parallelism (the stages may use their own TP communicator,
//! but nothing here coordinates them).

use std::collections::HashMap;
use std::time::Duration;

use crate::backend::{DeviceBuffer, Stream};
use crate::comm::{CommElement, Communicator, P2p, DEFAULT_TIMEOUT};
use crate::core::pipeline::{schedule, Message, Op, Pass, PipelineConfig};
use crate::core::{Error, Result};

/// The user's model share on one pipeline rank: its chunks (virtual
/// stages; chunk `c` of rank `r` is global stage `c · pp + r`).
pub trait PipelineStage<T: CommElement> {
    /// `output = stage(input)` for `microbatch` (both `activation_len`
    /// elements), enqueued on `stream`. Save what the backward needs.
    fn forward(
        &mut self,
        stream: &Stream,
        chunk: usize,
        microbatch: usize,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
    ) -> Result<()>;

    /// `grad_input = d loss / d input` from `grad_output = d loss / d output`.
    fn backward_input(
        &mut self,
        stream: &Stream,
        chunk: usize,
        microbatch: usize,
        grad_output: &DeviceBuffer<T>,
        grad_input: &mut DeviceBuffer<T>,
    ) -> Result<()>;

    /// The weight gradients of `microbatch` (accumulated by the stage),
    /// always after that micro-batch's `backward_input` of the same chunk.
    fn backward_weight(&mut self, stream: &Stream, chunk: usize, microbatch: usize) -> Result<()>;
}

/// The ends of the pipeline: inputs of the first stage, loss of the last.
pub trait PipelineData<T: CommElement> {
    /// The first stage's input of `microbatch` (`activation_len` elements).
    fn input(&mut self, stream: &Stream, microbatch: usize) -> Result<DeviceBuffer<T>>;

    /// On the last stage: the loss of `microbatch` from its `output` (the
    /// implementation records it) and `d loss / d output`
    /// (`activation_len` elements).
    fn loss_grad(
        &mut self,
        stream: &Stream,
        microbatch: usize,
        output: &DeviceBuffer<T>,
    ) -> Result<DeviceBuffer<T>>;
}

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
    pub fn new(
        comm: &'c Communicator,
        cfg: PipelineConfig,
        activation_len: usize,
    ) -> Result<Self> {
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
        let first_recv = self.ops.first().and_then(|o| o.recv);
        let mut received: Option<DeviceBuffer<T>> = match first_recv {
            Some(m) => self
                .exchange(stream, None, Some(m))
                .map_err(|e| self.fail(&self.ops[0], "receiving its input", e))?,
            None => None,
        };
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
                    let mut out = self.alloc::<T>().map_err(|e| fail("allocating", e))?;
                    stage
                        .forward(stream, chunk, mb, &input, &mut out)
                        .map_err(|e| fail("the stage", e))?;
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
                            data.loss_grad(stream, mb, &y)
                                .map_err(|e| fail("the data's loss", e))?
                        }
                    };
                    let mut grad_in = self.alloc::<T>().map_err(|e| fail("allocating", e))?;
                    stage
                        .backward_input(stream, chunk, mb, &grad_out, &mut grad_in)
                        .map_err(|e| fail("the stage's backward_input", e))?;
                    if op.pass == Pass::Backward {
                        stage
                            .backward_weight(stream, chunk, mb)
                            .map_err(|e| fail("the stage's backward_weight", e))?;
                    }
                    (op.stage > 0).then_some(grad_in)
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
            let next = self.ops.get(i + 1);
            let next_recv = next.and_then(|o| o.recv);
            received = self.exchange(stream, send, next_recv).map_err(|e| {
                let what = match (op.send, next) {
                    (Some(_), Some(n)) if n.recv.is_some() => format!(
                        "sending its result and receiving for {:?} of micro-batch {} (stage {})",
                        n.pass, n.microbatch, n.stage
                    ),
                    (None, Some(n)) => format!(
                        "receiving for {:?} of micro-batch {} (stage {})",
                        n.pass, n.microbatch, n.stage
                    ),
                    _ => "sending its result".into(),
                };
                fail(&what, e)
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

    fn alloc<T: CommElement>(&self) -> Result<DeviceBuffer<T>> {
        self.comm.device().alloc_zeros(self.activation_len)
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

    /// Sends `send` (after the computation on `stream`) and receives
    /// `recv` as one group on the communicator's stream, waits for both
    /// with the timeout, releases the sent buffer and makes `stream` wait
    /// for the received one.
    fn exchange<T: CommElement>(
        &self,
        stream: &Stream,
        send: Option<(Message, DeviceBuffer<T>)>,
        recv: Option<Message>,
    ) -> Result<Option<DeviceBuffer<T>>> {
        if send.is_none() && recv.is_none() {
            return Ok(None);
        }
        let cs = self.comm.stream();
        if send.is_some() {
            cs.wait_event(&stream.record_event()?)?;
        }
        let mut rbuf = match recv {
            Some(_) => Some(self.alloc::<T>()?),
            None => None,
        };
        let handle = {
            let mut p2p: Vec<P2p<'_, T>> = Vec::with_capacity(2);
            if let Some((m, b)) = &send {
                p2p.push(P2p::Send(b, m.peer));
            }
            if let (Some(m), Some(b)) = (recv, rbuf.as_mut()) {
                p2p.push(P2p::Recv(b, m.peer));
            }
            self.comm.group_p2p(cs, &mut p2p)?
        };
        self.comm.wait(&handle, self.timeout)?;
        // A transfer that failed (e.g. timed out in-process) still completes
        // its event; the stream reports the failure.
        cs.synchronize()?;
        handle.wait_on(stream)?;
        // The send is done: release the output (deallocate_output_tensor).
        drop(send);
        Ok(rbuf)
    }
}
