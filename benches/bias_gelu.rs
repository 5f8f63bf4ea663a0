//! Bias + GeLU throughput on every available backend (criterion).
//!
//! Reports effective bytes moved (forward: read x + write out; backward: read
//! dy, x + write dx) as criterion throughput. Under the emulator the numbers
//! measure the emulator; on a GPU they are HBM figures to set against a
//! device-to-device copy in the same run (the `copy` entry).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrotron::ops::{BiasGelu, Gelu};
use ferrotron::{BackendKind, Device};
use half::bf16;

fn bench(c: &mut Criterion) {
    let mut devices = vec![Device::emu()];
    if let Ok(d) = Device::cuda(0) {
        devices.push(d);
    }
    for dev in devices {
        let (rows, cols) = match dev.kind() {
            BackendKind::Emu => (256usize, 4096usize),
            BackendKind::Cuda => (16384, 16384),
        };
        let n = rows * cols;
        let stream = dev.new_stream().unwrap();
        let x = dev.upload(&vec![bf16::from_f32(0.5); n]).unwrap();
        let dy = dev.upload(&vec![bf16::from_f32(0.25); n]).unwrap();
        let b = dev.upload(&vec![bf16::from_f32(0.1); cols]).unwrap();
        let mut y = dev.alloc_zeros::<bf16>(n).unwrap();
        let mut dx = dev.alloc_zeros::<bf16>(n).unwrap();
        let mut db = dev.alloc_zeros::<bf16>(cols).unwrap();
        let mut g = c.benchmark_group(format!("bias_gelu/{}", dev.kind()));
        g.sample_size(10);
        let shape = format!("{rows}x{cols}_bf16");
        for (label, vectorize) in [("vec128", true), ("scalar", false)] {
            let op = BiasGelu::new(rows, cols)
                .with_gelu(Gelu::Tanh)
                .with_vectorize(vectorize);
            g.throughput(Throughput::Bytes((2 * n * 2) as u64));
            g.bench_function(
                BenchmarkId::new(format!("forward_{label}"), &shape),
                |bch| {
                    bch.iter(|| {
                        op.forward(&stream, &x, Some(&b), &mut y).unwrap();
                        stream.synchronize().unwrap();
                    })
                },
            );
            g.throughput(Throughput::Bytes((3 * n * 2) as u64));
            g.bench_function(
                BenchmarkId::new(format!("backward_{label}"), &shape),
                |bch| {
                    bch.iter(|| {
                        op.backward(&stream, &dy, &x, Some(&b), &mut dx, Some(&mut db))
                            .unwrap();
                        stream.synchronize().unwrap();
                    })
                },
            );
        }
        g.throughput(Throughput::Bytes((2 * n * 2) as u64));
        g.bench_function(BenchmarkId::new("copy", &shape), |bch| {
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
