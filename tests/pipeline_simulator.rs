//! The pipeline simulator and its pictures (`core::pipeline::{simulate,
//! render}`): exact timelines of small hand-built schedules, the textbook
//! bubble and in-flight numbers of a hand-built 1F1B, every way a schedule
//! can fail to complete reported as an error, the SVG and ASCII pictures;
//! and the textbook numbers of the real schedules (`core::pipeline::schedule`).

use ferrotron::core::pipeline::render::{ascii, svg};
use ferrotron::core::pipeline::{
    schedule, simulate, Costs, Message, Op, Pass, Payload, PipelineConfig, ScheduleKind, Simulation,
};

const EPS: f64 = 1e-9;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= EPS * (1.0 + a.abs().max(b.abs()))
}

fn op(pass: Pass, microbatch: usize, stage: usize) -> Op {
    Op {
        pass,
        microbatch,
        chunk: 0,
        stage,
        recv: None,
        send: None,
    }
}

fn msg(peer: usize, payload: Payload, microbatch: usize, from_stage: usize) -> Message {
    Message {
        peer,
        payload,
        microbatch,
        from_stage,
    }
}

/// A forward on `rank` (= stage) of a `pp`-rank pipeline, with its messages.
fn fwd(rank: usize, pp: usize, mb: usize) -> Op {
    Op {
        recv: (rank > 0).then(|| msg(rank - 1, Payload::Activation, mb, rank - 1)),
        send: (rank + 1 < pp).then(|| msg(rank + 1, Payload::Activation, mb, rank)),
        ..op(Pass::Forward, mb, rank)
    }
}

/// A backward (`pass`: full or input-gradient) on `rank`, with its messages.
fn bwd(pass: Pass, rank: usize, pp: usize, mb: usize) -> Op {
    Op {
        recv: (rank + 1 < pp).then(|| msg(rank + 1, Payload::Gradient, mb, rank + 1)),
        send: (rank > 0).then(|| msg(rank - 1, Payload::Gradient, mb, rank)),
        ..op(pass, mb, rank)
    }
}

/// Megatron's non-interleaved 1F1B, built by hand.
fn one_f_one_b(pp: usize, m: usize) -> Vec<Vec<Op>> {
    (0..pp)
        .map(|r| {
            let warmup = (pp - r - 1).min(m);
            let mut ops: Vec<Op> = (0..warmup).map(|i| fwd(r, pp, i)).collect();
            for i in 0..m - warmup {
                ops.push(fwd(r, pp, warmup + i));
                ops.push(bwd(Pass::Backward, r, pp, i));
            }
            ops.extend((m - warmup..m).map(|i| bwd(Pass::Backward, r, pp, i)));
            ops
        })
        .collect()
}

fn total_ops(sim: &Simulation) -> usize {
    sim.timeline.iter().map(Vec::len).sum()
}

fn err_text(ops: &[Vec<Op>], costs: &Costs) -> String {
    match simulate(ops, costs) {
        Ok(sim) => panic!(
            "expected an error, got a simulation of makespan {}",
            sim.makespan
        ),
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------- simulator

#[test]
fn one_rank_runs_back_to_back() {
    let ops = vec![vec![
        op(Pass::Forward, 0, 0),
        op(Pass::Backward, 0, 0),
        op(Pass::Forward, 1, 0),
        op(Pass::Backward, 1, 0),
    ]];
    let sim = simulate(&ops, &Costs::default()).unwrap();
    let times: Vec<(f64, f64)> = sim.timeline[0].iter().map(|s| (s.start, s.end)).collect();
    assert_eq!(times, [(0.0, 1.0), (1.0, 3.0), (3.0, 4.0), (4.0, 6.0)]);
    assert_eq!(sim.makespan, 6.0);
    assert_eq!(sim.busy, [6.0]);
    assert_eq!(sim.ideal, 6.0);
    assert_eq!(sim.bubble_fraction, 0.0);
    assert_eq!(sim.peak_in_flight, [1]);
    assert_eq!(sim.ops_per_rank(), [4]);
}

#[test]
fn receive_waits_for_send_end_plus_latency() {
    // Two ranks, one micro-batch, latency 0.5.
    let pp = 2;
    let ops = vec![
        vec![fwd(0, pp, 0), bwd(Pass::Backward, 0, pp, 0)],
        vec![fwd(1, pp, 0), bwd(Pass::Backward, 1, pp, 0)],
    ];
    let costs = Costs::default().with_latency(0.5);
    let sim = simulate(&ops, &costs).unwrap();
    let t = |r: usize, i: usize| (sim.timeline[r][i].start, sim.timeline[r][i].end);
    assert_eq!(t(0, 0), (0.0, 1.0));
    assert_eq!(t(1, 0), (1.5, 2.5));
    assert_eq!(t(1, 1), (2.5, 4.5));
    assert_eq!(t(0, 1), (5.0, 7.0));
    assert_eq!(sim.makespan, 7.0);
    assert_eq!(sim.busy, [3.0, 3.0]);
    assert!(close(sim.bubble_fraction, 4.0 / 3.0));
}

#[test]
fn sends_are_asynchronous() {
    // Rank 0 sends two activations and goes on; rank 1 starts late but
    // rank 0 never waits for it.
    let pp = 2;
    let ops = vec![
        vec![fwd(0, pp, 0), fwd(0, pp, 1)],
        vec![op(Pass::Forward, 9, 1), fwd(1, pp, 0), fwd(1, pp, 1)],
    ];
    let costs = Costs::new(1.0, 2.0, 1.0, 1.0).with_stage_scale(vec![1.0, 5.0]);
    let sim = simulate(&ops, &costs).unwrap();
    assert_eq!(sim.timeline[0][1].end, 2.0);
    assert_eq!(
        (sim.timeline[1][0].start, sim.timeline[1][0].end),
        (0.0, 5.0)
    );
    assert_eq!(
        (sim.timeline[1][1].start, sim.timeline[1][1].end),
        (5.0, 10.0)
    );
    assert_eq!(sim.timeline[1][2].end, 15.0);
    assert_eq!(sim.busy, [2.0, 15.0]);
    assert_eq!(sim.peak_in_flight, [2, 3]);
}

#[test]
fn stage_scale_scales_every_pass() {
    let ops = vec![vec![
        op(Pass::Forward, 0, 1),
        op(Pass::BackwardInput, 0, 1),
        op(Pass::BackwardWeight, 0, 1),
    ]];
    let costs = Costs::new(1.0, 2.0, 3.0, 4.0).with_stage_scale(vec![1.0, 0.5]);
    let sim = simulate(&ops, &costs).unwrap();
    assert_eq!(sim.makespan, 4.0);
    assert_eq!(sim.timeline[0][2].start, 2.0);
    // The stage has no scale: an error, not a panic.
    let short = Costs::default().with_stage_scale(vec![1.0]);
    assert!(err_text(&ops, &short).contains("stage_scale"));
}

#[test]
fn hand_built_1f1b_has_the_textbook_bubble_and_in_flight() {
    for (pp, m) in [
        (1, 3),
        (2, 2),
        (2, 4),
        (4, 4),
        (4, 8),
        (3, 7),
        (8, 16),
        (4, 2),
    ] {
        let sim = simulate(&one_f_one_b(pp, m), &Costs::default()).unwrap();
        assert!(
            close(sim.ideal, 3.0 * m as f64),
            "pp {pp} m {m}: ideal {}",
            sim.ideal
        );
        if m >= pp {
            let want = (pp - 1) as f64 / m as f64;
            assert!(
                close(sim.bubble_fraction, want),
                "pp {pp} m {m}: bubble {} vs {want}",
                sim.bubble_fraction
            );
        }
        for r in 0..pp {
            assert_eq!(
                sim.peak_in_flight[r],
                (pp - r).min(m),
                "pp {pp} m {m} rank {r}"
            );
        }
    }
}

#[test]
fn in_flight_counts_forwards_until_their_backward_input() {
    let ops = vec![vec![
        op(Pass::Forward, 0, 0),
        op(Pass::Forward, 1, 0),
        op(Pass::BackwardInput, 0, 0),
        op(Pass::Forward, 2, 0),
        op(Pass::BackwardWeight, 0, 0),
        op(Pass::Forward, 3, 0),
        op(Pass::BackwardInput, 1, 0),
        op(Pass::BackwardInput, 2, 0),
        op(Pass::BackwardInput, 3, 0),
    ]];
    let sim = simulate(&ops, &Costs::default()).unwrap();
    assert_eq!(sim.peak_in_flight, [3]);
}

#[test]
fn empty_schedules_simulate_to_nothing() {
    let sim = simulate(&[], &Costs::default()).unwrap();
    assert_eq!(sim.makespan, 0.0);
    assert_eq!(sim.bubble_fraction, 0.0);
    assert!(sim.timeline.is_empty());
    let sim = simulate(&[vec![], vec![]], &Costs::default()).unwrap();
    assert_eq!(sim.busy, [0.0, 0.0]);
    assert_eq!(sim.peak_in_flight, [0, 0]);
}

// ------------------------------------------------------------------- errors

#[test]
fn a_wait_cycle_is_an_error() {
    // Each rank first waits for the other's message: deadlock.
    let pp = 2;
    let ops = vec![
        vec![bwd(Pass::Backward, 0, pp, 0), fwd(0, pp, 0)],
        vec![fwd(1, pp, 0), bwd(Pass::Backward, 1, pp, 0)],
    ];
    let e = err_text(&ops, &Costs::default());
    assert!(e.contains("wait cycle"), "{e}");
    assert!(e.contains("rank 0") && e.contains("rank 1"), "{e}");
}

#[test]
fn a_receive_never_sent_is_an_error() {
    let pp = 2;
    // Rank 0 forgets to send its activation.
    let ops = vec![vec![op(Pass::Forward, 0, 0)], vec![fwd(1, pp, 0)]];
    let e = err_text(&ops, &Costs::default());
    assert!(e.contains("never sent"), "{e}");
}

#[test]
fn a_send_never_received_is_an_error() {
    let pp = 2;
    let ops = vec![vec![fwd(0, pp, 0)], vec![op(Pass::Forward, 0, 1)]];
    let e = err_text(&ops, &Costs::default());
    assert!(e.contains("matching receive"), "{e}");
}

#[test]
fn messages_out_of_order_are_an_error() {
    let pp = 2;
    let ops = vec![
        vec![fwd(0, pp, 0), fwd(0, pp, 1)],
        vec![fwd(1, pp, 1), fwd(1, pp, 0)],
    ];
    let e = err_text(&ops, &Costs::default());
    assert!(e.contains("same order"), "{e}");
}

#[test]
fn bad_peers_and_costs_are_errors() {
    let mut bad = op(Pass::Forward, 0, 0);
    bad.send = Some(msg(5, Payload::Activation, 0, 0));
    assert!(err_text(&[vec![bad]], &Costs::default()).contains("peer 5"));
    let negative = Costs::new(-1.0, 2.0, 1.0, 1.0);
    assert!(err_text(&[vec![op(Pass::Forward, 0, 0)]], &negative).contains("forward"));
    let nan = Costs::default().with_latency(f64::NAN);
    assert!(err_text(&[vec![op(Pass::Forward, 0, 0)]], &nan).contains("p2p_latency"));
}

// ----------------------------------------------------------------- pictures

#[test]
fn svg_has_one_rect_per_op_and_a_legend() {
    let sim = simulate(&one_f_one_b(4, 8), &Costs::default()).unwrap();
    let s = svg(&sim, "1F1B <pp=4>");
    assert!(s.starts_with("<svg"), "{}", &s[..40]);
    assert!(s.trim_end().ends_with("</svg>"));
    assert_eq!(s.matches("<rect").count(), total_ops(&sim));
    assert_eq!(s.matches("<rect").count(), s.matches("</rect>").count());
    assert!(s.contains("class=\"legend\""));
    for word in ["F forward", "B backward", "W weight gradient"] {
        assert!(s.contains(word), "legend lacks {word}");
    }
    assert!(s.contains("1F1B &lt;pp=4&gt;"), "title not escaped");
    assert!(s.contains("makespan 33.00"));
    assert!(s.contains("bubble 37.5%"));
    assert_eq!(s.matches("<svg").count(), 1);
    assert_eq!(s.matches("<text").count(), s.matches("</text>").count());
}

#[test]
fn svg_shades_chunks_and_handles_empty() {
    let mut ops = vec![vec![op(Pass::Forward, 3, 0), op(Pass::Forward, 3, 1)]];
    ops[0][1].chunk = 1;
    let sim = simulate(&ops, &Costs::default()).unwrap();
    let s = svg(&sim, "chunks");
    assert!(s.contains("chunk 1"));
    assert!(s.contains("#4e79a7") && s.contains("#35608f"));
    assert_eq!(s.matches("<rect").count(), 2);

    let empty = simulate(&[], &Costs::default()).unwrap();
    let s = svg(&empty, "empty");
    assert!(s.starts_with("<svg"));
    assert_eq!(s.matches("<rect").count(), 0);
    assert!(s.contains("class=\"legend\""));
}

#[test]
fn ascii_has_a_line_per_rank_and_a_legend() {
    let sim = simulate(&one_f_one_b(2, 2), &Costs::default()).unwrap();
    let text = ascii(&sim, 0);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("rank ")).count(),
        2,
        "{text}"
    );
    assert!(lines.iter().any(|l| l.starts_with("legend:")), "{text}");
    // F = 1, B = 2, one column per time unit.
    assert_eq!(lines[0], "rank 0 |01..aa.bb|", "{text}");
    assert_eq!(lines[1], "rank 1 |.0aa1bb..|", "{text}");

    let narrow = ascii(&sim, 5);
    assert!(narrow
        .lines()
        .all(|l| !l.starts_with("rank ") || l.len() == "rank 0 ||".len() + 5));

    let w = simulate(&[vec![op(Pass::BackwardWeight, 12, 0)]], &Costs::default()).unwrap();
    assert!(ascii(&w, 0).starts_with("rank 0 |C|"));

    let empty = simulate(&[], &Costs::default()).unwrap();
    assert!(ascii(&empty, 40).contains("legend:"));
}

// ----------------------------------------------------- the real schedules

fn run(pp: usize, m: usize, kind: ScheduleKind, costs: &Costs) -> Simulation {
    let cfg = PipelineConfig {
        pp,
        microbatches: m,
        kind,
    };
    let ops = schedule(&cfg).unwrap_or_else(|e| panic!("{cfg:?}: {e}"));
    assert_eq!(ops.len(), pp, "{cfg:?}: one op list per rank");
    simulate(&ops, costs).unwrap_or_else(|e| panic!("{cfg:?}: {e}"))
}

#[test]
fn real_1f1b_has_the_textbook_bubble_and_in_flight() {
    for (pp, m) in [(2, 4), (4, 4), (4, 8), (8, 16), (3, 5)] {
        let sim = run(pp, m, ScheduleKind::OneFOneB, &Costs::default());
        let want = (pp - 1) as f64 / m as f64;
        assert!(
            close(sim.bubble_fraction, want),
            "1F1B pp {pp} m {m}: bubble {} vs {want}",
            sim.bubble_fraction
        );
        for r in 0..pp {
            assert_eq!(
                sim.peak_in_flight[r],
                (pp - r).min(m),
                "pp {pp} m {m} rank {r}"
            );
        }
    }
}

#[test]
fn real_interleaved_has_the_textbook_bubble() {
    for (pp, vp, m) in [(4, 2, 8), (2, 2, 4), (4, 3, 8), (2, 4, 6)] {
        // Each chunk holds 1/vp of the rank's layers.
        let costs = Costs::default().scaled(1.0 / vp as f64);
        let kind = ScheduleKind::Interleaved { vp, group: None };
        let sim = run(pp, m, kind, &costs);
        let want = (pp - 1) as f64 / (vp * m) as f64;
        assert!(
            close(sim.bubble_fraction, want),
            "interleaved pp {pp} vp {vp} m {m}: bubble {} vs {want}",
            sim.bubble_fraction
        );
        assert_eq!(sim.chunks(), vp);
    }
}

#[test]
fn real_zb_h1_has_the_textbook_bubble() {
    // F = B = W = 1.
    let costs = Costs::new(1.0, 2.0, 1.0, 1.0);
    for (pp, m) in [(2, 4), (4, 8), (4, 4), (8, 16)] {
        let sim = run(pp, m, ScheduleKind::ZeroBubbleH1, &costs);
        let want = (pp - 1) as f64 / (3 * m) as f64;
        assert!(
            close(sim.bubble_fraction, want),
            "ZB-H1 pp {pp} m {m}: bubble {} vs {want}",
            sim.bubble_fraction
        );
        // ZB-H1 holds no more activations than 1F1B.
        for r in 0..pp {
            assert!(
                sim.peak_in_flight[r] <= (pp - r).min(m),
                "pp {pp} m {m} rank {r}"
            );
        }
    }
}

#[test]
fn real_no_pipelining_has_no_bubble() {
    let sim = run(1, 4, ScheduleKind::NoPipelining, &Costs::default());
    assert_eq!(sim.bubble_fraction, 0.0);
    assert_eq!(sim.makespan, 12.0);
    assert_eq!(sim.peak_in_flight, [1]);
}
