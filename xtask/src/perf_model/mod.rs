//! `cargo run -p xtask -- perf-model`: a static performance model of the
//! bandwidth kernels on an H200 (sm_90a), from the build's ptxas report and
//! the SASS of its fatbins; no GPU needed. The model, its constants and its
//! error against measured H200 ratios are in docs/perf.md ("Static
//! performance model").
//!
//! Options:
//!   --build DIR        a dir holding `ptxas-report.txt` and `*.fatbin`:
//!                      what `scripts/perf_model_fatbins.sh DIR` builds (the
//!                      release fatbins, device asserts off: what CI models)
//!                      or the `out` dir of a `--features cuda` build (a
//!                      debug one keeps device asserts, which change the
//!                      code). Default: `target/perf-model-sm90a` when
//!                      it has both, else the newest
//!                      `target/*/build/ferrotron-*/out` that has both
//!                      (rerun the script after editing a kernel)
//!   --tools DIR        where `cuobjdump` and `nvdisasm` are (default: PATH,
//!                      then `$FTN_CI_CACHE/sass/nvidia/cu13/bin`)
//!   --thresholds FILE  per-case minimum predicted fraction (default
//!                      `xtask/perf-model-thresholds.txt`); a case below its
//!                      threshold fails the command
//!   --write-thresholds write the current predictions, less a margin, there
//!   --fit              also print the DRAM latency that best fits the
//!                      measurements (least squares on log ratios)
//!   --markdown         print the table as Markdown (docs/perf.md)
//!   --explain KERNEL   print KERNEL's loops, their source lines and hot paths
//!   --root DIR         the checkout whose `cuda/` sources the SASS was built
//!                      from (default: this one)
//!   --keep-sass DIR    keep the disassembly in DIR and reuse it while it is
//!                      newer than the fatbins (nvdisasm takes most of the time)

pub mod cases;
pub mod machine;
pub mod ptxas;
pub mod sass;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use cases::{Case, Elems, PhaseSpec};
use machine::{Machine, Phase, PhaseEstimate, H200};

const ARCH: &str = "sm_90a";
const THRESHOLDS: &str = "xtask/perf-model-thresholds.txt";
/// Margin below the current prediction that `--write-thresholds` stores.
const MARGIN: f64 = 0.03;

/// What the SASS says about one phase's region.
#[derive(Clone, Debug)]
pub struct RegionStats {
    pub path: sass::PathStats,
    /// `loop a..b` (addresses) or `kernel`.
    pub region: String,
    pub elems_per_iter: f64,
}

/// One evaluated case.
#[derive(Clone, Debug)]
pub struct Row {
    pub case: Case,
    pub phases: Vec<(PhaseSpec, RegionStats, Phase, PhaseEstimate)>,
    /// Fraction of copy bandwidth on the fused floor.
    pub predicted: f64,
    /// The same on the bytes the measurement counted.
    pub predicted_bench: f64,
}

pub struct Inputs {
    pub resources: HashMap<(String, String), ptxas::Resources>,
    pub functions: HashMap<String, sass::Function>,
    pub root: PathBuf,
}

/// Lines of `anchor` in its source file (1-based, inclusive): the snippet's
/// line, or for a loop header the lines up to its opening brace (the
/// increment may sit on the second line).
pub fn anchor_line(root: &Path, a: &cases::Anchor) -> Result<(u32, u32), String> {
    let path = root.join("cuda").join(a.file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut seen_within = false;
    for (i, line) in text.lines().enumerate() {
        if !seen_within {
            seen_within = line.contains(a.within);
        }
        if seen_within && line.contains(a.snippet) {
            let first = i as u32 + 1;
            if !line.trim_start().starts_with("for (") {
                return Ok((first, first));
            }
            let span = text.lines().skip(i).take(8).position(|l| l.contains('{'));
            return Ok((first, first + span.unwrap_or(0) as u32));
        }
    }
    Err(format!(
        "cuda/{}: no line containing {:?} after {:?}",
        a.file, a.snippet, a.within
    ))
}

/// The region of `f` the anchor names and its hot path.
pub fn region(
    f: &sass::Function,
    file: &str,
    lines: (u32, u32),
    widest: u32,
) -> Option<(String, sass::PathStats)> {
    let suffix = format!("cuda/{file}");
    let at_anchor =
        |i: &sass::Instr| i.line >= lines.0 && i.line <= lines.1 && i.file.ends_with(&suffix);
    let widest_in = |a: usize, b: usize| {
        f.instrs[a..=b]
            .iter()
            .filter_map(|i| i.global_read_bytes())
            .max()
            .unwrap_or(0)
    };
    let candidates: Vec<(usize, usize)> = f
        .loops()
        .into_iter()
        .filter(|&(a, b)| f.any_in(a, b, at_anchor) && widest_in(a, b) == widest)
        .collect();
    // Innermost: no other candidate nested inside. Among several (the
    // compiler's copies of a loop per branch, one per dtype of a mixed list)
    // the one that moves the most with its widest accesses is the hot one
    // (e.g. the vector-bias copy), then the shortest (the fp32 copy of a
    // mixed list, which has no conversions).
    let innermost: Vec<(usize, usize)> = candidates
        .iter()
        .copied()
        .filter(|&(a, b)| {
            !candidates
                .iter()
                .any(|&(c, d)| (c, d) != (a, b) && c >= a && d <= b)
        })
        .collect();
    let mut best: Option<(String, sass::PathStats)> = None;
    for (a, b) in innermost {
        if let Some(s) = f.hot_path(a, Some(b)) {
            let better = |o: &sass::PathStats| {
                s.wide_bytes > o.wide_bytes || (s.wide_bytes == o.wide_bytes && s.instrs < o.instrs)
            };
            if best.as_ref().is_none_or(|(_, o)| better(o)) {
                let r = format!("loop {:#x}..{:#x}", f.instrs[a].addr, f.instrs[b].addr);
                best = Some((r, s));
            }
        }
    }
    if best.is_none() && f.instrs.iter().any(at_anchor) {
        best = f.hot_path(0, None).map(|s| ("kernel".to_string(), s));
    }
    best
}

/// A case with its phases resolved against the SASS and ptxas report
/// (everything that does not depend on the machine constants).
#[derive(Clone, Debug)]
pub struct Prepared {
    pub case: Case,
    pub phases: Vec<(PhaseSpec, RegionStats, Phase)>,
}

pub fn prepare(inputs: &Inputs, case: &Case) -> Result<Prepared, String> {
    let mut phases = Vec::new();
    for spec in &case.phases {
        let f = inputs
            .functions
            .get(&spec.kernel)
            .ok_or_else(|| format!("{}: no {ARCH} SASS for {}", case.name, spec.kernel))?;
        let res = inputs
            .resources
            .get(&(spec.kernel.clone(), ARCH.to_string()))
            .ok_or_else(|| format!("{}: {} not in the ptxas report", case.name, spec.kernel))?;
        let line = anchor_line(&inputs.root, &spec.anchor)?;
        let (name, path) =
            region(f, spec.anchor.file, line, spec.anchor.widest).ok_or_else(|| {
                format!(
                    "{}: no region of {} holds cuda/{}:{} with {}-byte loads",
                    case.name, spec.kernel, spec.anchor.file, line.0, spec.anchor.widest
                )
            })?;
        let per_iter = match spec.elems_per_iter {
            Elems::Fixed(n) => n,
            Elems::PerLoadedBytes(b) => path.ldg_bytes as f64 / b,
        };
        let per_round = spec.elems_per_round.unwrap_or(per_iter);
        let scale = per_round / per_iter;
        // The wide loads that read DRAM: a thread's DRAM bytes per iteration
        // over the load width (the first ones on the path; see `waits`).
        let data_loads = if path.widest_load == 0 {
            0
        } else {
            (spec.read_bytes_per_elem * per_iter / path.widest_load as f64).ceil() as u32
        };
        let (data_waits, cached_waits) = path.waits(data_loads);
        let phase = Phase {
            threads: spec.threads,
            blocks: spec.blocks,
            registers: res.registers,
            smem: res.smem_bytes + spec.dynamic_smem,
            elems_per_round: per_round,
            bytes_per_elem: spec.bytes_per_elem,
            read_bytes_per_elem: spec.read_bytes_per_elem,
            l2_read_bytes_per_elem: spec.l2_read_bytes_per_elem,
            elems: spec.elems,
            instrs_per_round: path.instrs as f64 * scale,
            mufu_per_round: path.mufu as f64 * scale,
            shfl: path.shfl as f64,
            bar: path.bar as f64,
            cluster_bar: path.cluster_bar as f64,
            mbar_wait: path.mbar_wait as f64,
            load_groups: (path.load_groups + cached_waits) as f64,
            data_waits: data_waits as f64,
            one_round_per_block: spec.one_round_per_block,
            prefetch_rounds: spec.prefetch_rounds,
        };
        phases.push((
            spec.clone(),
            RegionStats {
                path,
                region: name,
                elems_per_iter: per_iter,
            },
            phase,
        ));
    }
    Ok(Prepared {
        case: case.clone(),
        phases,
    })
}

/// The model's prediction for a prepared case: its phases run one after
/// the other.
pub fn score(m: &Machine, p: &Prepared) -> Row {
    let phases: Vec<_> = p
        .phases
        .iter()
        .map(|(s, r, ph)| (s.clone(), r.clone(), *ph, machine::estimate(m, ph)))
        .collect();
    let seconds: f64 = phases.iter().map(|x| x.3.seconds).sum();
    Row {
        predicted: p.case.floor_bytes / seconds / m.copy_bytes_per_s,
        predicted_bench: p.case.bench_bytes / seconds / m.copy_bytes_per_s,
        case: p.case.clone(),
        phases,
    }
}

/// `target/perf-model-sm90a` (the release fatbins) if it holds a ptxas
/// report and fatbins, else the newest `target/*/build/ferrotron-*/out`
/// that does.
fn default_build_dir(root: &Path) -> Option<PathBuf> {
    let usable =
        |out: &Path| out.join("softmax.fatbin").is_file() && out.join("ptxas-report.txt").is_file();
    let release = root.join("target/perf-model-sm90a");
    if usable(&release) {
        return Some(release);
    }
    let mut candidates = Vec::new();
    for profile in std::fs::read_dir(root.join("target")).ok()?.flatten() {
        let Ok(builds) = std::fs::read_dir(profile.path().join("build")) else {
            continue;
        };
        candidates.extend(
            builds
                .flatten()
                .filter(|b| b.file_name().to_string_lossy().starts_with("ferrotron-"))
                .map(|b| b.path().join("out")),
        );
    }
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for out in candidates.into_iter().filter(|o| usable(o)) {
        let report = out.join("ptxas-report.txt");
        if let Ok(t) = report.metadata().and_then(|m| m.modified()) {
            if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
                best = Some((t, out));
            }
        }
    }
    best.map(|(_, p)| p)
}

fn find_tool(dir: Option<&Path>, name: &str) -> Result<PathBuf, String> {
    if let Some(d) = dir {
        return Ok(d.join(name));
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(p) = std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
        {
            return Ok(p);
        }
    }
    let cache = std::env::var_os("FTN_CI_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".ci-cache"));
    let p = cache.join("sass/nvidia/cu13/bin").join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{name} not found (PATH, {}): pip install --target $FTN_CI_CACHE/sass nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, or pass --tools",
            p.display()
        ))
    }
}

fn run_tool(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Disassembles every `*.fatbin` in `build` for sm_90a (with `keep`, the
/// listings are kept there and reused while newer than their fatbin).
fn load_inputs(
    root: &Path,
    build: &Path,
    tools: Option<&Path>,
    keep: Option<&Path>,
) -> Result<Inputs, String> {
    if let Some(k) = keep {
        let mut fresh = true;
        for e in std::fs::read_dir(build)
            .map_err(|e| e.to_string())?
            .flatten()
        {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "fatbin") {
                let dis = k.join(p.file_stem().unwrap()).with_extension("dis");
                let newer = |a: &Path, b: &Path| {
                    let t = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
                    matches!((t(a), t(b)), (Some(x), Some(y)) if x >= y)
                };
                fresh &= p.file_stem().is_some_and(|s| s == "gemm") || newer(&dis, &p);
            }
        }
        if fresh {
            let mut functions = HashMap::new();
            for e in std::fs::read_dir(k).map_err(|e| e.to_string())?.flatten() {
                if e.path().extension().is_some_and(|x| x == "dis") {
                    let text = std::fs::read_to_string(e.path()).map_err(|e| e.to_string())?;
                    for f in sass::parse(&text) {
                        functions.insert(f.name.clone(), f);
                    }
                }
            }
            let report = std::fs::read_to_string(build.join("ptxas-report.txt"))
                .map_err(|e| format!("{}: {e}", build.display()))?;
            return Ok(Inputs {
                resources: ptxas::parse(&report),
                functions,
                root: root.to_path_buf(),
            });
        }
    }
    let report_path = build.join("ptxas-report.txt");
    let report = std::fs::read_to_string(&report_path)
        .map_err(|e| format!("{}: {e}", report_path.display()))?;
    let cuobjdump = find_tool(tools, "cuobjdump")?;
    let nvdisasm = find_tool(tools, "nvdisasm")?;
    let work = std::env::temp_dir().join(format!("ftn-perf-model-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let mut functions = HashMap::new();
    let result = (|| {
        for entry in std::fs::read_dir(build)
            .map_err(|e| e.to_string())?
            .flatten()
        {
            let p = entry.path();
            if p.extension().is_none_or(|e| e != "fatbin")
                || p.file_stem().is_some_and(|s| s == "gemm")
            {
                continue;
            }
            let fatbin = std::fs::canonicalize(&p).map_err(|e| e.to_string())?;
            run_tool(
                Command::new(&cuobjdump)
                    .current_dir(&work)
                    .args(["-xelf", "all"])
                    .arg(&fatbin),
            )?;
        }
        for entry in std::fs::read_dir(&work)
            .map_err(|e| e.to_string())?
            .flatten()
        {
            let p = entry.path();
            if !p.to_string_lossy().ends_with(&format!(".{ARCH}.cubin")) {
                continue;
            }
            let text = run_tool(Command::new(&nvdisasm).args(["-g", "-c"]).arg(&p))?;
            if let Some(k) = keep {
                let stem = p
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .replace(&format!(".{ARCH}.cubin"), "");
                std::fs::create_dir_all(k).map_err(|e| e.to_string())?;
                std::fs::write(k.join(format!("{stem}.dis")), &text).map_err(|e| e.to_string())?;
            }
            for f in sass::parse(&text) {
                functions.insert(f.name.clone(), f);
            }
        }
        Ok::<(), String>(())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result?;
    Ok(Inputs {
        resources: ptxas::parse(&report),
        functions,
        root: root.to_path_buf(),
    })
}

/// `case name -> minimum predicted fraction` (lines `fraction  name`).
pub fn parse_thresholds(text: &str) -> Result<HashMap<String, f64>, String> {
    let mut m = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (v, name) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("{THRESHOLDS}:{}: expected `fraction name`", i + 1))?;
        let v: f64 = v
            .parse()
            .map_err(|_| format!("{THRESHOLDS}:{}: {v:?} is not a number", i + 1))?;
        m.insert(name.trim().to_string(), v);
    }
    Ok(m)
}

fn key(r: &Row) -> String {
    format!("{}: {}", r.case.family, r.case.name)
}

/// Cases whose prediction is below their threshold, cases without one, and
/// hot paths that call a subroutine (counted as one instruction: the
/// prediction would be too high).
pub fn check(rows: &[Row], thresholds: &HashMap<String, f64>) -> Vec<String> {
    let mut bad = Vec::new();
    for r in rows {
        for (spec, region, _, _) in &r.phases {
            if region.path.calls > 0 {
                bad.push(format!(
                    "{}: the hot path of {} ({}) makes {} subroutine call(s) (CALL), which the model counts as one instruction each; inline the callee (e.g. a 64-bit division or remainder) or take it out of the loop",
                    key(r),
                    spec.kernel,
                    region.region,
                    region.path.calls
                ));
            }
        }
        match thresholds.get(&key(r)) {
            Some(&t) if r.predicted + 1e-9 < t => bad.push(format!(
                "{}: predicted {:.3} of copy, below its threshold {t:.3}",
                key(r),
                r.predicted
            )),
            Some(_) => {}
            None => bad.push(format!("{}: no threshold in {THRESHOLDS}", key(r))),
        }
    }
    bad
}

/// Mean absolute error and RMS of log(predicted / measured) over measured rows.
pub fn errors(rows: &[Row]) -> (f64, f64, usize) {
    let pairs: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| r.case.measured.map(|m| (r.predicted_bench, m)))
        .collect();
    let n = pairs.len().max(1) as f64;
    let mae = pairs.iter().map(|(p, m)| (p - m).abs()).sum::<f64>() / n;
    let rms = (pairs.iter().map(|(p, m)| (p / m).ln().powi(2)).sum::<f64>() / n).sqrt();
    (mae, rms, pairs.len())
}

fn prepare_all(inputs: &Inputs) -> Result<Vec<Prepared>, String> {
    cases::all().iter().map(|c| prepare(inputs, c)).collect()
}

fn score_all(m: &Machine, prepared: &[Prepared]) -> Vec<Row> {
    prepared.iter().map(|p| score(m, p)).collect()
}

/// The target for a target case: ` (>= 0.90 met)` or ` (>= 0.85 not met)`.
fn target_mark(r: &Row) -> String {
    if !r.case.target {
        return String::new();
    }
    let t = target(&r.case);
    let met = if r.predicted >= t { "met" } else { "not met" };
    format!(" (>= {t:.2} {met})")
}

/// >= 0.90 of copy for forward kernels, >= 0.85 for backward ones.
fn target(c: &Case) -> f64 {
    if c.backward {
        0.85
    } else {
        0.90
    }
}

fn fmt_table(rows: &[Row], markdown: bool) -> String {
    let mut s = String::new();
    let head = [
        "family",
        "case",
        "kernel",
        "regs",
        "smem",
        "blocks/SM",
        "warps/SM",
        "KiB in flight/SM",
        "SASS/elem",
        "waits mem/L2",
        "moved/floor",
        "predicted",
        "predicted (measured bytes)",
        "measured",
        "error",
    ];
    let sep = if markdown { " | " } else { "  " };
    if markdown {
        s += &format!(
            "| {} |\n|{}\n",
            head.join(" | "),
            " --- |".repeat(head.len())
        );
    } else {
        s += &format!("{}\n", head.join(sep));
    }
    for r in rows {
        let moved: f64 = r
            .phases
            .iter()
            .map(|p| p.0.elems * p.0.bytes_per_elem)
            .sum();
        for (i, (spec, st, ph, est)) in r.phases.iter().enumerate() {
            let first = i == 0;
            let cells = [
                if first {
                    r.case.family.to_string()
                } else {
                    String::new()
                },
                if first {
                    r.case.name.clone()
                } else {
                    "+".into()
                },
                format!("`{}` ({})", spec.kernel, st.region),
                ph.registers.to_string(),
                ph.smem.to_string(),
                format!("{:.1}", est.blocks_per_sm),
                format!("{:.0}", est.warps_per_sm),
                format!("{:.1}", est.in_flight / 1024.0),
                format!("{:.1}", st.path.instrs as f64 / st.elems_per_iter),
                format!("{}/{}", ph.data_waits, (ph.load_groups - 1.0).max(0.0)),
                if first {
                    format!("{:.2}", moved / r.case.floor_bytes)
                } else {
                    String::new()
                },
                if first {
                    format!("{:.2}{}", r.predicted, target_mark(r))
                } else {
                    String::new()
                },
                match (first, r.case.measured) {
                    (true, Some(_)) => format!("{:.2}", r.predicted_bench),
                    _ => String::new(),
                },
                match (first, r.case.measured) {
                    (true, Some(m)) => format!("{m:.2}"),
                    _ => String::new(),
                },
                match (first, r.case.measured) {
                    (true, Some(m)) => format!("{:+.2}", r.predicted_bench - m),
                    _ => String::new(),
                },
            ];
            if markdown {
                s += &format!("| {} |\n", cells.join(" | "));
            } else {
                s += &format!("{}\n", cells.join(sep));
            }
        }
    }
    s
}

pub fn run(args: &[String]) -> ExitCode {
    match run_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("perf-model: {e}");
            ExitCode::FAILURE
        }
    }
}

fn arg_value(args: &[String], name: &str) -> Option<PathBuf> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
}

fn run_inner(args: &[String]) -> Result<ExitCode, String> {
    let root = arg_value(args, "--root")
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    let root = std::fs::canonicalize(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let build = match arg_value(args, "--build") {
        Some(b) => b,
        None => default_build_dir(&root).ok_or(
            "no `--features cuda` build found under target/ (run `cargo build --features cuda`, or pass --build DIR)",
        )?,
    };
    let tools = arg_value(args, "--tools");
    let keep = arg_value(args, "--keep-sass");
    let inputs = load_inputs(&root, &build, tools.as_deref(), keep.as_deref())?;
    if let Some(k) = arg_value(args, "--explain") {
        let k = k.to_string_lossy().into_owned();
        let f = inputs.functions.get(&k).ok_or(format!("no SASS for {k}"))?;
        for (a, b) in f.loops() {
            let lines: std::collections::BTreeSet<String> = f.instrs[a..=b]
                .iter()
                .filter(|i| i.file.contains("/cuda/") && !i.file.contains("include"))
                .map(|i| format!("{}:{}", i.file.rsplit('/').next().unwrap_or(""), i.line))
                .collect();
            let widest = f.instrs[a..=b]
                .iter()
                .filter_map(|i| i.global_read_bytes())
                .max();
            println!(
                "loop {:#x}..{:#x} widest {:?} path {:?}\n  lines {:?}",
                f.instrs[a].addr,
                f.instrs[b].addr,
                widest,
                f.hot_path(a, Some(b)),
                lines
            );
        }
        println!("kernel path {:?}", f.hot_path(0, None));
        return Ok(ExitCode::SUCCESS);
    }
    let m = H200;
    let prepared = prepare_all(&inputs)?;
    let rows = score_all(&m, &prepared);
    let markdown = args.iter().any(|a| a == "--markdown");
    println!(
        "perf-model: {ARCH} SASS and ptxas report from {}; machine: {} SMs, {:.2} GHz, copy {:.0} GiB/s = {:.1} B/cycle/SM, DRAM latency {:.0} cycles (Little's law: {:.1} KiB in flight per SM), L2 {:.0}, shuffle {:.0}, barrier {:.0} cycles",
        build.display(),
        m.sms,
        m.clock_hz / 1e9,
        m.copy_bytes_per_s / 1073741824.0,
        m.copy_bytes_per_cycle_sm(),
        m.dram_latency,
        m.needed_in_flight() / 1024.0,
        m.l2_latency,
        m.shfl_latency,
        m.bar_latency,
    );
    print!("{}", fmt_table(&rows, markdown));
    let (mae, rms, n) = errors(&rows);
    println!(
        "error vs the {n} measured H200 ratios: mean |predicted - measured| = {mae:.3}, rms log error = {rms:.3}"
    );
    let unmet: Vec<String> = rows
        .iter()
        .filter(|r| r.case.target)
        .filter(|r| r.predicted < target(&r.case))
        .map(key)
        .collect();
    println!(
        "targets (>= 0.90 forward, >= 0.85 backward, at the target shapes): {} of {} met",
        rows.iter().filter(|r| r.case.target).count() - unmet.len(),
        rows.iter().filter(|r| r.case.target).count()
    );
    if args.iter().any(|a| a == "--fit") {
        let mut best = (f64::INFINITY, 0.0);
        for l in (200..=4000).step_by(10) {
            let mm = Machine {
                dram_latency: l as f64,
                ..m
            };
            let (_, rms, _) = errors(&score_all(&mm, &prepared));
            if rms < best.0 {
                best = (rms, l as f64);
            }
        }
        println!(
            "fit: DRAM latency {:.0} cycles gives rms log error {:.3}",
            best.1, best.0
        );
    }
    let tpath = arg_value(args, "--thresholds").unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(THRESHOLDS)
    });
    if args.iter().any(|a| a == "--write-thresholds") {
        let mut text = String::from(
            "# Minimum predicted fraction of copy bandwidth per case (`cargo run -p xtask -- perf-model`\n# fails below it). Written by --write-thresholds: the prediction less 0.03.\n",
        );
        for r in &rows {
            let t = ((r.predicted - MARGIN) * 100.0).floor().max(0.0) / 100.0;
            text += &format!("{t:.2}  {}\n", key(r));
        }
        std::fs::write(&tpath, text).map_err(|e| format!("{}: {e}", tpath.display()))?;
        println!("wrote {}", tpath.display());
        return Ok(ExitCode::SUCCESS);
    }
    let text = std::fs::read_to_string(&tpath).map_err(|e| format!("{}: {e}", tpath.display()))?;
    let bad = check(&rows, &parse_thresholds(&text)?);
    if bad.is_empty() {
        println!("every case at or above its threshold ({})", tpath.display());
        Ok(ExitCode::SUCCESS)
    } else {
        for b in &bad {
            eprintln!("perf-model: {b}");
        }
        Ok(ExitCode::FAILURE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_LOOPS: &str = include_str!("fixtures/two_loops.sass");

    #[test]
    fn region_is_the_copy_that_moves_most_with_vector_accesses() {
        let f = &sass::parse(TWO_LOOPS)[0];
        let (name, s) = region(f, "k.cu", (7, 7), 16).unwrap();
        assert_eq!(name, "loop 0x10..0xc0");
        // Both 128-bit loads and the store; the scalar tail (more bytes,
        // narrower accesses) is skipped.
        assert_eq!((s.ldg, s.ldg_bytes, s.stg_bytes), (2, 32, 16));
        assert_eq!(s.instrs, 6);
        // The scalar loop for a 2-byte anchor width.
        let (name, s) = region(f, "k.cu", (7, 7), 2).unwrap();
        assert_eq!(name, "loop 0x100..0x120");
        assert_eq!(s.instrs, 3);
        // A line no loop holds: the whole kernel.
        let (name, _) = region(f, "k.cu", (5, 5), 16).unwrap();
        assert_eq!(name, "kernel");
        assert!(region(f, "k.cu", (99, 99), 16).is_none());
        assert!(region(f, "other.cu", (7, 7), 16).is_none());
    }

    #[test]
    fn anchors_resolve_to_lines_and_loop_headers_to_their_brace() {
        let dir = std::env::temp_dir().join(format!("ftn-anchor-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("cuda")).unwrap();
        std::fs::write(
            dir.join("cuda/a.cu"),
            "void f() {\n  x = 1;\n}\nvoid g() {\n  for (int i = 0;\n       i < n; ++i) {\n    x = 1;\n  }\n}\n",
        )
        .unwrap();
        let a = |within, snippet| cases::Anchor {
            file: "a.cu",
            within,
            snippet,
            widest: 16,
        };
        assert_eq!(anchor_line(&dir, &a("void f(", "x = 1")).unwrap(), (2, 2));
        assert_eq!(anchor_line(&dir, &a("void g(", "x = 1")).unwrap(), (7, 7));
        assert_eq!(
            anchor_line(&dir, &a("void g(", "for (int i")).unwrap(),
            (5, 6)
        );
        assert!(anchor_line(&dir, &a("void h(", "x"))
            .unwrap_err()
            .contains("no line"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn thresholds_parse_and_fail_below() {
        let t = parse_thresholds("# c\n0.50  copy: a\n\n0.9 bias+GeLU: fwd x\n").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t["bias+GeLU: fwd x"], 0.9);
        assert!(parse_thresholds("abc name")
            .unwrap_err()
            .contains("not a number"));
        assert!(parse_thresholds("0.5").unwrap_err().contains("expected"));
    }

    #[test]
    fn every_case_has_a_distinct_key_and_positive_bytes() {
        let all = cases::all();
        let mut keys: Vec<String> = all
            .iter()
            .map(|c| format!("{}: {}", c.family, c.name))
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), all.len());
        for c in &all {
            assert!(
                c.floor_bytes > 0.0 && c.bench_bytes >= c.floor_bytes,
                "{}",
                c.name
            );
            assert!(!c.phases.is_empty());
            for p in &c.phases {
                assert!(p.threads > 0 && p.blocks > 0 && p.elems > 0.0, "{}", c.name);
            }
        }
    }
}
