//! GEMM throughput on every available backend (criterion). Throughput is
//! reported in elements = FLOPs (2*M*N*K per GEMM), so criterion's
//! "elem/s" reads as FLOP/s.
//!
//! GPU: Megatron MLP shapes (tokens 4096, hidden 4096, FFN 16384) — fc1
//! forward with the fused bias+GeLU epilogue (saving the pre-activation) and
//! without it, fc2 forward, the wgrad with fp32 gradient-accumulation fusion,
//! and a plain 8192^3. Emulator: small shapes (the numbers measure the
//! emulator).
//!
//! TODO(issue 4): time cuBLASLt (through cudarc) with its GELU_BIAS epilogue
//! on the same shapes in the same run and print both TFLOP/s and the ratio;
//! not done yet, so no GPU comparison exists.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrotron::ops::gemm::{Aux, Epilogue, Gemm, GemmInputs};
use ferrotron::ops::Gelu;
use ferrotron::{BackendKind, Device};
use half::bf16;

fn bench(c: &mut Criterion) {
    let mut devices = vec![Device::emu()];
    if let Ok(d) = Device::cuda(0) {
        devices.push(d);
    }
    for dev in devices {
        let (tokens, hidden, ffn, cube) = match dev.kind() {
            BackendKind::Emu => (128usize, 128usize, 512usize, 256usize),
            BackendKind::Cuda => (4096, 4096, 16384, 8192),
        };
        let stream = dev.new_stream().unwrap();
        let fill = |n: usize, v: f32| dev.upload(&vec![bf16::from_f32(v); n]).unwrap();
        let x = fill(tokens * hidden, 0.5);
        let w1 = fill(ffn * hidden, 0.01);
        let b1 = fill(ffn, 0.1);
        let w2 = fill(hidden * ffn, 0.01);
        let h = fill(tokens * ffn, 0.25);
        let mut y1 = dev.alloc_zeros::<bf16>(tokens * ffn).unwrap();
        let mut pre = dev.alloc_zeros::<bf16>(tokens * ffn).unwrap();
        let mut y2 = dev.alloc_zeros::<bf16>(tokens * hidden).unwrap();
        let mut main_grad = dev.alloc_zeros::<f32>(ffn * hidden).unwrap();
        let ca = fill(cube * cube, 0.01);
        let mut cd = dev.alloc_zeros::<bf16>(cube * cube).unwrap();

        let mut g = c.benchmark_group(format!("gemm/{}", dev.kind()));
        g.sample_size(10);
        let fc1 = Gemm::new(tokens, ffn, hidden).trans_b(true);
        let flops = |m: usize, n: usize, k: usize| Throughput::Elements((2 * m * n * k) as u64);

        g.throughput(flops(tokens, ffn, hidden));
        let shape = format!("{tokens}x{ffn}x{hidden}_bf16");
        g.bench_function(BenchmarkId::new("fc1_bias_gelu_save_pre", &shape), |bch| {
            let op = fc1.epilogue(Epilogue::BiasGelu(Gelu::Tanh));
            bch.iter(|| {
                let inputs = GemmInputs {
                    a: &x,
                    b: &w1,
                    bias: Some(&b1),
                    c: None,
                };
                op.run(&stream, inputs, Aux::Store(&mut pre), &mut y1)
                    .unwrap();
                stream.synchronize().unwrap();
            })
        });
        g.bench_function(BenchmarkId::new("fc1_plain", &shape), |bch| {
            bch.iter(|| {
                let inputs = GemmInputs {
                    a: &x,
                    b: &w1,
                    bias: None,
                    c: None,
                };
                fc1.run(&stream, inputs, Aux::None, &mut y1).unwrap();
                stream.synchronize().unwrap();
            })
        });
        g.throughput(flops(tokens, hidden, ffn));
        let shape2 = format!("{tokens}x{hidden}x{ffn}_bf16");
        g.bench_function(BenchmarkId::new("fc2_plain", &shape2), |bch| {
            let op = Gemm::new(tokens, hidden, ffn).trans_b(true);
            bch.iter(|| {
                let inputs = GemmInputs {
                    a: &h,
                    b: &w2,
                    bias: None,
                    c: None,
                };
                op.run(&stream, inputs, Aux::None, &mut y2).unwrap();
                stream.synchronize().unwrap();
            })
        });
        g.throughput(flops(ffn, hidden, tokens));
        let shape3 = format!("{ffn}x{hidden}x{tokens}_bf16_f32acc");
        g.bench_function(BenchmarkId::new("fc1_wgrad_main_grad", &shape3), |bch| {
            // main_grad[ffn, hidden] += dY1^T X
            let op = Gemm::new(ffn, hidden, tokens).trans_a(true).beta(1.0);
            bch.iter(|| {
                let inputs = GemmInputs {
                    a: &y1,
                    b: &x,
                    bias: None,
                    c: None,
                };
                op.run(&stream, inputs, Aux::None, &mut main_grad).unwrap();
                stream.synchronize().unwrap();
            })
        });
        g.throughput(flops(cube, cube, cube));
        g.bench_function(
            BenchmarkId::new("square", format!("{cube}^3_bf16")),
            |bch| {
                let op = Gemm::new(cube, cube, cube);
                bch.iter(|| {
                    let inputs = GemmInputs {
                        a: &ca,
                        b: &ca,
                        bias: None,
                        c: None,
                    };
                    op.run(&stream, inputs, Aux::None, &mut cd).unwrap();
                    stream.synchronize().unwrap();
                })
            },
        );
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
