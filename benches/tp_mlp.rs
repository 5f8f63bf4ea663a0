//! One tensor-parallel MLP step (forward + backward) on 2 in-process ranks of
//! the CUDA EMULATOR (CPU threads): backward communication overlapped with
//! the weight gradients vs serialised on the compute stream, and the step's
//! collectives timed alone, giving the fraction of communication hidden
//! `(t_serial - t_overlap) / t_comm_alone`. These are emulator numbers: they
//! show that the overlap machinery works, not what a GPU and NCCL would do.
//!
//!     cargo bench --bench tp_mlp
//!
//! Environment: `FTN_TP_MLP_ITERS` (default 5) timed steps per case.

use std::time::{Duration, Instant};

use ferrotron::comm::{Communicator, ReduceOp};
use ferrotron::parallel::linear::{LinearGrads, WeightGrad};
use ferrotron::parallel::mlp::{MlpGrads, MlpOptions, TpMlp};
use ferrotron::{Device, Result, Stream};
use half::bf16;

const TP: usize = 2;
const TOKENS: usize = 128;
const HIDDEN: usize = 256;
const FFN: usize = 1024;

fn run_ranks<R: Send>(f: impl Fn(Communicator) -> Result<R> + Sync) -> Vec<R> {
    let devices: Vec<Device> = (0..TP).map(|_| Device::emu()).collect();
    let comms = Communicator::in_process(&devices).expect("communicator");
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread").expect("rank"))
            .collect()
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn values(n: usize, seed: u32) -> Vec<bf16> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
            bf16::from_f32(((h >> 8) % 2001) as f32 / 1000.0 - 1.0)
        })
        .collect()
}

/// Median time of one forward + backward step (slowest rank).
fn time_step(sp: bool, overlap: bool, iters: usize) -> Duration {
    let times = run_ranks(|c| {
        let dev = c.device().clone();
        let stream = dev.new_stream()?;
        let o = MlpOptions {
            sequence_parallel: sp,
            overlap,
            ..Default::default()
        };
        let (w1, b1) = (values(FFN * HIDDEN, 1), values(FFN, 2));
        let (w2, b2) = (values(HIDDEN * FFN, 3), values(HIDDEN, 4));
        let mut mlp = TpMlp::from_full(&c, HIDDEN, FFN, &w1, &b1, &w2, &b2, o)?;
        let rows = mlp.rows(&c, TOKENS).unwrap();
        let x = dev.upload(&values(rows * HIDDEN, 5))?;
        let dy = dev.upload(&values(rows * HIDDEN, 6))?;
        let mut y = dev.alloc_zeros::<bf16>(rows * HIDDEN)?;
        let mut dx = dev.alloc_zeros::<bf16>(rows * HIDDEN)?;
        let mut g1 = dev.alloc_zeros::<f32>(FFN / TP * HIDDEN)?;
        let mut g2 = dev.alloc_zeros::<f32>(HIDDEN * FFN / TP)?;
        let mut gb1 = dev.alloc_zeros::<bf16>(FFN / TP)?;
        let mut gb2 = dev.alloc_zeros::<bf16>(HIDDEN)?;
        let mut out = Vec::new();
        for it in 0..=iters {
            let t = Instant::now();
            mlp.forward(&c, &stream, &x, &mut y, TOKENS)?;
            let grads = MlpGrads {
                fc1: LinearGrads {
                    weight: WeightGrad::Accumulate(&mut g1),
                    bias: Some(&mut gb1),
                },
                fc2: LinearGrads {
                    weight: WeightGrad::Accumulate(&mut g2),
                    bias: Some(&mut gb2),
                },
            };
            mlp.backward(&c, &stream, &x, &dy, &mut dx, grads)?;
            stream.synchronize()?;
            if it > 0 {
                out.push(t.elapsed());
            }
        }
        Ok(median(out))
    });
    times.into_iter().max().unwrap_or_default()
}

/// The step's collectives alone, same sizes, serialised on one stream:
/// `(all of them, the backward ones the overlap can hide)`.
fn time_comm(sp: bool, iters: usize) -> (Duration, Duration) {
    let times = run_ranks(|c| {
        let dev = c.device().clone();
        let s: Stream = dev.new_stream()?;
        let full = TOKENS * HIDDEN;
        let mut whole = dev.alloc_zeros::<bf16>(full)?;
        let mut part = dev.alloc_zeros::<bf16>(full / TP)?;
        let mut all = Vec::new();
        let mut bwd = Vec::new();
        for it in 0..=iters {
            let t = Instant::now();
            // Forward: fc1's input all-gather (SP) and fc2's output reduction.
            if sp {
                c.all_gather(&s, &part, &mut whole)?;
                c.reduce_scatter(&s, &whole, &mut part, ReduceOp::Sum)?;
            } else {
                c.all_reduce_in_place(&s, &mut whole, ReduceOp::Sum)?;
            }
            s.synchronize()?;
            // Backward: (SP: fc2's dY all-gather, not overlapped) then fc1's
            // input re-gather (SP) and dX reduction, both overlappable.
            if sp {
                c.all_gather(&s, &part, &mut whole)?;
                s.synchronize()?;
            }
            let th = Instant::now();
            if sp {
                c.all_gather(&s, &part, &mut whole)?;
                c.reduce_scatter(&s, &whole, &mut part, ReduceOp::Sum)?;
            } else {
                c.all_reduce_in_place(&s, &mut whole, ReduceOp::Sum)?;
            }
            s.synchronize()?;
            if it > 0 {
                all.push(t.elapsed());
                bwd.push(th.elapsed());
            }
        }
        Ok((median(all), median(bwd)))
    });
    let a = times.iter().map(|t| t.0).max().unwrap_or_default();
    let b = times.iter().map(|t| t.1).max().unwrap_or_default();
    (a, b)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it once quickly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let iters = std::env::var("FTN_TP_MLP_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 5 });
    println!(
        "TP MLP step on the CUDA EMULATOR (CPU), tp={TP}, bf16, tokens={TOKENS} hidden={HIDDEN} \
         ffn={FFN}, median of {iters} steps (emulator numbers, not GPU figures)"
    );
    for sp in [false, true] {
        let t_overlap = time_step(sp, true, iters);
        let t_serial = time_step(sp, false, iters);
        let (t_comm, t_comm_bwd) = time_comm(sp, iters);
        let hidden = (ms(t_serial) - ms(t_overlap)) / ms(t_comm);
        let hidden_bwd = (ms(t_serial) - ms(t_overlap)) / ms(t_comm_bwd);
        println!(
            "sp={sp:5}: overlap {:8.2} ms | serialised {:8.2} ms | collectives alone {:7.2} ms \
             (overlappable backward ones {:7.2} ms) | hidden = {:5.1}% of all comm, {:5.1}% of \
             the overlappable comm",
            ms(t_overlap),
            ms(t_serial),
            ms(t_comm),
            ms(t_comm_bwd),
            100.0 * hidden,
            100.0 * hidden_bwd
        );
        println!(
            "          communication is {:.3}% of the serialised step here: when that is below the \
             run-to-run noise of the step, the hidden fraction is noise, not a measurement",
            100.0 * ms(t_comm) / ms(t_serial)
        );
    }
}
