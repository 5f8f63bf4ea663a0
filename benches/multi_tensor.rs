//! Multi-tensor unscale, L2 norm and clip over 100 gradients of mixed sizes
//! and dtypes (criterion), on every available backend.
//!
//! Throughput is the HBM byte floor of each kernel (see cuda/multi_tensor.cu):
//! unscale and clip read + write every element, the norm reads every element
//! once. Under the emulator the numbers measure the emulator; on a GPU set
//! them against the device-to-device `copy` entry of the same run.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrotron::ops::multi_tensor::{GradRef, MultiTensor, TensorRef};
use ferrotron::{BackendKind, Device, DeviceBuffer};
use half::{bf16, f16};

enum Buf {
    F32(DeviceBuffer<f32>),
    F16(DeviceBuffer<f16>),
    BF16(DeviceBuffer<bf16>),
}

impl Buf {
    fn grad(&mut self) -> GradRef<'_> {
        match self {
            Buf::F32(b) => b.into(),
            Buf::F16(b) => b.into(),
            Buf::BF16(b) => b.into(),
        }
    }
    fn tensor(&self) -> TensorRef<'_> {
        match self {
            Buf::F32(b) => b.into(),
            Buf::F16(b) => b.into(),
            Buf::BF16(b) => b.into(),
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut devices = vec![Device::emu()];
    if let Ok(d) = Device::cuda(0) {
        devices.push(d);
    }
    for dev in devices {
        // 100 tensors: sizes cycle over a spread (a layer's weights, biases,
        // norms), dtypes cycle fp32 / bf16 / fp16.
        let unit = match dev.kind() {
            BackendKind::Emu => 256usize,
            BackendKind::Cuda => 65_536,
        };
        let stream = dev.new_stream().unwrap();
        let mut bufs = Vec::new();
        let mut bytes = 0usize;
        for i in 0..100 {
            let n = unit * [64, 1, 16, 3, 256, 7, 32, 1][i % 8] + i;
            bufs.push(match i % 3 {
                0 => {
                    bytes += 4 * n;
                    Buf::F32(dev.upload(&vec![0.5f32; n]).unwrap())
                }
                1 => {
                    bytes += 2 * n;
                    Buf::BF16(dev.upload(&vec![bf16::from_f32(0.5); n]).unwrap())
                }
                _ => {
                    bytes += 2 * n;
                    Buf::F16(dev.upload(&vec![f16::from_f32(0.5); n]).unwrap())
                }
            });
        }
        let mut found = dev.alloc_zeros::<f32>(1).unwrap();
        let mut norm = dev.alloc_zeros::<f32>(1).unwrap();
        let mut mt = MultiTensor::new();
        let mut g = c.benchmark_group(format!("multi_tensor/{}", dev.kind()));
        g.sample_size(10);
        let label = format!("100_tensors_{}MB", bytes >> 20);

        g.throughput(Throughput::Bytes(2 * bytes as u64));
        g.bench_function(BenchmarkId::new("unscale", &label), |b| {
            b.iter(|| {
                let mut grads: Vec<GradRef<'_>> = bufs.iter_mut().map(Buf::grad).collect();
                // scale 1: values stay put across iterations.
                mt.unscale(&stream, &mut grads, 1.0, &mut found).unwrap();
                stream.synchronize().unwrap();
            })
        });

        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(BenchmarkId::new("l2_norm", &label), |b| {
            b.iter(|| {
                let views: Vec<TensorRef<'_>> = bufs.iter().map(Buf::tensor).collect();
                mt.l2_norm(&stream, &views, &mut norm).unwrap();
                stream.synchronize().unwrap();
            })
        });

        // max_norm just below the norm: clips by ~1 every time (values
        // shrink by < 1e-6 per iteration).
        let views: Vec<TensorRef<'_>> = bufs.iter().map(Buf::tensor).collect();
        mt.l2_norm(&stream, &views, &mut norm).unwrap();
        drop(views);
        let max_norm = norm.to_host().unwrap()[0] as f64 * (1.0 - 1e-6);
        g.throughput(Throughput::Bytes(2 * bytes as u64));
        g.bench_function(BenchmarkId::new("clip", &label), |b| {
            b.iter(|| {
                let mut grads: Vec<GradRef<'_>> = bufs.iter_mut().map(Buf::grad).collect();
                mt.clip_by_norm(&stream, &mut grads, &norm, max_norm)
                    .unwrap();
                stream.synchronize().unwrap();
            })
        });

        // Reference: a device copy of the first (fp32) tensor, 8 B/element moved.
        if let Buf::F32(src) = &bufs[0] {
            let mut dst = dev.alloc_zeros::<f32>(src.len()).unwrap();
            g.throughput(Throughput::Bytes(8 * src.len() as u64));
            g.bench_function(
                BenchmarkId::new("copy", format!("{}KB", (4 * src.len()) >> 10)),
                |b| {
                    b.iter(|| {
                        stream.copy_device(src, &mut dst).unwrap();
                        stream.synchronize().unwrap();
                    })
                },
            );
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
