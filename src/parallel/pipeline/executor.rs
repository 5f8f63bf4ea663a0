//! [`PipelineExecutor`]: one rank's run of a schedule (see the module
//! documentation of [`super`]).

use std::collections::HashMap;
use std::time::Duration;

use super::pool::Pool;
pub use super::transfer::ShapeMode;
use super::transfer::{Posted, Transfers, RUN};
use super::{PipelineData, PipelineStage};
use crate::backend::{DeviceBuffer, Stream};
use crate::comm::{CommElement, Communicator, DEFAULT_TIMEOUT};
use crate::core::pipeline::{
    forward_only, grouped_transfers, schedule, Op, P2pGroup, Pass, PipelineConfig,
};
use crate::core::{Error, Result};

/// What a run keeps between operations.
pub(super) struct RunState<T: CommElement> {
    /// Outputs of the last stage's forwards, until their backward.
    pub outputs: HashMap<(usize, usize), DeviceBuffer<T>>,
    /// (input, output) lengths of every forward, until its backward.
    pub lens: HashMap<(usize, usize), (usize, usize)>,
}

impl<T: CommElement> Default for RunState<T> {
    fn default() -> Self {
        RunState {
            outputs: HashMap::new(),
            lens: HashMap::new(),
        }
    }
}

/// How the executor moves messages between ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum P2pMode {
    /// Receives posted one operation ahead on the communicator's stream,
    /// sends on one stream per peer: transfers overlap computation, but the
    /// schedules are deadlock-free only with buffered sends that progress
    /// independently (the in-process backend; the default there).
    Streams,
    /// One group of sends and receives (NCCL's `ncclGroupStart/End`) at a
    /// time on the communicator's stream, planned by
    /// [`crate::core::pipeline::grouped_transfers`] to be deadlock-free with
    /// rendezvous transfers that never progress concurrently (the default
    /// on NCCL).
    Grouped(Vec<P2pGroup>),
}

/// One pipeline rank's executor.
pub struct PipelineExecutor<'c> {
    pub(super) comm: &'c Communicator,
    pub(super) cfg: PipelineConfig,
    pub(super) activation_len: usize,
    pub(super) shapes: ShapeMode,
    pub(super) timeout: Duration,
    pub(super) ops: Vec<Op>,
    /// Every rank's operations (for planning grouped transfers).
    all_ops: Vec<Vec<Op>>,
    pub(super) p2p: P2pMode,
    /// Forwards only (evaluation): see [`PipelineExecutor::with_forward_only`].
    forward_only: bool,
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
        let all = schedule(&cfg)?;
        let ops = all[comm.rank()].clone();
        let exec = PipelineExecutor {
            comm,
            cfg,
            activation_len,
            shapes: ShapeMode::Static,
            timeout: DEFAULT_TIMEOUT,
            ops,
            all_ops: all,
            p2p: P2pMode::Streams,
            forward_only: false,
        };
        exec.with_grouped_p2p(comm.is_nccl())
    }

    /// `true`: grouped transfers ([`P2pMode::Grouped`], the default on
    /// NCCL); `false`: per-stream transfers ([`P2pMode::Streams`], the
    /// default in-process). Every rank of the pipeline must choose the same.
    pub fn with_grouped_p2p(mut self, grouped: bool) -> Result<Self> {
        self.p2p = if grouped {
            let mut plan = grouped_transfers(&self.all_ops)?;
            P2pMode::Grouped(plan.swap_remove(self.comm.rank()))
        } else {
            P2pMode::Streams
        };
        Ok(self)
    }

    /// Forward-only runs (evaluation, inference): this rank runs only the
    /// forwards of its schedule, in the same order, with their activation
    /// transfers ([`crate::core::pipeline::forward_only`], deadlock-free
    /// wherever the full schedule is). After each forward the stage's
    /// [`PipelineStage::release`] drops what it saved for the backward; on
    /// the last stage [`PipelineData::forward_loss`] takes the output. The
    /// stage's weight gradients are untouched. Every rank of the pipeline
    /// must choose it; call it after choosing the transfer mode or before
    /// (a grouped plan is made again for the forwards).
    pub fn with_forward_only(mut self) -> Result<Self> {
        self.all_ops = forward_only(&self.all_ops);
        self.ops = self.all_ops[self.comm.rank()].clone();
        self.forward_only = true;
        let grouped = matches!(self.p2p, P2pMode::Grouped(_));
        self.with_grouped_p2p(grouped)
    }

    /// Whether this executor runs forwards only.
    pub fn is_forward_only(&self) -> bool {
        self.forward_only
    }

    /// How messages move.
    pub fn p2p_mode(&self) -> &P2pMode {
        &self.p2p
    }

    /// The host-side timeout of every wait for a transfer.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Variable shapes: every activation and gradient message is preceded
    /// by a shape message with its element count, so every micro-batch may
    /// have its own length (the first stage's input sets it; each stage's
    /// [`PipelineStage::output_len`] gives its output's). `max_len` bounds
    /// every message (a larger input, output or announced shape is an
    /// error). Every rank of the pipeline must use the same mode.
    pub fn with_variable_shapes(mut self, max_len: usize) -> Result<Self> {
        if max_len == 0 {
            return Err(Error::invalid(
                "PipelineExecutor::with_variable_shapes",
                "max_len",
                ">= 1",
                0,
            ));
        }
        self.shapes = ShapeMode::Variable { max_len };
        Ok(self)
    }

    /// How long messages are.
    pub fn shapes(&self) -> ShapeMode {
        self.shapes
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
        let mut tr = Transfers {
            comm: self.comm,
            shapes: self.shapes,
            activation_len: self.activation_len,
            timeout: self.timeout,
            pool: Pool { free: Vec::new() },
            shape_pool: Pool { free: Vec::new() },
            sends: Vec::new(),
            shape_sends: Vec::new(),
        };
        let mut posted = None;
        let r = match &self.p2p {
            P2pMode::Streams => self.run_ops(stream, stage, data, &mut tr, &mut posted),
            P2pMode::Grouped(groups) => self.run_grouped(stream, stage, data, &mut tr, groups),
        };
        if r.is_err() {
            tr.drain(posted);
        }
        r
    }

    /// The `(min, max)` length of a message, input or output.
    fn len_bounds(&self) -> (usize, usize) {
        match self.shapes {
            ShapeMode::Static => (self.activation_len, self.activation_len),
            ShapeMode::Variable { max_len } => (1, max_len),
        }
    }

    /// `Ok` if `len` is allowed for `arg`, else its named error.
    pub(super) fn check_len(&self, arg: &'static str, len: usize, what: &str) -> Result<()> {
        let (lo, hi) = self.len_bounds();
        if (lo..=hi).contains(&len) {
            return Ok(());
        }
        let expected = match self.shapes {
            ShapeMode::Static => format!("{lo} elements (activation_len) {what}"),
            ShapeMode::Variable { .. } => format!("1..={hi} elements (max_len) {what}"),
        };
        Err(Error::invalid(RUN, arg, expected, len))
    }

    fn run_ops<T, S, D>(
        &self,
        stream: &Stream,
        stage: &mut S,
        data: &mut D,
        tr: &mut Transfers<'_, T>,
        posted: &mut Option<Posted<T>>,
    ) -> Result<()>
    where
        T: CommElement,
        S: PipelineStage<T> + ?Sized,
        D: PipelineData<T> + ?Sized,
    {
        let rank = self.comm.rank();
        let mut state = RunState::default();
        // One send stream per peer: sends to a peer complete in posting
        // order, and a send waiting for its receiver blocks neither the
        // receives nor the sends to the other peer (the buffered sends the
        // schedules are checked against).
        let mut send_streams: HashMap<usize, Stream> = HashMap::new();
        if let Some(m) = self.ops.first().and_then(|o| o.recv) {
            *posted = Some(
                tr.post_recv(m.peer)
                    .map_err(|e| self.fail(&self.ops[0], "posting its receive", e))?,
            );
        }
        for (i, op) in self.ops.iter().enumerate() {
            let (chunk, mb) = (op.chunk, op.microbatch);
            let fail = |what: &str, e: Error| self.fail(op, what, e);
            let internal = |message: &str| {
                fail(
                    "internal",
                    Error::Backend {
                        backend: "pipeline executor",
                        message: message.into(),
                    },
                )
            };
            // This operation's message, received ahead (posted before the
            // previous computation).
            let received = match op.recv {
                Some(_) => {
                    let p = posted
                        .take()
                        .ok_or_else(|| internal("no posted receive for an operation with one"))?;
                    Some(
                        tr.complete(stream, p)
                            .map_err(|e| fail("receiving its input", e))?,
                    )
                }
                None => None,
            };
            // Post the next operation's receive before this computation, so
            // the transfer overlaps it. Receives stay in schedule order on
            // the communicator's stream; only the host's wait moves later.
            if let Some(n) = self.ops.get(i + 1) {
                if let Some(m) = n.recv {
                    *posted = Some(
                        tr.post_recv(m.peer)
                            .map_err(|e| self.fail(n, "posting its receive", e))?,
                    );
                }
            }
            let produced = self.compute(stream, stage, data, tr, &mut state, op, received)?;
            match (op.send, produced) {
                (Some(m), Some(buf)) => {
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
                    let what = format!(
                        "{:?} of micro-batch {mb} (stage {}, chunk {chunk}): sending its result",
                        op.pass, op.stage
                    );
                    tr.send(stream, ss, m.peer, buf, what)
                        .map_err(|e| fail("sending its result", e))?;
                }
                (None, _) => {}
                (Some(_), None) => {
                    return Err(internal("an operation that sends produced nothing"))
                }
            }
            tr.release_sent().map_err(|e| fail("sending", e))?;
        }
        tr.finish_sends().map_err(|(what, e)| Error::Backend {
            backend: "pipeline executor",
            message: format!("pipeline rank {rank}: {what}: {e}"),
        })?;
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
        self.finish(&state)
    }

    /// The end of a run: every last-stage output had its backward.
    pub(super) fn finish<T: CommElement>(&self, state: &RunState<T>) -> Result<()> {
        let rank = self.comm.rank();
        if let Some((chunk, mb)) = state.outputs.keys().next() {
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

    /// Runs one operation's computation on `stream`; returns the output it
    /// sends, if any. `received`: its input or output gradient from a peer.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn compute<T, S, D>(
        &self,
        stream: &Stream,
        stage: &mut S,
        data: &mut D,
        tr: &mut Transfers<'_, T>,
        state: &mut RunState<T>,
        op: &Op,
        received: Option<DeviceBuffer<T>>,
    ) -> Result<Option<DeviceBuffer<T>>>
    where
        T: CommElement,
        S: PipelineStage<T> + ?Sized,
        D: PipelineData<T> + ?Sized,
    {
        let (chunk, mb) = (op.chunk, op.microbatch);
        let last_stage = self.cfg.stages() - 1;
        let fail = |what: &str, e: Error| self.fail(op, what, e);
        let internal = |message: &str| {
            fail(
                "internal",
                Error::Backend {
                    backend: "pipeline executor",
                    message: message.into(),
                },
            )
        };
        let produced = match op.pass {
            Pass::Forward => {
                let input = match received {
                    Some(b) => b,
                    None => {
                        let b = data
                            .input(stream, mb)
                            .map_err(|e| fail("the data's input", e))?;
                        self.check_len("input", b.len(), "from PipelineData::input")
                            .map_err(|e| fail("the data's input", e))?;
                        b
                    }
                };
                let out_len = match self.shapes {
                    ShapeMode::Static => self.activation_len,
                    ShapeMode::Variable { .. } => {
                        let n = stage.output_len(chunk, mb, input.len());
                        self.check_len("output_len", n, "from PipelineStage::output_len")
                            .map_err(|e| fail("the stage's output_len", e))?;
                        n
                    }
                };
                if !self.forward_only {
                    state.lens.insert((chunk, mb), (input.len(), out_len));
                }
                let mut out = tr
                    .pool
                    .take(self.comm, out_len, stream)
                    .map_err(|e| fail("allocating", e))?;
                stage
                    .forward(stream, chunk, mb, &input, &mut out)
                    .map_err(|e| fail("the stage", e))?;
                tr.pool
                    .put_after(input, stream)
                    .map_err(|e| fail("releasing its input", e))?;
                if self.forward_only {
                    stage
                        .release(chunk, mb)
                        .map_err(|e| fail("the stage's release", e))?;
                }
                if op.stage == last_stage && self.forward_only {
                    data.forward_loss(stream, mb, &out)
                        .map_err(|e| fail("the data's forward_loss", e))?;
                    tr.pool
                        .put_after(out, stream)
                        .map_err(|e| fail("releasing its output", e))?;
                    None
                } else if op.stage == last_stage {
                    state.outputs.insert((chunk, mb), out);
                    None
                } else {
                    Some(out)
                }
            }
            Pass::Backward | Pass::BackwardInput => {
                let (in_len, out_len) = state
                    .lens
                    .remove(&(chunk, mb))
                    .ok_or_else(|| internal("backward before its forward"))?;
                let grad_out = match received {
                    Some(g) => g,
                    None => {
                        let y = state.outputs.remove(&(chunk, mb)).ok_or_else(|| {
                            internal("backward of the last stage before its forward")
                        })?;
                        let g = data
                            .loss_grad(stream, mb, &y)
                            .map_err(|e| fail("the data's loss", e))?;
                        tr.pool
                            .put_after(y, stream)
                            .map_err(|e| fail("releasing its output", e))?;
                        g
                    }
                };
                if grad_out.len() != out_len {
                    return Err(fail(
                        "its output gradient",
                        Error::invalid(
                            RUN,
                            if op.recv.is_some() {
                                "received gradient"
                            } else {
                                "loss_grad"
                            },
                            format!("{out_len} elements (the forward's output length)"),
                            grad_out.len(),
                        ),
                    ));
                }
                let mut grad_in = tr
                    .pool
                    .take(self.comm, in_len, stream)
                    .map_err(|e| fail("allocating", e))?;
                stage
                    .backward_input(stream, chunk, mb, &grad_out, &mut grad_in)
                    .map_err(|e| fail("the stage's backward_input", e))?;
                tr.pool
                    .put_after(grad_out, stream)
                    .map_err(|e| fail("releasing its output gradient", e))?;
                if op.pass == Pass::Backward {
                    stage
                        .backward_weight(stream, chunk, mb)
                        .map_err(|e| fail("the stage's backward_weight", e))?;
                }
                if op.stage > 0 {
                    Some(grad_in)
                } else {
                    tr.pool
                        .put_after(grad_in, stream)
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
        Ok(produced)
    }

    pub(super) fn fail(&self, op: &Op, what: &str, e: Error) -> Error {
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
}
