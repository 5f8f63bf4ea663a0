//! The pipeline executor combined with tensor parallelism on 4 in-process
//! emulator ranks, pp = 2 × tp = 2: the world communicator is split along
//! the rank grid into pipeline groups (`Axis::Pp`) and tensor-parallel
//! groups (`Axis::Tp`). Every stage is a column-parallel GEMM `y = x · W_s`
//! (`W_s` `[H, H]`): tp rank `t` holds the columns `t·H/2 ..` of `W_s`,
//! computes its half of `y` and all-gathers the halves over its tp group;
//! the backward all-reduces the partial `dx = dy_t · W_tᵀ` and keeps
//! `dW_t = xᵀ · dy_t`. Loss `0.5 · ||y||²` on the last stage, m = 8, for
//! 1F1B, interleaved (vp 2) and ZB-H1: every micro-batch's loss (on both tp
//! ranks of the last stage) and every shard of every stage's weight gradient
//! against the unpipelined, unsharded float64 computation.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::pipeline::{down, reference, up, Data};
use common::ranks::{mm, mm_at, mm_bt, run_ranks_with_timeout};
use common::{assert_close, Rng};
use ferrotron::comm::{Communicator, ReduceOp};
use ferrotron::core::pipeline::{PipelineConfig, ScheduleKind};
use ferrotron::core::rank_grid::{Axis, RankGrid, RankOrder};
use ferrotron::parallel::pipeline::{PipelineExecutor, PipelineStage};
use ferrotron::{DType, DeviceBuffer, Result, Stream};

const PP: usize = 2;
const TP: usize = 2;
const H: usize = 16;
const HT: usize = H / TP;
const ROWS: usize = 4;
const M: usize = 8;
const LEN: usize = ROWS * H;

/// Columns `t·HT ..` of a row-major `[rows, H]` matrix.
fn cols(a: &[f64], rows: usize, t: usize) -> Vec<f64> {
    (0..rows)
        .flat_map(|i| a[i * H + t * HT..i * H + (t + 1) * HT].iter().copied())
        .collect()
}

/// One pipeline rank's chunks, sharded over its tp group. Buffers for the
/// collectives are allocated once (no frees while sends are in flight).
struct TpGemmStage<'c> {
    tp: &'c Communicator,
    /// Per chunk: this tp rank's columns of W, `[H, HT]`.
    w: Vec<Vec<f64>>,
    grad: Vec<Vec<f64>>,
    saved_x: HashMap<(usize, usize), Vec<f64>>,
    saved_dy: HashMap<(usize, usize), Vec<f64>>,
    local: DeviceBuffer<f32>,
    gathered: DeviceBuffer<f32>,
    partial: DeviceBuffer<f32>,
    timeout: Duration,
}

impl PipelineStage<f32> for TpGemmStage<'_> {
    fn forward(
        &mut self,
        stream: &Stream,
        chunk: usize,
        mb: usize,
        input: &DeviceBuffer<f32>,
        output: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let x = down(stream, input)?;
        let y_t = mm(&x, &self.w[chunk], ROWS, HT, H);
        up(stream, &y_t, &mut self.local)?;
        let h = self
            .tp
            .all_gather(stream, &self.local, &mut self.gathered)?;
        self.tp.wait(&h, self.timeout)?;
        // gathered: [TP][ROWS, HT] -> y [ROWS, H].
        let g = down(stream, &self.gathered)?;
        let mut y = vec![0.0; LEN];
        for t in 0..TP {
            for i in 0..ROWS {
                for j in 0..HT {
                    y[i * H + t * HT + j] = g[t * ROWS * HT + i * HT + j];
                }
            }
        }
        up(stream, &y, output)?;
        self.saved_x.insert((chunk, mb), x);
        Ok(())
    }

    fn backward_input(
        &mut self,
        stream: &Stream,
        chunk: usize,
        mb: usize,
        grad_output: &DeviceBuffer<f32>,
        grad_input: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let dy = down(stream, grad_output)?;
        let dy_t = cols(&dy, ROWS, self.tp.rank());
        // dx = dy_t · W_tᵀ, summed over the tp group.
        let dx = mm_bt(&dy_t, &self.w[chunk], ROWS, H, HT);
        up(stream, &dx, &mut self.partial)?;
        let h = self
            .tp
            .all_reduce(stream, &self.partial, grad_input, ReduceOp::Sum)?;
        self.tp.wait(&h, self.timeout)?;
        self.saved_dy.insert((chunk, mb), dy_t);
        Ok(())
    }

    fn backward_weight(&mut self, _stream: &Stream, chunk: usize, mb: usize) -> Result<()> {
        let x = self.saved_x.remove(&(chunk, mb)).expect("W after F");
        let dy_t = self.saved_dy.remove(&(chunk, mb)).expect("W after B");
        let dw = mm_at(&x, &dy_t, H, HT, ROWS);
        for (g, d) in self.grad[chunk].iter_mut().zip(dw) {
            *g += d;
        }
        Ok(())
    }
}

/// Per world rank: (pp rank, tp rank, losses, per-chunk dW shards).
type RankOut = Result<(usize, usize, Vec<Option<f64>>, Vec<Vec<f64>>)>;

fn check(kind: ScheduleKind, salt: u64) {
    let cfg = PipelineConfig {
        pp: PP,
        microbatches: M,
        kind,
    };
    let (mut rng, seed) = Rng::new(salt);
    let w: Vec<Vec<f64>> = (0..cfg.stages())
        .map(|_| rng.tensor::<f32>(H * H, 0.3).1)
        .collect();
    let xs: Vec<Vec<f32>> = (0..M).map(|_| rng.tensor::<f32>(LEN, 1.0).0).collect();
    let (ref_losses, ref_grads) = reference(&w, &xs, ROWS, H);
    let grid = RankGrid::new(PP * TP, TP, 1, PP, RankOrder::TpCpEpDpPp).unwrap();
    // A deadlock fails after 30 s instead of the default 300 s.
    let timeout = Duration::from_secs(30);
    let outs = run_ranks_with_timeout(PP * TP, timeout, |world| -> RankOut {
        let coords = grid.coords(world.rank())?;
        let pp_comm = world.split_for_grid(&grid, &[Axis::Pp])?;
        let tp_comm = world.split_for_grid(&grid, &[Axis::Tp])?;
        assert_eq!((pp_comm.size(), tp_comm.size()), (PP, TP));
        assert_eq!((pp_comm.rank(), tp_comm.rank()), (coords.pp, coords.tp));
        let (r, t) = (pp_comm.rank(), tp_comm.rank());
        let dev = world.device().clone();
        let vp = cfg.vp();
        let mut stage = TpGemmStage {
            tp: &tp_comm,
            w: (0..vp).map(|ch| cols(&w[ch * PP + r], H, t)).collect(),
            grad: vec![vec![0.0; H * HT]; vp],
            saved_x: HashMap::new(),
            saved_dy: HashMap::new(),
            local: dev.alloc_zeros(ROWS * HT)?,
            gathered: dev.alloc_zeros(LEN)?,
            partial: dev.alloc_zeros(LEN)?,
            timeout,
        };
        let mut data = Data::new(&xs);
        let stream = dev.new_stream()?;
        let mut ex = PipelineExecutor::new(&pp_comm, cfg, LEN)?.with_timeout(timeout * 3);
        ex.run(&stream, &mut stage, &mut data)?;
        Ok((r, t, data.losses, stage.grad))
    });
    let what = format!("pp {PP} x tp {TP} {kind:?}");
    let mut seen = Vec::new();
    for (rank, out) in outs.into_iter().enumerate() {
        let (r, t, losses, grads) = out.unwrap_or_else(|e| panic!("{what}: rank {rank}: {e}"));
        seen.push((r, t));
        if r == PP - 1 {
            let l: Vec<f64> = losses
                .iter()
                .map(|l| l.unwrap_or_else(|| panic!("{what}: a micro-batch without loss")))
                .collect();
            assert_close(
                &format!("{what}: losses of tp rank {t}"),
                DType::F32,
                seed,
                &l,
                &ref_losses,
            );
        } else {
            assert!(
                losses.iter().all(Option::is_none),
                "{what}: pp rank {r} has losses"
            );
        }
        for (ch, g) in grads.iter().enumerate() {
            let st = ch * PP + r;
            common::assert_close_scaled(
                &format!("{what}: dW of stage {st}, tp shard {t}"),
                DType::F32,
                seed,
                g,
                &cols(&ref_grads[st], H, t),
                10.0,
            );
        }
    }
    seen.sort();
    assert_eq!(seen, vec![(0, 0), (0, 1), (1, 0), (1, 1)], "{what}");
}

#[test]
fn one_f_one_b_tp2() {
    check(ScheduleKind::OneFOneB, 50);
}

#[test]
fn interleaved_vp2_tp2() {
    check(
        ScheduleKind::Interleaved {
            vp: 2,
            group: Some(2),
        },
        51,
    );
}

#[test]
fn zero_bubble_h1_tp2() {
    check(ScheduleKind::ZeroBubbleH1, 52);
}
