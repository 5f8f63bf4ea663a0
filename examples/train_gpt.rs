//! Trains a character-level GPT with tensor × pipeline × data parallelism
//! on in-process emulator ranks (one thread per rank), then draws the loss
//! curve and samples text from the trained model.
//!
//!     cargo run --release --example train_gpt
//!     cargo run --release --example train_gpt -- --tp 2 --pp 2 --dp 2 --steps 300
//!
//! On GPUs, one process per GPU over NCCL (build with `--features cuda`):
//! `--launch N` starts N copies of this program torchrun-style, or run it
//! under `torchrun --no-python --nproc-per-node N` (any launcher that sets
//! `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`); global
//! rank 0 prints the progress and the MFU.
//!
//! Defaults: Shakespeare's sonnets (`data/sonnets.txt`), 2 layers, hidden
//! 128, 4 heads, seq 64, TP 2 × PP 2 × DP 2 = 8 ranks, 1F1B, bf16,
//! distributed optimizer.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use ferrotron::comm::rendezvous::JobEnv;
use ferrotron::models::gpt::mfu::{mfu, peak_flops, PEAK_ENV};
use ferrotron::models::gpt::plot::{loss_svg, Series};
use ferrotron::models::gpt::sample::generate;
use ferrotron::models::gpt::{
    train_in_process, train_this_process, CharCorpus, EvalOptions, GptConfig, JobOptions,
    ParallelConfig, Precision, Recompute, Schedule, StepReport, TrainConfig,
};

const USAGE: &str =
    "usage: train_gpt [--tp N] [--pp N] [--vp N] [--dp N] [--schedule 1f1b|interleaved]
  [--micro-batch SEQS] [--micro-batches N (per data-parallel rank)]
  [--recompute none|selective|uniform:N|block:N] [--precision bf16|fp16] [--steps N]
  [--data FILE] [--layers N] [--hidden N] [--heads N] [--seq N] [--lr X]
  [--dropout P] [--attention-dropout P] [--seed N] [--save DIR] [--resume DIR]
  [--out DIR] [--sample CHARS] [--target LOSS] [--memory-report] [--no-dist-opt]
  [--holdout FRACTION (the text's tail kept for evaluation)] [--eval-every N (0: never)]
  [--eval-batches N]
  [--sequence-parallel (LayerNorms and dropouts on 1/tp of the tokens per rank)]
  [--launch N (one process per GPU, NCCL; needs --features cuda)]
  defaults: --tp 2 --pp 2 --vp 1 --dp 2 --schedule 1f1b --micro-batch 4 --micro-batches 2
            --recompute none --precision bf16 --steps 300 --data data/sonnets.txt
            --layers 2 --hidden 128 --heads 4 --seq 64 --lr 3e-3 --out target/train_gpt
            --sample 300 --target 2.0 --holdout 0.1 --eval-every 50 --eval-batches 4";

struct Args {
    par: ParallelConfig,
    model: GptConfig,
    train: TrainConfig,
    data: PathBuf,
    micro_batches: usize,
    save: Option<PathBuf>,
    resume: Option<PathBuf>,
    out: PathBuf,
    sample: usize,
    target: f64,
    memory_report: bool,
    launch: Option<usize>,
    holdout: f64,
    eval_every: u64,
    eval_batches: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        par: ParallelConfig {
            tp: 2,
            pp: 2,
            vp: 1,
            dp: 2,
            schedule: Schedule::OneFOneB,
            micro_batch: 4,
            global_batch: 0,
            recompute: Recompute::None,
            distributed_optimizer: true,
            precision: Precision::Bf16,
            sequence_parallel: false,
        },
        // 2 layers (1 per pipeline stage): the same loss per step as 4
        // layers on this corpus, in about 60 % of the time (docs/training.md).
        model: GptConfig {
            layers: 2,
            ..GptConfig::small(0, 64)
        },
        train: TrainConfig::default(),
        data: PathBuf::from("data/sonnets.txt"),
        micro_batches: 2,
        save: None,
        resume: None,
        out: PathBuf::from("target/train_gpt"),
        sample: 300,
        target: 2.0,
        memory_report: false,
        launch: None,
        holdout: 0.1,
        eval_every: 50,
        eval_batches: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        if flag == "--memory-report" {
            a.memory_report = true;
            continue;
        }
        if flag == "--no-dist-opt" {
            a.par.distributed_optimizer = false;
            continue;
        }
        if flag == "--sequence-parallel" {
            a.par.sequence_parallel = true;
            continue;
        }
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let n = || {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: expected a whole number, got {v}"))
        };
        let f = || {
            v.parse::<f32>()
                .map_err(|_| format!("{flag}: expected a number, got {v}"))
        };
        match flag.as_str() {
            "--tp" => a.par.tp = n()?,
            "--pp" => a.par.pp = n()?,
            "--vp" => a.par.vp = n()?,
            "--dp" => a.par.dp = n()?,
            "--schedule" => {
                a.par.schedule = match v.as_str() {
                    "1f1b" => Schedule::OneFOneB,
                    "interleaved" => Schedule::Interleaved,
                    _ => return Err(format!("--schedule: expected 1f1b or interleaved, got {v}")),
                }
            }
            "--micro-batch" => a.par.micro_batch = n()?,
            "--micro-batches" => a.micro_batches = n()?,
            "--recompute" => a.par.recompute = parse_recompute(&v)?,
            "--precision" => {
                a.par.precision = match v.as_str() {
                    "bf16" => Precision::Bf16,
                    "fp16" => Precision::Fp16,
                    _ => return Err(format!("--precision: expected bf16 or fp16, got {v}")),
                }
            }
            "--steps" => a.train.steps = n()? as u64,
            "--data" => a.data = PathBuf::from(&v),
            "--layers" => a.model.layers = n()?,
            "--hidden" => {
                a.model.hidden = n()?;
                a.model.ffn = 4 * a.model.hidden;
            }
            "--heads" => a.model.heads = n()?,
            "--seq" => a.model.seq = n()?,
            "--lr" => {
                a.train.lr = f()?;
                a.train.min_lr = a.train.lr / 10.0;
            }
            "--dropout" => a.model.hidden_dropout = f()?,
            "--attention-dropout" => a.model.attention_dropout = f()?,
            "--seed" => a.model.seed = n()? as u64,
            "--save" => a.save = Some(PathBuf::from(&v)),
            "--resume" => a.resume = Some(PathBuf::from(&v)),
            "--out" => a.out = PathBuf::from(&v),
            "--sample" => a.sample = n()?,
            "--target" => a.target = f()? as f64,
            "--launch" => a.launch = Some(n()?),
            "--holdout" => a.holdout = f()? as f64,
            "--eval-every" => a.eval_every = n()? as u64,
            "--eval-batches" => a.eval_batches = n()?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    a.par.global_batch = a.par.micro_batch * a.par.dp * a.micro_batches;
    Ok(a)
}

fn parse_recompute(v: &str) -> Result<Recompute, String> {
    let count = |s: &str| {
        s.parse::<usize>()
            .map_err(|_| format!("--recompute: expected a layer count after ':', got {s}"))
    };
    match v.split_once(':') {
        None if v == "none" => Ok(Recompute::None),
        None if v == "selective" => Ok(Recompute::Selective),
        Some(("uniform", n)) => Ok(Recompute::Uniform(count(n)?)),
        Some(("block", n)) => Ok(Recompute::Block(count(n)?)),
        _ => Err(format!(
            "--recompute: expected none, selective, uniform:N or block:N, got {v}"
        )),
    }
}

fn bar(done: u64, total: u64) -> String {
    let w = 24;
    let f = (done as usize * w) / total.max(1) as usize;
    format!("[{}{}]", "#".repeat(f), ".".repeat(w - f))
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("train_gpt: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(n) = a.launch {
        return launch(n);
    }
    match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train_gpt: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(mut a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(&a.data)
        .map_err(|e| format!("reading --data {}: {e}", a.data.display()))?;
    let full = CharCorpus::new(&text)?;
    a.model.vocab = full.vocab();
    // The text's tail is held out for evaluation (none without it).
    let (corpus, held_out) = if a.eval_every > 0 {
        let (train, held) = full.split_off(a.holdout)?;
        (train, Some(held))
    } else {
        (full, None)
    };
    let (m, p) = (&a.model, &a.par);
    p.validate(m, p.world())?;
    let opts = JobOptions {
        resume: a.resume.clone(),
        save: a.save.clone(),
        gather_params: a.sample > 0,
        eval: held_out.clone().map(|corpus| EvalOptions {
            corpus,
            every: a.eval_every,
            batches: a.eval_batches,
        }),
    };
    // Under a launcher (ours or torchrun) every process is one rank; only
    // global rank 0 reports.
    let job = match std::env::var_os("RANK") {
        Some(_) => Some(JobEnv::from_env()?),
        None => None,
    };
    if let Some(env) = job.as_ref().filter(|e| e.rank != 0) {
        train_this_process(env, m, p, &a.train, &corpus, &opts, &mut |_| {})?;
        return Ok(());
    }
    let tokens_per_step = p.global_batch * m.seq;
    println!(
        "ferrotron train_gpt: {} layers, hidden {}, {} heads, seq {}, vocab {} ({} chars of {}), {:.2} M parameters",
        m.layers,
        m.hidden,
        m.heads,
        m.seq,
        m.vocab,
        corpus.len(),
        a.data.display(),
        m.parameters() as f64 / 1e6
    );
    println!(
        "  ranks: tp {} x pp {} (vp {}) x dp {} = {} {}; {:?}, {:?}, recompute {:?}, {}{}",
        p.tp,
        p.pp,
        p.vp,
        p.dp,
        p.world(),
        if job.is_some() {
            "processes (one per GPU, NCCL)"
        } else {
            "in-process emulator ranks"
        },
        p.schedule,
        p.precision,
        p.recompute,
        if p.distributed_optimizer {
            "distributed optimizer (ZeRO-1)"
        } else {
            "replicated optimizer (plain DDP)"
        },
        if p.sequence_parallel {
            ", sequence parallel"
        } else {
            ""
        }
    );
    println!(
        "  batch: {} sequences = {} tokens per step ({} micro-batches of {} per data-parallel rank); {} steps, lr {} (warm-up {}, cosine to {})",
        p.global_batch, tokens_per_step, p.micro_batches(), p.micro_batch, a.train.steps,
        a.train.lr, a.train.warmup, a.train.min_lr
    );
    match &held_out {
        Some(h) => println!(
            "  held out: the last {} chars ({:.0} %), evaluated every {} steps and at the end on {} batches ({} tokens)",
            h.len(),
            100.0 * a.holdout,
            a.eval_every,
            a.eval_batches,
            a.eval_batches * tokens_per_step
        ),
        None => println!("  held out: nothing (--eval-every 0)"),
    }
    println!(
        "  loss of a uniform guess: ln({}) = {:.3} nats/char",
        m.vocab,
        (m.vocab as f64).ln()
    );
    #[cfg(feature = "checkpoint")]
    if let Some(dir) = &a.resume {
        let (tp, pp) = ferrotron::models::gpt::saved_layout(dir)?;
        let how = if (tp, pp) == (p.tp, p.pp) {
            "the same layout".to_string()
        } else {
            format!(
                "saved at tp {tp} x pp {pp}, resharded to tp {} x pp {} on load",
                p.tp, p.pp
            )
        };
        println!("  resuming {} ({how})", dir.display());
    }
    if a.memory_report {
        return memory_report(m, p, &a.train, &corpus);
    }
    let flops_per_step = m.flops_per_token() * tokens_per_step as f64;
    let started = Instant::now();
    let total = a.train.steps;
    let mut first_below: Option<(u64, f64)> = None;
    let target = a.target;
    let mut last_elapsed = 0.0;
    let tty = std::io::stdout().is_terminal();
    let mut on_step = |r: &StepReport| {
        // The step's own time (evaluating after it is not training).
        let dt = (r.elapsed - last_elapsed - r.eval_seconds).max(1e-9);
        last_elapsed = r.elapsed;
        if r.loss < target && first_below.is_none() {
            first_below = Some((r.step, r.elapsed));
        }
        let val = r
            .val_loss
            .map_or(String::new(), |v| format!(" | held-out {v:.3}"));
        let line = format!(
            "{} step {:>4}/{total} loss {:.3} | {:>6.0} tok/s {:>5.2} GFLOP/s | lr {:.2e} | norm {:.2} | scale {}{val}{}",
            bar(r.step + 1, total),
            r.step + 1,
            r.loss,
            tokens_per_step as f64 / dt,
            flops_per_step / dt / 1e9,
            r.lr,
            r.grad_norm,
            r.loss_scale,
            if r.skipped { " | SKIPPED (inf/nan)" } else { "" }
        );
        if (r.step + 1) % 25 == 0
            || r.step == 0
            || r.step + 1 == total
            || r.skipped
            || r.val_loss.is_some()
        {
            println!("\r{line}");
        } else if tty {
            print!("\r{line}");
            let _ = std::io::stdout().flush();
        }
    };
    let summary = match &job {
        Some(env) => train_this_process(env, m, p, &a.train, &corpus, &opts, &mut on_step)?,
        None => train_in_process(m, p, &a.train, &corpus, &opts, &mut on_step)?,
    };
    let wall = started.elapsed().as_secs_f64();
    let steps = &summary.steps;
    let Some(last) = steps.last() else {
        println!("nothing to train: the checkpoint is already at step {total}");
        return Ok(());
    };
    let skipped = steps.iter().filter(|s| s.skipped).count();
    let tail: Vec<f64> = steps.iter().rev().take(10).map(|s| s.loss).collect();
    let tail_mean = tail.iter().sum::<f64>() / tail.len() as f64;
    println!();
    let model_flops = flops_per_step * steps.len() as f64;
    // Throughput and MFU count training time only: evaluating is not training.
    let evaluating: f64 = steps.iter().map(|s| s.eval_seconds).sum();
    let train_wall = (wall - evaluating).max(1e-9);
    let utilisation = match peak_flops(&summary.device_name, |k| std::env::var(k).ok()) {
        Some(peak) => format!(
            "MFU {:.1} % of {} x {:.0} TFLOP/s ({})",
            100.0 * mfu(model_flops, train_wall, p.world(), peak),
            p.world(),
            peak / 1e12,
            summary.device_name
        ),
        None if summary.device_name.contains("emulator") => {
            "MFU is reported on GPUs only".to_string()
        }
        None => format!(
            "no MFU: no peak known for {} (set {PEAK_ENV})",
            summary.device_name
        ),
    };
    println!(
        "done: {} steps in {:.1} s ({:.1} s of it evaluating; {:.0} tokens/s, {:.2} GFLOP/s of model FLOPs; {utilisation})",
        steps.len(),
        wall,
        evaluating,
        (steps.len() * tokens_per_step) as f64 / train_wall,
        model_flops / train_wall / 1e9
    );
    println!(
        "  loss {:.3} -> {:.3} (mean of the last 10 steps {:.3}); skipped steps {skipped}",
        steps[0].loss, last.loss, tail_mean
    );
    let evals: Vec<(u64, f64)> = steps
        .iter()
        .filter_map(|s| s.val_loss.map(|v| (s.step + 1, v)))
        .collect();
    if let (Some(first), Some(end)) = (evals.first(), evals.last()) {
        let best = evals
            .iter()
            .copied()
            .fold(*first, |b, e| if e.1 < b.1 { e } else { b });
        println!(
            "  held-out loss {:.3} (step {}) -> {:.3} (step {}); best {:.3} at step {}; last training loss {:.3}",
            first.1, first.0, end.1, end.0, best.1, best.0, last.loss
        );
    }
    match first_below {
        Some((s, t)) => println!(
            "  loss first below {target} at step {} after {t:.1} s",
            s + 1
        ),
        None => println!("  loss never went below {target}"),
    }
    let mut per_layer: Vec<_> = summary.activation_bytes.iter().collect();
    per_layer.sort();
    if let Some((_, &bytes)) = per_layer.first() {
        println!(
            "  activations kept per layer and micro-batch (layer 0, this rank's share): {:.1} KiB",
            bytes as f64 / 1024.0
        );
    }
    std::fs::create_dir_all(&a.out)?;
    let pts: Vec<(f64, f64)> = steps
        .iter()
        .map(|s| ((s.step + 1) as f64, s.loss))
        .collect();
    let title = format!(
        "GPT {}L h{} on {} — tp {} x pp {} x dp {}, {:?}",
        m.layers,
        m.hidden,
        a.data
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("data"),
        p.tp,
        p.pp,
        p.dp,
        p.precision
    );
    let val_pts: Vec<(f64, f64)> = evals.iter().map(|&(s, v)| (s as f64, v)).collect();
    let mut series = vec![Series {
        name: "training loss",
        color: "#1f6fb4",
        points: &pts,
    }];
    if !val_pts.is_empty() {
        series.push(Series {
            name: "held-out loss",
            color: "#d9730d",
            points: &val_pts,
        });
    }
    let svg = loss_svg(&title, &series, Some(target));
    let svg_path = a.out.join("loss.svg");
    std::fs::write(&svg_path, svg)?;
    let csv: String = std::iter::once(
        "step,loss,grad_norm,lr,loss_scale,skipped,elapsed_s,held_out_loss\n".to_string(),
    )
    .chain(steps.iter().map(|s| {
        format!(
            "{},{},{},{},{},{},{:.3},{}\n",
            s.step + 1,
            s.loss,
            s.grad_norm,
            s.lr,
            s.loss_scale,
            s.skipped as u8,
            s.elapsed,
            s.val_loss.map_or(String::new(), |v| v.to_string())
        )
    }))
    .collect();
    std::fs::write(a.out.join("loss.csv"), csv)?;
    println!("  loss curve: {} (and loss.csv)", svg_path.display());
    if let Some(dir) = &a.save {
        println!("  checkpoint: {}", dir.display());
    }
    if a.sample > 0 && job.is_some() {
        println!("  no sample: the ranks' parameters stay in their processes (sampling is for in-process runs)");
    } else if a.sample > 0 {
        let prompt = "From fairest";
        let prompt = if corpus.encode(prompt).is_ok() {
            prompt
        } else {
            "T"
        };
        let text = generate(m, &summary.params, &corpus, prompt, a.sample, 0.8, 7)?;
        println!("\nsample (temperature 0.8):\n{prompt}{text}");
    }
    Ok(())
}

/// `--launch n`: this program `n` times, torchrun-style (`RANK`,
/// `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), with the same
/// flags; rank 0's output is shown, the others' errors. The first rank to
/// fail stops the rest.
fn launch(n: usize) -> ExitCode {
    match launch_ranks(n) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("train_gpt --launch: {e}");
            ExitCode::FAILURE
        }
    }
}

fn launch_ranks(n: usize) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if n == 0 {
        return Err("--launch: expected at least 1 process, got 0".into());
    }
    if std::env::var_os("RANK").is_some() {
        return Err("--launch inside a launched job (RANK is already set)".into());
    }
    let exe = std::env::current_exe()?;
    let mut flags = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(f) = it.next() {
        if f == "--launch" {
            it.next();
        } else {
            flags.push(f);
        }
    }
    // A free port for rank 0's rendezvous (the window until it binds is tiny).
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut children = Vec::with_capacity(n);
    for rank in 0..n {
        let child = std::process::Command::new(&exe)
            .args(&flags)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .stdout(if rank == 0 {
                std::process::Stdio::inherit()
            } else {
                std::process::Stdio::null()
            })
            .spawn()
            .map_err(|e| format!("starting rank {rank}: {e}"))?;
        children.push(Some(child));
    }
    let mut failed = None;
    while children.iter().any(Option::is_some) {
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            if let Some(status) = child.try_wait()? {
                *slot = None;
                if !status.success() && failed.is_none() {
                    failed = Some((rank, status));
                }
            }
        }
        if let Some((rank, status)) = failed {
            for child in children.iter_mut().flatten() {
                let _ = child.kill();
                let _ = child.wait();
            }
            eprintln!(
                "train_gpt --launch: rank {rank} failed ({status}); the other ranks were stopped"
            );
            return Ok(ExitCode::FAILURE);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(ExitCode::SUCCESS)
}

/// One step per recomputation mode; the bytes layer 0 keeps per
/// micro-batch (measured from its buffers) next to Korthikanti et al.'s
/// per-layer formulas for 16-bit activations.
fn memory_report(
    m: &GptConfig,
    p: &ParallelConfig,
    train: &TrainConfig,
    corpus: &CharCorpus,
) -> Result<(), Box<dyn std::error::Error>> {
    let (s, b, h, a, t) = (
        m.seq as f64,
        p.micro_batch as f64,
        m.hidden as f64,
        m.heads as f64,
        p.tp as f64,
    );
    let sbh = s * b * h;
    // Korthikanti et al., table 2: without and with sequence parallelism.
    let rows: [(Recompute, f64, &str); 3] = if p.sequence_parallel {
        [
            (
                Recompute::None,
                sbh / t * (34.0 + 5.0 * a * s / h),
                "sbh/t (34 + 5as/h)",
            ),
            (Recompute::Selective, 34.0 * sbh / t, "34 sbh/t"),
            (Recompute::Uniform(1), 2.0 * sbh / t, "2sbh/t"),
        ]
    } else {
        [
            (
                Recompute::None,
                sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t)),
                "sbh(10 + 24/t + 5as/(ht))",
            ),
            (
                Recompute::Selective,
                sbh * (10.0 + 24.0 / t),
                "sbh(10 + 24/t)",
            ),
            (Recompute::Uniform(1), 2.0 * sbh, "2sbh"),
        ]
    };
    println!(
        "activation memory per layer and micro-batch (s {} b {} h {} a {} tp {}{}; KiB):",
        m.seq,
        p.micro_batch,
        m.hidden,
        m.heads,
        p.tp,
        if p.sequence_parallel {
            ", sequence parallel"
        } else {
            ""
        }
    );
    println!(
        "  {:<28} {:>10} {:>10}  paper formula",
        "mode", "measured", "paper"
    );
    let train = TrainConfig { steps: 1, ..*train };
    for (mode, paper, formula) in rows {
        let pm = ParallelConfig {
            recompute: mode,
            ..*p
        };
        let sum = train_in_process(m, &pm, &train, corpus, &JobOptions::default(), &mut |_| {})?;
        let got = sum.activation_bytes.get(&0).copied().unwrap_or(0);
        println!(
            "  {:<28} {:>10.1} {:>10.1}  {formula}",
            format!("{mode:?}"),
            got as f64 / 1024.0,
            paper / 1024.0
        );
    }
    println!(
        "  (ferrotron stores no dropout masks — they are regenerated from Philox — and no dropped \
probabilities when attention dropout is 0; the MLP keeps both its pre-activation and GeLU output)"
    );
    Ok(())
}
