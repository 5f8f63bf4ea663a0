//! Steps `small` and `correctness`: every kernel against the float64 oracles
//! of `ferrotron::reference`, at the tolerances of the per-op tests
//! (`tests/common/mod.rs`: relative error `||out - ref|| / ||ref||` at most
//! 1e-5 for fp32, 1e-3 for fp16, 1e-2 for bf16, plus a subnormal floor).
//!
//! `small` launches every kernel family and path once at tiny shapes and
//! compares every element: bias + GeLU (vector and scalar, forward and
//! backward with dbias), softmax (warp, block and long paths; no mask,
//! padding, causal), LayerNorm / RMSNorm (warp, block and global paths,
//! forward and backward with dgamma/dbeta), GEMM (both tiles, every
//! epilogue, the element-load path, fp32 output, wgrad, the bias gradient),
//! multi-tensor unscale / L2 norm / clip and the device grad scaler,
//! `copy_2d` (16-byte and byte paths), and the vocab-parallel embedding and
//! cross-entropy on a one-rank NCCL communicator (skipped without NCCL).
//! This is what compute-sanitizer runs, so shapes stay tiny.
//!
//! `correctness` runs Megatron shapes (8192-16384 tokens, hidden 1024-20480,
//! ffn 16384, 32 heads, sequence 1024-2048, vocabulary 50257) in bf16, plus
//! fp16 and fp32 at one shape per family. Every output is pre-filled with NaN
//! (an unwritten element fails) and followed by guard elements holding a
//! sentinel byte pattern; the op writes a view of exactly the output's
//! length, and the guard must be intact afterwards. Every deterministic
//! reduction (bias-GeLU dbias, LayerNorm dgamma/dbeta, the GEMM bias
//! gradient, the multi-tensor L2 norm, the vocab cross-entropy loss) runs
//! twice and must agree bit for bit. The large-shape paths run at their real
//! sizes: bias + GeLU whose grid-stride loop wraps past 65,536 blocks,
//! LayerNorm rows spilling into grid y (> 65,536 rows), a batched GEMM with
//! batch > 65,535, and an elementwise op over more than 2^31 bf16 elements
//! (~4.3 GB in, 4.3 GB out). Big outputs are compared on a deterministic
//! sample of rows (always including the first, the last and those around
//! each boundary); reductions over all rows are checked in full, the host
//! work spread over threads. Finally the zeroing race: with a GEMM chain
//! keeping the GPU busy on one stream, freshly zeroed buffers are written
//! and read back on another stream (a late memset would zero them), and
//! read back as zeros when nothing writes them.
//!
//! One table row per check; a failing row is written first, and the step
//! returns an error at the end, so every row is always in the summary.

use std::ops::Range;
use std::time::Instant;

use ferrotron::comm::Communicator;
use ferrotron::core::dtype::FloatElement;
use ferrotron::core::loss_scaler::{DynamicGradScaler, GradScalerConfig};
use ferrotron::core::plan::gemm::GemmTile;
use ferrotron::ops::copy::{copy_2d, Block2d};
use ferrotron::ops::gemm::{Aux, BiasGrad, Epilogue, Gemm, GemmInputs};
use ferrotron::ops::gemm_provider::GemmProvider;
use ferrotron::ops::multi_tensor::{DeviceGradScaler, GradRef, MultiTensor, TensorRef};
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask, SoftmaxPath};
use ferrotron::ops::{BiasGelu, Gelu, LayerNorm, RmsNorm};
use ferrotron::parallel::vocab::{
    padded_vocab_size, VocabParallelCrossEntropy, VocabParallelEmbedding,
};
use ferrotron::reference::{
    bias_gelu as gelu_oracle, gemm as gemm_oracle, layernorm as ln_oracle,
    multi_tensor as mt_oracle, softmax as sm_oracle, vocab_parallel as vp_oracle,
};
use ferrotron::{DType, Device, DeviceBuffer, Element, Error, Result, Stream};
use half::{bf16, f16};

use crate::report::Report;
use crate::timing::Rng;

/// Trailing guard elements after every checked output.
const GUARD: usize = 64;
/// The guard's byte pattern (a finite value in every float format, unlike
/// the 0xFF NaN fill of the output itself).
const SENTINEL: u8 = 0x5A;
/// Rows of a big output compared with the oracle (plus boundary rows).
const SAMPLE_ROWS: usize = 48;

fn fail(message: impl Into<String>) -> Error {
    Error::Backend {
        backend: "check",
        message: message.into(),
    }
}

// ------------------------------------------------------------------ helpers

/// Relative-error tolerance per storage dtype (as `tests/common/mod.rs`).
fn tolerance(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

fn subnormal_step(d: DType) -> f64 {
    match d {
        DType::F32 => f32::from_bits(1) as f64,
        DType::F16 => f16::from_bits(1).to_f64(),
        DType::BF16 => bf16::from_bits(1).to_f64(),
        _ => 0.0,
    }
}

/// `||out - ref|| / ||ref||` (absolute when ref is zero); NaN when any
/// output is NaN or the lengths differ.
fn rel_err(out: &[f64], reference: &[f64]) -> f64 {
    if out.len() != reference.len() {
        return f64::NAN;
    }
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

/// The error and, when it exceeds the tolerance of `tests/common`
/// (`assert_close_scaled`), why.
fn compare(d: DType, out: &[f64], reference: &[f64], factor: f64) -> (f64, Option<String>) {
    let e = rel_err(out, reference);
    let tol = tolerance(d) * factor;
    let ref_norm = reference.iter().map(|r| r * r).sum::<f64>().sqrt();
    let floor = (out.len() as f64).sqrt() * (subnormal_step(d) / 2.0).max(f32::MIN_POSITIVE as f64);
    let allowed = if ref_norm > 0.0 {
        tol + floor / ref_norm
    } else {
        tol.max(floor)
    };
    if e <= allowed {
        (e, None)
    } else if e.is_nan() {
        let nans = out.iter().filter(|v| v.is_nan()).count();
        (e, Some(format!("{nans} NaN element(s) (unwritten?)")))
    } else {
        (e, Some(format!("error {e:.2e} > {allowed:.2e}")))
    }
}

fn to_f64<T: FloatElement>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Rows `rows` (in order) of a row-major `[_, cols]` host matrix, in f64.
fn rows_f64<T: FloatElement>(v: &[T], cols: usize, rows: &[usize]) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows.len() * cols);
    for &r in rows {
        out.extend(v[r * cols..(r + 1) * cols].iter().map(|x| x.to_f64()));
    }
    out
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().min(32))
}

/// `f` over `0..n` split into one contiguous range per thread, results in
/// range order.
fn par<R: Send>(n: usize, f: impl Fn(Range<usize>) -> R + Sync) -> Result<Vec<R>> {
    let t = threads().min(n.max(1));
    let per = n.div_ceil(t).max(1);
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..t)
            .map(|i| {
                let f = &f;
                let range = (i * per).min(n)..((i + 1) * per).min(n);
                sc.spawn(move || f(range))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| fail("a host check thread panicked")))
            .collect()
    })
}

/// `n` values uniform in `[-scale, scale)` rounded to `T`; deterministic for
/// a seed whatever the thread count (blocks of 2^16 seeded by their index).
fn gen<T: FloatElement>(n: usize, seed: u64, scale: f64) -> Vec<T> {
    const BLOCK: usize = 1 << 16;
    let mut v = vec![T::from_f64(0.0); n];
    let per = n.div_ceil(threads()).div_ceil(BLOCK).max(1) * BLOCK;
    std::thread::scope(|sc| {
        for (p, part) in v.chunks_mut(per).enumerate() {
            sc.spawn(move || {
                for (b, block) in part.chunks_mut(BLOCK).enumerate() {
                    let index = (p * per / BLOCK + b) as u64;
                    let mut rng = Rng::new(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    for x in block {
                        *x = T::from_f64(scale * rng.sym());
                    }
                }
            });
        }
    });
    v
}

/// All rows when `full`, else about `SAMPLE_ROWS` evenly spaced rows plus the
/// first, the last and every `extra` row in range; sorted, distinct.
fn pick(rows: usize, full: bool, extra: &[usize]) -> Vec<usize> {
    if full || rows <= SAMPLE_ROWS {
        return (0..rows).collect();
    }
    let mut v: Vec<usize> = (0..SAMPLE_ROWS)
        .map(|i| i * (rows - 1) / (SAMPLE_ROWS - 1))
        .collect();
    v.extend(extra.iter().copied().filter(|&r| r < rows));
    v.sort_unstable();
    v.dedup();
    v
}

/// A NaN-filled buffer (0xFF bytes are NaN in every float format).
fn poisoned<T: Element>(s: &Stream, n: usize) -> Result<DeviceBuffer<T>> {
    let mut b = s.device().alloc_zeros::<T>(n)?;
    s.fill_bytes(&mut b, 0xFF)?;
    Ok(b)
}

/// A non-owning view of `len` elements of `buf` from element `start`.
///
/// # Safety
/// `buf` must outlive the view and every launch that uses it, and
/// `start + len <= buf.len()`.
unsafe fn view_of<T: Element>(
    buf: &DeviceBuffer<T>,
    start: usize,
    len: usize,
) -> Result<DeviceBuffer<T>> {
    if start + len > buf.len() {
        return Err(fail(format!(
            "view {start}+{len} past a buffer of {}",
            buf.len()
        )));
    }
    let addr = buf.addr() + (start * T::DTYPE.size()) as u64;
    DeviceBuffer::from_raw_parts(buf.device(), addr, len)
}

/// An output of `len` NaN elements followed by `GUARD` sentinel elements.
/// Ops write `view()`, a buffer of exactly `len` elements.
struct Guarded<T: Element> {
    buf: DeviceBuffer<T>,
    len: usize,
}

impl<T: Element> Guarded<T> {
    fn new(s: &Stream, len: usize) -> Result<Self> {
        let buf = poisoned::<T>(s, len + GUARD)?;
        // SAFETY: `buf` holds len + GUARD elements and outlives the view,
        // which only this enqueued fill uses; the stream is synchronised
        // below before the view is dropped.
        let mut tail = unsafe { view_of(&buf, len, GUARD)? };
        s.fill_bytes(&mut tail, SENTINEL)?;
        s.synchronize()?;
        Ok(Guarded { buf, len })
    }

    /// The output itself.
    fn view(&self) -> Result<DeviceBuffer<T>> {
        // SAFETY: the first `len` elements of `buf`; every caller uses the
        // view for launches it synchronises (or reads back) while `self`,
        // which owns `buf`, is still alive.
        unsafe { view_of(&self.buf, 0, self.len) }
    }

    /// `None` when every guard byte still holds the sentinel.
    fn guard(&self) -> Result<Option<String>> {
        // SAFETY: the guard elements of `buf`, read synchronously (to_host
        // waits for the device) while `self` is alive.
        let tail = unsafe { view_of(&self.buf, self.len, GUARD)? }.to_host()?;
        let bad = bytemuck::cast_slice::<T, u8>(&tail)
            .iter()
            .filter(|&&b| b != SENTINEL)
            .count();
        Ok((bad > 0).then(|| format!("{bad} guard byte(s) past the output overwritten")))
    }

    fn host(&self) -> Result<Vec<T>> {
        self.view()?.to_host()
    }

    /// Rows `rows` of a `[_, cols]` output, concatenated.
    fn rows(&self, cols: usize, rows: &[usize]) -> Result<Vec<T>> {
        if rows.len() * cols == self.len {
            return self.host();
        }
        let mut out = Vec::with_capacity(rows.len() * cols);
        for &r in rows {
            // SAFETY: a row inside the output, read synchronously.
            out.extend(unsafe { view_of(&self.buf, r * cols, cols)? }.to_host()?);
        }
        Ok(out)
    }
}

fn bits<T: Element>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// The step's state: its stream, the report and the failures so far.
struct Ctx<'a> {
    dev: &'a Device,
    s: Stream,
    r: &'a mut Report,
    /// Compare every element (`small`) rather than a sample.
    full: bool,
    rows: usize,
    fails: Vec<String>,
}

impl<'a> Ctx<'a> {
    fn new(dev: &'a Device, r: &'a mut Report, full: bool) -> Result<Self> {
        r.header(&["family", "variant", "dtype", "rel. error", "result"]);
        Ok(Ctx {
            dev,
            s: dev.new_stream()?,
            r,
            full,
            rows: 0,
            fails: Vec::new(),
        })
    }

    /// One table row; `problems` empty means pass.
    fn row(
        &mut self,
        family: &str,
        variant: &str,
        d: &str,
        err: Option<f64>,
        problems: Vec<String>,
    ) {
        self.rows += 1;
        let e = err.map_or("-".to_string(), |e| format!("{e:.2e}"));
        let verdict = if problems.is_empty() {
            "pass".to_string()
        } else {
            let text = problems.join("; ");
            self.fails.push(format!("{family} {variant} {d}: {text}"));
            format!("**FAIL**: {text}")
        };
        self.r
            .row(&[family.into(), variant.into(), d.into(), e, verdict]);
    }

    /// A row comparing `got` with `want`, with other problems (guards).
    #[allow(clippy::too_many_arguments)]
    fn cmp(
        &mut self,
        family: &str,
        variant: &str,
        d: DType,
        got: &[f64],
        want: &[f64],
        factor: f64,
        more: Vec<Option<String>>,
    ) {
        let (e, p) = compare(d, got, want, factor);
        let problems: Vec<String> = p.into_iter().chain(more.into_iter().flatten()).collect();
        self.row(family, variant, &d.to_string(), Some(e), problems);
    }

    /// A bitwise-rerun row.
    fn rerun<T: Element>(&mut self, family: &str, variant: &str, a: &[T], b: &[T]) {
        let same = bits(a) == bits(b);
        let p = if same {
            vec![]
        } else {
            vec!["second run differs bitwise".to_string()]
        };
        self.row(
            family,
            &format!("{variant}: bitwise rerun"),
            &T::DTYPE.to_string(),
            None,
            p,
        );
    }

    fn finish(self) -> Result<()> {
        self.r.line(&format!(
            "{} check(s), {} failed",
            self.rows,
            self.fails.len()
        ));
        if self.fails.is_empty() {
            Ok(())
        } else {
            let mut m = self.fails[..self.fails.len().min(5)].join(" | ");
            if self.fails.len() > 5 {
                m += &format!(" | and {} more", self.fails.len() - 5);
            }
            Err(fail(format!("{} check(s) failed: {m}", self.fails.len())))
        }
    }
}

// ------------------------------------------------------------ bias + GeLU

#[allow(clippy::too_many_arguments)]
fn bias_gelu<T: FloatElement>(
    c: &mut Ctx,
    label: &str,
    rows: usize,
    cols: usize,
    gelu: Gelu,
    vectorize: bool,
    rerun: bool,
    seed: u64,
) -> Result<()> {
    let n = rows * cols;
    let x = gen::<T>(n, seed, 3.0);
    let b = gen::<T>(cols, seed + 1, 1.0);
    let dy = gen::<T>(n, seed + 2, 1.0);
    let (xd, bd, dyd) = (c.dev.upload(&x)?, c.dev.upload(&b)?, c.dev.upload(&dy)?);
    let op = BiasGelu::new(rows, cols)
        .with_gelu(gelu)
        .with_vectorize(vectorize);
    let y = Guarded::<T>::new(&c.s, n)?;
    op.forward(&c.s, &xd, Some(&bd), &mut y.view()?)?;
    let dx = Guarded::<T>::new(&c.s, n)?;
    let db = Guarded::<T>::new(&c.s, cols)?;
    op.backward(
        &c.s,
        &dyd,
        &xd,
        Some(&bd),
        &mut dx.view()?,
        Some(&mut db.view()?),
    )?;
    c.s.synchronize()?;
    let path = if vectorize { "vector" } else { "scalar" };
    let variant = format!("{label} {rows}x{cols} {gelu:?} {path}");

    let sample = pick(rows, c.full, &[]);
    let bf = to_f64(&b);
    let (xs, dys) = (rows_f64(&x, cols, &sample), rows_f64(&dy, cols, &sample));
    let want_y = gelu_oracle::forward(gelu, &xs, Some(&bf), cols);
    let got_y = to_f64(&y.rows(cols, &sample)?);
    let g = y.guard()?;
    c.cmp(
        "bias+GeLU",
        &format!("fwd {variant}"),
        T::DTYPE,
        &got_y,
        &want_y,
        1.0,
        vec![g],
    );
    let (want_dx, _) = gelu_oracle::backward(gelu, &dys, &xs, Some(&bf), cols);
    let got_dx = to_f64(&dx.rows(cols, &sample)?);
    let g = dx.guard()?;
    c.cmp(
        "bias+GeLU",
        &format!("bwd dx {variant}"),
        T::DTYPE,
        &got_dx,
        &want_dx,
        1.0,
        vec![g],
    );

    // dbias over every row: the oracle on blocks of rows, partial sums added.
    let partials = par(rows, |range| {
        let mut acc = vec![0.0f64; cols];
        let mut r0 = range.start;
        while r0 < range.end {
            let r1 = (r0 + 256).min(range.end);
            let xs = to_f64(&x[r0 * cols..r1 * cols]);
            let dys = to_f64(&dy[r0 * cols..r1 * cols]);
            let (_, part) = gelu_oracle::backward(gelu, &dys, &xs, Some(&bf), cols);
            for (a, p) in acc.iter_mut().zip(&part) {
                *a += p;
            }
            r0 = r1;
        }
        acc
    })?;
    let mut want_db = vec![0.0f64; cols];
    for p in &partials {
        for (a, v) in want_db.iter_mut().zip(p) {
            *a += v;
        }
    }
    let first = db.host()?;
    let g = db.guard()?;
    c.cmp(
        "bias+GeLU",
        &format!("bwd dbias {variant}"),
        T::DTYPE,
        &to_f64(&first),
        &want_db,
        1.0,
        vec![g],
    );
    if rerun {
        let mut db2 = poisoned::<T>(&c.s, cols)?;
        op.backward(&c.s, &dyd, &xd, Some(&bd), &mut dx.view()?, Some(&mut db2))?;
        c.s.synchronize()?;
        let second = db2.to_host()?;
        c.rerun("bias+GeLU", &format!("dbias {variant}"), &first, &second);
    }
    Ok(())
}

/// Forward over more than 2^31 bf16 elements: x is a random block of rows
/// repeated on the device (`copy_device` into views), the output is read
/// back on sampled rows, including those around element 2^31.
fn bias_gelu_huge(c: &mut Ctx) -> Result<()> {
    let (rows, cols, block_rows) = (131_080usize, 16_384usize, 1021usize);
    let n = rows * cols;
    let block = gen::<bf16>(block_rows * cols, 0xB16, 3.0);
    let b = gen::<bf16>(cols, 0xB17, 1.0);
    let bd = c.dev.upload(&b)?;
    let blockd = c.dev.upload(&block)?;
    let xd = c.dev.alloc_zeros::<bf16>(n)?;
    let mut r0 = 0;
    while r0 < rows {
        let len = block_rows.min(rows - r0) * cols;
        // SAFETY: `xd` and `blockd` outlive the copy, synchronised below.
        let mut dst = unsafe { view_of(&xd, r0 * cols, len)? };
        let src = unsafe { view_of(&blockd, 0, len)? };
        c.s.copy_device(&src, &mut dst)?;
        r0 += block_rows;
    }
    c.s.synchronize()?;
    let y = Guarded::<bf16>::new(&c.s, n)?;
    let t = Instant::now();
    BiasGelu::new(rows, cols).with_gelu(Gelu::Tanh).forward(
        &c.s,
        &xd,
        Some(&bd),
        &mut y.view()?,
    )?;
    c.s.synchronize()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let edge = (1usize << 31) / cols;
    let sample = pick(rows, false, &[edge - 1, edge, edge + 1, rows - 2]);
    let xs: Vec<f64> = sample
        .iter()
        .flat_map(|&r| {
            let br = r % block_rows;
            block[br * cols..(br + 1) * cols].iter().map(|v| v.to_f64())
        })
        .collect();
    let want = gelu_oracle::forward(Gelu::Tanh, &xs, Some(&to_f64(&b)), cols);
    let got = to_f64(&y.rows(cols, &sample)?);
    let g = y.guard()?;
    c.cmp(
        "bias+GeLU",
        &format!("fwd {rows}x{cols} = {n} elements > 2^31 (offsets past 2^31; {ms:.0} ms)"),
        DType::BF16,
        &got,
        &want,
        1.0,
        vec![g],
    );
    Ok(())
}

// ------------------------------------------------------------------ softmax

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    None,
    Padding,
    Causal,
}

#[allow(clippy::too_many_arguments)]
fn softmax<T: FloatElement>(
    c: &mut Ctx,
    label: &str,
    shape: sm_oracle::Shape,
    mode: Mode,
    path: SoftmaxPath,
    vectorize: bool,
    seed: u64,
) -> Result<()> {
    let sm_oracle::Shape { b, np, sq, sk } = shape;
    let n = b * np * sq * sk;
    let scale = 0.125f32;
    let x = gen::<T>(n, seed, 8.0);
    let dy = gen::<T>(n, seed + 1, 1.0);
    let mask: Vec<u8> = if mode == Mode::Padding {
        let mut rng = Rng::new(seed + 2);
        let mut m: Vec<u8> = (0..b * sq * sk)
            .map(|_| u8::from(rng.sym() < -0.4))
            .collect();
        for mat in m.chunks_mut(sq * sk) {
            mat[..sk].fill(1); // a fully masked row per batch entry
        }
        m
    } else {
        Vec::new()
    };
    let maskd = c.dev.upload(&mask)?;
    let dmask = match mode {
        Mode::None => SoftmaxMask::None,
        Mode::Causal => SoftmaxMask::Causal,
        Mode::Padding => SoftmaxMask::Padding(&maskd),
    };
    let op = ScaleMaskSoftmax::new(b, np, sq, sk, scale)
        .with_vectorize(vectorize)
        .with_path(Some(path));
    let (xd, dyd) = (c.dev.upload(&x)?, c.dev.upload(&dy)?);
    let y = Guarded::<T>::new(&c.s, n)?;
    op.forward(&c.s, &xd, dmask, &mut y.view()?)?;
    let dx = Guarded::<T>::new(&c.s, n)?;
    op.backward(&c.s, &y.view()?, &dyd, &mut dx.view()?)?;
    c.s.synchronize()?;
    let variant = format!("{label} {path:?} [{b},{np},{sq},{sk}] {mode:?}");

    // Whole [sq, sk] matrices: all, or the first and the last.
    let mats: Vec<usize> = if c.full || b * np <= 2 {
        (0..b * np).collect()
    } else {
        vec![0, b * np - 1]
    };
    let rows: Vec<usize> = mats.iter().flat_map(|&m| m * sq..(m + 1) * sq).collect();
    let got_y = to_f64(&y.rows(sk, &rows)?);
    let got_dx = to_f64(&dx.rows(sk, &rows)?);
    let (mut want_y, mut want_dx) = (Vec::new(), Vec::new());
    let one = sm_oracle::Shape {
        b: 1,
        np: 1,
        sq,
        sk,
    };
    for (i, &m) in mats.iter().enumerate() {
        let xs = to_f64(&x[m * sq * sk..(m + 1) * sq * sk]);
        let bi = m / np;
        let om = match mode {
            Mode::None => sm_oracle::Mask::None,
            Mode::Causal => sm_oracle::Mask::Causal,
            Mode::Padding => sm_oracle::Mask::Padding(&mask[bi * sq * sk..(bi + 1) * sq * sk]),
        };
        want_y.extend(sm_oracle::forward(&xs, one, scale as f64, om));
        let ys = &got_y[i * sq * sk..(i + 1) * sq * sk];
        let dys = to_f64(&dy[m * sq * sk..(m + 1) * sq * sk]);
        want_dx.extend(sm_oracle::backward(ys, &dys, sk, scale as f64));
    }
    let g = y.guard()?;
    c.cmp(
        "softmax",
        &format!("fwd {variant}"),
        T::DTYPE,
        &got_y,
        &want_y,
        1.0,
        vec![g],
    );
    let g = dx.guard()?;
    c.cmp(
        "softmax",
        &format!("bwd {variant}"),
        T::DTYPE,
        &got_dx,
        &want_dx,
        1.0,
        vec![g],
    );
    Ok(())
}

// -------------------------------------------------------- LayerNorm, RMSNorm

#[allow(clippy::too_many_arguments)]
fn norm<T: FloatElement>(
    c: &mut Ctx,
    label: &str,
    rows: usize,
    hidden: usize,
    rms: bool,
    rerun: bool,
    extra_rows: &[usize],
    seed: u64,
) -> Result<()> {
    let n = rows * hidden;
    let eps = 1e-5f32;
    let x = gen::<T>(n, seed, 2.0);
    let g = gen::<T>(hidden, seed + 1, 1.0);
    let bt = gen::<T>(hidden, seed + 2, 1.0);
    let dy = gen::<T>(n, seed + 3, 1.0);
    let (xd, gd, bd, dyd) = (
        c.dev.upload(&x)?,
        c.dev.upload(&g)?,
        c.dev.upload(&bt)?,
        c.dev.upload(&dy)?,
    );
    let y = Guarded::<T>::new(&c.s, n)?;
    let mean = Guarded::<f32>::new(&c.s, rows)?;
    let rstd = Guarded::<f32>::new(&c.s, rows)?;
    let dx = Guarded::<T>::new(&c.s, n)?;
    let dg = Guarded::<T>::new(&c.s, hidden)?;
    let db = Guarded::<T>::new(&c.s, hidden)?;
    let s = c.s.clone();
    let backward = |dgv: &mut DeviceBuffer<T>, dbv: &mut DeviceBuffer<T>| -> Result<()> {
        if rms {
            RmsNorm::new(rows, hidden).backward(
                &s,
                &dyd,
                &xd,
                &rstd.view()?,
                Some(&gd),
                &mut dx.view()?,
                Some(dgv),
            )
        } else {
            LayerNorm::new(rows, hidden).backward(
                &s,
                &dyd,
                &xd,
                &mean.view()?,
                &rstd.view()?,
                Some(&gd),
                &mut dx.view()?,
                Some(dgv),
                Some(dbv),
            )
        }
    };
    if rms {
        RmsNorm::new(rows, hidden).with_eps(eps).forward(
            &c.s,
            &xd,
            Some(&gd),
            &mut y.view()?,
            &mut rstd.view()?,
        )?;
    } else {
        LayerNorm::new(rows, hidden).with_eps(eps).forward(
            &c.s,
            &xd,
            Some(&gd),
            Some(&bd),
            &mut y.view()?,
            &mut mean.view()?,
            &mut rstd.view()?,
        )?;
    }
    backward(&mut dg.view()?, &mut db.view()?)?;
    c.s.synchronize()?;
    let fam = if rms { "RMSNorm" } else { "LayerNorm" };
    let variant = format!("{label} {rows}x{hidden}");

    let sample = pick(rows, c.full, extra_rows);
    let (gf, bf) = (to_f64(&g), to_f64(&bt));
    let xs = rows_f64(&x, hidden, &sample);
    let want = ln_oracle::forward(
        &xs,
        hidden,
        Some(&gf[..]),
        (!rms).then_some(&bf[..]),
        eps as f64,
        false,
        rms,
    );
    let got_y = to_f64(&y.rows(hidden, &sample)?);
    let gy = y.guard()?;
    c.cmp(
        fam,
        &format!("fwd y {variant}"),
        T::DTYPE,
        &got_y,
        &want.y,
        1.0,
        vec![gy],
    );
    let rstd_h: Vec<f64> = rstd.host()?.iter().map(|&v| v as f64).collect();
    let mean_h: Vec<f64> = if rms {
        vec![0.0; rows]
    } else {
        mean.host()?.iter().map(|&v| v as f64).collect()
    };
    let mut stat_problems = vec![rstd.guard()?];
    let mut worst = 0.0f64;
    for (i, &r) in sample.iter().enumerate() {
        let e = (rstd_h[r] - want.rstd[i]).abs() / want.rstd[i];
        worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
        if !rms {
            let spread = want.mean[i].abs() + 1.0 / want.rstd[i];
            let e = (mean_h[r] - want.mean[i]).abs() / spread * 10.0;
            worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
        }
    }
    if worst > 1e-5 {
        stat_problems.push(Some(format!("rstd/mean error {worst:.2e} > 1e-5")));
    }
    if !rms {
        stat_problems.push(mean.guard()?);
    }
    let problems: Vec<String> = stat_problems.into_iter().flatten().collect();
    c.row(
        fam,
        &format!("fwd mean/rstd {variant}"),
        "f32",
        Some(worst),
        problems,
    );

    // dx on the sampled rows, with the saved statistics (as tests/layernorm).
    let ms: Vec<f64> = sample.iter().map(|&r| mean_h[r]).collect();
    let rs: Vec<f64> = sample.iter().map(|&r| rstd_h[r]).collect();
    let dys = rows_f64(&dy, hidden, &sample);
    let rb = ln_oracle::backward_with_stats(&dys, &xs, hidden, Some(&gf[..]), &ms, &rs, false, rms);
    let got_dx = to_f64(&dx.rows(hidden, &sample)?);
    let first_term = dys
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            let t = rs[i / hidden] * gf[i % hidden] * d;
            t * t
        })
        .sum::<f64>()
        .sqrt();
    let num = got_dx
        .iter()
        .zip(&rb.dx)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        .sqrt();
    let den = rb
        .dx
        .iter()
        .map(|v| v * v)
        .sum::<f64>()
        .sqrt()
        .max(first_term);
    let e = num / den;
    let mut p: Vec<String> = dx.guard()?.into_iter().collect();
    if e.is_nan() || e > tolerance(T::DTYPE) {
        p.push(format!("error {e:.2e} > {:.0e}", tolerance(T::DTYPE)));
    }
    c.row(
        fam,
        &format!("bwd dx {variant}"),
        &T::DTYPE.to_string(),
        Some(e),
        p,
    );

    // dgamma / dbeta over every row: the oracle on row blocks, summed.
    let partials = par(rows, |range| {
        let mut acc = (vec![0.0f64; hidden], vec![0.0f64; hidden]);
        let mut r0 = range.start;
        while r0 < range.end {
            let r1 = (r0 + 256).min(range.end);
            let rb = ln_oracle::backward_with_stats(
                &to_f64(&dy[r0 * hidden..r1 * hidden]),
                &to_f64(&x[r0 * hidden..r1 * hidden]),
                hidden,
                Some(&gf[..]),
                &mean_h[r0..r1],
                &rstd_h[r0..r1],
                false,
                rms,
            );
            for (a, v) in acc.0.iter_mut().zip(&rb.dgamma) {
                *a += v;
            }
            if !rms {
                for (a, v) in acc.1.iter_mut().zip(&rb.dbeta) {
                    *a += v;
                }
            }
            r0 = r1;
        }
        acc
    })?;
    let (mut want_dg, mut want_db) = (vec![0.0f64; hidden], vec![0.0f64; hidden]);
    for (pg, pb) in &partials {
        for i in 0..hidden {
            want_dg[i] += pg[i];
            want_db[i] += pb[i];
        }
    }
    let first_g = dg.host()?;
    let gg = dg.guard()?;
    c.cmp(
        fam,
        &format!("bwd dgamma {variant}"),
        T::DTYPE,
        &to_f64(&first_g),
        &want_dg,
        1.0,
        vec![gg],
    );
    let first_b = db.host()?;
    if !rms {
        let gb = db.guard()?;
        c.cmp(
            fam,
            &format!("bwd dbeta {variant}"),
            T::DTYPE,
            &to_f64(&first_b),
            &want_db,
            1.0,
            vec![gb],
        );
    }
    if rerun {
        let mut dg2 = poisoned::<T>(&c.s, hidden)?;
        let mut db2 = poisoned::<T>(&c.s, hidden)?;
        backward(&mut dg2, &mut db2)?;
        c.s.synchronize()?;
        let (g2, b2) = (dg2.to_host()?, db2.to_host()?);
        c.rerun(fam, &format!("dgamma {variant}"), &first_g, &g2);
        if !rms {
            c.rerun(fam, &format!("dbeta {variant}"), &first_b, &b2);
        }
    }
    Ok(())
}

// --------------------------------------------------------------------- GEMM

#[derive(Clone, Copy, Debug)]
struct GemmCase {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    ta: bool,
    tb: bool,
    epi: Epilogue,
    tile: Option<GemmTile>,
    fast: bool,
}

impl GemmCase {
    fn new(m: usize, n: usize, k: usize) -> Self {
        GemmCase {
            m,
            n,
            k,
            batch: 1,
            ta: false,
            tb: false,
            epi: Epilogue::None,
            tile: None,
            fast: true,
        }
    }
}

/// One GEMM against the oracle on sampled (batch, row) pairs: all when
/// `full`; else every batch entry in `batches` (all rows when m is small,
/// sampled rows otherwise).
fn gemm<T: FloatElement, O: FloatElement>(
    c: &mut Ctx,
    label: &str,
    g: GemmCase,
    batches: &[usize],
    seed: u64,
) -> Result<()> {
    let GemmCase {
        m,
        n,
        k,
        batch,
        ta,
        tb,
        epi,
        ..
    } = g;
    let (ra, ca) = if ta { (k, m) } else { (m, k) };
    let (rb, cb) = if tb { (n, k) } else { (k, n) };
    let (sa, sb, sd) = (m * k, k * n, m * n);
    let with_bias = matches!(epi, Epilogue::Bias | Epilogue::BiasGelu(_));
    let a = gen::<T>(batch * sa, seed, 1.0);
    let b = gen::<T>(batch * sb, seed + 1, 1.0);
    let bias = gen::<T>(n, seed + 2, 1.0);
    let pre_in: Vec<O> = if matches!(epi, Epilogue::DGelu(_)) {
        gen::<O>(batch * sd, seed + 3, 2.0)
    } else {
        Vec::new()
    };
    let (ad, bd, biasd, pred) = (
        c.dev.upload(&a)?,
        c.dev.upload(&b)?,
        c.dev.upload(&bias)?,
        c.dev.upload(&pre_in)?,
    );
    let d = Guarded::<O>::new(&c.s, batch * sd)?;
    let pre = Guarded::<O>::new(&c.s, batch * sd)?;
    let op = Gemm::new(m, n, k)
        .provider(GemmProvider::Ferrotron)
        .trans_a(ta)
        .trans_b(tb)
        .batch(batch)
        .epilogue(epi)
        .tile(g.tile)
        .fast_path(g.fast);
    let mut pre_view = pre.view()?;
    let aux = match epi {
        Epilogue::BiasGelu(_) => Aux::Store(&mut pre_view),
        Epilogue::DGelu(_) => Aux::PreActivation(&pred),
        _ => Aux::None,
    };
    let inputs = GemmInputs {
        a: &ad,
        b: &bd,
        bias: with_bias.then_some(&biasd),
        c: None,
    };
    let t = Instant::now();
    op.run(&c.s, inputs, aux, &mut d.view()?)?;
    c.s.synchronize()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;

    let tile = g.tile.map_or("auto tile".to_string(), |t| format!("{t:?}"));
    let fast = if g.fast { "" } else { " element loads" };
    let bstr = if batch > 1 {
        format!(" batch {batch}")
    } else {
        String::new()
    };
    let variant = format!(
        "{label} {m}x{n}x{k}{bstr} ta={ta} tb={tb} {epi:?} {tile}{fast} -> {}{}",
        O::DTYPE,
        if c.full {
            String::new()
        } else {
            format!(" ({ms:.0} ms)")
        }
    );
    let bias_f = to_f64(&bias);
    let batches: Vec<usize> = if c.full {
        (0..batch).collect()
    } else {
        batches.iter().copied().filter(|&z| z < batch).collect()
    };
    let rows = pick(m, c.full, &[]);
    // (batch entry, row) pairs, the oracle on each row in parallel.
    let pairs: Vec<(usize, usize)> = batches
        .iter()
        .flat_map(|&z| rows.iter().map(move |&i| (z, i)))
        .collect();
    let mut b_cache: Vec<(usize, Vec<f64>)> = Vec::new();
    for &z in &batches {
        b_cache.push((z, to_f64(&b[z * sb..(z + 1) * sb])));
    }
    let results = par(pairs.len(), |range| {
        let mut out = Vec::new();
        for &(z, i) in &pairs[range] {
            let a_row: Vec<f64> = (0..k)
                .map(|l| {
                    let idx = if ta { l * ca + i } else { i * ca + l };
                    a[z * sa + idx].to_f64()
                })
                .collect();
            let bf = b_cache
                .iter()
                .find(|(bz, _)| *bz == z)
                .map(|(_, v)| v.as_slice())
                .unwrap_or(&[]);
            let aux_row: Vec<f64> = if pre_in.is_empty() {
                vec![0.0; n]
            } else {
                to_f64(&pre_in[z * sd + i * n..z * sd + (i + 1) * n])
            };
            let p = gemm_oracle::Problem {
                m: 1,
                n,
                k,
                batch: 1,
                trans_a: false,
                trans_b: tb,
                alpha: 1.0,
                beta: 0.0,
                epilogue: epi,
            };
            let mat = |data, ld, stride| gemm_oracle::Mat { data, ld, stride };
            let _ = rb;
            out.push(gemm_oracle::gemm(
                &p,
                mat(&a_row, k, k),
                mat(bf, cb, sb),
                None,
                with_bias.then_some(&bias_f[..]),
                Some(mat(&aux_row, n, n)),
            ));
        }
        out
    })?;
    let (mut want, mut want_pre) = (Vec::new(), Vec::new());
    for (dv, pv) in results.into_iter().flatten() {
        want.extend(dv);
        want_pre.extend(pv);
    }
    let flat: Vec<usize> = pairs.iter().map(|&(z, i)| z * m + i).collect();
    let got = to_f64(&d.rows(n, &flat)?);
    let gd = d.guard()?;
    c.cmp("GEMM", &variant, O::DTYPE, &got, &want, 1.0, vec![gd]);
    if matches!(epi, Epilogue::BiasGelu(_)) {
        let got_pre = to_f64(&pre.rows(n, &flat)?);
        let gp = pre.guard()?;
        c.cmp(
            "GEMM",
            &format!("pre-activation of {variant}"),
            O::DTYPE,
            &got_pre,
            &want_pre,
            1.0,
            vec![gp],
        );
    }
    let _ = ra;
    Ok(())
}

/// `dbias = column sums of dy` (fixed order), twice when `rerun`.
fn bias_grad(c: &mut Ctx, rows: usize, cols: usize, rerun: bool, seed: u64) -> Result<()> {
    let dy = gen::<bf16>(rows * cols, seed, 1.0);
    let dyd = c.dev.upload(&dy)?;
    let db = Guarded::<bf16>::new(&c.s, cols)?;
    BiasGrad::new(rows, cols).run(&c.s, &dyd, &mut db.view()?)?;
    c.s.synchronize()?;
    let partials = par(rows, |range| {
        let xs = to_f64(&dy[range.start * cols..range.end * cols]);
        gemm_oracle::column_sums(&xs, range.len(), cols, cols)
    })?;
    let mut want = vec![0.0f64; cols];
    for p in &partials {
        for (a, v) in want.iter_mut().zip(p) {
            *a += v;
        }
    }
    let first = db.host()?;
    let g = db.guard()?;
    let variant = format!("bias gradient {rows}x{cols}");
    c.cmp(
        "GEMM",
        &variant,
        DType::BF16,
        &to_f64(&first),
        &want,
        1.0,
        vec![g],
    );
    if rerun {
        let mut db2 = poisoned::<bf16>(&c.s, cols)?;
        BiasGrad::new(rows, cols).run(&c.s, &dyd, &mut db2)?;
        c.s.synchronize()?;
        let second = db2.to_host()?;
        c.rerun("GEMM", &variant, &first, &second);
    }
    Ok(())
}

// ------------------------------------------------------------- multi-tensor

enum Buf {
    F32(DeviceBuffer<f32>),
    F16(DeviceBuffer<f16>),
    BF16(DeviceBuffer<bf16>),
}

impl Buf {
    fn grad(&mut self) -> GradRef<'_> {
        match self {
            Buf::F32(b) => b.into(),
            Buf::F16(b) => b.into(),
            Buf::BF16(b) => b.into(),
        }
    }
    fn tensor(&self) -> TensorRef<'_> {
        match self {
            Buf::F32(b) => b.into(),
            Buf::F16(b) => b.into(),
            Buf::BF16(b) => b.into(),
        }
    }
    fn host(&self) -> Result<Vec<f64>> {
        Ok(match self {
            Buf::F32(b) => to_f64(&b.to_host()?),
            Buf::F16(b) => to_f64(&b.to_host()?),
            Buf::BF16(b) => to_f64(&b.to_host()?),
        })
    }
    fn dtype(&self) -> DType {
        self.tensor().dtype()
    }
    /// `x` rounded to this tensor's dtype.
    fn round(&self, x: f32) -> f64 {
        match self {
            Buf::F32(_) => x as f64,
            Buf::F16(_) => f16::from_f32(x).to_f64(),
            Buf::BF16(_) => bf16::from_f32(x).to_f64(),
        }
    }
}

/// Tensors of the given sizes, dtypes cycling f32, bf16, f16, values
/// uniform in `[-scale, scale)`; with their (rounded) values in f64.
fn make_list(
    dev: &Device,
    sizes: &[usize],
    seed: u64,
    scale: f64,
) -> Result<(Vec<Buf>, Vec<Vec<f64>>)> {
    let mut bufs = Vec::new();
    let mut vals = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let s = seed + i as u64;
        match i % 3 {
            0 => {
                let h = gen::<f32>(n, s, scale);
                vals.push(to_f64(&h));
                bufs.push(Buf::F32(dev.upload(&h)?));
            }
            1 => {
                let h = gen::<bf16>(n, s, scale);
                vals.push(to_f64(&h));
                bufs.push(Buf::BF16(dev.upload(&h)?));
            }
            _ => {
                let h = gen::<f16>(n, s, scale);
                vals.push(to_f64(&h));
                bufs.push(Buf::F16(dev.upload(&h)?));
            }
        }
    }
    Ok((bufs, vals))
}

fn read1(b: &DeviceBuffer<f32>) -> Result<f32> {
    b.to_host()?
        .first()
        .copied()
        .ok_or_else(|| fail("empty scalar buffer"))
}

fn multi_tensor(c: &mut Ctx, label: &str, sizes: &[usize], seed: u64) -> Result<()> {
    let total: usize = sizes.iter().sum();
    let variant = format!("{label} {} tensors, {total} elements", sizes.len());
    let (mut bufs, vals) = make_list(c.dev, sizes, seed, 300.0)?;
    let mut mt = MultiTensor::new();

    // L2 norm, twice, bitwise.
    let norm = Guarded::<f32>::new(&c.s, 1)?;
    let tensors: Vec<TensorRef<'_>> = bufs.iter().map(Buf::tensor).collect();
    mt.l2_norm(&c.s, &tensors, &mut norm.view()?)?;
    let first = norm.host()?;
    let mut norm2 = poisoned::<f32>(&c.s, 1)?;
    mt.l2_norm(&c.s, &tensors, &mut norm2)?;
    drop(tensors);
    let second = norm2.to_host()?;
    let want = mt_oracle::l2_norm(&vals);
    let got = first.first().copied().unwrap_or(f32::NAN) as f64;
    let e = ((got - want) / want).abs();
    let mut p: Vec<String> = norm.guard()?.into_iter().collect();
    if e.is_nan() || e > 1e-5 {
        p.push(format!("norm {got} vs {want}"));
    }
    c.row(
        "multi-tensor",
        &format!("L2 norm {variant}"),
        "mixed",
        Some(e),
        p,
    );
    c.rerun(
        "multi-tensor",
        &format!("L2 norm {variant}"),
        &first,
        &second,
    );

    // Unscale: every element bitwise T(fp32(x) * inv), found_inf stays 0.
    let scale = 1024.0f32;
    let mut found = c.dev.alloc_zeros::<f32>(1)?;
    {
        let mut list: Vec<GradRef<'_>> = bufs.iter_mut().map(Buf::grad).collect();
        mt.unscale(&c.s, &mut list, scale, &mut found)?;
    }
    c.s.synchronize()?;
    let inv = mt_oracle::inv_scale(scale);
    let (reference, _) = mt_oracle::scale(&vals, inv as f64);
    let mut p = Vec::new();
    let mut worst = 0.0f64;
    let mut unscaled = Vec::new();
    for (i, (buf, v)) in bufs.iter().zip(&vals).enumerate() {
        let out = buf.host()?;
        let (e, bad) = compare(buf.dtype(), &out, &reference[i], 1.0);
        worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
        if let Some(b) = bad {
            p.push(format!("tensor {i}: {b}"));
        }
        let wrong = out
            .iter()
            .zip(v)
            .filter(|(&o, &x)| o.to_bits() != buf.round(x as f32 * inv).to_bits())
            .count();
        if wrong > 0 {
            p.push(format!(
                "tensor {i}: {wrong} element(s) not bitwise T(fp32(x) * inv)"
            ));
        }
        unscaled.push(out);
    }
    let flag = read1(&found)?;
    if flag != 0.0 {
        p.push(format!("found_inf {flag} on finite gradients"));
    }
    c.row(
        "multi-tensor",
        &format!("unscale {variant}"),
        "mixed",
        Some(worst),
        p,
    );

    // A NaN in the last element of the last tensor sets found_inf.
    {
        let mut last = gen::<f16>(40_000, seed + 99, 1.0);
        let end = last.len() - 1;
        last[end] = f16::NAN;
        let mut bad = c.dev.upload(&last)?;
        let mut found = c.dev.alloc_zeros::<f32>(1)?;
        let mut list: Vec<GradRef<'_>> = bufs.iter_mut().map(Buf::grad).collect();
        list.push((&mut bad).into());
        // Unscale by 1.0: the other tensors keep their values.
        mt.unscale(&c.s, &mut list, 1.0, &mut found)?;
        drop(list);
        let flag = read1(&found)?;
        let p = if flag == 1.0 {
            vec![]
        } else {
            vec![format!("found_inf {flag}, expected 1")]
        };
        c.row(
            "multi-tensor",
            &format!("unscale found_inf (NaN last) {label}"),
            "mixed",
            None,
            p,
        );
    }

    // clip_grad_norm to 0.3 of the norm: every tensor times the coefficient.
    let true_norm = mt_oracle::l2_norm(&unscaled);
    let max_norm = 0.3 * true_norm;
    let clip_norm = Guarded::<f32>::new(&c.s, 1)?;
    {
        let mut list: Vec<GradRef<'_>> = bufs.iter_mut().map(Buf::grad).collect();
        mt.clip_grad_norm(&c.s, &mut list, max_norm, &mut clip_norm.view()?)?;
    }
    c.s.synchronize()?;
    let coeff = mt_oracle::clip_coeff(true_norm, max_norm).unwrap_or(1.0);
    let (reference, _) = mt_oracle::scale(&unscaled, coeff);
    let mut p: Vec<String> = clip_norm.guard()?.into_iter().collect();
    let mut worst = 0.0f64;
    for (i, buf) in bufs.iter().enumerate() {
        let (e, bad) = compare(buf.dtype(), &buf.host()?, &reference[i], 1.0);
        worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
        if let Some(b) = bad {
            p.push(format!("tensor {i}: {b}"));
        }
    }
    let n32 = clip_norm.host()?.first().copied().unwrap_or(f32::NAN) as f64;
    let ne = ((n32 - true_norm) / true_norm).abs();
    if ne.is_nan() || ne > 1e-5 {
        p.push(format!("clip norm {n32} vs {true_norm}"));
    }
    c.row(
        "multi-tensor",
        &format!("clip_grad_norm {variant}"),
        "mixed",
        Some(worst),
        p,
    );
    Ok(())
}

/// The device grad scaler against the host state machine, then unscale by
/// the device scale against unscale by the host scale (bitwise).
fn grad_scaler(c: &mut Ctx) -> Result<()> {
    let config = GradScalerConfig {
        initial_scale: 1024.0,
        growth_interval: 2,
        hysteresis: 1,
        ..GradScalerConfig::default()
    };
    let mut host = DynamicGradScaler::new(config)?;
    let mut device = DeviceGradScaler::new(c.dev, config)?;
    let mut found = c.dev.alloc_zeros::<f32>(1)?;
    let mut p = Vec::new();
    for (step, flag) in [0.0f32, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        .into_iter()
        .enumerate()
    {
        c.s.copy_from_host(&[flag], &mut found)?;
        device.update(&c.s, &mut found, true)?;
        host.update(flag > 0.0);
        let got = device.to_host()?;
        let state = |s: &DynamicGradScaler| {
            (
                s.scale().to_bits(),
                s.growth_tracker(),
                s.hysteresis_tracker(),
            )
        };
        if state(&got) != state(&host) {
            p.push(format!("step {step}: device {got:?} vs host {host:?}"));
        }
        let reset = read1(&found)?;
        if reset != 0.0 {
            p.push(format!("step {step}: found_inf not reset ({reset})"));
        }
    }
    let g = gen::<f16>(5000, 0x5CA1E, 100.0);
    let mut a = c.dev.upload(&g)?;
    let mut b = c.dev.upload(&g)?;
    let mut mt = MultiTensor::new();
    let (mut f1, mut f2) = (c.dev.alloc_zeros::<f32>(1)?, c.dev.alloc_zeros::<f32>(1)?);
    mt.unscale(&c.s, &mut [GradRef::from(&mut a)], host.scale(), &mut f1)?;
    mt.unscale_with_scaler(&c.s, &mut [GradRef::from(&mut b)], &device, &mut f2)?;
    c.s.synchronize()?;
    if bits(&a.to_host()?) != bits(&b.to_host()?) {
        p.push("unscale_with_scaler differs from unscale by the host scale".into());
    }
    c.row(
        "multi-tensor",
        "device grad scaler: 7 updates + unscale_with_scaler",
        "f32/f16",
        None,
        p,
    );
    Ok(())
}

// ------------------------------------------------------------------ copy_2d

fn copy2d<T: FloatElement>(
    c: &mut Ctx,
    label: &str,
    rows: usize,
    cols: usize,
    src_at: Block2d,
    dst_at: Block2d,
) -> Result<()> {
    let src_len = src_at.offset + (rows - 1) * src_at.pitch + cols;
    let dst_len = dst_at.offset + (rows - 1) * dst_at.pitch + cols + GUARD;
    let src_h = gen::<T>(src_len, 0xC0FF + rows as u64, 1.0);
    let fill = T::from_f64(-7.0);
    let src = c.dev.upload(&src_h)?;
    let mut dst = c.dev.upload(&vec![fill; dst_len])?;
    copy_2d(&c.s, &src, src_at, &mut dst, dst_at, rows, cols)?;
    c.s.synchronize()?;
    let got = dst.to_host()?;
    let mut want = vec![fill; dst_len];
    for i in 0..rows {
        let (s0, d0) = (
            src_at.offset + i * src_at.pitch,
            dst_at.offset + i * dst_at.pitch,
        );
        want[d0..d0 + cols].copy_from_slice(&src_h[s0..s0 + cols]);
    }
    let wrong = bits(&got)
        .chunks(T::DTYPE.size())
        .zip(bits(&want).chunks(T::DTYPE.size()))
        .filter(|(a, b)| a != b)
        .count();
    let p = if wrong == 0 {
        vec![]
    } else {
        vec![format!("{wrong} element(s) differ (block or around it)")]
    };
    let variant = format!("{label} {rows}x{cols} {src_at:?} -> {dst_at:?}");
    c.row("copy_2d", &variant, &T::DTYPE.to_string(), None, p);
    Ok(())
}

// ----------------------------------------------------------- vocab-parallel

/// A one-rank NCCL communicator, or why there is none.
fn one_rank(dev: &Device) -> std::result::Result<Communicator, String> {
    Communicator::nccl_library().map_err(|e| format!("no NCCL library ({e})"))?;
    let id = Communicator::nccl_unique_id().map_err(|e| format!("NCCL unique id: {e}"))?;
    Communicator::nccl(dev, 0, 1, &id).map_err(|e| format!("NCCL communicator: {e}"))
}

/// Token ids mostly in `[0, vocab)`, plus padding rows, -1 and past the end.
fn ids(tokens: usize, vocab: usize, padded: usize, seed: u64) -> Vec<i64> {
    let mut rng = Rng::new(seed);
    let mut v: Vec<i64> = (0..tokens)
        .map(|_| (rng.next_u64() % vocab as u64) as i64)
        .collect();
    let specials = [-1, vocab as i64, padded as i64 - 1, padded as i64 + 7];
    for (k, s) in specials.into_iter().enumerate() {
        let i = (k * 5 + 3) % tokens;
        v[i] = s;
    }
    v
}

#[allow(clippy::too_many_arguments)]
fn vocab(
    c: &mut Ctx,
    comm: &Communicator,
    label: &str,
    vocab: usize,
    hidden: usize,
    tokens: usize,
    ce_tokens: usize,
    rerun: bool,
) -> Result<()> {
    let padded = padded_vocab_size(vocab, 1).ok_or_else(|| fail("padded vocab size"))?;
    let s = comm.stream().clone();

    // Embedding (fp32, as Megatron's embedding in the tests).
    let weight = gen::<f32>(padded * hidden, 0xE3B, 1.0);
    let id = ids(tokens, vocab, padded, 0x1D5);
    let dy = gen::<f32>(tokens * hidden, 0xE3C, 1.0);
    let (wd, idd, dyd) = (
        c.dev.upload(&weight)?,
        c.dev.upload(&id)?,
        c.dev.upload(&dy)?,
    );
    let emb = VocabParallelEmbedding::new(vocab, hidden);
    let out = Guarded::<f32>::new(&s, tokens * hidden)?;
    emb.forward(comm, &s, &idd, &wd, &mut out.view()?)?;
    let dw = Guarded::<f32>::new(&s, padded * hidden)?;
    emb.backward(comm, &s, &idd, &dyd, &mut dw.view()?, false)?;
    s.synchronize()?;
    // The oracle reads the table without its padding rows (zero there).
    let mut w64 = to_f64(&weight);
    w64.truncate(vocab * hidden);
    let want = vp_oracle::embedding_forward(&w64, vocab, hidden, &id);
    let got = to_f64(&out.host()?);
    let mut p: Vec<String> = out.guard()?.into_iter().collect();
    // Padding-row ids read their rows of the padded table.
    let want: Vec<f64> = want
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let t = id[i / hidden];
            if t >= vocab as i64 && t < padded as i64 {
                weight[t as usize * hidden + i % hidden] as f64
            } else {
                v
            }
        })
        .collect();
    let wrong = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    if wrong > 0 {
        p.push(format!("{wrong} element(s) not the exact table row"));
    }
    c.row(
        "vocab-parallel",
        &format!("{label} embedding fwd tokens {tokens} vocab {vocab} hidden {hidden}"),
        "f32",
        None,
        p,
    );
    let want_dw = vp_oracle::embedding_backward(&to_f64(&dy), padded, hidden, &id);
    let got_dw = to_f64(&dw.host()?);
    let g = dw.guard()?;
    c.cmp(
        "vocab-parallel",
        &format!("{label} embedding bwd dweight"),
        DType::F32,
        &got_dw,
        &want_dw,
        1.0,
        vec![g],
    );

    // Cross-entropy with label smoothing (bf16 logits, i64 labels).
    let eps = 0.1f32;
    let logits = gen::<bf16>(ce_tokens * padded, 0xCE, 8.0);
    let labels = ids(ce_tokens, vocab, padded, 0x1AB);
    let dloss = gen::<f32>(ce_tokens, 0xCF, 1.0);
    let (ld, labd, dld) = (
        c.dev.upload(&logits)?,
        c.dev.upload(&labels)?,
        c.dev.upload(&dloss)?,
    );
    let ce = VocabParallelCrossEntropy::new(ce_tokens, padded).with_label_smoothing(eps);
    let loss = Guarded::<f32>::new(&s, ce_tokens)?;
    let saved = ce.forward(comm, &s, &ld, &labd, &mut loss.view()?)?;
    let grad = Guarded::<bf16>::new(&s, ce_tokens * padded)?;
    ce.backward(comm, &s, &ld, &labd, &saved, &dld, &mut grad.view()?)?;
    s.synchronize()?;
    let sample = pick(ce_tokens, c.full, &[3, 8, 13, 18]);
    let lsub = rows_f64(&logits, padded, &sample);
    let labsub: Vec<i64> = sample.iter().map(|&t| labels[t]).collect();
    let dlsub: Vec<f64> = sample.iter().map(|&t| dloss[t] as f64).collect();
    let (want_loss, want_grad) =
        vp_oracle::cross_entropy(&lsub, padded, &labsub, eps as f64, &dlsub);
    let loss_h = loss.host()?;
    let got_loss: Vec<f64> = sample.iter().map(|&t| loss_h[t] as f64).collect();
    let g = loss.guard()?;
    let what =
        format!("{label} cross-entropy fwd loss tokens {ce_tokens} vocab {padded} eps {eps}");
    c.cmp(
        "vocab-parallel",
        &what,
        DType::F32,
        &got_loss,
        &want_loss,
        1.0,
        vec![g],
    );
    let got_grad = to_f64(&grad.rows(padded, &sample)?);
    let g = grad.guard()?;
    c.cmp(
        "vocab-parallel",
        &format!("{label} cross-entropy bwd grad"),
        DType::BF16,
        &got_grad,
        &want_grad,
        1.0,
        vec![g],
    );
    if rerun {
        let mut loss2 = poisoned::<f32>(&s, ce_tokens)?;
        ce.forward(comm, &s, &ld, &labd, &mut loss2)?;
        s.synchronize()?;
        let second = loss2.to_host()?;
        c.rerun(
            "vocab-parallel",
            &format!("{label} cross-entropy loss"),
            &loss_h,
            &second,
        );
    }
    Ok(())
}

fn vocab_or_skip(c: &mut Ctx, small: bool) -> Result<()> {
    match one_rank(c.dev) {
        Ok(comm) => {
            if small {
                vocab(c, &comm, "small", 300, 24, 37, 19, false)
            } else {
                // GPT-2 vocabulary; 8192 tokens of hidden 1024 for the
                // embedding, 4096 tokens for the cross-entropy.
                vocab(c, &comm, "Megatron", 50257, 1024, 8192, 4096, true)
            }
        }
        Err(why) => {
            c.r.row(&[
                "vocab-parallel".into(),
                "embedding, cross-entropy".into(),
                "-".into(),
                "-".into(),
                format!("SKIPPED: {why}"),
            ]);
            Ok(())
        }
    }
}

// ------------------------------------------------------------- zeroing race

/// With a GEMM chain queued on one stream, `alloc_zeros` buffers written and
/// read back on another stream must hold what was written (a memset landing
/// late would zero them), and unwritten ones must read back as zeros. No call
/// here waits for the whole device (no `to_host`, no buffer dropped) until
/// the loop is over.
fn zeroing_race(c: &mut Ctx, iterations: usize, chain: usize) -> Result<()> {
    let busy = c.dev.new_stream()?;
    let work = c.dev.new_stream()?;
    let dim = 8192;
    let a = c.dev.upload(&gen::<bf16>(dim * dim, 0xB5, 0.01))?;
    let mut y = c.dev.alloc_zeros::<bf16>(dim * dim)?;
    let op = Gemm::new(dim, dim, dim)
        .provider(GemmProvider::Ferrotron)
        .trans_b(true);
    for _ in 0..chain {
        let inputs = GemmInputs {
            a: &a,
            b: &a,
            bias: None,
            c: None,
        };
        op.run(&busy, inputs, Aux::None, &mut y)?;
    }
    let done = busy.record_event()?;
    let t = Instant::now();
    let len = 1 << 20; // 4 MiB of f32
    let pattern: Vec<f32> = (0..len).map(|i| 1.0 + (i % 1000) as f32).collect();
    let mut keep = Vec::with_capacity(iterations);
    let mut keep_bf16 = Vec::with_capacity(iterations);
    let mut host = vec![0f32; len];
    let (mut zeroed, mut nonzero, mut busy_iters) = (0usize, 0usize, 0usize);
    let bias = c.dev.upload(&vec![bf16::from_f32(0.5); 1024])?;
    let x = c.dev.upload(&vec![bf16::from_f32(1.0); 1024 * 1024])?;
    let mut kernel_bad = 0usize;
    for i in 0..iterations {
        if !done.is_complete()? {
            busy_iters += 1;
        }
        match i % 3 {
            0 => {
                // Upload on the work stream into a fresh zeroed buffer.
                let mut b = c.dev.alloc_zeros::<f32>(len)?;
                work.copy_from_host(&pattern, &mut b)?;
                work.copy_to_host(&b, &mut host)?;
                if host != pattern {
                    zeroed += 1;
                }
                keep.push(b);
            }
            1 => {
                // A kernel on the work stream writes a fresh zeroed buffer.
                let mut out = c.dev.alloc_zeros::<bf16>(1024 * 1024)?;
                BiasGelu::new(1024, 1024).with_gelu(Gelu::Tanh).forward(
                    &work,
                    &x,
                    Some(&bias),
                    &mut out,
                )?;
                let mut h = vec![bf16::ZERO; 1024 * 1024];
                work.copy_to_host(&out, &mut h)?;
                let want = bf16::from_f64(gelu_oracle::gelu(Gelu::Tanh, 1.5));
                if h.iter().any(|v| v.to_bits() != want.to_bits()) {
                    kernel_bad += 1;
                }
                // Kept alive: dropping frees after a device-wide sync.
                keep_bf16.push(out);
            }
            _ => {
                // Nothing writes it: it must read back as zeros.
                let b = c.dev.alloc_zeros::<f32>(len)?;
                work.copy_to_host(&b, &mut host)?;
                if host.iter().any(|&v| v.to_bits() != 0) {
                    nonzero += 1;
                }
                keep.push(b);
            }
        }
    }
    let loop_s = t.elapsed().as_secs_f64();
    let still_busy = !done.is_complete()?;
    busy.synchronize()?;
    work.synchronize()?;
    drop(keep);
    drop(keep_bf16);
    let mut p = Vec::new();
    if zeroed > 0 {
        p.push(format!(
            "{zeroed} upload(s) read back changed (zeroed by a late memset?)"
        ));
    }
    if kernel_bad > 0 {
        p.push(format!("{kernel_bad} kernel output(s) read back wrong"));
    }
    if nonzero > 0 {
        p.push(format!("{nonzero} alloc_zeros buffer(s) not all zero"));
    }
    let variant = format!(
        "{iterations} alloc_zeros + write/read on a 2nd stream under {chain} queued {dim}^3 GEMMs; \
         GPU busy in {busy_iters} of {iterations} iterations{} ({loop_s:.2} s)",
        if still_busy { ", still busy after" } else { "" }
    );
    c.row("zeroing race", &variant, "f32/bf16", None, p);
    Ok(())
}

// -------------------------------------------------------------------- steps

/// Every kernel family and path once at tiny shapes, every element compared.
pub fn small(dev: &Device, r: &mut Report) -> Result<()> {
    let mut ctx = Ctx::new(dev, r, true)?;
    let c = &mut ctx;
    for vec in [true, false] {
        bias_gelu::<bf16>(c, "small", 8, 264, Gelu::Tanh, vec, true, 1)?;
        bias_gelu::<f16>(c, "small", 5, 72, Gelu::Erf, vec, false, 2)?;
        bias_gelu::<f32>(c, "small", 7, 36, Gelu::Tanh, vec, false, 3)?;
    }
    let shape = |b, np, sq, sk| sm_oracle::Shape { b, np, sq, sk };
    for mode in [Mode::None, Mode::Padding, Mode::Causal] {
        softmax::<bf16>(
            c,
            "small",
            shape(2, 2, 8, 8),
            mode,
            SoftmaxPath::Warp,
            true,
            10,
        )?;
        softmax::<bf16>(
            c,
            "small",
            shape(1, 2, 40, 40),
            mode,
            SoftmaxPath::Block,
            true,
            11,
        )?;
        softmax::<bf16>(
            c,
            "small",
            shape(1, 1, 24, 24),
            mode,
            SoftmaxPath::Long,
            true,
            12,
        )?;
    }
    softmax::<f16>(
        c,
        "small",
        shape(2, 1, 4, 33),
        Mode::Padding,
        SoftmaxPath::Warp,
        false,
        13,
    )?;
    softmax::<f32>(
        c,
        "small",
        shape(1, 2, 3, 1100),
        Mode::None,
        SoftmaxPath::Block,
        true,
        14,
    )?;
    softmax::<f32>(
        c,
        "small",
        shape(1, 1, 2, 16400),
        Mode::None,
        SoftmaxPath::Long,
        true,
        15,
    )?;
    for rms in [false, true] {
        norm::<bf16>(c, "warp", 9, 64, rms, true, &[], 20)?;
        norm::<bf16>(c, "block", 5, 1536, rms, false, &[], 21)?;
        norm::<bf16>(c, "global", 3, 12800, rms, false, &[], 22)?;
    }
    norm::<f32>(c, "warp", 6, 33, false, false, &[], 23)?;
    norm::<f16>(c, "block", 4, 1032, true, false, &[], 24)?;
    let g = GemmCase::new(70, 96, 48);
    for tile in [GemmTile::T128x128, GemmTile::T64x64] {
        for epi in [
            Epilogue::None,
            Epilogue::Bias,
            Epilogue::BiasGelu(Gelu::Tanh),
            Epilogue::DGelu(Gelu::Erf),
        ] {
            let case = GemmCase {
                tb: true,
                epi,
                tile: Some(tile),
                ..g
            };
            gemm::<bf16, bf16>(c, "small", case, &[], 30)?;
        }
        let wgrad = GemmCase {
            ta: true,
            tile: Some(tile),
            ..g
        };
        gemm::<bf16, f32>(c, "small wgrad", wgrad, &[], 31)?;
        let slow = GemmCase {
            fast: false,
            tile: Some(tile),
            epi: Epilogue::BiasGelu(Gelu::Erf),
            ..GemmCase::new(33, 40, 20)
        };
        gemm::<f16, f16>(c, "small", slow, &[], 32)?;
    }
    let batched = GemmCase {
        batch: 3,
        tb: true,
        ..GemmCase::new(16, 24, 32)
    };
    gemm::<f16, f16>(c, "small", batched, &[], 33)?;
    bias_grad(c, 70, 300, true, 34)?;
    multi_tensor(c, "small", &[4000, 17, 16_385, 0, 3, 700], 40)?;
    grad_scaler(c)?;
    for t in [true, false] {
        let (so, sp, d_o, dp) = if t {
            (4, 136, 8, 132)
        } else {
            (5, 137, 8, 132)
        };
        let label = if t { "16-byte" } else { "byte" };
        copy2d::<f32>(
            c,
            label,
            9,
            128,
            Block2d {
                offset: so,
                pitch: sp,
            },
            Block2d {
                offset: d_o,
                pitch: dp,
            },
        )?;
    }
    copy2d::<bf16>(
        c,
        "bf16",
        5,
        33,
        Block2d {
            offset: 1,
            pitch: 40,
        },
        Block2d {
            offset: 0,
            pitch: 33,
        },
    )?;
    vocab_or_skip(c, true)?;
    ctx.finish()
}

/// Megatron shapes, the large-shape paths at their real sizes, the zeroing
/// race; big outputs compared on sampled rows.
pub fn run(dev: &Device, r: &mut Report) -> Result<()> {
    let mut ctx = Ctx::new(dev, r, false)?;
    let c = &mut ctx;
    // bias + GeLU: 16384 tokens x ffn 16384 (268M elements: the vectorised
    // grid-stride loop wraps its 65,536 x 256 x 8 twice), fp32 scalar (wraps
    // 65,536 x 256 twice), and more than 2^31 elements.
    bias_gelu::<bf16>(
        c,
        "fc1, grid-stride wraps",
        16384,
        16384,
        Gelu::Tanh,
        true,
        true,
        100,
    )?;
    bias_gelu::<f16>(c, "fc1", 8192, 4096, Gelu::Erf, true, false, 101)?;
    bias_gelu::<f32>(
        c,
        "fc1, grid-stride wraps",
        8192,
        4096,
        Gelu::Tanh,
        false,
        false,
        102,
    )?;
    bias_gelu_huge(c)?;

    // Softmax: 32 heads, sequence 2048 (block path) and 1024 (warp path),
    // a 32k context (long path); fp16 / fp32 at sequence 512.
    let shape = |b, np, sq, sk| sm_oracle::Shape { b, np, sq, sk };
    softmax::<bf16>(
        c,
        "attention",
        shape(1, 32, 2048, 2048),
        Mode::Causal,
        SoftmaxPath::Block,
        true,
        110,
    )?;
    softmax::<bf16>(
        c,
        "attention",
        shape(2, 16, 1024, 1024),
        Mode::Padding,
        SoftmaxPath::Warp,
        true,
        111,
    )?;
    softmax::<bf16>(
        c,
        "attention",
        shape(1, 16, 1024, 1024),
        Mode::Causal,
        SoftmaxPath::Warp,
        true,
        112,
    )?;
    softmax::<bf16>(
        c,
        "long context",
        shape(1, 4, 8, 32768),
        Mode::None,
        SoftmaxPath::Long,
        true,
        113,
    )?;
    softmax::<bf16>(
        c,
        "long context",
        shape(2, 2, 8, 20000),
        Mode::Padding,
        SoftmaxPath::Long,
        true,
        114,
    )?;
    softmax::<f16>(
        c,
        "attention",
        shape(1, 8, 512, 512),
        Mode::Causal,
        SoftmaxPath::Warp,
        true,
        115,
    )?;
    softmax::<f32>(
        c,
        "attention",
        shape(1, 8, 512, 512),
        Mode::Padding,
        SoftmaxPath::Warp,
        true,
        116,
    )?;

    // LayerNorm / RMSNorm: hidden 4096 (block path), 12288 (the pipelined
    // fused backward at its widest: 192 KiB of shared memory), 1024 (warp),
    // 20480 (global), and 70,000 rows of 2048 (rows spill into grid y).
    norm::<bf16>(c, "block", 16384, 4096, false, true, &[], 120)?;
    norm::<bf16>(c, "block, widest", 8192, 12288, false, true, &[], 127)?;
    norm::<bf16>(c, "block", 16384, 4096, true, true, &[], 121)?;
    norm::<bf16>(c, "warp", 16384, 1024, false, false, &[], 122)?;
    norm::<bf16>(c, "global", 2048, 20480, true, false, &[], 123)?;
    let spill = [65_535, 65_536, 65_537, 69_998];
    norm::<bf16>(
        c,
        "block, rows spill into grid y",
        70_000,
        2048,
        false,
        false,
        &spill,
        124,
    )?;
    norm::<f16>(c, "block", 8192, 4096, false, false, &[], 125)?;
    norm::<f32>(c, "block", 8192, 4096, true, false, &[], 126)?;

    // GEMM: the MLP of hidden 4096, ffn 16384, 8192 tokens.
    let fc1 = GemmCase {
        tb: true,
        epi: Epilogue::BiasGelu(Gelu::Tanh),
        ..GemmCase::new(8192, 16384, 4096)
    };
    gemm::<bf16, bf16>(c, "fc1 fwd", fc1, &[0], 130)?;
    let fc2 = GemmCase {
        tb: true,
        epi: Epilogue::Bias,
        ..GemmCase::new(8192, 4096, 16384)
    };
    gemm::<bf16, bf16>(c, "fc2 fwd", fc2, &[0], 131)?;
    let dgelu = GemmCase {
        epi: Epilogue::DGelu(Gelu::Tanh),
        ..GemmCase::new(8192, 16384, 4096)
    };
    gemm::<bf16, bf16>(c, "fc2 dgrad + dGeLU", dgelu, &[0], 132)?;
    let wgrad = GemmCase {
        ta: true,
        ..GemmCase::new(4096, 16384, 8192)
    };
    gemm::<bf16, f32>(c, "fc2 wgrad", wgrad, &[0], 133)?;
    let small_tile = GemmCase {
        tile: Some(GemmTile::T64x64),
        ..fc2
    };
    gemm::<bf16, bf16>(c, "fc2 fwd", small_tile, &[0], 134)?;
    let fc1_h = GemmCase {
        epi: Epilogue::Bias,
        ..fc1
    };
    gemm::<f16, f16>(c, "fc1 fwd", fc1_h, &[0], 135)?;
    // Batch past grid z (65,535): every sampled entry, all its rows.
    let mut entries: Vec<usize> = (0..32).map(|i| i * 69_999 / 31).collect();
    entries.extend([1, 65_534, 65_535, 65_536, 65_537, 69_998]);
    entries.sort_unstable();
    entries.dedup();
    let batched = GemmCase {
        batch: 70_000,
        ..GemmCase::new(16, 16, 16)
    };
    gemm::<bf16, bf16>(c, "batch past grid z", batched, &entries, 136)?;
    bias_grad(c, 8192, 16384, true, 137)?;

    // Multi-tensor over one layer's gradients (mixed dtypes, ~50M elements).
    let sizes = [
        4096 * 4096,
        3 * 4096,
        16384 * 1024,
        1024,
        7,
        12_582_917,
        4096 * 1024,
    ];
    multi_tensor(c, "layer", &sizes, 140)?;
    grad_scaler(c)?;

    // copy_2d: the q block of a fused [8192, 3 x 4096] qkv, aligned and not.
    let packed = Block2d {
        offset: 0,
        pitch: 4096,
    };
    copy2d::<bf16>(
        c,
        "q of qkv",
        8192,
        4096,
        Block2d {
            offset: 4096,
            pitch: 12288,
        },
        packed,
    )?;
    copy2d::<bf16>(
        c,
        "unaligned",
        8192,
        4095,
        Block2d {
            offset: 4097,
            pitch: 12288,
        },
        Block2d {
            offset: 3,
            pitch: 4099,
        },
    )?;

    vocab_or_skip(c, false)?;
    zeroing_race(c, 150, 300)?;
    ctx.finish()
}
