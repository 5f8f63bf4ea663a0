//! Variable shapes (`PipelineExecutor::with_variable_shapes`): micro-batch
//! `mb` has `1 + (mb · 3) mod 5` rows, and stage `s` is a GEMM
//! `[rows, K_s] × [K_s, K_{s+1}]` with widths that change from stage to
//! stage, so every activation and gradient message has its own length (the
//! stages' `output_len`). For pp 2 and 4 and every schedule (1F1B,
//! interleaved vp 2, ZB-H1), m = 8: every micro-batch's loss and every
//! stage's weight gradient against an unpipelined float64 computation of
//! the same chain; forward-only runs (evaluation) give the same losses and
//! no gradient, with per-stream and grouped transfers. Errors: a loss gradient of the wrong length is an error
//! naming `loss_grad` on its rank, and every other rank fails within the
//! timeout instead of hanging; an input longer than `max_len` is an error
//! naming `input`; `max_len = 0` is refused.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::pipeline::{assert_losses, down, up, Data};
use common::ranks::{mm, mm_at, mm_bt, run_ranks, run_ranks_with_timeout};
use common::Rng;
use ferrotron::core::pipeline::{PipelineConfig, ScheduleKind};
use ferrotron::parallel::pipeline::{PipelineData, PipelineExecutor, PipelineStage};
use ferrotron::{DType, DeviceBuffer, Error, Result, Stream};

const M: usize = 8;

fn rows(mb: usize) -> usize {
    1 + (mb * 3) % 5
}

/// Width of stage `s`'s input (`s = stages`: the last output).
fn width(s: usize) -> usize {
    4 + 4 * (s % 3)
}

struct VarStage {
    /// Per chunk: (K_in, K_out, W `[K_in, K_out]`).
    w: Vec<(usize, usize, Vec<f64>)>,
    grad: Vec<Vec<f64>>,
    saved_x: HashMap<(usize, usize), Vec<f64>>,
    saved_dy: HashMap<(usize, usize), Vec<f64>>,
}

fn bad(message: String) -> Error {
    Error::Backend {
        backend: "test stage",
        message,
    }
}

impl PipelineStage<f32> for VarStage {
    fn forward(
        &mut self,
        stream: &Stream,
        chunk: usize,
        mb: usize,
        input: &DeviceBuffer<f32>,
        output: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let (ki, ko, w) = &self.w[chunk];
        let x = down(stream, input)?;
        if x.len() != rows(mb) * ki || output.len() != rows(mb) * ko {
            return Err(bad(format!(
                "micro-batch {mb}: input {} / output {} elements",
                x.len(),
                output.len()
            )));
        }
        up(stream, &mm(&x, w, rows(mb), *ko, *ki), output)?;
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
        let (ki, ko, w) = &self.w[chunk];
        let dy = down(stream, grad_output)?;
        if dy.len() != rows(mb) * ko || grad_input.len() != rows(mb) * ki {
            return Err(bad(format!(
                "micro-batch {mb}: dy {} / dx {} elements",
                dy.len(),
                grad_input.len()
            )));
        }
        up(stream, &mm_bt(&dy, w, rows(mb), *ki, *ko), grad_input)?;
        self.saved_dy.insert((chunk, mb), dy);
        Ok(())
    }

    fn backward_weight(&mut self, _stream: &Stream, chunk: usize, mb: usize) -> Result<()> {
        let (ki, ko, _) = &self.w[chunk];
        let x = self.saved_x.remove(&(chunk, mb)).expect("W after F");
        let dy = self.saved_dy.remove(&(chunk, mb)).expect("W after B");
        for (g, d) in self.grad[chunk]
            .iter_mut()
            .zip(mm_at(&x, &dy, *ki, *ko, rows(mb)))
        {
            *g += d;
        }
        Ok(())
    }

    fn output_len(&self, chunk: usize, _mb: usize, input_len: usize) -> usize {
        let (ki, ko, _) = &self.w[chunk];
        input_len / ki * ko
    }
}

/// Unpipelined float64 losses and summed weight gradients of the chain.
fn reference(w: &[Vec<f64>], xs: &[Vec<f32>]) -> (Vec<f64>, Vec<Vec<f64>>) {
    let s_n = w.len();
    let mut grads: Vec<Vec<f64>> = (0..s_n)
        .map(|s| vec![0.0; width(s) * width(s + 1)])
        .collect();
    let mut losses = Vec::new();
    for (mb, x) in xs.iter().enumerate() {
        let r = rows(mb);
        let mut acts = vec![x.iter().map(|&v| v as f64).collect::<Vec<f64>>()];
        for (s, ws) in w.iter().enumerate() {
            let y = mm(acts.last().unwrap(), ws, r, width(s + 1), width(s));
            acts.push(y);
        }
        let y = acts.last().unwrap();
        losses.push(0.5 * y.iter().map(|v| v * v).sum::<f64>());
        let mut dy = y.clone();
        for s in (0..s_n).rev() {
            for (g, d) in grads[s]
                .iter_mut()
                .zip(mm_at(&acts[s], &dy, width(s), width(s + 1), r))
            {
                *g += d;
            }
            dy = mm_bt(&dy, &w[s], r, width(s), width(s + 1));
        }
    }
    (losses, grads)
}

struct Problem {
    w: Vec<Vec<f64>>,
    xs: Vec<Vec<f32>>,
}

fn problem(stages: usize, rng: &mut Rng) -> Problem {
    let w = (0..stages)
        .map(|s| rng.tensor::<f32>(width(s) * width(s + 1), 0.4).1)
        .collect();
    let xs = (0..M)
        .map(|mb| rng.tensor::<f32>(rows(mb) * width(0), 1.0).0)
        .collect();
    Problem { w, xs }
}

fn stage_of(cfg: &PipelineConfig, p: &Problem, r: usize) -> VarStage {
    let (pp, vp) = (cfg.pp, cfg.vp());
    VarStage {
        w: (0..vp)
            .map(|ch| {
                let s = ch * pp + r;
                (width(s), width(s + 1), p.w[s].clone())
            })
            .collect(),
        grad: (0..vp)
            .map(|ch| vec![0.0; width(ch * pp + r) * width(ch * pp + r + 1)])
            .collect(),
        saved_x: HashMap::new(),
        saved_dy: HashMap::new(),
    }
}

/// The longest message of the problem.
fn max_len(stages: usize) -> usize {
    (0..M).map(rows).max().unwrap() * (0..=stages).map(width).max().unwrap()
}

fn check(pp: usize, kind: ScheduleKind, salt: u64) {
    check_mode(pp, kind, salt, false);
}

fn check_mode(pp: usize, kind: ScheduleKind, salt: u64, grouped: bool) {
    check_run(pp, kind, salt, grouped, false);
}

/// `forward_only`: the executor runs forwards only (evaluation): the
/// losses as in training, and no weight gradient.
fn check_run(pp: usize, kind: ScheduleKind, salt: u64, grouped: bool, forward_only: bool) {
    let cfg = PipelineConfig {
        pp,
        microbatches: M,
        kind,
    };
    let (mut rng, seed) = Rng::new(salt);
    let p = problem(cfg.stages(), &mut rng);
    let (ref_losses, ref_grads) = reference(&p.w, &p.xs);
    let outs = run_ranks_with_timeout(pp, Duration::from_secs(30), |c| -> Result<_> {
        let mut stage = stage_of(&cfg, &p, c.rank());
        let mut data = Data::new(&p.xs);
        let stream = c.device().new_stream()?;
        let mut ex = PipelineExecutor::new(&c, cfg, 1)?
            .with_timeout(Duration::from_secs(60))
            .with_variable_shapes(max_len(cfg.stages()))?
            .with_grouped_p2p(grouped)?;
        if forward_only {
            ex = ex.with_forward_only()?;
        }
        ex.run(&stream, &mut stage, &mut data)?;
        Ok((data.losses, stage.grad))
    });
    let what =
        format!("variable shapes, pp {pp} {kind:?} grouped {grouped} forward-only {forward_only}");
    let errors: Vec<String> = outs
        .iter()
        .enumerate()
        .filter_map(|(r, o)| o.as_ref().err().map(|e| format!("rank {r}: {e}")))
        .collect();
    assert!(errors.is_empty(), "{what}:\n{}", errors.join("\n"));
    for (r, out) in outs.into_iter().enumerate() {
        let (losses, grads) = out.unwrap_or_else(|e| panic!("{what}: rank {r}: {e}"));
        if r == pp - 1 {
            assert_losses(&what, seed, &losses, &ref_losses);
        }
        if forward_only {
            assert!(
                grads.iter().flatten().all(|&g| g == 0.0),
                "{what}: rank {r} has gradients"
            );
            continue;
        }
        for (ch, g) in grads.iter().enumerate() {
            let st = ch * pp + r;
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
fn variable_lengths_every_schedule() {
    for (i, pp) in [2, 4].into_iter().enumerate() {
        check(pp, ScheduleKind::OneFOneB, 60 + i as u64);
        check(pp, ScheduleKind::ZeroBubbleH1, 62 + i as u64);
    }
    check(
        2,
        ScheduleKind::Interleaved {
            vp: 2,
            group: Some(2),
        },
        64,
    );
    check(4, ScheduleKind::Interleaved { vp: 2, group: None }, 65);
}

#[test]
fn variable_lengths_grouped_transfers() {
    check_mode(4, ScheduleKind::OneFOneB, 70, true);
    check_mode(2, ScheduleKind::ZeroBubbleH1, 71, true);
    check_mode(
        2,
        ScheduleKind::Interleaved { vp: 2, group: None },
        72,
        true,
    );
    check_mode(
        4,
        ScheduleKind::Interleaved { vp: 2, group: None },
        73,
        true,
    );
}

/// Forward-only runs (evaluation; the GPT's mode over NCCL is variable
/// shapes with grouped transfers): every micro-batch's loss as in
/// training, no weight gradient, with both transfer modes.
#[test]
fn variable_lengths_forward_only() {
    for grouped in [false, true] {
        check_run(4, ScheduleKind::OneFOneB, 80, grouped, true);
        check_run(2, ScheduleKind::ZeroBubbleH1, 81, grouped, true);
        check_run(
            4,
            ScheduleKind::Interleaved { vp: 2, group: None },
            82,
            grouped,
            true,
        );
    }
}

/// Returns a loss gradient one element short for micro-batch 2.
struct ShortGrad<'a>(Data<'a>);

impl PipelineData<f32> for ShortGrad<'_> {
    fn input(&mut self, stream: &Stream, mb: usize) -> Result<DeviceBuffer<f32>> {
        self.0.input(stream, mb)
    }

    fn loss_grad(
        &mut self,
        stream: &Stream,
        mb: usize,
        output: &DeviceBuffer<f32>,
    ) -> Result<DeviceBuffer<f32>> {
        let g = self.0.loss_grad(stream, mb, output)?;
        if mb != 2 {
            return Ok(g);
        }
        let h = down(stream, &g)?;
        let mut short = stream.device().alloc_zeros(h.len() - 1)?;
        up(stream, &h[..h.len() - 1], &mut short)?;
        Ok(short)
    }
}

#[test]
fn wrong_gradient_length_is_a_named_error_on_every_rank() {
    let cfg = PipelineConfig {
        pp: 4,
        microbatches: M,
        kind: ScheduleKind::OneFOneB,
    };
    let (mut rng, _) = Rng::new(66);
    let p = problem(cfg.stages(), &mut rng);
    let start = Instant::now();
    let outs = run_ranks_with_timeout(4, Duration::from_secs(2), |c| -> Result<()> {
        let mut stage = stage_of(&cfg, &p, c.rank());
        let mut data = ShortGrad(Data::new(&p.xs));
        let stream = c.device().new_stream()?;
        PipelineExecutor::new(&c, cfg, 1)?
            .with_timeout(Duration::from_secs(6))
            .with_variable_shapes(max_len(cfg.stages()))?
            .run(&stream, &mut stage, &mut data)
    });
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
    for (r, out) in outs.into_iter().enumerate() {
        let e = match out {
            Ok(()) => panic!("rank {r} succeeded with a short loss gradient"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(&format!("pipeline rank {r}:")), "rank {r}: {e}");
        if r == 3 {
            assert!(e.contains("Backward of micro-batch 2"), "{e}");
            assert!(e.contains("argument `loss_grad`"), "{e}");
            let want = rows(2) * width(4);
            assert!(e.contains(&format!("expected {want} elements")), "{e}");
            assert!(e.contains(&format!("got {}", want - 1)), "{e}");
        }
    }
}

/// Grouped transfers agree on every length before the run, so the data
/// must say them: without `input_len` the first rank names it, the others
/// fail within the timeout instead of waiting for lengths forever.
#[test]
fn grouped_variable_shapes_need_input_len() {
    let cfg = PipelineConfig {
        pp: 2,
        microbatches: M,
        kind: ScheduleKind::OneFOneB,
    };
    let (mut rng, _) = Rng::new(67);
    let p = problem(cfg.stages(), &mut rng);
    let outs = run_ranks_with_timeout(2, Duration::from_secs(2), |c| -> Result<()> {
        let mut stage = stage_of(&cfg, &p, c.rank());
        let mut data = ShortGrad(Data::new(&p.xs));
        let stream = c.device().new_stream()?;
        PipelineExecutor::new(&c, cfg, 1)?
            .with_timeout(Duration::from_secs(4))
            .with_variable_shapes(max_len(cfg.stages()))?
            .with_grouped_p2p(true)?
            .run(&stream, &mut stage, &mut data)
    });
    for (r, out) in outs.into_iter().enumerate() {
        let e = match out {
            Ok(()) => panic!("rank {r} succeeded without input lengths"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(&format!("pipeline rank {r}:")), "rank {r}: {e}");
        assert!(e.contains("agreeing on message lengths"), "rank {r}: {e}");
        if r == 0 {
            assert!(e.contains("PipelineData::input_len"), "{e}");
        }
    }
}

#[test]
fn input_longer_than_max_len_and_zero_max_len() {
    let cfg = PipelineConfig {
        pp: 1,
        microbatches: M,
        kind: ScheduleKind::NoPipelining,
    };
    let (mut rng, _) = Rng::new(67);
    let p = problem(1, &mut rng);
    let outs = run_ranks(1, |c| -> Result<()> {
        let mut stage = stage_of(&cfg, &p, 0);
        let mut data = Data::new(&p.xs);
        let stream = c.device().new_stream()?;
        // Micro-batch 0 has 1 row (4 elements); micro-batch 1 has 4 rows.
        PipelineExecutor::new(&c, cfg, 1)?
            .with_variable_shapes(8)?
            .run(&stream, &mut stage, &mut data)
    });
    let e = outs[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("Forward of micro-batch 1"), "{e}");
    assert!(e.contains("argument `input`"), "{e}");
    assert!(e.contains("1..=8 elements (max_len)"), "{e}");
    let outs = run_ranks(1, |c| {
        PipelineExecutor::new(&c, cfg, 1)?
            .with_variable_shapes(0)
            .map(|_| ())
    });
    match &outs[0] {
        Err(Error::InvalidArgument { arg, .. }) => assert_eq!(*arg, "max_len"),
        other => panic!("expected an InvalidArgument on max_len, got {other:?}"),
    }
}
