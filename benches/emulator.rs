//! The emulator's speed, each case on one worker thread and on all of them:
//!
//! * a 1024 x 1024 row reduction (warp shuffles + shared memory + barriers;
//!   one block of 256 threads per row). Target (docs/testing.md, "The
//!   emulator's role"): under 0.5 s on one core (the fibers' context switch is
//!   what decides this; swapcontext took 7.6 s);
//! * a bf16 512 x 512 x 512 GEMM through the project's tensor-core kernel
//!   (cuda/gemm.cu: mma.sync + ldmatrix + cp.async), throughput in FLOP
//!   (criterion's "elem/s" reads as FLOP/s). Target (issue 15): >= 4 GFLOP/s
//!   per worker thread;
//! * the training ops' forward kernels at 1024 x 1024 bf16 through the public
//!   API: softmax, LayerNorm, bias + GeLU (throughput in elements).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask};
use ferrotron::ops::{BiasGelu, LayerNorm};
use ferrotron::Device;
use half::bf16;

#[link(name = "ftn_emu_selftest", kind = "static")]
extern "C" {
    fn ftn_emu_bench_row_reduce(rows: u32, cols: u32, workers: u32) -> f64;
    fn ftn_emu_bench_gemm(m: u32, n: u32, k: u32, workers: u32) -> f64;
}

const GEMM: u32 = 512;
const ROWS: usize = 1024;
const COLS: usize = 1024;

fn all_workers() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

fn bench_kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("emulator");
    g.sample_size(10);
    for workers in [1u32, all_workers()] {
        g.throughput(Throughput::Elements((ROWS * COLS) as u64));
        g.bench_function(format!("row_reduce_1024x1024_{workers}_workers"), |b| {
            b.iter(|| {
                // SAFETY: plain values in, a checksum out (NaN on failure).
                let checksum = unsafe { ftn_emu_bench_row_reduce(1024, 1024, workers) };
                assert!(checksum.is_finite(), "row-reduce kernel failed");
                checksum
            })
        });
        let flops = 2 * u64::from(GEMM).pow(3);
        g.throughput(Throughput::Elements(flops));
        g.bench_function(format!("gemm_bf16_512x512x512_{workers}_workers"), |b| {
            b.iter(|| {
                // SAFETY: plain values in, a checksum out (NaN on failure).
                let checksum = unsafe { ftn_emu_bench_gemm(GEMM, GEMM, GEMM, workers) };
                assert!(checksum.is_finite(), "GEMM kernel failed");
                checksum
            })
        });
    }
    g.finish();
}

/// An emulator device with `workers` worker threads (read from
/// FTN_EMU_THREADS when the device is made).
fn emu_device(workers: u32) -> Device {
    std::env::set_var("FTN_EMU_THREADS", workers.to_string());
    let dev = Device::emu();
    std::env::remove_var("FTN_EMU_THREADS");
    dev
}

fn bench_ops(c: &mut Criterion) {
    let mut g = c.benchmark_group("emulator_ops");
    g.sample_size(10);
    g.throughput(Throughput::Elements((ROWS * COLS) as u64));
    for workers in [1u32, all_workers()] {
        let dev = emu_device(workers);
        let stream = dev.new_stream().unwrap();
        let n = ROWS * COLS;
        let x = dev.upload(&vec![bf16::from_f32(0.5); n]).unwrap();
        let row = dev.upload(&vec![bf16::from_f32(0.1); COLS]).unwrap();
        let mut y = dev.alloc_zeros::<bf16>(n).unwrap();
        let mut mean = dev.alloc_zeros::<f32>(ROWS).unwrap();
        let mut rstd = dev.alloc_zeros::<f32>(ROWS).unwrap();

        let softmax = ScaleMaskSoftmax::new(1, 1, ROWS, COLS, 0.125);
        g.bench_function(
            format!("softmax_fwd_1024x1024_bf16_{workers}_workers"),
            |b| {
                b.iter(|| {
                    softmax
                        .forward(&stream, &x, SoftmaxMask::None, &mut y)
                        .unwrap();
                    stream.synchronize().unwrap();
                })
            },
        );
        let ln = LayerNorm::new(ROWS, COLS);
        g.bench_function(
            format!("layernorm_fwd_1024x1024_bf16_{workers}_workers"),
            |b| {
                b.iter(|| {
                    ln.forward(
                        &stream,
                        &x,
                        Some(&row),
                        Some(&row),
                        &mut y,
                        &mut mean,
                        &mut rstd,
                    )
                    .unwrap();
                    stream.synchronize().unwrap();
                })
            },
        );
        let bias_gelu = BiasGelu::new(ROWS, COLS);
        g.bench_function(
            format!("bias_gelu_fwd_1024x1024_bf16_{workers}_workers"),
            |b| {
                b.iter(|| {
                    bias_gelu.forward(&stream, &x, Some(&row), &mut y).unwrap();
                    stream.synchronize().unwrap();
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench_kernels, bench_ops);
criterion_main!(benches);
