//! Fused scale + mask + softmax throughput on every available backend
//! (criterion), one row length per kernel path: [*, 128] (warp path),
//! [*, 4096] (block path), [*, 65536] (long path), bf16.
//!
//! Reports the HBM byte floor as criterion throughput: forward reads x once
//! and writes y once (2n * 2 bytes), backward reads y and dy and writes dx
//! (3n * 2 bytes). Under the emulator the numbers measure the emulator; on a
//! GPU they are to be set against the device-to-device copy of the same run
//! (the `copy` entry).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask};
use ferrotron::{BackendKind, Device};
use half::bf16;

fn bench(c: &mut Criterion) {
    let mut devices = vec![Device::emu()];
    if let Ok(d) = Device::cuda(0) {
        devices.push(d);
    }
    for dev in devices {
        // Total elements per run: 2^20 on the emulator; 2^27 (256 MiB of
        // bf16 per buffer, well beyond L2) on a GPU.
        let n: usize = match dev.kind() {
            BackendKind::Emu => 1 << 20,
            BackendKind::Cuda => 1 << 27,
        };
        let stream = dev.new_stream().unwrap();
        let x = dev.upload(&vec![bf16::from_f32(0.5); n]).unwrap();
        let dy = dev.upload(&vec![bf16::from_f32(0.25); n]).unwrap();
        let mut y = dev.alloc_zeros::<bf16>(n).unwrap();
        let mut dx = dev.alloc_zeros::<bf16>(n).unwrap();
        let mut g = c.benchmark_group(format!("softmax/{}", dev.kind()));
        g.sample_size(10);
        for sk in [128usize, 4096, 65536] {
            let rows = n / sk;
            let op = ScaleMaskSoftmax::new(1, 1, rows, sk, 0.125);
            let shape = format!("{rows}x{sk}_bf16_{:?}", op.chosen_path());
            g.throughput(Throughput::Bytes((2 * n * 2) as u64));
            g.bench_function(BenchmarkId::new("forward", &shape), |bch| {
                bch.iter(|| {
                    op.forward(&stream, &x, SoftmaxMask::None, &mut y).unwrap();
                    stream.synchronize().unwrap();
                })
            });
            g.throughput(Throughput::Bytes((3 * n * 2) as u64));
            g.bench_function(BenchmarkId::new("backward", &shape), |bch| {
                bch.iter(|| {
                    op.backward(&stream, &y, &dy, &mut dx).unwrap();
                    stream.synchronize().unwrap();
                })
            });
        }
        g.throughput(Throughput::Bytes((2 * n * 2) as u64));
        g.bench_function(BenchmarkId::new("copy", format!("{n}_bf16")), |bch| {
            bch.iter(|| {
                stream.copy_device(&x, &mut y).unwrap();
                stream.synchronize().unwrap();
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
