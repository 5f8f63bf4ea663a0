//! A pipeline schedule, simulated and drawn: builds the schedule
//! (`ferrotron::core::pipeline::schedule`), simulates it under the given
//! costs, writes an SVG picture, prints the ASCII timeline and a summary
//! (makespan, bubble fraction against the textbook formula, peak in-flight
//! activations and operations per rank).
//!
//!     cargo run --example pipeline_schedule -- --pp 4 --vp 2 --microbatches 8 \
//!         --schedule interleaved [--out schedule.svg] \
//!         [--forward 1 --backward 2 --weight 1 --latency 0] [--group N] [--width N]
//!
//! Costs describe a rank's whole share of the layers: with `--vp v` every
//! chunk costs `1/v` of them. `--backward` is the whole backward; the
//! zero-bubble schedules split it into `B = backward − weight` and
//! `W = weight`, so the defaults give `F = 1, B = 2` for 1F1B and
//! `F = B = W = 1` for ZB-H1.

use std::process::ExitCode;

use ferrotron::core::pipeline::render::{ascii, svg};
use ferrotron::core::pipeline::{schedule, simulate, Costs, PipelineConfig, ScheduleKind};

const USAGE: &str = "usage: pipeline_schedule [--pp N] [--vp N] [--microbatches N] \
[--schedule none|1f1b|interleaved|zb-h1] [--out FILE.svg] [--forward T] [--backward T] \
[--weight T] [--latency T] [--group N] [--width COLUMNS]
  defaults: --pp 4 --vp 1 (2 for interleaved) --microbatches 8 --schedule 1f1b
            --forward 1 --backward 2 --weight 1 --latency 0 --width 0 (auto)
  --out defaults to pipeline_<schedule>_pp<pp>_vp<vp>_m<m>.svg in the current folder";

struct Args {
    pp: usize,
    vp: Option<usize>,
    microbatches: usize,
    schedule: String,
    out: Option<String>,
    forward: f64,
    backward: f64,
    weight: f64,
    latency: f64,
    group: Option<usize>,
    width: usize,
}

fn parse_num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: `{v}` is not a valid number"))
}

fn parse_time(flag: &str, v: &str) -> Result<f64, String> {
    let t: f64 = parse_num(flag, v)?;
    if t.is_finite() && t >= 0.0 {
        Ok(t)
    } else {
        Err(format!("{flag}: expected a finite time >= 0, got {v}"))
    }
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut a = Args {
        pp: 4,
        vp: None,
        microbatches: 8,
        schedule: "1f1b".into(),
        out: None,
        forward: 1.0,
        backward: 2.0,
        weight: 1.0,
        latency: 0.0,
        group: None,
        width: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(None);
        }
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (flag, None),
        };
        let v = match inline.or_else(|| it.next()) {
            Some(v) => v,
            None => return Err(format!("{flag}: missing value")),
        };
        match flag.as_str() {
            "--pp" => a.pp = parse_num(&flag, &v)?,
            "--vp" => a.vp = Some(parse_num(&flag, &v)?),
            "--microbatches" | "-m" => a.microbatches = parse_num(&flag, &v)?,
            "--schedule" => a.schedule = v.to_ascii_lowercase(),
            "--out" => a.out = Some(v),
            "--forward" => a.forward = parse_time(&flag, &v)?,
            "--backward" => a.backward = parse_time(&flag, &v)?,
            "--weight" => a.weight = parse_time(&flag, &v)?,
            "--latency" => a.latency = parse_time(&flag, &v)?,
            "--group" => a.group = Some(parse_num(&flag, &v)?),
            "--width" => a.width = parse_num(&flag, &v)?,
            _ => return Err(format!("unknown argument `{flag}`")),
        }
    }
    if a.pp == 0 {
        return Err("--pp must be at least 1".into());
    }
    if a.microbatches == 0 {
        return Err("--microbatches must be at least 1".into());
    }
    if a.vp == Some(0) {
        return Err("--vp must be at least 1".into());
    }
    if a.weight > a.backward {
        return Err(format!(
            "--weight ({}) cannot exceed --backward ({}): the backward is B + W",
            a.weight, a.backward
        ));
    }
    Ok(Some(a))
}

fn run(a: &Args) -> Result<(), String> {
    let vp =
        a.vp.unwrap_or(if a.schedule == "interleaved" { 2 } else { 1 });
    let kind = match a.schedule.as_str() {
        "none" | "no-pipelining" => ScheduleKind::NoPipelining,
        "1f1b" => ScheduleKind::OneFOneB,
        "interleaved" => ScheduleKind::Interleaved { vp, group: a.group },
        "zb-h1" | "zbh1" | "zb" => ScheduleKind::ZeroBubbleH1,
        other => {
            return Err(format!(
                "unknown schedule `{other}` (expected none, 1f1b, interleaved or zb-h1)"
            ))
        }
    };
    if vp != 1 && !matches!(kind, ScheduleKind::Interleaved { .. }) {
        return Err(format!("--vp {vp} needs --schedule interleaved"));
    }
    let (p, m, v) = (a.pp as f64, a.microbatches as f64, vp as f64);
    let (f, bi, w) = (a.forward, a.backward - a.weight, a.weight);

    let cfg = PipelineConfig {
        pp: a.pp,
        microbatches: a.microbatches,
        kind,
    };
    let ops = schedule(&cfg).map_err(|e| format!("schedule: {e}"))?;
    let costs = Costs::new(a.forward, a.backward, bi, w)
        .scaled(1.0 / v)
        .with_latency(a.latency);
    let sim = simulate(&ops, &costs).map_err(|e| format!("simulate: {e}"))?;

    let name = match kind {
        ScheduleKind::NoPipelining => "none",
        ScheduleKind::OneFOneB => "1f1b",
        ScheduleKind::Interleaved { .. } => "interleaved",
        ScheduleKind::ZeroBubbleH1 => "zb-h1",
    };
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| format!("pipeline_{name}_pp{}_vp{vp}_m{}.svg", a.pp, a.microbatches));
    let title = format!(
        "{name}: pp {}, vp {vp}, {} micro-batches (F {}, B {}, W {}, latency {})",
        a.pp, a.microbatches, a.forward, a.backward, a.weight, a.latency
    );
    std::fs::write(&out, svg(&sim, &title)).map_err(|e| format!("writing {out}: {e}"))?;

    // The textbook bubble, for equal stage costs and no latency.
    let (formula, textbook) = match kind {
        ScheduleKind::NoPipelining => ("0".to_string(), 0.0),
        ScheduleKind::OneFOneB => (
            format!("(p-1)/m = {}/{}", a.pp - 1, a.microbatches),
            (p - 1.0) / m,
        ),
        ScheduleKind::Interleaved { .. } => (
            format!("(p-1)/(v*m) = {}/{}", a.pp - 1, vp * a.microbatches),
            (p - 1.0) / (v * m),
        ),
        ScheduleKind::ZeroBubbleH1 => (
            "(p-1)(F+B-W)/(m(F+B+W))".to_string(),
            if f + bi + w > 0.0 {
                (p - 1.0) * (f + bi - w).max(0.0) / (m * (f + bi + w))
            } else {
                0.0
            },
        ),
    };

    println!("{title}");
    if sim.timeline.iter().all(Vec::is_empty) {
        println!("(the schedule has no operations)");
    }
    print!("{}", ascii(&sim, a.width));
    println!();
    println!("makespan            {:.3}", sim.makespan);
    println!("ideal (busiest rank) {:.3}", sim.ideal);
    println!(
        "bubble fraction     {:.4} ({:.1}%); textbook {formula} = {:.4}",
        sim.bubble_fraction,
        sim.bubble_fraction * 100.0,
        textbook
    );
    println!("rank  ops  busy      peak in-flight activations (micro-batch-stages)");
    for r in 0..sim.ranks() {
        println!(
            "{r:>4}  {:>3}  {:>8.3}  {}",
            sim.timeline[r].len(),
            sim.busy[r],
            sim.peak_in_flight[r]
        );
    }
    println!("picture: {out}");
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
