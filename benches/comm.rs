//! In-process collectives: bus bandwidth of all-reduce, all-gather and
//! reduce-scatter (nccl-tests' definition: all-reduce moves 2(n-1)/n of the
//! buffer per rank, the other two (n-1)/n), beside a plain memcpy of the same
//! size on this machine. On GPUs the NCCL path is NCCL itself.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferrotron::comm::{Communicator, ReduceOp};
use ferrotron::Device;

const BYTES: usize = 16 << 20;

#[derive(Clone, Copy)]
enum Op {
    AllReduce,
    AllGather,
    ReduceScatter,
}

/// Runs `iters` operations on every rank (one thread each); returns the wall time.
fn run(n: usize, op: Op, iters: u64) -> Duration {
    let devices: Vec<Device> = (0..n).map(|_| Device::emu()).collect();
    let comms = Communicator::in_process(&devices).unwrap();
    let elems = BYTES / 4;
    let t = std::sync::Mutex::new(Duration::ZERO);
    std::thread::scope(|s| {
        for c in comms {
            let t = &t;
            s.spawn(move || {
                let dev = c.device().clone();
                let st = dev.new_stream().unwrap();
                let big = dev.upload(&vec![1.0f32; elems]).unwrap();
                let mut out = dev.alloc_zeros::<f32>(elems).unwrap();
                let part_in = dev.alloc_zeros::<f32>(elems / n).unwrap();
                let mut part_out = dev.alloc_zeros::<f32>(elems / n).unwrap();
                c.barrier(&st).unwrap().synchronize().unwrap();
                let start = Instant::now();
                for _ in 0..iters {
                    match op {
                        Op::AllReduce => c.all_reduce(&st, &big, &mut out, ReduceOp::Sum).unwrap(),
                        Op::AllGather => c.all_gather(&st, &part_in, &mut out).unwrap(),
                        Op::ReduceScatter => c
                            .reduce_scatter(&st, &big, &mut part_out, ReduceOp::Sum)
                            .unwrap(),
                    };
                }
                st.synchronize().unwrap();
                let el = start.elapsed();
                let mut g = t.lock().unwrap();
                *g = (*g).max(el);
            });
        }
    });
    t.into_inner().unwrap()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("comm_in_process_16MiB");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(BYTES as u64));
    let src = vec![1u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    g.bench_function("memcpy", |b| {
        b.iter(|| dst.copy_from_slice(std::hint::black_box(&src)))
    });
    for n in [2usize, 4] {
        for (name, op, factor) in [
            ("all_reduce", Op::AllReduce, 2.0),
            ("all_gather", Op::AllGather, 1.0),
            ("reduce_scatter", Op::ReduceScatter, 1.0),
        ] {
            // Bus bytes per operation: factor * (n-1)/n * buffer.
            let bus = (factor * (n - 1) as f64 / n as f64 * BYTES as f64) as u64;
            g.throughput(Throughput::Bytes(bus));
            g.bench_function(format!("{name}_{n}ranks_busbw"), |b| {
                b.iter_custom(|iters| run(n, op, iters))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
