//! The pipeline executor posts an operation's receive before the previous
//! computation, so the transfer overlaps it. pp = 2, 1F1B, m = 8, identity
//! stages: the last rank runs `F0 B0 F1 B1 …`, and `F(k+1)` receives
//! micro-batch `k + 1`'s activation from rank 0. Rank 0's forward of
//! micro-batch `k + 1` waits until rank 1 is inside its backward of `k`,
//! so that activation cannot have been sent before. Inside `B(k)`, rank 1
//! records an event on the communicator's stream (where receives run):
//! * 50 ms later the event is still pending — a receive was posted on that
//!   stream and waits for its send (without posting ahead the stream is
//!   idle and the event completes at once: the test fails);
//! * then it lets rank 0 go, and the event completes while `B(k)` is still
//!   running: the activation of `k + 1` arrived during the computation of
//!   `k`.
//!
//! With static shapes the pre-posted receive is the activation itself;
//! with variable shapes it is its shape message (the data's receive is
//! posted once the shape is known), checked the same way. The losses are
//! checked too (identity stages: `0.5 · ||x||²`).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::pipeline::Data;
use common::ranks::run_ranks_with_timeout;
use ferrotron::comm::Communicator;
use ferrotron::core::pipeline::{PipelineConfig, ScheduleKind};
use ferrotron::parallel::pipeline::{PipelineExecutor, PipelineStage};
use ferrotron::{DeviceBuffer, Error, Result, Stream};

const M: usize = 8;
const LEN: usize = 32;

struct Probe<'a> {
    comm: &'a Communicator,
    /// Rank 1 is inside its backward of micro-batch `flag − 1`.
    flag: &'a AtomicUsize,
    /// Rank 1, per micro-batch `k < M − 1`: (a receive was pending on the
    /// communicator's stream during `B(k)`, it completed during `B(k)`).
    seen: Vec<(usize, bool, bool)>,
}

fn err(message: String) -> Error {
    Error::Backend {
        backend: "test stage",
        message,
    }
}

impl PipelineStage<f32> for Probe<'_> {
    fn forward(
        &mut self,
        stream: &Stream,
        _chunk: usize,
        mb: usize,
        input: &DeviceBuffer<f32>,
        output: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        if self.comm.rank() == 0 && mb >= 1 {
            let deadline = Instant::now() + Duration::from_secs(20);
            while self.flag.load(Ordering::SeqCst) < mb {
                if Instant::now() > deadline {
                    return Err(err(format!("rank 1 never reached B({})", mb - 1)));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        stream.copy_device(input, output)
    }

    fn backward_input(
        &mut self,
        stream: &Stream,
        _chunk: usize,
        mb: usize,
        grad_output: &DeviceBuffer<f32>,
        grad_input: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        if self.comm.rank() == 1 && mb + 1 < M {
            let probe = self.comm.stream().record_event()?;
            std::thread::sleep(Duration::from_millis(50));
            let pending = !probe.is_complete()?;
            self.flag.store(mb + 1, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut arrived = false;
            while Instant::now() < deadline {
                if probe.is_complete()? {
                    arrived = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            self.seen.push((mb, pending, arrived));
        }
        stream.copy_device(grad_output, grad_input)
    }

    fn backward_weight(&mut self, _stream: &Stream, _chunk: usize, _mb: usize) -> Result<()> {
        Ok(())
    }
}

fn check(variable: bool) {
    let cfg = PipelineConfig {
        pp: 2,
        microbatches: M,
        kind: ScheduleKind::OneFOneB,
    };
    let xs: Vec<Vec<f32>> = (0..M)
        .map(|mb| (0..LEN).map(|i| ((i + 3 * mb) % 7) as f32 - 3.0).collect())
        .collect();
    let flag = AtomicUsize::new(0);
    let outs = run_ranks_with_timeout(2, Duration::from_secs(30), |c| -> Result<_> {
        let mut stage = Probe {
            comm: &c,
            flag: &flag,
            seen: Vec::new(),
        };
        let mut data = Data::new(&xs);
        let stream = c.device().new_stream()?;
        let mut ex = PipelineExecutor::new(&c, cfg, LEN)?.with_timeout(Duration::from_secs(60));
        if variable {
            ex = ex.with_variable_shapes(LEN)?;
        }
        ex.run(&stream, &mut stage, &mut data)?;
        Ok((stage.seen, data.losses))
    });
    let what = if variable {
        "variable shapes"
    } else {
        "static"
    };
    let (seen0, _) = outs[0]
        .as_ref()
        .unwrap_or_else(|e| panic!("{what}: rank 0: {e}"));
    assert!(seen0.is_empty());
    let (seen, losses) = outs[1]
        .as_ref()
        .unwrap_or_else(|e| panic!("{what}: rank 1: {e}"));
    assert_eq!(seen.len(), M - 1, "{what}: {seen:?}");
    for &(mb, pending, arrived) in seen {
        assert!(
            pending,
            "{what}: no receive was posted during the backward of micro-batch {mb}"
        );
        assert!(
            arrived,
            "{what}: the receive posted during the backward of micro-batch {mb} never completed \
             during it"
        );
    }
    for (mb, (l, x)) in losses.iter().zip(&xs).enumerate() {
        let want = 0.5 * x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>();
        assert_eq!(*l, Some(want), "{what}: loss of micro-batch {mb}");
    }
}

#[test]
fn next_receive_overlaps_the_computation() {
    check(false);
}

#[test]
fn next_shape_receive_overlaps_the_computation() {
    check(true);
}
