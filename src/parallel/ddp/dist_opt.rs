//! The distributed optimizer (ZeRO-1, Megatron-Core's
//! `DistributedOptimizer`): data-parallel rank `r` owns the `r`-th of `dp`
//! contiguous shards of every bucket (shards ignore parameter boundaries).
//! fp32 master weights and the Adam moments exist only for the owned
//! elements. A step, after [`DistributedDataParallel::finish_grad_sync`] has
//! reduce-scattered the gradients into the shards: (optional unscale with the
//! device grad scaler, found_inf max-reduced over ranks) → global gradient
//! L2 norm (each rank's shard norm, all-gathered, normed again) → optional
//! clip → [`FusedAdam`] on the shard, writing the updated parameters into the
//! parameter buffer's shard in the param dtype → all-gather of every bucket's
//! parameters.

use crate::backend::{AnyBuffer, DeviceBuffer, Stream};
use crate::comm::ReduceOp;
use crate::core::ddp_layout;
use crate::core::dtype::{bf16, f16};
use crate::core::{Error, Result};
use crate::ops::adam::{
    default_weight_decay, AdamConfig, AdamScalars, AdamTensors, FusedAdam, Unscale,
};
use crate::ops::multi_tensor::{DeviceGradScaler, GradRef, MultiTensor, TensorRef};

use super::buffers::view_any;
use super::reducer::{copy_any, grad_ref, DistributedDataParallel};

const OP: &str = "DistributedOptimizer";

/// The optimizer's fixed settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DistOptConfig {
    pub adam: AdamConfig,
    /// Weight decay of every tensor of two or more dimensions (tensors of
    /// at most one dimension get 0: [`default_weight_decay`]).
    pub weight_decay: f32,
    /// Clip the global gradient L2 norm to this (`None`: no clipping).
    pub max_grad_norm: Option<f64>,
}

impl Default for DistOptConfig {
    fn default() -> Self {
        DistOptConfig {
            adam: AdamConfig::default(),
            weight_decay: crate::ops::adam::DEFAULT_WEIGHT_DECAY,
            max_grad_norm: Some(1.0),
        }
    }
}

/// The part of one parameter this rank owns: elements `[lo, hi)` of its
/// group's buffer, at `state` in the group's optimizer-state buffers.
#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    pub(super) group: usize,
    /// The global id of the parameter the segment belongs to.
    pub(super) param: usize,
    pub(super) lo: usize,
    pub(super) hi: usize,
    pub(super) state: usize,
    weight_decay: f32,
}

/// fp32 master weights and moments of one group's owned shards.
pub(super) struct GroupState {
    pub(super) master: DeviceBuffer<f32>,
    pub(super) m: DeviceBuffer<f32>,
    pub(super) v: DeviceBuffer<f32>,
}

/// The ZeRO-1 optimizer of one data-parallel rank.
pub struct DistributedOptimizer {
    config: DistOptConfig,
    adam: FusedAdam,
    mt: MultiTensor,
    pub(super) states: Vec<GroupState>,
    pub(super) segments: Vec<Segment>,
    /// Per bucket (the reducer's order): the all-gather's input shard.
    gather: Vec<AnyBuffer>,
    local_norm: DeviceBuffer<f32>,
    norms: DeviceBuffer<f32>,
    norm: DeviceBuffer<f32>,
    /// Per model-parallel rank: the data-parallel norms, gathered.
    mp_norms: Option<DeviceBuffer<f32>>,
    /// Global parameter ids whose gradient the norm leaves out (replicas
    /// counted on another model-parallel rank).
    not_in_norm: Vec<usize>,
    /// Megatron's `overlap_param_gather`: `step` dispatches the parameter
    /// all-gathers without making `compute` wait for them.
    overlap_param_gather: bool,
}

impl std::fmt::Debug for DistributedOptimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DistributedOptimizer({:?}, {} segments)",
            self.config,
            self.segments.len()
        )
    }
}

fn host_f32(b: &AnyBuffer) -> Result<Vec<f32>> {
    Ok(match b {
        AnyBuffer::F32(x) => x.to_host()?,
        AnyBuffer::F16(x) => x.to_host()?.into_iter().map(f16::to_f32).collect(),
        AnyBuffer::BF16(x) => x.to_host()?.into_iter().map(bf16::to_f32).collect(),
        other => {
            return Err(Error::invalid(
                OP,
                "param",
                "f32, f16 or bf16",
                other.dtype(),
            ))
        }
    })
}

fn tensor_ref(b: &AnyBuffer) -> Result<TensorRef<'_>> {
    Ok(match b {
        AnyBuffer::F32(x) => TensorRef::F32(x),
        AnyBuffer::F16(x) => TensorRef::F16(x),
        AnyBuffer::BF16(x) => TensorRef::BF16(x),
        other => {
            return Err(Error::invalid(
                OP,
                "grad",
                "f32, f16 or bf16",
                other.dtype(),
            ))
        }
    })
}

/// The elements `[lo, hi)` of `bucket` this rank's optimizer updates: its
/// `1/dp` shard (distributed optimizer), or all of it (plain DDP, where
/// every rank holds the whole all-reduced gradient).
fn owned(
    bucket: &ddp_layout::BucketRange,
    dp: usize,
    rank: usize,
    sharded: bool,
) -> Result<(usize, usize)> {
    if sharded {
        ddp_layout::shard(bucket, dp, rank)
    } else {
        Ok((bucket.start, bucket.end))
    }
}

impl DistributedOptimizer {
    /// The optimizer state for the shards `ddp`'s rank owns, its master
    /// weights copied from the parameter buffer (write the initial
    /// parameters into `ddp.buffers().param(..)` views first; this waits for
    /// the device). `ddp` must use the distributed optimizer.
    pub fn new(ddp: &DistributedDataParallel<'_>, config: DistOptConfig) -> Result<Self> {
        if let Some(m) = config.max_grad_norm {
            if !(m.is_finite() && m > 0.0) {
                return Err(Error::invalid(
                    OP,
                    "max_grad_norm",
                    "a finite value > 0",
                    format!("{m:?}"),
                ));
            }
        }
        // At construction, as the C ABI checks it (not first at the step).
        if !(config.weight_decay.is_finite() && config.weight_decay >= 0.0) {
            return Err(Error::invalid(
                OP,
                "weight_decay",
                "a finite value >= 0",
                format!("{:?}", config.weight_decay),
            ));
        }
        let adam = FusedAdam::new(config.adam)?;
        let sharded = ddp.config().distributed_optimizer;
        let comm = ddp.comm();
        let (dp, rank) = (comm.size(), comm.rank());
        let b = &ddp.buffers;
        let dev = b.device();
        let mut segments = Vec::new();
        let mut states = Vec::new();
        let mut gather = Vec::new();
        for (gi, g) in b.groups.iter().enumerate() {
            let mut state = 0usize;
            let mut master_host = Vec::new();
            let pbuf = g.param.as_ref().ok_or_else(|| {
                Error::invalid(
                    OP,
                    "ddp",
                    "parameter buffers (a distributed-optimizer layout, or \
                     DistributedDataParallel::allocate_param_buffers first)",
                    "none",
                )
            })?;
            for bucket in &g.layout.buckets {
                let (lo, hi) = owned(bucket, dp, rank, sharded)?;
                for &m in &bucket.params {
                    let slot = g.layout.params[m];
                    if let Some((a, z)) = ddp_layout::overlap(&slot, (lo, hi)) {
                        let shape = &b.info(super::ParamId(g.members[m]))?.shape;
                        segments.push(Segment {
                            group: gi,
                            param: g.members[m],
                            lo: a,
                            hi: z,
                            state,
                            weight_decay: default_weight_decay(&[shape], config.weight_decay)[0],
                        });
                        // SAFETY: [a, z) lies in the group's parameter buffer,
                        // read here while `ddp` is borrowed.
                        let view = unsafe { view_any(pbuf, a, z - a) }?;
                        master_host.extend(host_f32(&view)?);
                        state += z - a;
                    }
                }
                gather.push(AnyBuffer::zeros(
                    dev,
                    g.param_dtype,
                    if sharded { hi - lo } else { 0 },
                )?);
            }
            let master = if master_host.is_empty() {
                dev.alloc_zeros(0)?
            } else {
                dev.upload(&master_host)?
            };
            states.push(GroupState {
                master,
                m: dev.alloc_zeros(state)?,
                v: dev.alloc_zeros(state)?,
            });
        }
        Ok(DistributedOptimizer {
            config,
            adam,
            mt: MultiTensor::new(),
            states,
            segments,
            gather,
            local_norm: dev.alloc_zeros(1)?,
            norms: dev.alloc_zeros(dp)?,
            norm: dev.alloc_zeros(1)?,
            mp_norms: None,
            not_in_norm: Vec::new(),
            overlap_param_gather: false,
        })
    }

    /// Leaves `params` out of the global gradient norm (they are still
    /// clipped and updated): Megatron's rule that a parameter replicated
    /// over the model-parallel ranks counts once — e.g. LayerNorm weights on
    /// every tensor-parallel rank but the first, or the last pipeline
    /// stage's copy of a tied embedding. Errors: an id of another registry.
    pub fn exclude_from_norm(
        &mut self,
        ddp: &DistributedDataParallel<'_>,
        params: &[super::ParamId],
    ) -> Result<()> {
        for &p in params {
            ddp.buffers.check(OP, p)?;
            if !self.not_in_norm.contains(&p.index()) {
                self.not_in_norm.push(p.index());
            }
        }
        Ok(())
    }

    /// Megatron's `overlap_param_gather` (off by default). On: [`Self::step`]
    /// enqueues every bucket's parameter all-gather on the communicator's
    /// stream in forward order ([`DistributedDataParallel::param_gather_order`])
    /// and returns without making `compute` wait; the forward then calls
    /// [`DistributedDataParallel::wait_param_gather`] before it reads a
    /// parameter, which makes `compute` wait for that bucket only. Off:
    /// `compute` waits for every all-gather inside `step`.
    pub fn set_overlap_param_gather(&mut self, on: bool) {
        self.overlap_param_gather = on;
    }

    pub fn overlap_param_gather(&self) -> bool {
        self.overlap_param_gather
    }

    /// Bytes of device memory this optimizer owns: the fp32 master weights
    /// and Adam moments of this rank's segments (12 bytes per owned
    /// element), one all-gather input shard per bucket (parameter dtype,
    /// `1/dp` of the bucket) and the norm scalars (`4 * (dp + 2)`). Kernel
    /// workspace inside `MultiTensor` / `FusedAdam` is not counted.
    pub fn memory_bytes(&self) -> usize {
        let states: usize = self
            .states
            .iter()
            .map(|s| 4 * (s.master.len() + s.m.len() + s.v.len()))
            .sum();
        let gather: usize = self.gather.iter().map(|b| b.len() * b.dtype().size()).sum();
        states + gather + 4 * (self.local_norm.len() + self.norms.len() + self.norm.len())
    }

    /// Errors unless this optimizer was built from `ddp` (same device,
    /// data-parallel size and group layout).
    pub(super) fn check_built_from(
        &self,
        op: &'static str,
        ddp: &DistributedDataParallel<'_>,
    ) -> Result<()> {
        let b = &ddp.buffers;
        let ok = self.norms.len() == ddp.comm().size()
            && self.norms.device().same(b.device())
            && self.states.len() == b.groups.len()
            && self
                .segments
                .iter()
                .all(|s| s.param < b.num_params() && b.place(s.param).0 == s.group);
        if ok {
            Ok(())
        } else {
            Err(Error::invalid(
                op,
                "ddp",
                "the DistributedDataParallel this optimizer was built from",
                "another one",
            ))
        }
    }

    /// The elements of parameters this rank owns (the sum of its segments;
    /// summed over ranks, every parameter element exactly once).
    pub fn owned_elements(&self) -> usize {
        self.segments.iter().map(|s| s.hi - s.lo).sum()
    }

    /// The global gradient L2 norm of the last step (before clipping), `[1]`
    /// f32 on the device.
    pub fn grad_norm(&self) -> &DeviceBuffer<f32> {
        &self.norm
    }

    /// One optimizer step on `compute`, after `ddp.finish_grad_sync`.
    /// With `scaler`, the gradient shards are unscaled by it and
    /// `found_inf` (`[1]` f32, required then; zeroed here) becomes the max
    /// over ranks, skipping the update on every rank; update the scaler with
    /// it afterwards. Every rank must call it. It first makes `compute`
    /// wait for any parameter all-gather still pending from an overlapped
    /// step; it ends by all-gathering every bucket in forward order, which
    /// `compute` waits for unless [`Self::set_overlap_param_gather`] is on.
    pub fn step(
        &mut self,
        ddp: &mut DistributedDataParallel<'_>,
        compute: &Stream,
        scalars: &mut AdamScalars,
        scaler: Option<(&DeviceGradScaler, &mut DeviceBuffer<f32>)>,
    ) -> Result<()> {
        self.step_model_parallel(ddp, compute, scalars, scaler, None)
    }

    /// [`Self::step`] for one model-parallel shard of a model (tensor and
    /// pipeline parallelism): `model_parallel` is the group of every rank
    /// holding another part of the same data-parallel replica (tp · pp
    /// ranks). `found_inf` is also max-reduced over it, and the gradient
    /// norm is `sqrt(sum over its ranks of norm_r^2)`, so every rank of the
    /// model clips and skips alike; parameters [`Self::exclude_from_norm`]
    /// names are left out of this rank's share. Every rank of both groups
    /// must call it.
    pub fn step_model_parallel(
        &mut self,
        ddp: &mut DistributedDataParallel<'_>,
        compute: &Stream,
        scalars: &mut AdamScalars,
        scaler: Option<(&DeviceGradScaler, &mut DeviceBuffer<f32>)>,
        model_parallel: Option<&crate::comm::Communicator>,
    ) -> Result<()> {
        const STEP: &str = "DistributedOptimizer::step";
        let mp = model_parallel.filter(|c| c.size() > 1);
        if let Some(c) = mp {
            ddp.buffers
                .device()
                .check_same(STEP, "model_parallel", c.device())?;
        }
        let comm = ddp.comm();
        let dev = ddp.buffers.device().clone();
        dev.check_same(STEP, "compute", compute.device())?;
        self.check_built_from(STEP, ddp)?;
        if !ddp.grads_synced() {
            return Err(Error::invalid(
                STEP,
                "ddp",
                "gradients reduced by finish_grad_sync since the last mark_grad_ready / zero_grad_buffer",
                "gradients not synchronised",
            ));
        }
        // The update below writes the parameter shards that a previous
        // overlapped all-gather may still read: wait for any left pending.
        ddp.finish_param_gather(compute)?;
        let cs = comm.stream();
        let groups = &ddp.buffers.groups;
        // Views of this rank's owned gradient, parameter and state segments.
        let mut grads = Vec::with_capacity(self.segments.len());
        let mut models = Vec::with_capacity(self.segments.len());
        for s in &self.segments {
            let g = &groups[s.group];
            let pbuf = g
                .param
                .as_ref()
                .ok_or_else(|| Error::invalid(STEP, "ddp", "parameter buffers", "none"))?;
            // SAFETY: segments lie in their group's buffers (built from the
            // same layout); the views are used for work enqueued while `ddp`
            // is borrowed and the buffers' drop is stream-ordered.
            grads.push(unsafe { view_any(&g.grad, s.lo, s.hi - s.lo) }?);
            // SAFETY: as above.
            models.push(unsafe { view_any(pbuf, s.lo, s.hi - s.lo) }?);
        }
        let state_views =
            |pick: fn(&GroupState) -> &DeviceBuffer<f32>| -> Result<Vec<DeviceBuffer<f32>>> {
                self.segments
                    .iter()
                    .map(|s| {
                        let b = pick(&self.states[s.group]);
                        // SAFETY: [state, state + len) lies in the group's state
                        // buffer (sized as the sum of its segments); `self` owns it.
                        unsafe {
                            DeviceBuffer::from_raw_parts(
                                &dev,
                                b.addr() + 4 * s.state as u64,
                                s.hi - s.lo,
                            )
                        }
                    })
                    .collect()
            };
        let mut masters = state_views(|g| &g.master)?;
        let mut ms = state_views(|g| &g.m)?;
        let mut vs = state_views(|g| &g.v)?;

        // Unscale and agree on found_inf.
        let mut found: Option<&DeviceBuffer<f32>> = None;
        if let Some((scaler, flag)) = scaler {
            compute.fill_bytes(flag, 0)?;
            let mut list: Vec<GradRef<'_>> =
                grads.iter_mut().map(grad_ref).collect::<Result<_>>()?;
            self.mt
                .unscale_with_scaler(compute, &mut list, scaler, flag)?;
            cs.wait_event(&compute.record_event()?)?;
            comm.all_reduce_in_place(cs, flag, ReduceOp::Max)?
                .wait_on(compute)?;
            if let Some(c) = mp {
                c.stream().wait_event(&compute.record_event()?)?;
                c.all_reduce_in_place(c.stream(), flag, ReduceOp::Max)?
                    .wait_on(compute)?;
            }
            found = Some(flag);
        }

        // Global norm: sqrt(sum over ranks of shard_norm^2).
        {
            let list: Vec<TensorRef<'_>> = grads
                .iter()
                .zip(&self.segments)
                .filter(|(_, s)| !self.not_in_norm.contains(&s.param))
                .map(|(g, _)| tensor_ref(g))
                .collect::<Result<_>>()?;
            self.mt.l2_norm(compute, &list, &mut self.local_norm)?;
        }
        if ddp.config().distributed_optimizer {
            cs.wait_event(&compute.record_event()?)?;
            comm.all_gather(cs, &self.local_norm, &mut self.norms)?
                .wait_on(compute)?;
            self.mt
                .l2_norm(compute, &[TensorRef::F32(&self.norms)], &mut self.norm)?;
        } else {
            // Plain DDP: every rank holds the whole all-reduced gradient.
            self.mt
                .l2_norm(compute, &[TensorRef::F32(&self.local_norm)], &mut self.norm)?;
        }
        if let Some(c) = mp {
            let gathered = match &mut self.mp_norms {
                Some(b) if b.len() == c.size() => b,
                slot => slot.insert(dev.alloc_zeros(c.size())?),
            };
            c.stream().wait_event(&compute.record_event()?)?;
            c.all_gather(c.stream(), &self.norm, gathered)?
                .wait_on(compute)?;
            self.mt
                .l2_norm(compute, &[TensorRef::F32(gathered)], &mut self.norm)?;
        }
        if let Some(max) = self.config.max_grad_norm {
            let mut list: Vec<GradRef<'_>> =
                grads.iter_mut().map(grad_ref).collect::<Result<_>>()?;
            self.mt.clip_by_norm(compute, &mut list, &self.norm, max)?;
        }

        // Adam on the shard, writing the params in their dtype.
        {
            let wd: Vec<f32> = self.segments.iter().map(|s| s.weight_decay).collect();
            let gl: Vec<TensorRef<'_>> = grads.iter().map(tensor_ref).collect::<Result<_>>()?;
            let mut ml: Vec<GradRef<'_>> =
                models.iter_mut().map(grad_ref).collect::<Result<_>>()?;
            let mut pl: Vec<&mut DeviceBuffer<f32>> = masters.iter_mut().collect();
            let mut al: Vec<&mut DeviceBuffer<f32>> = ms.iter_mut().collect();
            let mut vl: Vec<&mut DeviceBuffer<f32>> = vs.iter_mut().collect();
            let mut t = AdamTensors {
                params: &mut pl,
                exp_avg: &mut al,
                exp_avg_sq: &mut vl,
                grads: &gl,
                model: Some(&mut ml),
                weight_decay: &wd,
            };
            self.adam.step(
                compute,
                &mut t,
                scalars,
                found.map(|b| b as _),
                Unscale::None,
            )?;
        }

        // Plain DDP: every rank updated every parameter; nothing to gather.
        if !ddp.config().distributed_optimizer {
            return Ok(());
        }
        // All-gather every bucket's parameters, in forward order.
        cs.wait_event(&compute.record_event()?)?;
        let (dp, rank) = (comm.size(), comm.rank());
        let order = ddp.forward_order().to_vec();
        let mut events = Vec::with_capacity(order.len());
        for i in order {
            let bid = ddp.buckets()[i];
            let g = &groups[bid.group];
            let pbuf = g
                .param
                .as_ref()
                .ok_or_else(|| Error::invalid(STEP, "ddp", "parameter buffers", "none"))?;
            let bucket = ddp.buffers.bucket(bid)?;
            let (lo, hi) = ddp_layout::shard(bucket, dp, rank)?;
            // SAFETY: the shard and the bucket lie in the parameter buffer.
            let mine = unsafe { view_any(pbuf, lo, hi - lo) }?;
            copy_any(cs, &mine, &mut self.gather[i])?;
            // SAFETY: as above.
            let mut whole = unsafe { view_any(pbuf, bucket.start, bucket.numel()) }?;
            match (&self.gather[i], &mut whole) {
                (AnyBuffer::F32(a), AnyBuffer::F32(b)) => comm.all_gather(cs, a, b).map(drop),
                (AnyBuffer::F16(a), AnyBuffer::F16(b)) => comm.all_gather(cs, a, b).map(drop),
                (AnyBuffer::BF16(a), AnyBuffer::BF16(b)) => comm.all_gather(cs, a, b).map(drop),
                (a, _) => Err(Error::invalid(STEP, "param", "f32, f16 or bf16", a.dtype())),
            }?;
            if self.overlap_param_gather {
                events.push((i, cs.record_event()?));
            }
        }
        if self.overlap_param_gather {
            ddp.set_param_gather(events);
            Ok(())
        } else {
            compute.wait_event(&cs.record_event()?)
        }
    }
}
