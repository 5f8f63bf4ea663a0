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
//! * the training ops' kernels at 1024 x 1024 bf16 through the public API,
//!   forward and backward: softmax, LayerNorm, bias + GeLU (throughput in
//!   elements);
//! * group `native_floor` (`emulator/native_floor.rs`): the same training
//!   ops as plain vectorised C++ loops, checked against the kernels' outputs:
//!   the speed no emulator of these kernels could beat by much on this CPU;
//!   and the softmax and LayerNorm warp kernels hand-lowered to lockstep form
//!   (`lockstep_*`, bitwise the kernels' outputs): what an emulator running
//!   a warp's lanes in lockstep could reach.
//!
//! `FTN_BENCH_CLOCK=cpu` times with the process's CPU clock instead of the
//! wall clock: on a shared machine that is the comparable figure (for a
//! one-worker case it is that worker's time; for several workers their sum).

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, Throughput};
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask};
use ferrotron::ops::{BiasGelu, LayerNorm};
use ferrotron::Device;
use half::bf16;

#[path = "emulator/native_floor.rs"]
mod native_floor;

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

fn bench_kernels<M: Measurement>(c: &mut Criterion<M>) {
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

fn bench_ops<M: Measurement>(c: &mut Criterion<M>) {
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
        let dy = dev.upload(&vec![bf16::from_f32(0.25); n]).unwrap();
        let mut dx = dev.alloc_zeros::<bf16>(n).unwrap();
        let mut drow = dev.alloc_zeros::<bf16>(COLS).unwrap();
        let mut drow2 = dev.alloc_zeros::<bf16>(COLS).unwrap();
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
        softmax
            .forward(&stream, &x, SoftmaxMask::None, &mut y)
            .unwrap();
        g.bench_function(
            format!("softmax_bwd_1024x1024_bf16_{workers}_workers"),
            |b| {
                b.iter(|| {
                    softmax.backward(&stream, &y, &dy, &mut dx).unwrap();
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
        g.bench_function(
            format!("layernorm_bwd_1024x1024_bf16_{workers}_workers"),
            |b| {
                b.iter(|| {
                    ln.backward(
                        &stream,
                        &dy,
                        &x,
                        &mean,
                        &rstd,
                        Some(&row),
                        &mut dx,
                        Some(&mut drow),
                        Some(&mut drow2),
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
        g.bench_function(
            format!("bias_gelu_bwd_1024x1024_bf16_{workers}_workers"),
            |b| {
                b.iter(|| {
                    bias_gelu
                        .backward(&stream, &dy, &x, Some(&row), &mut dx, Some(&mut drow))
                        .unwrap();
                    stream.synchronize().unwrap();
                })
            },
        );
    }
    g.finish();
}

/// The process's CPU time (all threads), for `FTN_BENCH_CLOCK=cpu`.
struct CpuTime;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// Linux's `CLOCK_PROCESS_CPUTIME_ID`.
const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;

fn cpu_now() -> std::time::Duration {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec (two 64-bit fields on the
    // 64-bit Linux targets this bench runs on).
    let rc = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl Measurement for CpuTime {
    type Intermediate = std::time::Duration;
    type Value = std::time::Duration;
    fn start(&self) -> Self::Intermediate {
        cpu_now()
    }
    fn end(&self, start: Self::Intermediate) -> Self::Value {
        cpu_now() - start
    }
    fn add(&self, a: &Self::Value, b: &Self::Value) -> Self::Value {
        *a + *b
    }
    fn zero(&self) -> Self::Value {
        std::time::Duration::ZERO
    }
    fn to_f64(&self, v: &Self::Value) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        static WALL: WallTime = WallTime;
        WALL.formatter() // nanoseconds, like the wall clock
    }
}

fn bench_floor<M: Measurement>(c: &mut Criterion<M>) {
    let dev = emu_device(1);
    let stream = dev.new_stream().unwrap();
    let mut g = c.benchmark_group("native_floor");
    g.sample_size(10);
    g.throughput(Throughput::Elements((ROWS * COLS) as u64));
    for mut case in native_floor::cases(&stream, ROWS, COLS) {
        g.bench_function(format!("{}_{ROWS}x{COLS}_bf16", case.name), |b| {
            b.iter(|| case.run())
        });
    }
    g.finish();
}

fn main() {
    let cpu = std::env::var("FTN_BENCH_CLOCK").is_ok_and(|v| v == "cpu");
    if cpu {
        let mut c = Criterion::default()
            .with_measurement(CpuTime)
            .configure_from_args();
        bench_kernels(&mut c);
        bench_ops(&mut c);
        bench_floor(&mut c);
        c.final_summary();
    } else {
        let mut c = Criterion::default().configure_from_args();
        bench_kernels(&mut c);
        bench_ops(&mut c);
        bench_floor(&mut c);
        c.final_summary();
    }
}
