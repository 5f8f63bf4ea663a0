//! The emulator's speed on a synchronisation-heavy kernel: a 1024 x 1024
//! row reduction (warp shuffles + shared memory + barriers; one block of 256
//! threads per row), on one worker thread and on all of them. The target
//! (docs/testing.md, "The emulator's role"): under 0.5 s on one core (the fibers' context switch is what
//! decides this; swapcontext took 7.6 s).

use criterion::{criterion_group, criterion_main, Criterion};

#[link(name = "ftn_emu_selftest", kind = "static")]
extern "C" {
    fn ftn_emu_bench_row_reduce(rows: u32, cols: u32, workers: u32) -> f64;
}

// The emulator runtime the bench kernel launches through.
use ferrotron as _;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("emulator");
    g.sample_size(10);
    let all = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    for workers in [1u32, all] {
        g.bench_function(format!("row_reduce_1024x1024_{workers}_workers"), |b| {
            b.iter(|| {
                // SAFETY: plain values in, a checksum out (NaN on failure).
                let checksum = unsafe { ftn_emu_bench_row_reduce(1024, 1024, workers) };
                assert!(checksum.is_finite(), "row-reduce kernel failed");
                checksum
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
