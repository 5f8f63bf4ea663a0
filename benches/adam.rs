//! Fused multi-tensor AdamW (criterion) over a list of ~1M elements in 100
//! tensors of mixed sizes, on every available backend.
//!
//! Throughput is the HBM byte floor of the update (see cuda/adam.cu): p, m, v
//! read and written (24 B per element), the gradient read (4 B fp32, 2 B
//! bf16) and the model copy written (2 B bf16). Under the emulator the
//! numbers measure the emulator.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrotron::ops::adam::{AdamConfig, AdamScalars, AdamTensors, FusedAdam, Unscale};
use ferrotron::ops::multi_tensor::{GradRef, TensorRef};
use ferrotron::{BackendKind, Device, DeviceBuffer};
use half::bf16;

fn bench(c: &mut Criterion) {
    let mut devices = vec![Device::emu()];
    if let Ok(d) = Device::cuda(0) {
        devices.push(d);
    }
    for dev in devices {
        // ~1M elements on the emulator, ~30M on a GPU.
        let unit = match dev.kind() {
            BackendKind::Emu => 544usize,
            BackendKind::Cuda => 16_384,
        };
        let stream = dev.new_stream().unwrap();
        let sizes: Vec<usize> = (0..100)
            .map(|i| unit * [64, 1, 16, 3, 24, 7, 32, 1][i % 8] + i)
            .collect();
        let numel: usize = sizes.iter().sum();
        let mut p: Vec<DeviceBuffer<f32>> = sizes
            .iter()
            .map(|&n| dev.upload(&vec![0.5f32; n]).unwrap())
            .collect();
        let mut m: Vec<DeviceBuffer<f32>> =
            sizes.iter().map(|&n| dev.alloc_zeros(n).unwrap()).collect();
        let mut v: Vec<DeviceBuffer<f32>> =
            sizes.iter().map(|&n| dev.alloc_zeros(n).unwrap()).collect();
        let g32: Vec<DeviceBuffer<f32>> = sizes
            .iter()
            .map(|&n| dev.upload(&vec![1e-3f32; n]).unwrap())
            .collect();
        let g16: Vec<DeviceBuffer<bf16>> = sizes
            .iter()
            .map(|&n| dev.upload(&vec![bf16::from_f32(1e-3); n]).unwrap())
            .collect();
        let mut model: Vec<DeviceBuffer<bf16>> =
            sizes.iter().map(|&n| dev.alloc_zeros(n).unwrap()).collect();
        let wd = vec![0.01f32; sizes.len()];
        let mut adam = FusedAdam::new(AdamConfig::default()).unwrap();
        let mut scalars = AdamScalars::new(&stream, 1e-4).unwrap();

        let mut g = c.benchmark_group(format!("adam/{}", dev.kind()));
        g.sample_size(10);
        let label = format!("100_tensors_{}k_elements", numel >> 10);
        for (name, bf16_io, bytes) in [
            ("fp32_grads", false, 28 * numel),
            ("bf16_grads_bf16_model", true, 28 * numel),
        ] {
            g.throughput(Throughput::Bytes(bytes as u64));
            g.bench_function(BenchmarkId::new(name, &label), |b| {
                b.iter(|| {
                    let mut ps: Vec<&mut DeviceBuffer<f32>> = p.iter_mut().collect();
                    let mut ms: Vec<&mut DeviceBuffer<f32>> = m.iter_mut().collect();
                    let mut vs: Vec<&mut DeviceBuffer<f32>> = v.iter_mut().collect();
                    let gs: Vec<TensorRef<'_>> = if bf16_io {
                        g16.iter().map(TensorRef::from).collect()
                    } else {
                        g32.iter().map(TensorRef::from).collect()
                    };
                    let mut models: Vec<GradRef<'_>> =
                        model.iter_mut().map(GradRef::from).collect();
                    let mut t = AdamTensors {
                        params: &mut ps,
                        exp_avg: &mut ms,
                        exp_avg_sq: &mut vs,
                        grads: &gs,
                        model: bf16_io.then_some(models.as_mut_slice()),
                        weight_decay: &wd,
                    };
                    adam.step(&stream, &mut t, &mut scalars, None, Unscale::None)
                        .unwrap();
                    stream.synchronize().unwrap();
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
