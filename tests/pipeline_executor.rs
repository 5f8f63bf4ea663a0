//! The pipeline executor (`parallel::pipeline`) on in-process emulator ranks:
//! a chain of plain GEMM stages `y = x · W_s` (`W_s` `[H, H]`, micro-batch
//! `[ROWS, H]`, f32, host math through upload/download) with the loss
//! `0.5 · ||y||²` on the last stage, for pp = 1, 2, 4 and every valid
//! schedule (no pipelining, 1F1B, interleaved with vp = 2, ZB-H1), m = 8:
//! the loss of every micro-batch and every stage's weight gradient against
//! the unpipelined float64 computation; forward-only runs (evaluation) for
//! every schedule and transfer mode give the losses, release every saved
//! input and leave the gradients zero. Plus: a stage failing on
//! micro-batch 3 gives every rank an error naming its rank and a
//! micro-batch (the others through the communicator's timeout), a
//! configuration whose pp is not the communicator's size is refused, and
//! tied embeddings: with stage 0's `E` and the last stage's `Eᵀ` one
//! weight, `TiedEmbeddingGroup::allreduce` gives the first and last rank
//! the reference's summed `dE` (pp 2/4, 1F1B, interleaved, ZB-H1), leaves
//! middle ranks alone, is a no-op at pp = 1 and an error on mismatched
//! lengths.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::pipeline::{assert_losses, down, reference, up, Data};
use common::ranks::{mm, mm_at, mm_bt, run_ranks, run_ranks_with_timeout};
use common::Rng;
use ferrotron::core::pipeline::{PipelineConfig, ScheduleKind};
use ferrotron::parallel::pipeline::{
    allreduce_tied_grads, PipelineExecutor, PipelineStage, TiedEmbeddingGroup,
};
use ferrotron::{DType, DeviceBuffer, Error, Result, Stream};

const H: usize = 16;
const ROWS: usize = 4;
const M: usize = 8;
const LEN: usize = ROWS * H;

/// The chunks of one rank: weights, accumulated weight gradients, saved
/// inputs (until W) and output gradients (between B and W).
struct GemmStage {
    w: Vec<Vec<f64>>,
    grad: Vec<Vec<f64>>,
    saved_x: HashMap<(usize, usize), Vec<f64>>,
    saved_dy: HashMap<(usize, usize), Vec<f64>>,
    /// Fail the forward of (chunk, micro-batch).
    fail_at: Option<(usize, usize)>,
}

impl PipelineStage<f32> for GemmStage {
    fn forward(
        &mut self,
        stream: &Stream,
        chunk: usize,
        mb: usize,
        input: &DeviceBuffer<f32>,
        output: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        if self.fail_at == Some((chunk, mb)) {
            return Err(Error::Backend {
                backend: "test stage",
                message: "injected failure".into(),
            });
        }
        let x = down(stream, input)?;
        let y = mm(&x, &self.w[chunk], ROWS, H, H);
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
        // dx = dy · W^T (W [H, H] row-major: mm_bt with b = W as [n = H, k = H]).
        let dx = mm_bt(&dy, &self.w[chunk], ROWS, H, H);
        up(stream, &dx, grad_input)?;
        self.saved_dy.insert((chunk, mb), dy);
        Ok(())
    }

    fn backward_weight(&mut self, _stream: &Stream, chunk: usize, mb: usize) -> Result<()> {
        let x = self.saved_x.remove(&(chunk, mb)).expect("W after F");
        let dy = self.saved_dy.remove(&(chunk, mb)).expect("W after B");
        let dw = mm_at(&x, &dy, H, H, ROWS);
        for (g, d) in self.grad[chunk].iter_mut().zip(dw) {
            *g += d;
        }
        Ok(())
    }

    fn release(&mut self, chunk: usize, mb: usize) -> Result<()> {
        self.saved_x.remove(&(chunk, mb)).expect("release after F");
        Ok(())
    }
}

/// Rank `r`'s chunks of `p`'s stages (chunk `ch` is global stage
/// `ch · pp + r`), no gradients yet, failing at `fail_at` if given.
fn stage_of(
    cfg: &PipelineConfig,
    p: &Problem,
    r: usize,
    fail_at: Option<(usize, usize)>,
) -> GemmStage {
    let (pp, vp) = (cfg.pp, cfg.vp());
    GemmStage {
        w: (0..vp).map(|ch| p.w[ch * pp + r].clone()).collect(),
        grad: vec![vec![0.0; H * H]; vp],
        saved_x: HashMap::new(),
        saved_dy: HashMap::new(),
        fail_at,
    }
}

struct Problem {
    /// Per global stage.
    w: Vec<Vec<f64>>,
    xs: Vec<Vec<f32>>,
}

fn problem(stages: usize, rng: &mut Rng) -> Problem {
    let w = (0..stages)
        .map(|_| rng.tensor::<f32>(H * H, 0.3).1)
        .collect();
    let xs = (0..M).map(|_| rng.tensor::<f32>(LEN, 1.0).0).collect();
    Problem { w, xs }
}

/// Per rank: its losses (the last stage's rank has them) and its chunks'
/// weight gradients.
type RankOut = Result<(Vec<Option<f64>>, Vec<Vec<f64>>)>;

fn run_pipeline(
    cfg: PipelineConfig,
    p: &Problem,
    fail_at: Option<(usize, usize, usize)>,
    timeout: Option<Duration>,
    grouped: bool,
) -> Vec<RankOut> {
    let body = |c: ferrotron::comm::Communicator| -> RankOut {
        let r = c.rank();
        let fail = fail_at.and_then(|(rank, ch, mb)| (rank == r).then_some((ch, mb)));
        let mut stage = stage_of(&cfg, p, r, fail);
        let mut data = Data::new(&p.xs);
        let stream = c.device().new_stream()?;
        let mut ex = PipelineExecutor::new(&c, cfg, LEN)?.with_grouped_p2p(grouped)?;
        if let Some(t) = timeout {
            ex = ex.with_timeout(t * 3);
        }
        ex.run(&stream, &mut stage, &mut data)?;
        Ok((data.losses, stage.grad))
    };
    match timeout {
        Some(t) => run_ranks_with_timeout(cfg.pp, t, body),
        None => run_ranks(cfg.pp, body),
    }
}

fn check(pp: usize, kind: ScheduleKind, salt: u64) {
    check_mode(pp, kind, salt, false);
}

fn check_mode(pp: usize, kind: ScheduleKind, salt: u64, grouped: bool) {
    let cfg = PipelineConfig {
        pp,
        microbatches: M,
        kind,
    };
    let (mut rng, seed) = Rng::new(salt);
    let p = problem(cfg.stages(), &mut rng);
    let (ref_losses, ref_grads) = reference(&p.w, &p.xs, ROWS, H);
    // A deadlock fails after 30 s instead of the default 300 s.
    let outs = run_pipeline(cfg, &p, None, Some(Duration::from_secs(30)), grouped);
    let what = format!("pp {pp} {kind:?} grouped {grouped}");
    for (r, out) in outs.into_iter().enumerate() {
        let (losses, grads) = out.unwrap_or_else(|e| panic!("{what}: rank {r}: {e}"));
        if r == pp - 1 {
            assert_losses(&what, seed, &losses, &ref_losses);
        } else {
            assert!(
                losses.iter().all(Option::is_none),
                "{what}: rank {r} has losses"
            );
        }
        for (ch, g) in grads.iter().enumerate() {
            let st = ch * pp + r;
            // Several f32 roundings (one per stage and direction).
            common::assert_close_scaled(
                &format!("{what}: dW of stage {st}"),
                DType::F32,
                seed,
                g,
                &ref_grads[st],
                10.0,
            );
        }
    }
}

#[test]
fn no_pipelining_pp1() {
    check(1, ScheduleKind::NoPipelining, 1);
}

#[test]
fn one_f_one_b() {
    for (i, pp) in [1, 2, 4].into_iter().enumerate() {
        check(pp, ScheduleKind::OneFOneB, 10 + i as u64);
    }
}

#[test]
fn interleaved_vp2() {
    check(
        2,
        ScheduleKind::Interleaved {
            vp: 2,
            group: Some(2),
        },
        20,
    );
    check(4, ScheduleKind::Interleaved { vp: 2, group: None }, 21);
}

/// Grouped transfers (the NCCL mode): the in-process backend's sends are
/// rendezvous and one stream runs one group at a time, which is exactly
/// the worst case the plan is made for.
#[test]
fn grouped_transfers_every_schedule() {
    check_mode(1, ScheduleKind::NoPipelining, 40, true);
    for (i, pp) in [2, 4].into_iter().enumerate() {
        let i = i as u64;
        check_mode(pp, ScheduleKind::OneFOneB, 41 + i, true);
        check_mode(pp, ScheduleKind::ZeroBubbleH1, 43 + i, true);
        check_mode(
            pp,
            ScheduleKind::Interleaved { vp: 2, group: None },
            45 + i,
            true,
        );
    }
    check_mode(
        2,
        ScheduleKind::Interleaved {
            vp: 3,
            group: Some(2),
        },
        47,
        true,
    );
}

#[test]
fn zero_bubble_h1() {
    for (i, pp) in [1, 2, 4].into_iter().enumerate() {
        check(pp, ScheduleKind::ZeroBubbleH1, 30 + i as u64);
    }
}

#[test]
fn stage_error_reaches_every_rank() {
    for grouped in [false, true] {
        stage_error_reaches_every_rank_in(grouped);
    }
}

fn stage_error_reaches_every_rank_in(grouped: bool) {
    let cfg = PipelineConfig {
        pp: 4,
        microbatches: M,
        kind: ScheduleKind::OneFOneB,
    };
    let (mut rng, _) = Rng::new(40);
    let p = problem(cfg.stages(), &mut rng);
    let start = std::time::Instant::now();
    // Rank 1's forward of micro-batch 3 fails.
    let outs = run_pipeline(
        cfg,
        &p,
        Some((1, 0, 3)),
        Some(Duration::from_secs(2)),
        grouped,
    );
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
    for (r, out) in outs.into_iter().enumerate() {
        let e = match out {
            Ok(_) => panic!("rank {r} succeeded although rank 1 failed"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains(&format!("pipeline rank {r}:")),
            "grouped {grouped}: rank {r}: {e}"
        );
        assert!(e.contains("micro-batch"), "rank {r}: {e}");
        if r == 1 {
            assert!(e.contains("Forward of micro-batch 3"), "rank {r}: {e}");
            assert!(e.contains("injected failure"), "rank {r}: {e}");
        }
    }
}

#[test]
fn pp_must_match_the_communicator() {
    let cfg = PipelineConfig {
        pp: 4,
        microbatches: M,
        kind: ScheduleKind::OneFOneB,
    };
    let errs = run_ranks(2, |c| PipelineExecutor::new(&c, cfg, LEN).map(|_| ()));
    for e in errs {
        match e {
            Err(Error::InvalidArgument { arg, got, .. }) => {
                assert_eq!(arg, "cfg.pp");
                assert_eq!(got, "4");
            }
            other => panic!("expected an InvalidArgument on cfg.pp, got {other:?}"),
        }
    }
}

fn transpose(a: &[f64]) -> Vec<f64> {
    (0..H * H).map(|i| a[(i % H) * H + i / H]).collect()
}

/// Tied embeddings: stage 0's weight `E` and the last stage's `Eᵀ` are one
/// parameter. After the run, rank 0 holds `dE` of stage 0, the last rank
/// `dE` of the last stage (its `dWᵀ`); `TiedEmbeddingGroup::allreduce`
/// gives both the sum, the gradient of the shared weight in the
/// unpipelined reference; middle ranks' buffers stay as they were.
fn check_tied(pp: usize, kind: ScheduleKind, salt: u64) {
    let cfg = PipelineConfig {
        pp,
        microbatches: M,
        kind,
    };
    let (mut rng, seed) = Rng::new(salt);
    let mut p = problem(cfg.stages(), &mut rng);
    let last = cfg.stages() - 1;
    p.w[last] = transpose(&p.w[0]);
    let (_, ref_grads) = reference(&p.w, &p.xs, ROWS, H);
    let tied_ref: Vec<f64> = ref_grads[0]
        .iter()
        .zip(transpose(&ref_grads[last]))
        .map(|(a, b)| a + b)
        .collect();
    let outs = run_ranks_with_timeout(pp, Duration::from_secs(30), |c| -> Result<_> {
        let (r, vp) = (c.rank(), cfg.vp());
        let mut stage = stage_of(&cfg, &p, r, None);
        let mut data = Data::new(&p.xs);
        let stream = c.device().new_stream()?;
        PipelineExecutor::new(&c, cfg, LEN)?
            .with_timeout(Duration::from_secs(60))
            .run(&stream, &mut stage, &mut data)?;
        let group = TiedEmbeddingGroup::new(&c)?;
        // Rank 0: stage 0's dE; last rank: the last stage's dWᵀ = its dE.
        let before = if r == pp - 1 {
            transpose(&stage.grad[vp - 1])
        } else {
            stage.grad[0].clone()
        };
        let host: Vec<f32> = before.iter().map(|&v| v as f32).collect();
        let mut buf = c.device().upload(&host)?;
        group.allreduce(&stream, &mut buf, Duration::from_secs(30))?;
        Ok((group.is_member(), before, down(&stream, &buf)?))
    });
    let what = format!("tied pp {pp} {kind:?}");
    for (r, out) in outs.into_iter().enumerate() {
        let (member, before, after) = out.unwrap_or_else(|e| panic!("{what}: rank {r}: {e}"));
        assert_eq!(member, r == 0 || r == pp - 1, "{what}: rank {r}");
        if member {
            // One part alone is far from the sum: the check can fail.
            assert!(
                common::rel_err(&before, &tied_ref) > 1e-2,
                "{what}: rank {r}"
            );
            common::assert_close_scaled(
                &format!("{what}: rank {r}: tied dE"),
                DType::F32,
                seed,
                &after,
                &tied_ref,
                10.0,
            );
        } else {
            let b32: Vec<f64> = before.iter().map(|&v| v as f32 as f64).collect();
            assert_eq!(after, b32, "{what}: middle rank {r} changed");
        }
    }
}

#[test]
fn tied_embedding_grads() {
    check_tied(2, ScheduleKind::OneFOneB, 50);
    check_tied(4, ScheduleKind::OneFOneB, 51);
    check_tied(
        2,
        ScheduleKind::Interleaved {
            vp: 2,
            group: Some(2),
        },
        52,
    );
    check_tied(4, ScheduleKind::ZeroBubbleH1, 53);
}

#[test]
fn tied_embedding_grads_noop_and_mismatch() {
    // pp = 1: nothing to exchange, the buffer is unchanged.
    let outs = run_ranks(1, |c| -> Result<Vec<f32>> {
        let stream = c.device().new_stream()?;
        let mut buf = c.device().upload(&[1.0f32, 2.0, 3.0])?;
        allreduce_tied_grads(&c, &stream, &mut buf)?;
        let mut h = vec![0.0f32; 3];
        stream.copy_to_host(&buf, &mut h)?;
        Ok(h)
    });
    assert_eq!(outs[0].as_ref().unwrap(), &vec![1.0, 2.0, 3.0]);
    // Different lengths on the first and last rank: an error on both, no hang.
    let outs = run_ranks_with_timeout(3, Duration::from_secs(2), |c| -> Result<()> {
        let stream = c.device().new_stream()?;
        let group = TiedEmbeddingGroup::new(&c)?;
        let mut buf = c.device().alloc_zeros::<f32>(4 + c.rank())?;
        group.allreduce(&stream, &mut buf, Duration::from_secs(10))
    });
    for (r, out) in outs.into_iter().enumerate() {
        match (r, out) {
            (1, Ok(())) => {}
            (1, Err(e)) => panic!("middle rank: {e}"),
            (_, Ok(())) => panic!("rank {r}: mismatched lengths accepted"),
            (_, Err(e)) => {
                let e = e.to_string();
                assert!(e.contains(&format!("pipeline rank {r}:")), "{e}");
                assert!(e.contains("tied embedding gradient"), "{e}");
            }
        }
    }
}

/// Forward-only runs (`with_forward_only`, evaluation) for every schedule,
/// with per-stream and grouped rendezvous transfers: every micro-batch's
/// loss equals the float64 reference's (through `PipelineData`'s default
/// `forward_loss`), each forward's saved input is released, and no
/// backward runs (the weight gradients stay zero).
#[test]
fn forward_only_runs_give_the_losses_and_no_gradients() {
    let kinds = [
        (1, ScheduleKind::NoPipelining),
        (2, ScheduleKind::OneFOneB),
        (4, ScheduleKind::OneFOneB),
        (4, ScheduleKind::ZeroBubbleH1),
        (
            2,
            ScheduleKind::Interleaved {
                vp: 2,
                group: Some(2),
            },
        ),
        (4, ScheduleKind::Interleaved { vp: 2, group: None }),
    ];
    for (i, (pp, kind)) in kinds.into_iter().enumerate() {
        for grouped in [false, true] {
            let cfg = PipelineConfig {
                pp,
                microbatches: M,
                kind,
            };
            let (mut rng, seed) = Rng::new(60 + i as u64);
            let p = problem(cfg.stages(), &mut rng);
            let (ref_losses, _) = reference(&p.w, &p.xs, ROWS, H);
            let what = format!("forward-only pp {pp} {kind:?} grouped {grouped}");
            let outs = run_ranks_with_timeout(
                pp,
                Duration::from_secs(30),
                |c| -> Result<Vec<Option<f64>>> {
                    let (r, vp) = (c.rank(), cfg.vp());
                    let mut stage = stage_of(&cfg, &p, r, None);
                    let mut data = Data::new(&p.xs);
                    let stream = c.device().new_stream()?;
                    let mut ex = PipelineExecutor::new(&c, cfg, LEN)?
                        .with_grouped_p2p(grouped)?
                        .with_forward_only()?
                        .with_timeout(Duration::from_secs(90));
                    assert!(ex.is_forward_only());
                    assert_eq!(
                        ex.ops().len(),
                        vp * M,
                        "{what}: one forward per chunk and micro-batch"
                    );
                    ex.run(&stream, &mut stage, &mut data)?;
                    assert!(stage.saved_x.is_empty(), "{what}: rank {r} kept inputs");
                    assert!(
                        stage.grad.iter().flatten().all(|&g| g == 0.0),
                        "{what}: rank {r} has gradients"
                    );
                    Ok(data.losses)
                },
            );
            for (r, out) in outs.into_iter().enumerate() {
                let losses = out.unwrap_or_else(|e| panic!("{what}: rank {r}: {e}"));
                if r + 1 < pp {
                    assert!(losses.iter().all(Option::is_none), "{what}: rank {r}");
                    continue;
                }
                assert_losses(&what, seed, &losses, &ref_losses);
            }
        }
    }
}
