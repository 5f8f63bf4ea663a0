//! One rank's training loop state: its communicators (tensor, pipeline,
//! data and model parallel groups of the rank grid), its model share, the
//! data-parallel gradient buffers and distributed optimizer, the loss
//! scaler (fp16), and the pipeline executor. [`GptTrainer::step`] runs one
//! global batch:
//!
//! 1. parameters from the optimizer's buffer into the layers (a device copy);
//! 2. the pipeline schedule over this rank's micro-batches (forward,
//!    backward, gradients accumulated in fp32 into the contiguous buffers;
//!    each chunk's gradients marked ready after its last micro-batch);
//! 3. the tied embedding's two copies summed between the first and last
//!    pipeline ranks, then marked ready; the data-parallel reduction
//!    finished;
//! 4. the distributed optimizer: unscale + found-inf and the global norm
//!    over data- *and* model-parallel ranks (replicas counted once), clip,
//!    AdamW on this rank's shard, parameter all-gather;
//! 5. the loss scaler updated from the agreed found-inf flag (fp16).

use std::collections::HashMap;
use std::marker::PhantomData;
use std::path::Path;
use std::time::Duration;

use crate::backend::{DeviceBuffer, Stream};
use crate::comm::Communicator;
use crate::core::loss_scaler::GradScalerConfig;
use crate::core::rank_grid::{Axis, Coords, RankGrid, RankOrder};
use crate::core::{Error, Result};
use crate::ops::adam::{AdamConfig, AdamScalars};
use crate::ops::multi_tensor::DeviceGradScaler;
use crate::parallel::ddp::{
    DdpConfig, DistOptConfig, DistributedDataParallel, DistributedOptimizer, ParamId, ParamRegistry,
};
use crate::parallel::linear::TpElement;
use crate::parallel::pipeline::{PipelineExecutor, TiedEmbeddingGroup};
use crate::parallel::vocab::VocabParallelCrossEntropy;

#[cfg(feature = "checkpoint")]
use super::checkpoint_dir::{rank_file, saved_layout, state_file};
use super::config::{GptConfig, ParallelConfig};
use super::corpus::CharCorpus;
use super::loss::LossData;
use super::stage::{GptStage, StageRun};

const OP: &str = "GptTrainer";

/// Optimisation settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainConfig {
    pub steps: u64,
    /// Peak learning rate.
    pub lr: f32,
    /// Final learning rate of the cosine decay.
    pub min_lr: f32,
    /// Linear warm-up steps.
    pub warmup: u64,
    pub weight_decay: f32,
    /// Global gradient-norm clip (`None`: off).
    pub max_grad_norm: Option<f64>,
    /// Seeds the choice of training samples.
    pub data_seed: u64,
    /// fp16 only: the loss scaler's initial scale.
    pub initial_loss_scale: f32,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 300,
            lr: 3e-3,
            min_lr: 3e-4,
            warmup: 20,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            data_seed: 42,
            initial_loss_scale: 65536.0,
        }
    }
}

impl TrainConfig {
    /// Linear warm-up to `lr`, then cosine decay to `min_lr` at `steps`.
    pub fn lr_at(&self, step: u64) -> f32 {
        if step < self.warmup {
            return self.lr * (step + 1) as f32 / self.warmup as f32;
        }
        let span = self.steps.saturating_sub(self.warmup).max(1) as f32;
        let x = ((step - self.warmup) as f32 / span).min(1.0);
        self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + (std::f32::consts::PI * x).cos())
    }
}

/// One rank's communicators, split from the world along Megatron's rank
/// grid (`tp-cp-ep-dp-pp` order).
pub struct RankComms {
    pub world: Communicator,
    pub tp: Communicator,
    pub pp: Communicator,
    pub dp: Communicator,
    /// Tensor × pipeline: every rank of one model replica.
    pub mp: Communicator,
    pub coords: Coords,
}

impl RankComms {
    /// Every rank of `world` must call it (collective splits).
    pub fn split(world: Communicator, par: &ParallelConfig) -> Result<Self> {
        let grid = RankGrid::new(world.size(), par.tp, 1, par.pp, RankOrder::default())?;
        let coords = grid.coords(world.rank())?;
        let tp = world.split_for_grid(&grid, &[Axis::Tp])?;
        let pp = world.split_for_grid(&grid, &[Axis::Pp])?;
        let dp = world.split_for_grid(&grid, &[Axis::Dp])?;
        let mp = world.split_for_grid(&grid, &[Axis::Tp, Axis::Pp])?;
        Ok(RankComms {
            world,
            tp,
            pp,
            dp,
            mp,
            coords,
        })
    }

    /// Whether this rank reports the loss: the last pipeline stage's first
    /// tensor-parallel rank (one per data-parallel replica).
    pub fn reports_loss(&self, par: &ParallelConfig) -> bool {
        self.coords.pp + 1 == par.pp && self.coords.tp == 0
    }
}

/// One parameter's shard on one rank: its name, shard shape and values.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamShard {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// What one step did on one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    pub step: u64,
    /// Mean loss over this replica's tokens (loss-reporting ranks only).
    pub loss: Option<f64>,
    /// Global gradient norm before clipping (the same on every rank).
    pub grad_norm: f64,
    pub lr: f32,
    /// The loss scale the step used (1 in bf16).
    pub loss_scale: f32,
    /// The step found Inf/NaN gradients and was skipped (fp16).
    pub skipped: bool,
    /// The held-out loss after this step, where the job evaluated
    /// ([`GptTrainer::evaluate`]; on the loss-reporting ranks).
    pub val_loss: Option<f64>,
    /// Seconds this rank spent evaluating after the step (0 when it did not).
    pub eval_seconds: f64,
}

/// One rank of a GPT training run.
pub struct GptTrainer<'c, T: TpElement> {
    comms: &'c RankComms,
    pub(crate) cfg: GptConfig,
    pub(crate) par: ParallelConfig,
    train: TrainConfig,
    pub(crate) stage: GptStage<T>,
    /// Ids in [`GptStage::params_mut`] order.
    order: Vec<ParamId>,
    ddp: DistributedDataParallel<'c>,
    opt: DistributedOptimizer,
    scalars: AdamScalars,
    scaler: Option<(DeviceGradScaler, DeviceBuffer<f32>)>,
    exec: PipelineExecutor<'c>,
    /// The same schedule's forwards only, for [`GptTrainer::evaluate`].
    eval_exec: PipelineExecutor<'c>,
    tied: TiedEmbeddingGroup,
    /// This rank's tied word-embedding copy (pp > 1, first or last rank).
    tied_id: Option<ParamId>,
    compute: Stream,
    step: u64,
    _t: PhantomData<T>,
}

/// How long a rank waits for a peer before failing.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(300);

impl<'c, T: TpElement> GptTrainer<'c, T> {
    /// Builds this rank's share. Every rank must call it (collective
    /// splits); `scaled` turns on dynamic loss scaling (fp16). Errors: the
    /// configurations (named, before any work), and what the parts report.
    pub fn new(
        comms: &'c RankComms,
        cfg: &GptConfig,
        par: &ParallelConfig,
        train: &TrainConfig,
        scaled: bool,
    ) -> Result<Self> {
        par.validate(cfg, comms.world.size())?;
        let dev = comms.world.device().clone();
        let compute = dev.new_stream()?;
        let mut stage = GptStage::<T>::new(&comms.tp, cfg, par, comms.coords.pp)?;
        let mut reg = ParamRegistry::new();
        let mut names = HashMap::new();
        let mut order = Vec::new();
        let mut not_in_norm = Vec::new();
        let mut tied_id = None;
        for p in stage.params_mut() {
            let id = reg.register(&p.name, &p.shape, T::DTYPE)?;
            if (p.replicated && comms.coords.tp != 0) || p.tied_copy {
                not_in_norm.push(id);
            }
            if par.pp > 1 && (p.tied_copy || p.name == "embedding.word") {
                tied_id = Some(id);
            }
            names.insert(p.name.clone(), id);
            order.push(id);
        }
        stage.assign_ids(&names)?;
        let mut ddp = DistributedDataParallel::new(
            &comms.dp,
            reg,
            DdpConfig {
                distributed_optimizer: par.distributed_optimizer,
                ..DdpConfig::default()
            },
        )?;
        // Plain DDP: the optimizer, replicated, needs the parameter buffers.
        ddp.allocate_param_buffers()?;
        for (p, &id) in stage.params_mut().into_iter().zip(&order) {
            compute.copy_device(p.buf, &mut ddp.buffers().param::<T>(id)?)?;
        }
        compute.synchronize()?;
        let mut opt = DistributedOptimizer::new(
            &ddp,
            DistOptConfig {
                adam: AdamConfig {
                    betas: (0.9, 0.95),
                    ..AdamConfig::default()
                },
                weight_decay: train.weight_decay,
                max_grad_norm: train.max_grad_norm,
            },
        )?;
        opt.exclude_from_norm(&ddp, &not_in_norm)?;
        let scalars = AdamScalars::new(&compute, train.lr_at(0))?;
        let scaler = if scaled {
            let c = GradScalerConfig {
                initial_scale: train.initial_loss_scale,
                ..GradScalerConfig::default()
            };
            Some((DeviceGradScaler::new(&dev, c)?, dev.alloc_zeros::<f32>(1)?))
        } else {
            None
        };
        let t = cfg.seq * par.micro_batch;
        let max_len = (t * cfg.hidden).max(t * stage.shard_vocab());
        let executor = || -> Result<PipelineExecutor<'c>> {
            Ok(PipelineExecutor::new(&comms.pp, par.pipeline(), max_len)?
                .with_variable_shapes(max_len)?
                .with_timeout(PEER_TIMEOUT))
        };
        let exec = executor()?;
        let eval_exec = executor()?.with_forward_only()?;
        let tied = TiedEmbeddingGroup::new(&comms.pp)?;
        Ok(GptTrainer {
            comms,
            cfg: *cfg,
            par: *par,
            train: *train,
            stage,
            order,
            ddp,
            opt,
            scalars,
            scaler,
            exec,
            eval_exec,
            tied,
            tied_id,
            compute,
            step: 0,
            _t: PhantomData,
        })
    }

    /// The next step's index.
    pub fn next_step(&self) -> u64 {
        self.step
    }

    /// Bytes each of this rank's layers kept per micro-batch at its last
    /// forward, by global layer index.
    pub fn activation_bytes(&self) -> HashMap<usize, usize> {
        self.stage.layer_bytes.clone()
    }

    /// Device bytes of the gradient/parameter buffers and optimizer state.
    pub fn state_bytes(&self) -> usize {
        self.ddp.memory_bytes() + self.opt.memory_bytes()
    }

    /// One global batch (see the module docs). Every rank must call it.
    pub fn step(&mut self, corpus: &CharCorpus) -> Result<StepStats> {
        let (cfg, par) = (self.cfg, self.par);
        let dev = self.comms.world.device().clone();
        let (m, b, seq) = (par.micro_batches(), par.micro_batch, cfg.seq);
        let t = seq * b;
        let compute = self.compute.clone();
        let c = &compute;
        let lr = self.train.lr_at(self.step);
        self.scalars.set_lr(c, lr)?;
        self.ddp.zero_grad_buffer(c)?;
        self.ddp.set_is_last_microbatch(true)?;
        self.copy_params_to_stage()?;
        let (ids, labels) = self.upload_batch(corpus, self.step)?;
        let loss_scale = match &self.scaler {
            Some((s, _)) => s.to_host()?.scale(),
            None => 1.0,
        };
        let dloss = dev.upload(&vec![loss_scale / (t * m) as f32; t])?;
        let losses = self.run_pipeline(&ids, &labels, dloss, false)?;
        if let Some(id) = self.tied_id {
            let mut g = self.ddp.buffers().grad::<f32>(id)?;
            self.tied.allreduce(c, &mut g, PEER_TIMEOUT)?;
            drop(g);
            self.ddp.mark_grad_ready(c, id)?;
        }
        self.ddp.finish_grad_sync(c)?;
        let scaler = self.scaler.as_mut().map(|(s, f)| (&*s, f));
        self.opt.step_model_parallel(
            &mut self.ddp,
            c,
            &mut self.scalars,
            scaler,
            Some(&self.comms.mp),
        )?;
        let mut skipped = false;
        if let Some((s, found)) = self.scaler.as_mut() {
            skipped = found.to_host()?[0] > 0.0;
            s.update(c, found, true)?;
        }
        let grad_norm = self.opt.grad_norm().to_host()?[0] as f64;
        let loss = if self.comms.reports_loss(&par) {
            Some(loss_sum(&losses)? / (t * m) as f64)
        } else {
            None
        };
        c.synchronize()?;
        let stats = StepStats {
            step: self.step,
            loss,
            grad_norm,
            lr,
            loss_scale,
            skipped,
            val_loss: None,
            eval_seconds: 0.0,
        };
        self.step += 1;
        Ok(stats)
    }

    /// The mean loss (nats per token) of the current model over `batches`
    /// global batches of `corpus` (a held-out split): forwards only, over
    /// the same pipeline schedule's forwards, no dropout, no gradients, the
    /// optimizer state and the training samples untouched. Batch `i` is
    /// the same sequences at every call (they depend on the data seed and
    /// `i` only), so successive evaluations are comparable. Every rank must
    /// call it, between steps. `Some` on the ranks that report the loss
    /// (the mean over this data-parallel rank's share; the job averages
    /// the data-parallel ranks), `None` elsewhere. Errors: `batches == 0`,
    /// a corpus shorter than `seq + 1`, what the parts report.
    pub fn evaluate(&mut self, corpus: &CharCorpus, batches: usize) -> Result<Option<f64>> {
        if batches == 0 {
            return Err(Error::invalid(
                "GptTrainer::evaluate",
                "batches",
                "at least 1",
                0,
            ));
        }
        // This data-parallel rank's tokens per batch.
        let tokens = self.cfg.seq * self.par.micro_batch * self.par.micro_batches();
        // The parameters the next step would use (after any overlapped
        // all-gather of the last update).
        self.ddp.finish_param_gather(&self.compute)?;
        self.copy_params_to_stage()?;
        let mut sum = 0.0f64;
        for batch in 0..batches as u64 {
            let (ids, labels) = self.upload_batch(corpus, batch)?;
            let unused = self.comms.world.device().alloc_zeros::<f32>(1)?;
            let losses = self.run_pipeline(&ids, &labels, unused, true)?;
            sum += loss_sum(&losses)?;
        }
        self.compute.synchronize()?;
        Ok(self
            .comms
            .reports_loss(&self.par)
            .then(|| sum / (tokens * batches) as f64))
    }

    /// One pass of the pipeline over this rank's micro-batches `ids` /
    /// `labels`: the training schedule, the loss gradient scaled by
    /// `dloss` (`[tokens]`), or with `eval` its forwards only (no dropout,
    /// no gradients; `dloss` unused). The last stage's per-token losses
    /// per micro-batch (empty elsewhere).
    fn run_pipeline(
        &mut self,
        ids: &[TokenIds],
        labels: &[TokenIds],
        dloss: DeviceBuffer<f32>,
        eval: bool,
    ) -> Result<Vec<DeviceBuffer<f32>>> {
        let t = self.cfg.seq * self.par.micro_batch;
        let mut data = LossData::<T> {
            tp: &self.comms.tp,
            labels,
            ce: VocabParallelCrossEntropy::new(t, self.stage.shard_vocab()),
            dloss,
            losses: Vec::new(),
            _t: PhantomData,
        };
        let mut run = StageRun {
            stage: &mut self.stage,
            ddp: &mut self.ddp,
            tp: &self.comms.tp,
            ids,
            step: self.step,
            dp_rank: self.comms.coords.dp,
            eval,
        };
        let exec = if eval {
            &mut self.eval_exec
        } else {
            &mut self.exec
        };
        exec.run(&self.compute, &mut run, &mut data)?;
        Ok(data.losses)
    }

    /// The optimizer's parameter buffer copied into the layers' own
    /// parameters (on the compute stream), as every forward starts.
    fn copy_params_to_stage(&mut self) -> Result<()> {
        for (p, &id) in self.stage.params_mut().into_iter().zip(&self.order) {
            self.compute
                .copy_device(&*self.ddp.buffers().param::<T>(id)?, p.buf)?;
        }
        Ok(())
    }

    /// This data-parallel rank's share of global batch `index` of `corpus`
    /// (training step `index`, or evaluation batch `index`): per
    /// micro-batch, `[seq, batch]` input ids and targets, on the device.
    fn upload_batch(
        &self,
        corpus: &CharCorpus,
        index: u64,
    ) -> Result<(Vec<TokenIds>, Vec<TokenIds>)> {
        let dev = self.comms.world.device();
        let (m, b) = (self.par.micro_batches(), self.par.micro_batch);
        let dp_rank = self.comms.coords.dp;
        let mut ids = Vec::with_capacity(m);
        let mut labels = Vec::with_capacity(m);
        for mb in 0..m {
            let first = ((dp_rank * m + mb) * b) as u64;
            let (x, y) = corpus.batch(self.train.data_seed, index, first, b, self.cfg.seq)?;
            ids.push(dev.upload(&x)?);
            labels.push(dev.upload(&y)?);
        }
        Ok((ids, labels))
    }

    /// This rank's parameters (its shards), by name, as f32 with their
    /// shard shapes — what the world's `assemble_full` joins into the
    /// unsharded model.
    pub fn export_params(&mut self) -> Result<Vec<ParamShard>> {
        let order = self.order.clone();
        let mut out = Vec::new();
        let c = self.compute.clone();
        c.synchronize()?;
        for (p, id) in self.stage.params_mut().into_iter().zip(order) {
            let v = self.ddp.buffers().param::<T>(id)?.to_host()?;
            out.push(ParamShard {
                name: p.name,
                shape: p.shape,
                values: v.into_iter().map(|x| x.to_f64() as f32).collect(),
            });
        }
        Ok(out)
    }

    /// Single-rank only: replaces every parameter (layers and optimizer
    /// buffer) with the unsharded values in `params` (by name; the word
    /// embedding may omit its padding rows). Errors: a missing parameter or
    /// a wrong size.
    pub(crate) fn load_full_params(&mut self, params: &HashMap<String, Vec<f32>>) -> Result<()> {
        if self.comms.world.size() != 1 {
            return Err(Error::invalid(
                OP,
                "world",
                "a single rank",
                self.comms.world.size(),
            ));
        }
        let dev = self.comms.world.device().clone();
        let order = self.order.clone();
        for (p, id) in self.stage.params_mut().into_iter().zip(order) {
            let v = params.get(&p.name).ok_or_else(|| {
                Error::invalid(OP, "params", format!("a value for {}", p.name), "none")
            })?;
            let n: usize = p.shape.iter().product();
            if v.len() > n || (v.len() < n && p.name != "embedding.word") {
                return Err(Error::invalid(
                    OP,
                    "params",
                    format!("{n} values for {}", p.name),
                    v.len(),
                ));
            }
            let mut host: Vec<T> = v.iter().map(|&x| T::from_f64(x as f64)).collect();
            host.resize(n, T::from_f64(0.0));
            let buf = dev.upload(&host)?;
            self.compute.copy_device(&buf, p.buf)?;
            self.compute
                .copy_device(&buf, &mut self.ddp.buffers().param::<T>(id)?)?;
        }
        self.compute.synchronize()
    }

    /// Single-rank, one sequence (`micro_batch = 1`): the logits
    /// `[seq, vocab]` (padding dropped) of the forward over `ids`
    /// (`seq` of them), without dropout.
    pub(crate) fn forward_logits(&mut self, ids: &[i32]) -> Result<Vec<f32>> {
        use crate::parallel::pipeline::PipelineStage;
        let (seq, vocab) = (self.cfg.seq, self.cfg.vocab);
        if self.comms.world.size() != 1 || self.par.micro_batch != 1 || ids.len() != seq {
            return Err(Error::invalid(
                OP,
                "ids",
                format!("{seq} ids on a single rank with micro_batch 1"),
                ids.len(),
            ));
        }
        let dev = self.comms.world.device().clone();
        let ids_buf = [dev.upload(ids)?];
        let vs = self.stage.shard_vocab();
        let mut logits = dev.alloc_zeros::<T>(seq * vs)?;
        let dummy = dev.alloc_zeros::<T>(1)?;
        {
            let mut run = StageRun {
                stage: &mut self.stage,
                ddp: &mut self.ddp,
                tp: &self.comms.tp,
                ids: &ids_buf,
                step: 0,
                dp_rank: 0,
                eval: true,
            };
            run.forward(&self.compute, 0, 0, &dummy, &mut logits)?;
        }
        self.stage.clear_saved();
        let host = logits.to_host()?;
        Ok((0..seq)
            .flat_map(|i| {
                host[i * vs..i * vs + vocab]
                    .iter()
                    .map(|x| x.to_f64() as f32)
            })
            .collect())
    }

    /// Saves the optimizer checkpoint of this model-parallel rank into
    /// `dir` (one safetensors file per (tp, pp) rank; data-parallel rank 0
    /// writes) plus the step and loss-scaler state. Every rank must call it.
    #[cfg(feature = "checkpoint")]
    pub fn save(&self, dir: &Path) -> Result<()> {
        let co = self.comms.coords;
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        crate::parallel::ddp::save_checkpoint(
            &self.ddp,
            &self.opt,
            &self.scalars,
            &self.compute,
            &rank_file(dir, co.tp, co.pp),
        )?;
        if co.dp == 0 {
            let scaler = match &self.scaler {
                Some((s, _)) => {
                    let h = s.to_host()?;
                    format!(
                        "{} {} {}",
                        h.scale(),
                        h.growth_tracker(),
                        h.hysteresis_tracker()
                    )
                }
                None => "none".into(),
            };
            let side = state_file(dir, co.tp, co.pp);
            std::fs::write(&side, format!("step {}\nscaler {scaler}\n", self.step))
                .map_err(|e| io(&side, e))?;
        }
        Ok(())
    }

    /// Loads what [`Self::save`] wrote (any data-parallel size; another
    /// tensor- or pipeline-parallel size too, resharded on the way in: see
    /// `models::gpt::reshard`). Every rank must call it, before its first
    /// step.
    #[cfg(feature = "checkpoint")]
    pub fn load(&mut self, dir: &Path) -> Result<()> {
        use super::reshard::{rank_tensors, WantedParam};
        let co = self.comms.coords;
        let same_layout = saved_layout(dir)? == (self.par.tp, self.par.pp);
        if same_layout {
            crate::parallel::ddp::load_checkpoint(
                &mut self.ddp,
                &mut self.opt,
                &mut self.scalars,
                &self.compute,
                &rank_file(dir, co.tp, co.pp),
            )?;
        } else {
            // Saved on another (tp, pp): this rank's tensors are built from
            // the saved ones in memory (docs: models::gpt::reshard), then
            // loaded with the same checks as a file.
            let b = self.ddp.buffers();
            let infos = (0..b.num_params())
                .map(|p| b.info(ParamId(p)))
                .collect::<Result<Vec<_>>>()?;
            let wanted: Vec<WantedParam<'_>> = infos
                .iter()
                .map(|i| WantedParam {
                    name: &i.name,
                    shape: &i.shape,
                })
                .collect();
            let tensors = rank_tensors(&self.cfg, dir, (self.par.tp, co.tp), &wanted)?;
            crate::parallel::ddp::checkpoint::load_checkpoint_from(
                &mut self.ddp,
                &mut self.opt,
                &mut self.scalars,
                &self.compute,
                &tensors,
            )?;
        }
        // The step and the (global) loss-scaler state are every rank's.
        let side = if same_layout {
            state_file(dir, co.tp, co.pp)
        } else {
            state_file(dir, 0, 0)
        };
        let text = std::fs::read_to_string(&side).map_err(|e| io(&side, e))?;
        let bad = || {
            Error::invalid(
                OP,
                "checkpoint",
                "a `step N` / `scaler ...` state file",
                side.display().to_string(),
            )
        };
        let mut lines = text.lines();
        let step: u64 = lines
            .next()
            .and_then(|l| l.strip_prefix("step "))
            .and_then(|v| v.parse().ok())
            .ok_or_else(bad)?;
        let scaler_line = lines
            .next()
            .and_then(|l| l.strip_prefix("scaler "))
            .ok_or_else(bad)?;
        if let Some((s, _)) = self.scaler.as_mut() {
            let v: Vec<&str> = scaler_line.split(' ').collect();
            let parse = |i: usize| v.get(i).and_then(|x| x.parse::<f64>().ok()).ok_or_else(bad);
            let host = crate::core::loss_scaler::DynamicGradScaler::from_state(
                *s.config(),
                parse(0)? as f32,
                parse(1)? as i32,
                parse(2)? as i32,
            )?;
            *s = DeviceGradScaler::from_host(self.comms.world.device(), &host)?;
        }
        self.step = step;
        self.compute.synchronize()
    }
}

/// One micro-batch's `[seq, batch]` token ids on the device.
type TokenIds = DeviceBuffer<i32>;

/// The sum of the per-token losses of every micro-batch (waits for them).
fn loss_sum(losses: &[DeviceBuffer<f32>]) -> Result<f64> {
    let mut sum = 0.0f64;
    for l in losses {
        sum += l.to_host()?.iter().map(|&v| v as f64).sum::<f64>();
    }
    Ok(sum)
}

#[cfg(feature = "checkpoint")]
fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Backend {
        backend: "filesystem",
        message: format!("{}: {e}", path.display()),
    }
}
