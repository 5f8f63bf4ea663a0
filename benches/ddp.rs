//! Data-parallel gradient reduction overlapped with backward
//! (`parallel::ddp`), on dp = 4 in-process ranks of the CUDA EMULATOR (CPU
//! threads). A backward of `P` parameters, each gradient produced by a
//! "kernel" of known cost on the compute stream (a host function that
//! sleeps), several buckets, three ways:
//!
//! * compute only: `no_sync` (no collective) — the backward's own time;
//! * overlap: each gradient marked ready as soon as its kernel is enqueued,
//!   so a bucket's reduction runs on the communication stream while later
//!   kernels run;
//! * deferred: every kernel enqueued first, then every gradient marked, so
//!   all reductions run after the backward.
//!
//! Exposed communication = time − compute-only time; the fraction hidden is
//! `1 − exposed(overlap) / exposed(deferred)`.
//!
//! THESE ARE EMULATOR NUMBERS, NOT GPU NUMBERS: collectives are memory
//! copies and sums by CPU threads competing for the machine's cores with
//! the other ranks' streams; only the relative effect of overlap means
//! anything, and not its size on a GPU with NCCL.
//!
//!     cargo bench --bench ddp
//!
//! Environment: `FTN_DDP_REPS` (default 5) runs per case (median).

use std::sync::Barrier;
use std::time::{Duration, Instant};

use ferrotron::comm::Communicator;
use ferrotron::parallel::ddp::{DdpConfig, DistributedDataParallel, ParamId, ParamRegistry};
use ferrotron::{DType, Device, Result};

const DP: usize = 4;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    ComputeOnly,
    Overlap,
    Deferred,
}

/// One backward on every rank; the slowest rank's wall time per rep.
fn run(
    mode: Mode,
    params: usize,
    numel: usize,
    bucket: usize,
    kernel: Duration,
    dist: bool,
    reps: usize,
) -> Result<(Duration, usize)> {
    let devices: Vec<Device> = (0..DP).map(|_| Device::emu()).collect();
    let comms = Communicator::in_process_with_timeout(&devices, Duration::from_secs(120))?;
    let barrier = Barrier::new(DP);
    let out: Vec<Result<(Vec<Duration>, usize)>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let barrier = &barrier;
                s.spawn(move || -> Result<(Vec<Duration>, usize)> {
                    let mut reg = ParamRegistry::new();
                    let ids: Vec<ParamId> = (0..params)
                        .map(|p| reg.register(&format!("p{p}"), &[numel], DType::F32))
                        .collect::<Result<_>>()?;
                    let config = DdpConfig {
                        bucket_size: Some(bucket),
                        distributed_optimizer: dist,
                        ..DdpConfig::default()
                    };
                    let mut ddp = DistributedDataParallel::new(&comm, reg, config)?;
                    let nb = ddp.buckets().len();
                    let compute = comm.device().new_stream()?;
                    let mut times = Vec::with_capacity(reps + 1);
                    for _ in 0..reps + 1 {
                        ddp.zero_grad_buffer(&compute)?;
                        ddp.set_is_last_microbatch(mode != Mode::ComputeOnly)?;
                        compute.synchronize()?;
                        comm.stream().synchronize()?;
                        barrier.wait();
                        let t = Instant::now();
                        for &id in ids.iter().rev() {
                            compute.launch_host_fn(move || std::thread::sleep(kernel))?;
                            if mode != Mode::Deferred {
                                ddp.mark_grad_ready(&compute, id)?;
                            }
                        }
                        if mode == Mode::Deferred {
                            for &id in ids.iter().rev() {
                                ddp.mark_grad_ready(&compute, id)?;
                            }
                        }
                        if mode != Mode::ComputeOnly {
                            ddp.finish_grad_sync(&compute)?;
                        }
                        compute.synchronize()?;
                        times.push(t.elapsed());
                    }
                    times.remove(0); // warm-up
                    Ok((times, nb))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ferrotron::Error::Backend {
                        backend: "bench",
                        message: "a rank thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut per_rep = vec![Duration::ZERO; reps];
    let mut buckets = 0;
    for r in out {
        let (t, nb) = r?;
        buckets = nb;
        for (a, b) in per_rep.iter_mut().zip(t) {
            *a = (*a).max(b);
        }
    }
    per_rep.sort();
    Ok((per_rep[reps / 2], buckets))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        println!("ddp bench: run with `cargo bench --bench ddp`");
        return Ok(());
    }
    let reps: usize = std::env::var("FTN_DDP_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);
    println!("DDP gradient reduction overlap, dp = {DP}, in-process communicator, CUDA EMULATOR");
    println!("(emulator numbers, NOT GPU numbers: CPU threads doing the collectives; only the");
    println!(" relative effect of overlap is meaningful, not its size on a GPU with NCCL)");
    println!(
        "{:>6} {:>6} {:>9} {:>8} {:>8} {:>11} {:>11} {:>11} {:>9} {:>9} {:>7}",
        "dist",
        "params",
        "elems",
        "buckets",
        "kern ms",
        "compute ms",
        "overlap ms",
        "defer ms",
        "exp ovl",
        "exp def",
        "hidden"
    );
    for (dist, params, numel, per_bucket, kernel_ms) in [
        (false, 8, 1 << 18, 2, 4u64),
        (false, 8, 1 << 20, 2, 8),
        (true, 8, 1 << 20, 2, 8),
    ] {
        let bucket = numel * per_bucket;
        let kernel = Duration::from_millis(kernel_ms);
        let (c, nb) = run(Mode::ComputeOnly, params, numel, bucket, kernel, dist, reps)?;
        let (o, _) = run(Mode::Overlap, params, numel, bucket, kernel, dist, reps)?;
        let (d, _) = run(Mode::Deferred, params, numel, bucket, kernel, dist, reps)?;
        let exp_o = o.saturating_sub(c);
        let exp_d = d.saturating_sub(c);
        let hidden = if exp_d.is_zero() {
            f64::NAN
        } else {
            1.0 - exp_o.as_secs_f64() / exp_d.as_secs_f64()
        };
        println!(
            "{:>6} {:>6} {:>9} {:>8} {:>8} {:>11.1} {:>11.1} {:>11.1} {:>9.1} {:>9.1} {:>6.0}%",
            if dist { "ZeRO1" } else { "DDP" },
            params,
            numel,
            nb,
            kernel_ms,
            ms(c),
            ms(o),
            ms(d),
            ms(exp_o),
            ms(exp_d),
            hidden * 100.0
        );
    }
    println!(
        "exposed = time - compute-only time; hidden = 1 - exposed(overlap) / exposed(deferred)"
    );
    println!("(the last bucket's reduction can never be hidden: it starts after the last kernel)");
    Ok(())
}
