//! Running a GPT training job on in-process ranks (one thread per rank,
//! the in-process communicator, emulator devices by default), reporting
//! every step to the caller, and turning the trained shards back into one
//! unsharded model for sampling.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Instant;

use crate::backend::Device;
use crate::comm::Communicator;
use crate::core::dtype::{bf16, f16};
use crate::core::{Error, Result};
use crate::parallel::linear::TpElement;

use super::config::{GptConfig, ParallelConfig, Precision};
use super::corpus::CharCorpus;
use super::trainer::{GptTrainer, ParamShard, RankComms, StepStats, TrainConfig, PEER_TIMEOUT};

/// One step as the whole job saw it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    pub step: u64,
    /// Mean loss over the global batch (nats per token).
    pub loss: f64,
    pub grad_norm: f64,
    pub lr: f32,
    pub loss_scale: f32,
    pub skipped: bool,
    /// Mean held-out loss after this step (nats per token), on the steps
    /// the job evaluated ([`JobOptions::eval`]).
    pub val_loss: Option<f64>,
    /// Seconds of `elapsed` spent evaluating after this step (the slowest
    /// reporting rank's; 0 when the job did not evaluate).
    pub eval_seconds: f64,
    /// Seconds since the job's first step started.
    pub elapsed: f64,
}

/// What a finished job hands back.
#[derive(Debug, Default)]
pub struct TrainSummary {
    pub steps: Vec<StepReport>,
    /// The unsharded parameters at the end, by name (f32).
    pub params: HashMap<String, Vec<f32>>,
    /// Activation bytes kept per micro-batch by each layer (global index).
    pub activation_bytes: HashMap<usize, usize>,
    /// Optimizer + gradient-buffer bytes of each rank.
    pub state_bytes: Vec<usize>,
    /// The device the ranks ran on ("CPU emulator (1 worker thread)", "NVIDIA H200").
    pub device_name: String,
}

/// Options of [`train_in_process`] beyond the model and the split.
#[derive(Clone, Debug, Default)]
pub struct JobOptions {
    /// Load this checkpoint directory before the first step.
    pub resume: Option<std::path::PathBuf>,
    /// Save a checkpoint here after the last step.
    pub save: Option<std::path::PathBuf>,
    /// Gather the unsharded parameters at the end (for sampling).
    pub gather_params: bool,
    /// Evaluate on a held-out corpus during training.
    pub eval: Option<EvalOptions>,
}

/// Evaluation during training: after every `every`-th step and after the
/// last, the mean loss over `batches` global batches of `corpus` (the same
/// sequences each time), forwards only ([`GptTrainer::evaluate`]).
#[derive(Clone, Debug)]
pub struct EvalOptions {
    /// The held-out text (e.g. [`CharCorpus::split_off`]'s second part).
    pub corpus: CharCorpus,
    pub every: u64,
    pub batches: usize,
}

impl EvalOptions {
    /// Whether the job evaluates after `step` (0-based) of `steps`.
    pub fn after(&self, step: u64, steps: u64) -> bool {
        step + 1 == steps || (self.every > 0 && (step + 1) % self.every == 0)
    }
}

/// Trains `cfg` split by `par` on `par.world()` in-process ranks, each on
/// its own emulator device, for `train.steps` steps (after resuming, the
/// rest of them); `on_step` sees every step as soon as all loss-reporting
/// ranks finished it. Errors: a bad configuration (named, before any rank
/// starts), or the first rank error.
pub fn train_in_process(
    cfg: &GptConfig,
    par: &ParallelConfig,
    train: &TrainConfig,
    corpus: &CharCorpus,
    opts: &JobOptions,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<TrainSummary> {
    par.validate(cfg, par.world())?;
    let world = par.world();
    // The ranks share the cores: one launch's blocks need not be spread over
    // more of them (docs/emulator.md, "Worker threads").
    let workers = Device::emu_workers_per_rank(world);
    let devices = (0..world)
        .map(|_| Device::emu_with_workers(workers))
        .collect::<Result<Vec<Device>>>()?;
    let comms = Communicator::in_process_with_timeout(&devices, PEER_TIMEOUT)?;
    let reporters = par.dp;
    let (tx, rx) = mpsc::channel::<(usize, Result<StepStats>)>();
    let start = Instant::now();
    let mut summary = TrainSummary {
        device_name: devices[0].name(),
        ..TrainSummary::default()
    };
    let results: Vec<Result<RankEnd>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let tx = tx.clone();
                s.spawn(move || run_rank(c, cfg, par, train, corpus, opts, tx))
            })
            .collect();
        drop(tx);
        collect_steps(rx, reporters, start, &mut summary.steps, on_step);
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Backend {
                        backend: "train_in_process",
                        message: "a rank thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut shards = Vec::new();
    for r in results {
        let end = r?;
        summary.state_bytes.push(end.state_bytes);
        summary.activation_bytes.extend(end.activation_bytes);
        if let Some(p) = end.params {
            shards.push(p);
        }
    }
    if opts.gather_params {
        summary.params = assemble_full(cfg, par, &shards)?;
    }
    Ok(summary)
}

/// What a rank hands back at the end.
pub(crate) struct RankEnd {
    pub(crate) state_bytes: usize,
    pub(crate) activation_bytes: HashMap<usize, usize>,
    /// `(tp rank, pp rank, shards)` of data-parallel rank 0.
    pub(crate) params: Option<RankShards>,
}

/// One model-parallel rank's parameter shards.
pub(crate) struct RankShards {
    tp: usize,
    shards: Vec<ParamShard>,
}

fn run_rank(
    world: Communicator,
    cfg: &GptConfig,
    par: &ParallelConfig,
    train: &TrainConfig,
    corpus: &CharCorpus,
    opts: &JobOptions,
    tx: mpsc::Sender<(usize, Result<StepStats>)>,
) -> Result<RankEnd> {
    let rank = world.rank();
    let mut send = |comms: &RankComms, st: StepStats| {
        if comms.reports_loss(par) {
            // The receiver may have stopped listening after an error.
            let _ = tx.send((rank, Ok(st)));
        }
        Ok(())
    };
    let r = drive_rank(world, cfg, par, train, corpus, opts, &mut send);
    if let Err(e) = &r {
        let _ = tx.send((rank, Err(e.clone())));
    }
    r
}

/// What every rank does, whatever launched it: split the communicators,
/// build the trainer (resuming if asked), run the steps — handing each
/// step's stats to `report`, which may run collectives over the rank's
/// communicators — save, and export the shards for sampling.
pub(crate) fn drive_rank(
    world: Communicator,
    cfg: &GptConfig,
    par: &ParallelConfig,
    train: &TrainConfig,
    corpus: &CharCorpus,
    opts: &JobOptions,
    report: &mut dyn FnMut(&RankComms, StepStats) -> Result<()>,
) -> Result<RankEnd> {
    match par.precision {
        Precision::Bf16 => drive_typed::<bf16>(world, cfg, par, train, corpus, opts, report, false),
        Precision::Fp16 => drive_typed::<f16>(world, cfg, par, train, corpus, opts, report, true),
    }
}

#[allow(clippy::too_many_arguments)]
fn drive_typed<T: TpElement>(
    world: Communicator,
    cfg: &GptConfig,
    par: &ParallelConfig,
    train: &TrainConfig,
    corpus: &CharCorpus,
    opts: &JobOptions,
    report: &mut dyn FnMut(&RankComms, StepStats) -> Result<()>,
    scaled: bool,
) -> Result<RankEnd> {
    let comms = RankComms::split(world, par)?;
    let mut tr = GptTrainer::<T>::new(&comms, cfg, par, train, scaled)?;
    if let Some(dir) = &opts.resume {
        #[cfg(feature = "checkpoint")]
        tr.load(dir)?;
        #[cfg(not(feature = "checkpoint"))]
        return Err(no_checkpoints(dir));
    }
    while tr.next_step() < train.steps {
        let mut st = tr.step(corpus)?;
        if let Some(e) = opts.eval.as_ref().filter(|e| e.after(st.step, train.steps)) {
            let t0 = Instant::now();
            st.val_loss = tr.evaluate(&e.corpus, e.batches)?;
            st.eval_seconds = t0.elapsed().as_secs_f64();
        }
        report(&comms, st)?;
    }
    if let Some(dir) = &opts.save {
        #[cfg(feature = "checkpoint")]
        tr.save(dir)?;
        #[cfg(not(feature = "checkpoint"))]
        return Err(no_checkpoints(dir));
    }
    let params = if opts.gather_params && comms.coords.dp == 0 {
        Some(RankShards {
            tp: comms.coords.tp,
            shards: tr.export_params()?,
        })
    } else {
        None
    };
    Ok(RankEnd {
        state_bytes: tr.state_bytes(),
        activation_bytes: tr.activation_bytes(),
        params,
    })
}

/// Averages the loss-reporting ranks' stats per step (in step order) and
/// hands each complete step to `on_step`. Stops at the first error.
fn collect_steps(
    rx: mpsc::Receiver<(usize, Result<StepStats>)>,
    reporters: usize,
    start: Instant,
    out: &mut Vec<StepReport>,
    on_step: &mut dyn FnMut(&StepReport),
) {
    let mut pending: HashMap<u64, Vec<StepStats>> = HashMap::new();
    while let Ok((_, r)) = rx.recv() {
        let Ok(st) = r else { return };
        let v = pending.entry(st.step).or_default();
        v.push(st);
        if v.len() == reporters {
            let v = pending.remove(&st.step).unwrap_or_default();
            let loss = v.iter().filter_map(|s| s.loss).sum::<f64>() / reporters as f64;
            let val: Vec<f64> = v.iter().filter_map(|s| s.val_loss).collect();
            let val_loss = (!val.is_empty()).then(|| val.iter().sum::<f64>() / val.len() as f64);
            let rep = StepReport {
                step: st.step,
                loss,
                grad_norm: st.grad_norm,
                lr: st.lr,
                loss_scale: st.loss_scale,
                skipped: v.iter().any(|s| s.skipped),
                val_loss,
                eval_seconds: v.iter().map(|s| s.eval_seconds).fold(0.0, f64::max),
                elapsed: start.elapsed().as_secs_f64(),
            };
            on_step(&rep);
            out.push(rep);
        }
    }
}

/// How a parameter is split over the tensor-parallel ranks.
pub(crate) enum Split {
    Replicated,
    /// Along the first dimension (column-parallel, vocabulary).
    Rows,
    /// Along the last dimension (row-parallel weights).
    Cols,
}

pub(crate) fn split_of(name: &str) -> Split {
    let tail = name.rsplit_once("layers.").map_or(name, |(_, t)| t);
    if name == "embedding.word" || name == "output.word" {
        return Split::Rows;
    }
    if tail.ends_with("attention.qkv.weight")
        || tail.ends_with("attention.qkv.bias")
        || tail.ends_with("mlp.fc1.weight")
        || tail.ends_with("mlp.fc1.bias")
    {
        Split::Rows
    } else if tail.ends_with("attention.proj.weight") || tail.ends_with("mlp.fc2.weight") {
        Split::Cols
    } else {
        Split::Replicated
    }
}

/// Joins the tensor-parallel shards of every parameter (data-parallel rank
/// 0 of each model-parallel rank) into the unsharded model, with the word
/// embedding cut to `vocab` rows (padding dropped).
pub(crate) fn assemble_full(
    cfg: &GptConfig,
    par: &ParallelConfig,
    ranks: &[RankShards],
) -> Result<HashMap<String, Vec<f32>>> {
    let mut by_name: HashMap<String, Vec<(usize, &ParamShard)>> = HashMap::new();
    for r in ranks {
        for sh in &r.shards {
            by_name.entry(sh.name.clone()).or_default().push((r.tp, sh));
        }
    }
    let mut out = HashMap::new();
    for (name, mut parts) in by_name {
        parts.sort_by_key(|p| p.0);
        if parts.len() != par.tp {
            return Err(Error::invalid(
                "assemble_full",
                "ranks",
                format!("{} shards of {name}", par.tp),
                parts.len(),
            ));
        }
        let full: Vec<f32> = match split_of(&name) {
            Split::Replicated => parts[0].1.values.clone(),
            Split::Rows => parts
                .iter()
                .flat_map(|p| p.1.values.iter().copied())
                .collect(),
            Split::Cols => {
                let (rows, cols) = (parts[0].1.shape[0], parts[0].1.shape[1]);
                let mut v = Vec::with_capacity(rows * cols * par.tp);
                for i in 0..rows {
                    for p in &parts {
                        v.extend_from_slice(&p.1.values[i * cols..(i + 1) * cols]);
                    }
                }
                v
            }
        };
        let full = if name == "embedding.word" || name == "output.word" {
            full[..cfg.vocab * cfg.hidden].to_vec()
        } else {
            full
        };
        out.insert(name, full);
    }
    Ok(out)
}

#[cfg(not(feature = "checkpoint"))]
fn no_checkpoints(dir: &std::path::Path) -> Error {
    Error::invalid(
        "train_in_process",
        "opts",
        "no checkpoint directory (ferrotron was built without feature `checkpoint`)",
        dir.display().to_string(),
    )
}
