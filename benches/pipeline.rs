//! The pipeline executor (`parallel::pipeline`) on pp = 4 in-process ranks
//! of the CUDA EMULATOR (CPU threads):
//!
//! * (a) executor overhead: a 1F1B run whose stages only copy input to
//!   output (a tiny activation), as wall time per operation of a rank;
//! * (b) the measured bubble of stages of a known, uniform host cost (each
//!   pass sleeps: F = 2 ms, B = 4 ms, or B = W = 2 ms split; per chunk
//!   halved for interleaved vp = 2), m = 8, for 1F1B, interleaved (vp 2)
//!   and ZB-H1: `(makespan − busy) / busy` with `busy` the busiest rank's
//!   measured stage time, beside the simulator's prediction for the same
//!   costs and their ratio.
//!
//! These are emulator numbers: host time with 4 rank threads on however
//! many cores the machine has (sleeping stages do not compete for them).
//!
//!     cargo bench --bench pipeline
//!
//! Environment: `FTN_PIPELINE_REPS` (default 5) runs per case (median).

use std::sync::Barrier;
use std::time::{Duration, Instant};

use ferrotron::comm::Communicator;
use ferrotron::core::pipeline::simulate::{simulate, Costs};
use ferrotron::core::pipeline::{schedule, PipelineConfig, ScheduleKind};
use ferrotron::parallel::pipeline::{PipelineData, PipelineExecutor, PipelineStage};
use ferrotron::{Device, DeviceBuffer, Result, Stream};

const PP: usize = 4;

/// Host cost of each pass of one chunk (zero: copy only).
#[derive(Clone, Copy)]
struct Pass {
    f: Duration,
    b: Duration,
    w: Duration,
}

/// Copies input to output (forward) and grad_output to grad_input
/// (backward), sleeping the pass's cost first; sums the time spent.
struct SleepStage {
    cost: Pass,
    busy: Duration,
}

impl SleepStage {
    fn pass(&mut self, d: Duration) {
        if !d.is_zero() {
            let t = Instant::now();
            std::thread::sleep(d);
            self.busy += t.elapsed();
        }
    }
}

impl PipelineStage<f32> for SleepStage {
    fn forward(
        &mut self,
        stream: &Stream,
        _chunk: usize,
        _mb: usize,
        input: &DeviceBuffer<f32>,
        output: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        self.pass(self.cost.f);
        stream.copy_device(input, output)
    }

    fn backward_input(
        &mut self,
        stream: &Stream,
        _chunk: usize,
        _mb: usize,
        grad_output: &DeviceBuffer<f32>,
        grad_input: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        self.pass(self.cost.b);
        stream.copy_device(grad_output, grad_input)
    }

    fn backward_weight(&mut self, _stream: &Stream, _chunk: usize, _mb: usize) -> Result<()> {
        self.pass(self.cost.w);
        Ok(())
    }
}

/// Inputs and loss gradients from buffers made once (the pool keeps them).
struct Data {
    len: usize,
}

impl PipelineData<f32> for Data {
    fn input(&mut self, stream: &Stream, _mb: usize) -> Result<DeviceBuffer<f32>> {
        stream.device().alloc_zeros(self.len)
    }

    fn loss_grad(
        &mut self,
        stream: &Stream,
        _mb: usize,
        output: &DeviceBuffer<f32>,
    ) -> Result<DeviceBuffer<f32>> {
        let mut g = stream.device().alloc_zeros(self.len)?;
        stream.copy_device(output, &mut g)?;
        Ok(g)
    }
}

/// Per run: the makespan (first start to last end over the ranks) and the
/// busiest rank's stage time; `reps` runs on one set of communicators.
fn run(
    cfg: PipelineConfig,
    cost: Pass,
    len: usize,
    reps: usize,
    grouped: bool,
) -> Vec<(Duration, Duration)> {
    let devices: Vec<Device> = (0..PP).map(|_| Device::emu()).collect();
    let comms = Communicator::in_process(&devices).expect("communicator");
    let barrier = Barrier::new(PP);
    let per_rank: Vec<Vec<(Instant, Instant, Duration)>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let barrier = &barrier;
                s.spawn(move || {
                    let stream = c.device().new_stream().expect("stream");
                    let mut out = Vec::new();
                    for _ in 0..reps {
                        let mut stage = SleepStage {
                            cost,
                            busy: Duration::ZERO,
                        };
                        let mut data = Data { len };
                        let mut ex = PipelineExecutor::new(&c, cfg, len)
                            .and_then(|e| e.with_grouped_p2p(grouped))
                            .expect("executor");
                        barrier.wait();
                        let start = Instant::now();
                        ex.run(&stream, &mut stage, &mut data).expect("run");
                        stream.synchronize().expect("sync");
                        out.push((start, Instant::now(), stage.busy));
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    (0..reps)
        .map(|i| {
            let start = per_rank.iter().map(|r| r[i].0).min().unwrap();
            let end = per_rank.iter().map(|r| r[i].1).max().unwrap();
            let busy = per_rank.iter().map(|r| r[i].2).max().unwrap();
            (end - start, busy)
        })
        .collect()
}

fn median<T: PartialOrd + Copy>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: skip
    // the timing there.
    if !std::env::args().any(|a| a == "--bench") {
        println!("pipeline bench: run with `cargo bench --bench pipeline`");
        return;
    }
    let reps: usize = std::env::var("FTN_PIPELINE_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);

    // (a) executor overhead per operation.
    println!("(a) executor overhead, pp = {PP}, 1F1B, copy-only stages, emulator");
    println!(
        "{:>8} {:>4} {:>10} {:>8} {:>12} {:>12}",
        "p2p", "m", "act elems", "ops/rank", "run (ms)", "per op (us)"
    );
    let zero = Pass {
        f: Duration::ZERO,
        b: Duration::ZERO,
        w: Duration::ZERO,
    };
    for (grouped, (m, len)) in [false, true]
        .into_iter()
        .flat_map(|g| [(8, 256), (32, 256), (32, 16384)].map(|c| (g, c)))
    {
        let cfg = PipelineConfig {
            pp: PP,
            microbatches: m,
            kind: ScheduleKind::OneFOneB,
        };
        let ops = schedule(&cfg).expect("schedule")[0].len();
        let t = median(
            run(cfg, zero, len, reps, grouped)
                .into_iter()
                .map(|r| r.0)
                .collect(),
        );
        println!(
            "{:>8} {:>4} {:>10} {:>8} {:>12.3} {:>12.1}",
            if grouped { "grouped" } else { "streams" },
            m,
            len,
            ops,
            ms(t),
            ms(t) * 1e3 / ops as f64
        );
    }

    // (b) measured bubble vs the simulator.
    let (f, b) = (2.0, 4.0);
    let m = 8;
    println!();
    println!(
        "(b) bubble, pp = {PP}, m = {m}, F = {f} ms, B = {b} ms (ZB-H1: B = W = {} ms), \
         sleeping stages, median of {reps}",
        b / 2.0
    );
    println!(
        "{:<8} {:<16} {:>13} {:>10} {:>11} {:>12} {:>10}",
        "p2p", "schedule", "makespan (ms)", "busy (ms)", "measured", "predicted", "ratio"
    );
    let cases = [
        ("1F1B", ScheduleKind::OneFOneB),
        (
            "interleaved vp2",
            ScheduleKind::Interleaved { vp: 2, group: None },
        ),
        ("ZB-H1", ScheduleKind::ZeroBubbleH1),
    ];
    for (grouped, (name, kind)) in [false, true]
        .into_iter()
        .flat_map(|g| cases.map(|c| (g, c)))
    {
        let cfg = PipelineConfig {
            pp: PP,
            microbatches: m,
            kind,
        };
        // Per chunk: a rank's share of the layers split into vp chunks.
        let scale = 1.0 / cfg.vp() as f64;
        let costs = Costs::new(f, b, b / 2.0, b / 2.0).scaled(scale);
        let sim = simulate(&schedule(&cfg).expect("schedule"), &costs).expect("simulate");
        let d = |x: f64| Duration::from_secs_f64(x * 1e-3);
        let cost = match kind {
            ScheduleKind::ZeroBubbleH1 => Pass {
                f: d(costs.forward),
                b: d(costs.backward_input),
                w: d(costs.backward_weight),
            },
            // A full backward is backward_input then backward_weight.
            _ => Pass {
                f: d(costs.forward),
                b: d(costs.backward),
                w: Duration::ZERO,
            },
        };
        let runs = run(cfg, cost, 256, reps, grouped);
        let bubbles: Vec<f64> = runs
            .iter()
            .map(|(mk, busy)| (mk.as_secs_f64() - busy.as_secs_f64()) / busy.as_secs_f64())
            .collect();
        let bubble = median(bubbles);
        let mk = median(runs.iter().map(|r| r.0).collect());
        let busy = median(runs.iter().map(|r| r.1).collect());
        println!(
            "{:<8} {:<16} {:>13.2} {:>10.2} {:>11.4} {:>12.4} {:>10.3}",
            if grouped { "grouped" } else { "streams" },
            name,
            ms(mk),
            ms(busy),
            bubble,
            sim.bubble_fraction,
            bubble / sim.bubble_fraction
        );
    }
}
