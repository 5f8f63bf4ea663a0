//! A GPT training job of one process per GPU, launched the torchrun way
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`): each
//! process drives one rank on GPU `LOCAL_RANK` over an NCCL communicator
//! whose unique id rank 0 shares through [`rendezvous`]; the per-step
//! loss is summed over the ranks with one small all-reduce and reported
//! by global rank 0.
//!
//! [`rendezvous`]: crate::comm::rendezvous

use std::time::Instant;

use crate::comm::rendezvous::JobEnv;
use crate::comm::{Communicator, ReduceOp};
use crate::core::{Error, Result};

use super::config::{GptConfig, ParallelConfig};
use super::corpus::CharCorpus;
use super::trainer::{RankComms, StepStats, TrainConfig, PEER_TIMEOUT};
use super::world::{drive_rank, JobOptions, StepReport, TrainSummary};

const OP: &str = "train_this_process";

/// Trains this process's rank of a job of `env.world_size` processes (one
/// per GPU; `env.world_size` must equal `par.world()`). Every process must
/// call it with the same configuration. `on_step` runs on global rank 0
/// only; the summary's `steps` are filled there, its `params` are never
/// gathered (sampling is for in-process jobs). Errors: a bad configuration
/// or environment (named, before any communication), no usable GPU or
/// NCCL (a build without feature `cuda` says so), or the first failure.
pub fn train_this_process(
    env: &JobEnv,
    cfg: &GptConfig,
    par: &ParallelConfig,
    train: &TrainConfig,
    corpus: &CharCorpus,
    opts: &JobOptions,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<TrainSummary> {
    par.validate(cfg, par.world())?;
    if env.world_size != par.world() {
        return Err(Error::invalid(
            OP,
            "WORLD_SIZE",
            format!(
                "tp·pp·dp = {}·{}·{} = {}",
                par.tp,
                par.pp,
                par.dp,
                par.world()
            ),
            env.world_size,
        ));
    }
    let world = nccl_world(env)?;
    let opts = JobOptions {
        gather_params: false,
        ..opts.clone()
    };
    let start = Instant::now();
    let mut summary = TrainSummary {
        device_name: world.device().name(),
        ..TrainSummary::default()
    };
    let is_root = env.rank == 0;
    let mut report = |comms: &RankComms, st: StepStats| -> Result<()> {
        let rep = reduce_step(comms, par, &st, start)?;
        if is_root {
            on_step(&rep);
            summary.steps.push(rep);
        }
        Ok(())
    };
    let end = drive_rank(world, cfg, par, train, corpus, &opts, &mut report)?;
    summary.state_bytes.push(end.state_bytes);
    summary.activation_bytes.extend(end.activation_bytes);
    Ok(summary)
}

/// One step as the whole job saw it: the loss-reporting ranks' losses (one
/// per data-parallel replica) and skip flags summed over every rank.
fn reduce_step(
    comms: &RankComms,
    par: &ParallelConfig,
    st: &StepStats,
    start: Instant,
) -> Result<StepReport> {
    let reports = comms.reports_loss(par);
    let loss = if reports { st.loss.unwrap_or(0.0) } else { 0.0 };
    let val = if reports {
        st.val_loss.unwrap_or(0.0)
    } else {
        0.0
    };
    let skipped = if st.skipped { 1.0 } else { 0.0 };
    let world = &comms.world;
    let stream = world.stream();
    // Every rank evaluates on the same steps (EvalOptions::after); the
    // reporting ranks flag it.
    let evaluated = if st.val_loss.is_some() { 1.0 } else { 0.0 };
    let mut buf = world
        .device()
        .upload(&[loss as f32, skipped, val as f32, evaluated])?;
    let h = world.all_reduce_in_place(stream, &mut buf, ReduceOp::Sum)?;
    world.wait(&h, PEER_TIMEOUT)?;
    let sums: Vec<f32> = buf.to_host()?;
    Ok(StepReport {
        step: st.step,
        loss: f64::from(sums[0]) / par.dp as f64,
        grad_norm: st.grad_norm,
        lr: st.lr,
        loss_scale: st.loss_scale,
        skipped: sums[1] > 0.0,
        val_loss: (sums[3] > 0.0).then(|| f64::from(sums[2]) / par.dp as f64),
        // This process's own (the ranks evaluate together).
        eval_seconds: st.eval_seconds,
        elapsed: start.elapsed().as_secs_f64(),
    })
}

/// This process's GPU and its rank of the world's NCCL communicator.
#[cfg(feature = "cuda")]
fn nccl_world(env: &JobEnv) -> Result<Communicator> {
    let device = crate::backend::Device::cuda(env.local_rank)?;
    let id = if env.rank == 0 {
        Some(Communicator::nccl_unique_id()?)
    } else {
        None
    };
    let id = crate::comm::rendezvous::share_id(env, id, PEER_TIMEOUT)?;
    Communicator::nccl(&device, env.rank, env.world_size, &id)
}

#[cfg(not(feature = "cuda"))]
fn nccl_world(env: &JobEnv) -> Result<Communicator> {
    let _ = env;
    Err(Error::BackendUnavailable {
        backend: "nccl",
        reason: "a job of one process per GPU runs over NCCL: build with `--features cuda` \
                 (in-process ranks need no launcher: run without RANK/WORLD_SIZE set)"
            .into(),
    })
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;

    fn env(world_size: usize) -> JobEnv {
        JobEnv {
            rank: 0,
            world_size,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 1,
        }
    }

    fn par() -> ParallelConfig {
        ParallelConfig {
            tp: 1,
            pp: 1,
            vp: 1,
            dp: 2,
            schedule: crate::models::gpt::Schedule::OneFOneB,
            micro_batch: 1,
            global_batch: 2,
            recompute: crate::models::gpt::Recompute::None,
            distributed_optimizer: true,
            precision: crate::models::gpt::Precision::Bf16,
            sequence_parallel: false,
        }
    }

    fn job(env: &JobEnv, par: &ParallelConfig) -> Result<TrainSummary> {
        let corpus = CharCorpus::new("abcdefgh abcdefgh abcdefgh abcdefgh").unwrap();
        let cfg = GptConfig::small(corpus.vocab(), 8);
        train_this_process(
            env,
            &cfg,
            par,
            &TrainConfig::default(),
            &corpus,
            &JobOptions::default(),
            &mut |_| {},
        )
    }

    #[test]
    fn a_world_size_other_than_the_split_is_named_before_any_work() {
        let par = par();
        let e = job(&env(par.world() + 1), &par).unwrap_err().to_string();
        assert!(e.contains("WORLD_SIZE"), "{e}");
    }

    #[test]
    fn without_cuda_the_error_says_how_to_build() {
        let par = par();
        let e = job(&env(par.world()), &par).unwrap_err().to_string();
        assert!(e.contains("--features cuda"), "{e}");
    }
}
