//! Shared test helpers (docs/testing.md): seeded random inputs with the seed in
//! every failure message, NaN-poisoned outputs, relative-error comparison
//! with per-dtype tolerances, and the device list (GPU cases are reported as
//! skipped, never passed, when no GPU can be used).
#![allow(dead_code)]

pub mod ddp;
pub mod pipeline;
pub mod ranks;

use std::io::Write as _;

use ferrotron::core::dtype::FloatElement;
use ferrotron::{DType, Device};

/// Relative-error tolerance ||out - ref|| / ||ref|| per storage dtype.
pub fn tolerance(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

/// ||out - ref|| / ||ref|| (absolute when ref is all zeros). NaN if any
/// output is NaN, so a NaN never passes a `<=` check.
pub fn rel_err(out: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        if o.is_nan() {
            return f64::NAN;
        }
        num += (o - r) * (o - r);
        den += r * r;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// Spacing of the dtype's subnormals: the absolute error that storing a
/// result can add however exact the arithmetic (half of it, rounded).
pub fn subnormal_step(d: DType) -> f64 {
    match d {
        DType::F32 => f32::from_bits(1) as f64,
        DType::F16 => half::f16::from_bits(1).to_f64(),
        DType::BF16 => half::bf16::from_bits(1).to_f64(),
        _ => 0.0,
    }
}

/// The absolute error n values stored in `d` may carry however exact the
/// arithmetic: sqrt(n) * the larger of half the subnormal spacing and the
/// smallest normal fp32 (see [`assert_close`]).
fn storage_floor(d: DType, n: usize) -> f64 {
    (n as f64).sqrt() * (subnormal_step(d) / 2.0).max(f32::MIN_POSITIVE as f64)
}

/// Asserts ||out - ref|| <= tolerance(dtype) * ||ref|| + sqrt(n) * floor,
/// naming the case and the seed. `floor` is the larger of half the storage
/// format's subnormal spacing and the smallest normal fp32: results that
/// small (e.g. GeLU of x < -10) are subnormal in the storage format or in the
/// fp32 arithmetic, where no kernel keeps relative accuracy.
#[track_caller]
pub fn assert_close(what: &str, d: DType, seed: u64, out: &[f64], reference: &[f64]) {
    assert_close_scaled(what, d, seed, out, reference, 1.0);
}

/// [`assert_close`] with the dtype's tolerance multiplied by `factor`: for
/// results that pass through several ops, each rounding its output to the
/// storage dtype (the per-dtype tolerance is for one op).
#[track_caller]
pub fn assert_close_scaled(
    what: &str,
    d: DType,
    seed: u64,
    out: &[f64],
    reference: &[f64],
    factor: f64,
) {
    let e = rel_err(out, reference);
    let tol = tolerance(d) * factor;
    let ref_norm = reference.iter().map(|r| r * r).sum::<f64>().sqrt();
    let floor = storage_floor(d, out.len());
    let allowed = if ref_norm > 0.0 {
        tol + floor / ref_norm
    } else {
        tol.max(floor)
    };
    log_margin(e / allowed, what);
    assert!(
        e <= allowed,
        "{what} ({d}): relative error {e:e} > {allowed:e} (seed {seed}; rerun with FTN_TEST_SEED={seed})"
    );
}

/// Sums of |term| per column of a row-major `[rows, cols]` matrix of the
/// terms a column sum adds up: the scale a floating-point sum's error is
/// proportional to, whatever the order of the additions.
pub fn abs_column_sums(terms: &[f64], cols: usize) -> Vec<f64> {
    let mut sums = vec![0.0; cols];
    for row in terms.chunks(cols) {
        for (s, t) in sums.iter_mut().zip(row) {
            *s += t.abs();
        }
    }
    sums
}

/// The scales [`assert_close_sums`] needs for LayerNorm's (RMSNorm's)
/// parameter gradients: [`abs_column_sums`] of dy * xhat (dgamma) and of dy
/// (dbeta), xhat from the saved per-row statistics (`rms`: mean 0).
pub fn norm_param_grad_scales(
    dy: &[f64],
    x: &[f64],
    hidden: usize,
    mean: &[f64],
    rstd: &[f64],
    rms: bool,
) -> (Vec<f64>, Vec<f64>) {
    let dgamma_terms: Vec<f64> = dy
        .iter()
        .zip(x)
        .enumerate()
        .map(|(i, (&d, &v))| {
            let r = i / hidden;
            let m = if rms { 0.0 } else { mean[r] };
            d * (v - m) * rstd[r]
        })
        .collect();
    (
        abs_column_sums(&dgamma_terms, hidden),
        abs_column_sums(dy, hidden),
    )
}

/// [`assert_close`] for column sums (dbias, dgamma, dbeta): the error is
/// measured against `abs_sums` ([`abs_column_sums`] of the terms), not the
/// sums themselves. Terms of both signs cancel (a column of 37 rows can sum
/// to a tenth of its terms), and a sum computed in the storage precision is
/// only accurate relative to the sum of its terms' magnitudes; a dropped or
/// doubled row still moves the result by about 1/rows of that scale.
#[track_caller]
pub fn assert_close_sums(
    what: &str,
    d: DType,
    seed: u64,
    out: &[f64],
    reference: &[f64],
    abs_sums: &[f64],
) {
    assert_eq!(out.len(), reference.len());
    assert_eq!(abs_sums.len(), reference.len());
    if out.iter().any(|o| o.is_nan()) {
        panic!("{what} ({d}): NaN in the output (seed {seed}; rerun with FTN_TEST_SEED={seed})");
    }
    let err = out
        .iter()
        .zip(reference)
        .map(|(o, r)| (o - r) * (o - r))
        .sum::<f64>()
        .sqrt();
    let scale = abs_sums.iter().map(|s| s * s).sum::<f64>().sqrt();
    let allowed = tolerance(d) * scale + storage_floor(d, out.len());
    log_margin(err / allowed, what);
    assert!(
        err <= allowed,
        "{what} ({d}): error {err:e} > {allowed:e} = {:e} x sum of |terms| {scale:e} + floor (seed {seed}; rerun with FTN_TEST_SEED={seed})",
        tolerance(d)
    );
}

/// Asserts |got[i] - want[i]| <= tol * (1 + |want[i]|) for every element
/// (absolute below 1, relative above), naming the first that fails; logs
/// the worst element's margin.
#[track_caller]
pub fn assert_close_each(
    what: &str,
    got: impl ExactSizeIterator<Item = f64>,
    want: &[f64],
    tol: f64,
) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0.0f64;
    for (i, (g, &w)) in got.zip(want).enumerate() {
        let (err, allowed) = ((g - w).abs(), tol * (1.0 + w.abs()));
        assert!(
            err <= allowed,
            "{what}[{i}]: got {g}, want {w} (|error| {err:e} > {allowed:e})"
        );
        worst = worst.max(err / allowed);
    }
    log_margin(worst, what);
}

/// Asserts LayerNorm's (RMSNorm's) dx within tolerance(d), relative to the
/// larger of ||reference|| and ||rstd * gamma * dy||: dx = rstd * (g*dy -
/// mean(g*dy) - xhat * mean(g*dy*xhat)) cancels for tiny rows (hidden = 1:
/// RMSNorm's dx is ~eps/x^2 of its first term). `gamma(col)` is the
/// effective gamma (1 without one, 1 + gamma when zero-centred).
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub fn assert_close_norm_dx(
    what: &str,
    d: DType,
    seed: u64,
    out: &[f64],
    reference: &[f64],
    dy: &[f64],
    rstd: &[f64],
    gamma: impl Fn(usize) -> f64,
) {
    assert_eq!(out.len(), reference.len(), "{what}: length");
    let hidden = dy.len() / rstd.len();
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|t| t * t).sum::<f64>().sqrt();
    let first_term = norm(
        &mut dy
            .iter()
            .enumerate()
            .map(|(i, &g)| rstd[i / hidden] * gamma(i % hidden) * g),
    );
    let num = norm(&mut out.iter().zip(reference).map(|(a, b)| a - b));
    let err = num / norm(&mut reference.iter().copied()).max(first_term);
    log_margin(err / tolerance(d), what);
    assert!(
        err <= tolerance(d),
        "{what}: relative error {err:e} > {:e} (seed {seed}; rerun with FTN_TEST_SEED={seed})",
        tolerance(d)
    );
}

/// With `FTN_TEST_MARGINS=<file>`, appends "ratio file:line what" for a
/// check whose error is `ratio` times its allowance (a pass is <= 1), so
/// checks that pass with little room show before a seed makes them fail
/// (`scripts/test_margins.py` summarises the file per call site). One write
/// per line: the lines of parallel tests do not interleave.
#[track_caller]
pub fn log_margin(ratio: f64, what: &str) {
    if let Ok(path) = std::env::var("FTN_TEST_MARGINS") {
        let loc = std::panic::Location::caller();
        let line = format!(
            "{ratio:.4} {}:{} {}\n",
            loc.file(),
            loc.line(),
            what.replace('\n', " ")
        );
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .unwrap_or_else(|e| panic!("FTN_TEST_MARGINS={path}: cannot append: {e}"));
    }
}

/// SplitMix64: small, seedable, good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// Seeded from `FTN_TEST_SEED`, else from `salt` and the clock (fresh
    /// inputs every run); returns the seed so failures can print it.
    pub fn new(salt: u64) -> (Rng, u64) {
        let seed = std::env::var("FTN_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                t ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            });
        (Rng(seed), seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// `n` values `scale * N(0,1)` rounded to `T`, and the rounded values in f64.
    pub fn tensor<T: FloatElement>(&mut self, n: usize, scale: f64) -> (Vec<T>, Vec<f64>) {
        let v: Vec<T> = (0..n).map(|_| T::from_f64(scale * self.normal())).collect();
        let f = v.iter().map(|x| x.to_f64()).collect();
        (v, f)
    }
}

pub fn to_f64<T: FloatElement>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// The devices every case runs on: the emulator always; GPU 0 when it can be
/// used. Otherwise prints (uncaptured) how many GPU cases this test skipped.
pub fn devices(test: &str, gpu_cases: usize) -> Vec<Device> {
    let mut v = vec![Device::emu()];
    match Device::cuda(0) {
        Ok(d) => v.push(d),
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "[ferrotron] {test}: SKIPPED {gpu_cases} GPU case(s): {e}"
            );
        }
    }
    v
}
