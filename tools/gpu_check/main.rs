//! `ferrotron-gpu-check`: the one-shot device check (feature `cuda`).
//!
//! Each step appends to `<out>/summary.md` as it finishes, so a step that
//! times out loses nothing measured before it. `scripts/gpu_check.sh` runs
//! every step as its own process under its own timeout (a hung CUDA call
//! cannot be interrupted from inside), plus compute-sanitizer over `small`.
//! Without a GPU every step says SKIPPED and why.
//!
//!     ferrotron-gpu-check [--out DIR] [--emu] [STEP...]
//!
//! `--emu` runs `small` on the CPU emulator instead of GPU 0 (CI does, so
//! the check's own comparisons are tested on every commit); the other
//! steps need a GPU and say so.
//!
//! Steps (default: all, in this order): `env`, `small` (every kernel family
//! once at small shapes: what the sanitizers run), `correctness` (Megatron
//! shapes vs the float64 oracles, NaN-filled outputs, guard bytes, bitwise
//! reruns, the large-shape paths at their real sizes, the zeroing race on a
//! busy GPU), `bandwidth` (every bandwidth kernel with CUDA events, ratio to
//! a device-to-device copy), `gemm` (ours vs cuBLASLt), `nccl`.

mod bandwidth;
mod correctness;
mod env;
mod gemm;
mod nccl;
mod report;
mod timing;

use std::path::PathBuf;

use ferrotron::Device;
use report::Report;

/// The steps in the order `all` runs them.
const STEPS: [&str; 6] = ["env", "small", "correctness", "bandwidth", "gemm", "nccl"];

fn main() {
    let mut out = PathBuf::from("gpu-out");
    let mut steps = Vec::new();
    let mut emu = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => match args.next() {
                Some(d) => out = PathBuf::from(d),
                None => return usage("--out needs a folder"),
            },
            "-h" | "--help" => return usage(""),
            "--emu" => emu = true,
            "all" => steps.extend(STEPS.iter().map(|s| s.to_string())),
            s if STEPS.contains(&s) => steps.push(s.to_string()),
            other => return usage(&format!("unknown step {other:?}")),
        }
    }
    if steps.is_empty() {
        steps.extend(STEPS.iter().map(|s| s.to_string()));
    }
    let mut report = match Report::open(&out) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "ferrotron-gpu-check: cannot write to {}: {e}",
                out.display()
            );
            std::process::exit(2);
        }
    };
    let device = if emu {
        Ok(Device::emu())
    } else {
        Device::cuda(0)
    };
    let mut failed = false;
    for step in &steps {
        let start = std::time::Instant::now();
        report.section(step);
        let result = match &device {
            Err(e) if step != "env" => {
                report.line(&format!("SKIPPED: no usable GPU ({e})"));
                Ok(())
            }
            Ok(_) if emu && step != "small" && step != "env" => {
                report.line("SKIPPED: the emulator run covers only `small`");
                Ok(())
            }
            _ => run(step, device.as_ref().ok(), &mut report),
        };
        if let Err(e) = result {
            failed = true;
            report.line(&format!("**FAILED**: {e}"));
        }
        report.line(&format!("({step}: {:.1} s)", start.elapsed().as_secs_f64()));
    }
    if failed {
        std::process::exit(1);
    }
}

fn run(step: &str, dev: Option<&Device>, r: &mut Report) -> ferrotron::Result<()> {
    match (step, dev) {
        ("env", _) => env::run(dev, r),
        ("small", Some(d)) => correctness::small(d, r),
        ("correctness", Some(d)) => correctness::run(d, r),
        ("bandwidth", Some(d)) => bandwidth::run(d, r),
        ("gemm", Some(d)) => gemm::run(d, r),
        ("nccl", Some(d)) => nccl::run(d, r),
        _ => Ok(()),
    }
}

fn usage(problem: &str) {
    if !problem.is_empty() {
        eprintln!("ferrotron-gpu-check: {problem}");
    }
    eprintln!(
        "usage: ferrotron-gpu-check [--out DIR] [all | {}]...",
        STEPS.join(" | ")
    );
    std::process::exit(if problem.is_empty() { 0 } else { 2 });
}
