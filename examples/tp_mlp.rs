//! A complete tensor-parallel MLP step in Rust: 2 ranks (one thread each) on
//! the in-process communicator over the CUDA emulator, forward + backward,
//! checked against the same MLP computed on one rank.
//!
//!     cargo run --example tp_mlp

use ferrotron::comm::Communicator;
use ferrotron::parallel::linear::{LinearGrads, WeightGrad};
use ferrotron::parallel::mlp::{MlpGrads, MlpOptions, TpMlp};
use ferrotron::{Device, Result};
use half::bf16;

const TOKENS: usize = 8;
const HIDDEN: usize = 16;
const FFN: usize = 64;

/// Deterministic inputs in [-1, 1).
fn init(n: usize, salt: usize) -> Vec<bf16> {
    (0..n)
        .map(|i| bf16::from_f32((((i * 7919 + salt * 104_729) % 2000) as f32 / 1000.0 - 1.0) * 0.5))
        .collect()
}

/// One forward + backward of the MLP on every rank of `tp`; returns rank
/// 0's output and input gradient.
fn step(tp: usize) -> Result<(Vec<bf16>, Vec<bf16>)> {
    let (w1, b1) = (init(FFN * HIDDEN, 1), init(FFN, 2)); // fc1: [ffn, hidden]
    let (w2, b2) = (init(HIDDEN * FFN, 3), init(HIDDEN, 4)); // fc2: [hidden, ffn]
    let (x, dy) = (init(TOKENS * HIDDEN, 5), init(TOKENS * HIDDEN, 6));

    let devices: Vec<Device> = (0..tp).map(|_| Device::emu()).collect();
    let comms = Communicator::in_process(&devices)?;
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let (w1, b1, w2, b2, x, dy) = (&w1, &b1, &w2, &b2, &x, &dy);
                s.spawn(move || -> Result<(Vec<bf16>, Vec<bf16>)> {
                    let dev = comm.device().clone();
                    let stream = dev.new_stream()?;
                    // Each rank keeps its shard: fc1 rows, fc2 columns.
                    let mut mlp = TpMlp::from_full(
                        &comm,
                        HIDDEN,
                        FFN,
                        w1,
                        b1,
                        w2,
                        b2,
                        MlpOptions::default(),
                    )?;
                    let x = dev.upload(x)?;
                    let dy = dev.upload(dy)?;
                    let mut y = dev.alloc_zeros::<bf16>(TOKENS * HIDDEN)?;
                    mlp.forward(&comm, &stream, &x, &mut y, TOKENS)?;

                    // Gradients: weights accumulated into fp32 main_grads.
                    let mut dx = dev.alloc_zeros::<bf16>(TOKENS * HIDDEN)?;
                    let mut main1 = dev.alloc_zeros::<f32>(FFN / tp * HIDDEN)?;
                    let mut main2 = dev.alloc_zeros::<f32>(HIDDEN * FFN / tp)?;
                    let mut db1 = dev.alloc_zeros::<bf16>(FFN / tp)?;
                    let mut db2 = dev.alloc_zeros::<bf16>(HIDDEN)?;
                    let grads = MlpGrads {
                        fc1: LinearGrads {
                            weight: WeightGrad::Accumulate(&mut main1),
                            bias: Some(&mut db1),
                        },
                        fc2: LinearGrads {
                            weight: WeightGrad::Accumulate(&mut main2),
                            bias: Some(&mut db2),
                        },
                    };
                    mlp.backward(&comm, &stream, &x, &dy, &mut dx, grads)?;
                    stream.synchronize()?;
                    Ok((y.to_host()?, dx.to_host()?))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(results.into_iter().next().expect("at least one rank"))
}

fn main() -> ferrotron::Result<()> {
    let (y2, dx2) = step(2)?;
    let (y1, dx1) = step(1)?;
    let diff = |a: &[bf16], b: &[bf16]| {
        a.iter()
            .zip(b)
            .map(|(p, q)| (p.to_f32() - q.to_f32()).abs())
            .fold(0.0f32, f32::max)
    };
    println!(
        "TP=2 MLP vs TP=1: max |dy| {:.3e}, max |dx| {:.3e} (bf16)",
        diff(&y2, &y1),
        diff(&dx2, &dx1)
    );
    Ok(())
}
