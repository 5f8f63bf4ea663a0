//! Runs bias + GeLU (forward and backward) on the best available backend —
//! GPU 0 when ferrotron was built with `cuda` and a driver is present, else
//! the CUDA-on-CPU emulator — checks every output against the float64 oracle,
//! and prints what ran where and how long it took.
//!
//!     cargo run --release --example quickstart

use std::time::Instant;

use ferrotron::ops::{BiasGelu, Gelu};
use ferrotron::reference::bias_gelu as oracle;
use ferrotron::{Device, Result};
use half::bf16;

fn rel_err(out: &[f64], reference: &[f64]) -> f64 {
    let num: f64 = out
        .iter()
        .zip(reference)
        .map(|(o, r)| (o - r) * (o - r))
        .sum();
    let den: f64 = reference.iter().map(|r| r * r).sum();
    (num / den).sqrt()
}

fn main() -> Result<()> {
    let (dev, why_not_gpu) = Device::best();
    println!(
        "ferrotron quickstart: bias + GeLU on {} ({})",
        dev.kind(),
        dev.name()
    );
    if let Some(e) = why_not_gpu {
        println!("  (no GPU: {e})");
    }
    let (rows, cols) = (1024usize, 4096usize);
    let n = rows * cols;
    // Deterministic inputs in bf16, the usual Megatron activation dtype.
    let x: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f64(((i * 7919) % 2003) as f64 / 400.0 - 2.5))
        .collect();
    let bias: Vec<bf16> = (0..cols)
        .map(|c| bf16::from_f64((c % 17) as f64 / 17.0 - 0.5))
        .collect();
    let dy: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f64(((i * 31) % 101) as f64 / 50.0 - 1.0))
        .collect();

    let stream = dev.new_stream()?;
    let (xd, bd, dyd) = (dev.upload(&x)?, dev.upload(&bias)?, dev.upload(&dy)?);
    let mut y = dev.alloc_zeros::<bf16>(n)?;
    let mut dx = dev.alloc_zeros::<bf16>(n)?;
    let mut dbias = dev.alloc_zeros::<bf16>(cols)?;
    let op = BiasGelu::new(rows, cols).with_gelu(Gelu::Tanh);

    // Warm-up (loads modules on a GPU), then one timed run of each.
    op.forward(&stream, &xd, Some(&bd), &mut y)?;
    stream.synchronize()?;
    let t = Instant::now();
    op.forward(&stream, &xd, Some(&bd), &mut y)?;
    stream.synchronize()?;
    let fwd = t.elapsed();
    let t = Instant::now();
    op.backward(&stream, &dyd, &xd, Some(&bd), &mut dx, Some(&mut dbias))?;
    stream.synchronize()?;
    let bwd = t.elapsed();

    let f = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let (xf, bf, dyf) = (f(&x), f(&bias), f(&dy));
    let ref_y = oracle::forward(Gelu::Tanh, &xf, Some(&bf), cols);
    let (ref_dx, ref_db) = oracle::backward(Gelu::Tanh, &dyf, &xf, Some(&bf), cols);
    let errs = [
        ("forward  y     ", rel_err(&f(&y.to_host()?), &ref_y), fwd),
        ("backward dx    ", rel_err(&f(&dx.to_host()?), &ref_dx), bwd),
        (
            "backward dbias ",
            rel_err(&f(&dbias.to_host()?), &ref_db),
            bwd,
        ),
    ];
    let tol = 1e-2; // bf16 (docs/testing.md)
    println!("  shape [{rows}, {cols}] bf16, tanh GeLU; relative error vs the float64 oracle (tolerance {tol:e}):");
    let mut ok = true;
    for (name, err, time) in errs {
        let pass = err <= tol;
        ok &= pass;
        println!(
            "  {name} rel err {err:.2e}  {}  {:>9.3} ms",
            if pass { "ok  " } else { "FAIL" },
            time.as_secs_f64() * 1e3
        );
    }
    let bytes = (2 * n * 2) as f64;
    println!(
        "  forward moved {:.1} MB: {:.2} GB/s effective",
        bytes / 1e6,
        bytes / fwd.as_secs_f64() / 1e9
    );
    if !ok {
        eprintln!("quickstart: results do not match the oracle");
        std::process::exit(1);
    }
    println!("all outputs match the oracle");
    Ok(())
}
