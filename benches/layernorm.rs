//! LayerNorm / RMSNorm throughput on every available backend (criterion).
//!
//! Throughput is the HBM byte floor of each call (see cuda/layernorm.cu):
//! forward reads x and writes y (+ 8 bytes of statistics per row); backward
//! reads dy and x, writes dx (+ statistics read), and for dgamma/dbeta reads
//! dy and x once more. Under the emulator the numbers measure the emulator;
//! on a GPU they are HBM figures to set against the `copy` entry of the same
//! run (a device-to-device copy of x: read + write).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrotron::core::plan;
use ferrotron::ops::{LayerNorm, RmsNorm};
use ferrotron::{BackendKind, Device};
use half::bf16;

fn bench(c: &mut Criterion) {
    let mut devices = vec![Device::emu()];
    if let Ok(d) = Device::cuda(0) {
        devices.push(d);
    }
    for dev in devices {
        let stream = dev.new_stream().unwrap();
        let mut g = c.benchmark_group(format!("layernorm/{}", dev.kind()));
        g.sample_size(10);
        for hidden in [1024usize, 4096, 12288, 65536] {
            // ~1M elements under the emulator, ~256M-element-bytes on a GPU.
            let rows = match dev.kind() {
                BackendKind::Emu => (1 << 20) / hidden,
                BackendKind::Cuda => (1 << 27) / hidden,
            };
            let n = rows * hidden;
            let es = 2; // bf16
            let x = dev.upload(&vec![bf16::from_f32(0.5); n]).unwrap();
            let dy = dev.upload(&vec![bf16::from_f32(0.25); n]).unwrap();
            let gamma = dev.upload(&vec![bf16::from_f32(1.5); hidden]).unwrap();
            let beta = dev.upload(&vec![bf16::from_f32(0.1); hidden]).unwrap();
            let mut y = dev.alloc_zeros::<bf16>(n).unwrap();
            let mut dx = dev.alloc_zeros::<bf16>(n).unwrap();
            let mut dg = dev.alloc_zeros::<bf16>(hidden).unwrap();
            let mut db = dev.alloc_zeros::<bf16>(hidden).unwrap();
            let mut mean = dev.alloc_zeros::<f32>(rows).unwrap();
            let mut rstd = dev.alloc_zeros::<f32>(rows).unwrap();
            let shape = format!("{rows}x{hidden}_bf16");
            let ln = LayerNorm::new(rows, hidden);
            let rms = RmsNorm::new(rows, hidden);

            g.throughput(Throughput::Bytes((2 * n * es + 8 * rows) as u64));
            g.bench_function(BenchmarkId::new("ln_forward", &shape), |b| {
                b.iter(|| {
                    ln.forward(
                        &stream,
                        &x,
                        Some(&gamma),
                        Some(&beta),
                        &mut y,
                        &mut mean,
                        &mut rstd,
                    )
                    .unwrap();
                    stream.synchronize().unwrap();
                })
            });
            g.throughput(Throughput::Bytes((2 * n * es + 4 * rows) as u64));
            g.bench_function(BenchmarkId::new("rms_forward", &shape), |b| {
                b.iter(|| {
                    rms.forward(&stream, &x, Some(&gamma), &mut y, &mut rstd)
                        .unwrap();
                    stream.synchronize().unwrap();
                })
            });
            // Backward with parameter gradients: what it moves. Fused (warp
            // and block paths, as far as this device's shared memory
            // allows the pipelined kernel): one pass, 3n; otherwise the dx
            // pass (3n) + the parameter pass (2n).
            let fused = plan::layernorm::fused_backward_within(
                rows as u64,
                hidden as u64,
                es,
                true,
                true,
                stream.device().limits(),
            );
            let passes = if fused.is_some() { 3 } else { 5 };
            g.throughput(Throughput::Bytes((passes * n * es + 8 * rows) as u64));
            g.bench_function(BenchmarkId::new("ln_backward", &shape), |b| {
                b.iter(|| {
                    ln.backward(
                        &stream,
                        &dy,
                        &x,
                        &mean,
                        &rstd,
                        Some(&gamma),
                        &mut dx,
                        Some(&mut dg),
                        Some(&mut db),
                    )
                    .unwrap();
                    stream.synchronize().unwrap();
                })
            });
            g.throughput(Throughput::Bytes((3 * n * es + 8 * rows) as u64));
            g.bench_function(BenchmarkId::new("ln_backward_dx_only", &shape), |b| {
                b.iter(|| {
                    ln.backward(
                        &stream,
                        &dy,
                        &x,
                        &mean,
                        &rstd,
                        Some(&gamma),
                        &mut dx,
                        None,
                        None,
                    )
                    .unwrap();
                    stream.synchronize().unwrap();
                })
            });
            g.throughput(Throughput::Bytes((2 * n * es) as u64));
            g.bench_function(BenchmarkId::new("copy", &shape), |b| {
                b.iter(|| {
                    stream.copy_device(&x, &mut y).unwrap();
                    stream.synchronize().unwrap();
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
