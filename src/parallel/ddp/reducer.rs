//! Bucketed gradient reduction overlapped with backward (Megatron-Core's
//! `DistributedDataParallel` with `overlap_grad_reduce`): the caller marks
//! each parameter's gradient ready as backward produces it; once every
//! parameter of a bucket is ready in the last micro-batch, the bucket's
//! all-reduce (plain DDP) or reduce-scatter into this rank's shard
//! (distributed optimizer) is enqueued on the communicator's stream after an
//! event of the compute stream, while backward goes on.
//! [`DistributedDataParallel::finish_grad_sync`] makes the compute stream
//! wait for every bucket.

use crate::backend::{AnyBuffer, Device, Event, Stream};
use crate::comm::{Communicator, ReduceOp};
use crate::core::ddp_layout::{self, LayoutConfig};
use crate::core::{Error, Result};
use crate::ops::multi_tensor::{GradRef, MultiTensor};

use super::buckets::Readiness;
use super::buffers::{view_any, BucketId, ParamAndGradBuffers, ParamId, ParamKind, ParamRegistry};

const OP: &str = "DistributedDataParallel";

/// How the sum over data-parallel ranks becomes a mean.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GradAveraging {
    /// Multiply by `1/dp` before the sum (Megatron's
    /// `gradient_scaling_factor`), on the communication stream.
    #[default]
    PreScale,
    /// Sum with the collective's average (`ReduceOp::Avg`).
    Average,
    /// Sum only (the caller scales).
    Sum,
}

/// The data-parallel configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdpConfig {
    /// Elements per bucket; `None` is Megatron's default
    /// [`ddp_layout::default_bucket_size`]`(dp)`.
    pub bucket_size: Option<usize>,
    /// Reduce-scatter into shards (ZeRO-1) instead of all-reduce, with the
    /// distributed optimizer's padding.
    pub distributed_optimizer: bool,
    pub averaging: GradAveraging,
    /// Before a bucket's reduction, check every gradient in it for NaN / Inf
    /// (synchronises the host with the compute stream; an error names the
    /// parameter).
    pub check_for_nan_in_grad: bool,
}

impl Default for DdpConfig {
    fn default() -> Self {
        DdpConfig {
            bucket_size: None,
            distributed_optimizer: false,
            averaging: GradAveraging::PreScale,
            check_for_nan_in_grad: false,
        }
    }
}

/// Data-parallel gradient synchronisation over one data-parallel
/// communicator. Every rank must register the same parameters in the same
/// order and mark them ready in the same bucket order.
pub struct DistributedDataParallel<'c> {
    comm: &'c Communicator,
    config: DdpConfig,
    pub(crate) buffers: ParamAndGradBuffers,
    readiness: Readiness,
    /// Per bucket (in [`ParamAndGradBuffers::buckets`] order): the event
    /// recorded after its reduction, once started this step.
    events: Vec<Option<Event>>,
    buckets: Vec<BucketId>,
    /// Per bucket: the reduce-scatter's output shard (distributed optimizer;
    /// the in-process backend cannot alias input and output).
    scratch: Vec<Option<AnyBuffer>>,
    is_last_microbatch: bool,
    /// True from `finish_grad_sync` until the next gradient is marked or the
    /// buffers are zeroed: the shards hold this step's reduced gradients.
    synced: bool,
    mt: MultiTensor,
    /// `[1]` f32: the (unused) found_inf of the pre-scale.
    found_inf: crate::backend::DeviceBuffer<f32>,
    /// One found_inf flag per parameter for the NaN check.
    nan_flags: crate::backend::DeviceBuffer<f32>,
    /// Bucket indices (into `buckets`) in forward order: by the first
    /// registered parameter of each bucket (the reverse of the layout).
    forward_order: Vec<usize>,
    /// Per bucket (distributed optimizer, `overlap_param_gather`): the event
    /// recorded on the communication stream after the bucket's parameter
    /// all-gather, while no one has waited for it yet.
    param_gather: Vec<Option<Event>>,
}

impl std::fmt::Debug for DistributedDataParallel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DistributedDataParallel({:?}, {:?})",
            self.config, self.buffers
        )
    }
}

impl<'c> DistributedDataParallel<'c> {
    /// Allocates the buffers of `registry` on the communicator's device, laid
    /// out for `comm.size()` data-parallel ranks. Errors: an empty registry,
    /// `bucket_size == Some(0)`.
    pub fn new(comm: &'c Communicator, registry: ParamRegistry, config: DdpConfig) -> Result<Self> {
        let dp = comm.size();
        let bucket_size = config
            .bucket_size
            .unwrap_or_else(|| ddp_layout::default_bucket_size(dp));
        if bucket_size == 0 {
            return Err(Error::invalid(OP, "bucket_size", "at least 1 element", 0));
        }
        let layout = LayoutConfig {
            bucket_size,
            dp,
            distributed_optimizer: config.distributed_optimizer,
        };
        let dev: &Device = comm.device();
        let buffers = ParamAndGradBuffers::new(dev, registry, layout)?;
        let buckets = buffers.buckets();
        let mut scratch = Vec::with_capacity(buckets.len());
        for &b in &buckets {
            scratch.push(if config.distributed_optimizer {
                let r = buffers.bucket(b)?;
                // The layout pads every bucket to a multiple of dp; checked again.
                let (lo, hi) = ddp_layout::shard(r, dp, comm.rank())?;
                Some(AnyBuffer::zeros(
                    dev,
                    buffers.groups[b.group].grad_dtype,
                    hi - lo,
                )?)
            } else {
                None
            });
        }
        let readiness = Readiness::new(&buffers);
        let mut forward_order: Vec<usize> = (0..buckets.len()).collect();
        let first_param = |i: usize| -> Result<usize> {
            let ps = buffers.bucket_params(buckets[i])?;
            Ok(ps.iter().map(|p| p.0).min().unwrap_or(usize::MAX))
        };
        let mut keys = Vec::with_capacity(buckets.len());
        for i in 0..buckets.len() {
            keys.push(first_param(i)?);
        }
        forward_order.sort_by_key(|&i| keys[i]);
        Ok(DistributedDataParallel {
            forward_order,
            param_gather: (0..buckets.len()).map(|_| None).collect(),
            comm,
            config,
            events: (0..buckets.len()).map(|_| None).collect(),
            buckets,
            scratch,
            readiness,
            is_last_microbatch: true,
            synced: false,
            mt: MultiTensor::new(),
            found_inf: dev.alloc_zeros(1)?,
            nan_flags: dev.alloc_zeros(buffers.num_params())?,
            buffers,
        })
    }

    /// Plain data parallelism only: allocates parameter buffers (the
    /// distributed-optimizer layout has them already), so that a
    /// [`super::DistributedOptimizer`] can run on every rank over the whole
    /// all-reduced gradient — the replicated optimizer of plain DDP: full
    /// fp32 master weights and moments on every rank, no parameter
    /// all-gather. Idempotent. Write the initial parameters into
    /// `buffers().param(..)` before building the optimizer.
    pub fn allocate_param_buffers(&mut self) -> Result<()> {
        let dev = self.buffers.device().clone();
        for g in &mut self.buffers.groups {
            if g.param.is_none() {
                g.param = Some(AnyBuffer::zeros(&dev, g.param_dtype, g.layout.numel)?);
            }
        }
        Ok(())
    }

    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    pub fn config(&self) -> &DdpConfig {
        &self.config
    }

    /// The contiguous buffers (views of each parameter's gradient).
    pub fn buffers(&self) -> &ParamAndGradBuffers {
        &self.buffers
    }

    /// Bytes of device memory this object owns: the buffers
    /// ([`ParamAndGradBuffers::memory_bytes`]), the reduce-scatter scratch
    /// shards (distributed optimizer: gradient dtype, `1/dp` of each
    /// bucket) and the flags (`4 * (1 + num_params)`: pre-scale found_inf
    /// and one NaN flag per parameter).
    pub fn memory_bytes(&self) -> usize {
        let scratch: usize = self
            .scratch
            .iter()
            .flatten()
            .map(|b| b.len() * b.dtype().size())
            .sum();
        self.buffers.memory_bytes() + scratch + 4 * (self.found_inf.len() + self.nan_flags.len())
    }

    /// Every bucket, in reduction order.
    pub fn buckets(&self) -> &[BucketId] {
        &self.buckets
    }

    /// Every bucket in forward order (the order of the first registered
    /// parameter of each bucket: the reverse of the reduction order within a
    /// group). The distributed optimizer all-gathers parameters in this
    /// order.
    pub fn param_gather_order(&self) -> Vec<BucketId> {
        self.forward_order
            .iter()
            .map(|&i| self.buckets[i])
            .collect()
    }

    /// The number of buckets whose parameter all-gather was dispatched by
    /// an overlapped [`DistributedOptimizer::step`](super::DistributedOptimizer::step)
    /// and not waited for yet.
    pub fn param_gathers_pending(&self) -> usize {
        self.param_gather.iter().flatten().count()
    }

    /// Overlapped parameter all-gather (Megatron's `overlap_param_gather`):
    /// makes `compute` wait for the all-gather of the bucket holding
    /// `param` (and so, the communication stream being in order, for every
    /// bucket dispatched before it), before the forward reads the parameter.
    /// Every bucket was dispatched by the step, in forward order, so any
    /// order of waits is correct and none can wait for an all-gather that
    /// was never issued. A no-op when nothing is pending for that bucket.
    /// Errors: an unknown parameter (`param`); plain data parallelism
    /// (`ddp`: no parameter buffer, nothing to gather).
    pub fn wait_param_gather(&mut self, compute: &Stream, param: ParamId) -> Result<()> {
        const WAIT: &str = "DistributedDataParallel::wait_param_gather";
        self.buffers.check(WAIT, param)?;
        let b = self.buffers.bucket_of(param)?;
        self.wait_param_gather_bucket(compute, b)
    }

    /// [`Self::wait_param_gather`] for a whole bucket. Errors: a bucket of
    /// another model (`bucket`); plain data parallelism (`ddp`).
    pub fn wait_param_gather_bucket(&mut self, compute: &Stream, b: BucketId) -> Result<()> {
        const WAIT: &str = "DistributedDataParallel::wait_param_gather";
        self.check_param_gather(WAIT, compute)?;
        let i = self.bucket_index(b)?;
        if let Some(e) = self.param_gather[i].take() {
            compute.wait_event(&e)?;
            // Buckets dispatched earlier completed before this one.
            let pos = self.forward_order.iter().position(|&x| x == i).unwrap_or(0);
            for &j in &self.forward_order[..pos] {
                self.param_gather[j] = None;
            }
        }
        Ok(())
    }

    /// Makes `compute` wait for every pending parameter all-gather
    /// (Megatron's `finish_param_sync`). A no-op when none is pending.
    pub fn finish_param_gather(&mut self, compute: &Stream) -> Result<()> {
        const FIN: &str = "DistributedDataParallel::finish_param_gather";
        self.buffers
            .device()
            .check_same(FIN, "compute", compute.device())?;
        for ev in self.param_gather.iter_mut() {
            if let Some(e) = ev.take() {
                compute.wait_event(&e)?;
            }
        }
        Ok(())
    }

    /// Makes `compute` wait for every pending parameter all-gather without
    /// clearing them (for readers holding `&self`, such as checkpoints).
    pub(crate) fn wait_param_gathers_shared(&self, compute: &Stream) -> Result<()> {
        for e in self.param_gather.iter().flatten() {
            compute.wait_event(e)?;
        }
        Ok(())
    }

    /// Records the all-gather events of an overlapped step (bucket index,
    /// event); every earlier one must have been waited for.
    pub(crate) fn set_param_gather(&mut self, events: Vec<(usize, Event)>) {
        for (i, e) in events {
            self.param_gather[i] = Some(e);
        }
    }

    /// Bucket indices (into [`Self::buckets`]) in forward order.
    pub(crate) fn forward_order(&self) -> &[usize] {
        &self.forward_order
    }

    fn check_param_gather(&self, op: &'static str, compute: &Stream) -> Result<()> {
        self.buffers
            .device()
            .check_same(op, "compute", compute.device())?;
        if !self.config.distributed_optimizer {
            return Err(Error::invalid(
                op,
                "ddp",
                "a DistributedDataParallel with distributed_optimizer = true",
                "plain data parallelism (parameters are not gathered)",
            ));
        }
        Ok(())
    }

    /// Megatron's `no_sync`: `false` for every micro-batch but the last, whose
    /// gradients only accumulate locally. Errors if a backward is half done.
    pub fn set_is_last_microbatch(&mut self, is_last: bool) -> Result<()> {
        if self.readiness.any_ready() {
            return Err(Error::invalid(
                OP,
                "is_last_microbatch",
                "a change between backward passes",
                "a change while some gradients of this backward are marked ready",
            ));
        }
        self.is_last_microbatch = is_last;
        Ok(())
    }

    pub fn is_last_microbatch(&self) -> bool {
        self.is_last_microbatch
    }

    /// True after [`Self::finish_grad_sync`] until the next
    /// [`Self::mark_grad_ready`] or [`Self::zero_grad_buffer`].
    pub fn grads_synced(&self) -> bool {
        self.synced
    }

    /// The event recorded after bucket `b`'s reduction, once it was started
    /// in this step (`None` before, and after [`Self::finish_grad_sync`]).
    pub fn bucket_event(&self, b: BucketId) -> Result<Option<&Event>> {
        let i = self.bucket_index(b)?;
        Ok(self.events[i].as_ref())
    }

    fn bucket_index(&self, b: BucketId) -> Result<usize> {
        self.buckets
            .iter()
            .position(|&x| x == b)
            .ok_or_else(|| Error::invalid(OP, "bucket", "a bucket of this model", format!("{b:?}")))
    }

    /// Marks `param`'s gradient as complete on `compute` (everything that
    /// writes it has been enqueued there). In the last micro-batch, when this
    /// completes a bucket, the bucket's reduction is enqueued at once on the
    /// communicator's stream, after the work enqueued on `compute` so far.
    /// Errors: an unknown parameter; one marked twice in one backward; a NaN
    /// or Inf gradient (with `check_for_nan_in_grad`).
    pub fn mark_grad_ready(&mut self, compute: &Stream, param: ParamId) -> Result<()> {
        const MARK: &str = "DistributedDataParallel::mark_grad_ready";
        self.buffers.check(MARK, param)?;
        self.buffers
            .device()
            .check_same(MARK, "compute", compute.device())?;
        let complete = self.readiness.mark(&self.buffers, param)?;
        self.synced = false;
        if let Some(b) = complete {
            if self.is_last_microbatch {
                self.start_bucket(compute, b)?;
            }
        }
        if self.readiness.all_ready() && !self.is_last_microbatch {
            // A no_sync backward is over; the next one starts afresh.
            self.readiness.reset();
        }
        Ok(())
    }

    /// Enqueues bucket `b`'s reduction on the communicator's stream.
    fn start_bucket(&mut self, compute: &Stream, b: BucketId) -> Result<()> {
        if self.config.check_for_nan_in_grad {
            self.check_nan(compute, b)?;
        }
        let i = self.bucket_index(b)?;
        let cs = self.comm.stream();
        cs.wait_event(&compute.record_event()?)?;
        let dp = self.comm.size();
        let (start, end) = self.buffers.bucket_range(b)?;
        let grp = &self.buffers.groups[b.group];
        // SAFETY: the bucket lies in the group's buffer, which `self` owns
        // and keeps alive (drop is stream-ordered) past the enqueued work.
        let mut bucket = unsafe { view_any(&grp.grad, start, end - start) }?;
        let op = match self.config.averaging {
            GradAveraging::PreScale => {
                if dp > 1 {
                    let mut list = [grad_ref(&mut bucket)?];
                    self.mt
                        .unscale(cs, &mut list, dp as f32, &mut self.found_inf)?;
                }
                ReduceOp::Sum
            }
            GradAveraging::Average => ReduceOp::Avg,
            GradAveraging::Sum => ReduceOp::Sum,
        };
        match self.scratch[i].as_mut() {
            None => all_reduce(self.comm, cs, &mut bucket, op)?,
            Some(shard) => {
                reduce_scatter(self.comm, cs, &bucket, shard, op)?;
                let (lo, hi) = ddp_layout::shard(self.buffers.bucket(b)?, dp, self.comm.rank())?;
                // SAFETY: the shard lies in the bucket (see above).
                let mut mine = unsafe { view_any(&grp.grad, lo, hi - lo) }?;
                copy_any(cs, shard, &mut mine)?;
            }
        }
        self.events[i] = Some(cs.record_event()?);
        Ok(())
    }

    fn check_nan(&mut self, compute: &Stream, b: BucketId) -> Result<()> {
        let params = self.buffers.bucket_params(b)?;
        for &p in &params {
            let (g, m) = self.buffers.place(p.0);
            let s = self.buffers.groups[g].layout.params[m];
            let grp = &self.buffers.groups[g];
            // SAFETY: the parameter's slot lies in the group's buffer; the
            // flag is element p of `nan_flags`; both outlive the work.
            let mut view = unsafe { view_any(&grp.grad, s.start, s.numel) }?;
            // SAFETY: as above.
            let mut flag = unsafe {
                crate::backend::DeviceBuffer::<f32>::from_raw_parts(
                    compute.device(),
                    self.nan_flags.addr() + 4 * p.0 as u64,
                    1,
                )
            }?;
            compute.fill_bytes(&mut flag, 0)?;
            // Multiplying by 1 is exact: the gradient keeps its bits and the
            // flag is set iff a value is NaN or infinite.
            self.mt
                .unscale(compute, &mut [grad_ref(&mut view)?], 1.0, &mut flag)?;
        }
        let mut flags = vec![0f32; self.nan_flags.len()];
        compute.copy_to_host(&self.nan_flags, &mut flags)?;
        if let Some(&p) = params.iter().find(|p| flags[p.0] != 0.0) {
            return Err(Error::invalid(
                "DistributedDataParallel::mark_grad_ready",
                "grad",
                "finite gradient values",
                format!(
                    "NaN or Inf in the gradient of '{}' on data-parallel rank {}",
                    self.buffers.name(p.0),
                    self.comm.rank()
                ),
            ));
        }
        Ok(())
    }

    /// Makes `compute` wait for every bucket's reduction (after the last
    /// micro-batch). Errors, naming them, if some parameters were never
    /// marked ready, or in a `no_sync` micro-batch. Afterwards the next step
    /// starts: readiness is cleared.
    pub fn finish_grad_sync(&mut self, compute: &Stream) -> Result<()> {
        const FIN: &str = "DistributedDataParallel::finish_grad_sync";
        self.buffers
            .device()
            .check_same(FIN, "compute", compute.device())?;
        if !self.is_last_microbatch {
            return Err(Error::invalid(
                FIN,
                "is_last_microbatch",
                "the last micro-batch (set_is_last_microbatch(true))",
                "a no_sync micro-batch",
            ));
        }
        let missing = self.readiness.not_ready(&self.buffers);
        if !missing.is_empty() {
            return Err(Error::invalid(
                FIN,
                "params",
                "every gradient marked ready in the last micro-batch",
                format!("{} not ready: {}", missing.len(), missing.join(", ")),
            ));
        }
        for ev in self.events.iter_mut() {
            if let Some(e) = ev.take() {
                compute.wait_event(&e)?;
            }
        }
        self.readiness.reset();
        self.synced = true;
        Ok(())
    }

    /// Megatron's `finalize_model_grads` for one model chunk:
    /// [`Self::finish_grad_sync`] (the data-parallel reduction), then every
    /// gradient registered [`ParamKind::TpDuplicated`] is all-reduced (sum)
    /// over `tp_comm` (the tensor-parallel group of this rank), on
    /// `tp_comm`'s stream after `compute`'s work; `compute` waits for it.
    /// Gradients registered [`ParamKind::Local`] are not touched: see
    /// [`ParamKind`] for which ferrotron layers return gradients already
    /// summed over TP (the row-parallel bias under sequence parallelism).
    /// With the distributed optimizer the whole gradient of each duplicated
    /// parameter is reduced; only this rank's shard of it is used. Every
    /// rank of `tp_comm` must call it (same registry, so the same
    /// collectives in the same order). Errors: `tp_comm` on another device;
    /// as `finish_grad_sync`.
    pub fn finalize_model_grads(&mut self, compute: &Stream, tp_comm: &Communicator) -> Result<()> {
        const FIN: &str = "DistributedDataParallel::finalize_model_grads";
        self.buffers.device().check_same_as(
            FIN,
            "tp_comm",
            tp_comm.device(),
            "the data-parallel buffers",
        )?;
        self.finish_grad_sync(compute)?;
        if tp_comm.size() == 1 {
            return Ok(());
        }
        let dup: Vec<usize> = (0..self.buffers.num_params())
            .filter(|&p| {
                self.buffers
                    .info(ParamId(p))
                    .is_ok_and(|i| i.kind == ParamKind::TpDuplicated)
            })
            .collect();
        if dup.is_empty() {
            return Ok(());
        }
        let ts = tp_comm.stream();
        ts.wait_event(&compute.record_event()?)?;
        for p in dup {
            let (g, m) = self.buffers.place(p);
            let grp = &self.buffers.groups[g];
            let s = grp.layout.params[m];
            // SAFETY: the parameter's slot lies in its group's gradient
            // buffer, which `self` owns; `compute` waits for the collective
            // below before this call returns.
            let mut view = unsafe { view_any(&grp.grad, s.start, s.numel) }?;
            all_reduce(tp_comm, ts, &mut view, ReduceOp::Sum)?;
        }
        compute.wait_event(&ts.record_event()?)
    }

    /// Zeroes every gradient buffer on `stream` (after any reduction in
    /// flight) and starts a new step.
    pub fn zero_grad_buffer(&mut self, stream: &Stream) -> Result<()> {
        for ev in self.events.iter_mut() {
            if let Some(e) = ev.take() {
                stream.wait_event(&e)?;
            }
        }
        for g in &mut self.buffers.groups {
            fill_zero(stream, &mut g.grad)?;
        }
        self.readiness.reset();
        self.synced = false;
        Ok(())
    }
}

pub(crate) fn grad_ref(b: &mut AnyBuffer) -> Result<GradRef<'_>> {
    match b {
        AnyBuffer::F32(x) => Ok(GradRef::F32(x)),
        AnyBuffer::F16(x) => Ok(GradRef::F16(x)),
        AnyBuffer::BF16(x) => Ok(GradRef::BF16(x)),
        other => Err(Error::invalid(
            OP,
            "grad",
            "f32, f16 or bf16",
            other.dtype(),
        )),
    }
}

/// Runs `$body` with `$b` the typed buffer of a float AnyBuffer.
macro_rules! float_any {
    ($any:expr, $b:ident => $body:expr) => {
        match $any {
            AnyBuffer::F32($b) => $body,
            AnyBuffer::F16($b) => $body,
            AnyBuffer::BF16($b) => $body,
            other => Err(Error::invalid(
                OP,
                "buffer",
                "f32, f16 or bf16",
                other.dtype(),
            )),
        }
    };
}

fn all_reduce(comm: &Communicator, s: &Stream, b: &mut AnyBuffer, op: ReduceOp) -> Result<()> {
    float_any!(b, x => comm.all_reduce_in_place(s, x, op).map(drop))
}

fn reduce_scatter(
    comm: &Communicator,
    s: &Stream,
    send: &AnyBuffer,
    recv: &mut AnyBuffer,
    op: ReduceOp,
) -> Result<()> {
    match (send, recv) {
        (AnyBuffer::F32(a), AnyBuffer::F32(b)) => comm.reduce_scatter(s, a, b, op).map(drop),
        (AnyBuffer::F16(a), AnyBuffer::F16(b)) => comm.reduce_scatter(s, a, b, op).map(drop),
        (AnyBuffer::BF16(a), AnyBuffer::BF16(b)) => comm.reduce_scatter(s, a, b, op).map(drop),
        (a, _) => Err(Error::invalid(OP, "grad", "f32, f16 or bf16", a.dtype())),
    }
}

/// `dst = src` (same dtype and length) on `s`.
pub(crate) fn copy_any(s: &Stream, src: &AnyBuffer, dst: &mut AnyBuffer) -> Result<()> {
    match (src, dst) {
        (AnyBuffer::F32(a), AnyBuffer::F32(b)) => s.copy_device(a, b),
        (AnyBuffer::F16(a), AnyBuffer::F16(b)) => s.copy_device(a, b),
        (AnyBuffer::BF16(a), AnyBuffer::BF16(b)) => s.copy_device(a, b),
        (a, b) => Err(Error::invalid(
            OP,
            "copy",
            format!("{} to {}", a.dtype(), a.dtype()),
            b.dtype(),
        )),
    }
}

fn fill_zero(s: &Stream, b: &mut AnyBuffer) -> Result<()> {
    float_any!(b, x => s.fill_bytes(x, 0))
}
