//! Fused scale + mask + softmax against the float64 oracle: every dtype, every
//! mask mode, row lengths from 1 to 65536 (warp, block and long paths), each
//! path forced on small rows, vector and scalar accesses, in-place variants,
//! fully masked rows (exact zeros, zero gradient), broadcast and per-batch
//! padding masks, and argument validation.

mod common;

use common::{assert_close, devices, to_f64, Rng};
use ferrotron::core::dtype::FloatElement;
use ferrotron::core::plan::softmax::path_supports;
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask, SoftmaxPath};
use ferrotron::reference::softmax::{self as oracle, Mask, Shape};
use ferrotron::{Device, DeviceBuffer, Stream};
use half::{bf16, f16};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    None,
    /// Per-batch padding mask `[b, 1, sq, sk]`.
    Padding,
    /// Broadcast padding mask `[1, 1, sq, sk]`.
    PaddingBroadcast,
    Causal,
}

fn poisoned<T: FloatElement>(stream: &Stream, n: usize) -> DeviceBuffer<T> {
    let mut b = stream.device().alloc_zeros::<T>(n).unwrap();
    stream.fill_bytes(&mut b, 0xFF).unwrap(); // NaN in every float format
    b
}

/// A random padding mask (about 30% masked) whose first row of every
/// `[sq, sk]` matrix is fully masked, and whose last row is fully unmasked.
fn padding_mask(rng: &mut Rng, matrices: usize, sq: usize, sk: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..matrices * sq * sk)
        .map(|_| u8::from(rng.uniform() < 0.3))
        .collect();
    for mat in m.chunks_mut(sq * sk) {
        mat[..sk].fill(1);
        if sq > 1 {
            mat[(sq - 1) * sk..].fill(0);
        }
    }
    m
}

struct Case {
    shape: Shape,
    mode: Mode,
    vectorize: bool,
    path: Option<SoftmaxPath>,
    scale: f32,
    /// Standard deviation of the logits before scaling.
    spread: f64,
    /// Added to the logits before scaling.
    offset: f64,
    /// Standard deviation of the upstream gradient dy.
    grad_spread: f64,
    /// Check the backward pass (off only for ill-conditioned rows, see
    /// `huge_and_tiny_magnitudes`).
    backward: bool,
}

impl Case {
    fn new(b: usize, np: usize, sq: usize, sk: usize, mode: Mode) -> Case {
        Case {
            shape: Shape { b, np, sq, sk },
            mode,
            vectorize: true,
            path: None,
            scale: 0.5,
            spread: 2.0,
            offset: 0.0,
            grad_spread: 1.0,
            backward: true,
        }
    }
}

/// Forward (out of place and in place) and backward (out of place and in
/// place) of one case against the oracle; exact zeros where the oracle has
/// exact zeros (causal columns, fully masked rows), in y and in dx.
fn run_case<T: FloatElement>(dev: &Device, c: &Case) {
    let Shape { b, np, sq, sk } = c.shape;
    let n = b * np * sq * sk;
    let (mut rng, seed) = Rng::new((n * 31 + sk) as u64 ^ c.mode as u64);
    let stream = dev.new_stream().unwrap();
    // Long rows get a wider spread: with near-uniform rows every y is about
    // 1/sk, which for sk >= 16k is below fp16's normal range (6.1e-5) and
    // then its subnormal spacing alone exceeds the fp16 tolerance.
    let spread = if sk > 4096 {
        c.spread.max(4.0)
    } else {
        c.spread
    };
    let (x, xf): (Vec<T>, Vec<f64>) = {
        let (x, _) = rng.tensor::<T>(n, spread);
        let x: Vec<T> = x
            .iter()
            .map(|v| T::from_f64(v.to_f64() + c.offset))
            .collect();
        let f = to_f64(&x);
        (x, f)
    };
    let mask_host = match c.mode {
        Mode::Padding => padding_mask(&mut rng, b, sq, sk),
        Mode::PaddingBroadcast => padding_mask(&mut rng, 1, sq, sk),
        _ => Vec::new(),
    };
    let mask_dev = dev.upload(&mask_host).unwrap();
    let (mask, ref_mask) = match c.mode {
        Mode::None => (SoftmaxMask::None, Mask::None),
        Mode::Causal => (SoftmaxMask::Causal, Mask::Causal),
        _ => (SoftmaxMask::Padding(&mask_dev), Mask::Padding(&mask_host)),
    };
    let op = ScaleMaskSoftmax::new(b, np, sq, sk, c.scale)
        .with_vectorize(c.vectorize)
        .with_path(c.path);
    let what = format!(
        "[{b}, {np}, {sq}, {sk}] {:?} vec={} path={:?} scale={} on {dev:?}",
        c.mode,
        c.vectorize,
        op.chosen_path(),
        c.scale
    );

    let xd = dev.upload(&x).unwrap();
    let mut y = poisoned::<T>(&stream, n);
    op.forward(&stream, &xd, mask, &mut y).unwrap();
    stream.synchronize().unwrap();
    let y_host = y.to_host().unwrap();
    let yf = to_f64(&y_host);
    let reference = oracle::forward(&xf, c.shape, c.scale as f64, ref_mask);
    assert_close(&format!("forward {what}"), T::DTYPE, seed, &yf, &reference);
    for (i, (&o, &r)) in yf.iter().zip(&reference).enumerate() {
        assert!(
            r != 0.0 || o == 0.0,
            "forward {what}: element {i} must be exactly 0, got {o} (seed {seed})"
        );
    }

    let mut xi = dev.upload(&x).unwrap();
    op.forward_in_place(&stream, &mut xi, mask).unwrap();
    let yi = xi.to_host().unwrap();
    assert!(
        bytemuck::cast_slice::<T, u8>(&yi) == bytemuck::cast_slice::<T, u8>(&y_host),
        "in-place forward differs from out-of-place: {what} (seed {seed})"
    );

    if !c.backward {
        return;
    }
    // Backward from the kernel's own y (as training does).
    let (dy, dyf) = rng.tensor::<T>(n, c.grad_spread);
    let dyd = dev.upload(&dy).unwrap();
    let mut dx = poisoned::<T>(&stream, n);
    op.backward(&stream, &y, &dyd, &mut dx).unwrap();
    stream.synchronize().unwrap();
    let dx_host = dx.to_host().unwrap();
    let dxf = to_f64(&dx_host);
    let rdx = oracle::backward(&yf, &dyf, sk, c.scale as f64);
    assert_close(&format!("backward {what}"), T::DTYPE, seed, &dxf, &rdx);
    for (i, (&o, &r)) in dxf.iter().zip(&reference).enumerate() {
        assert!(
            r != 0.0 || o == 0.0,
            "backward {what}: dx[{i}] must be exactly 0 where y is, got {o} (seed {seed})"
        );
    }

    let mut g = dev.upload(&dy).unwrap();
    op.backward_in_place(&stream, &y, &mut g).unwrap();
    let gi = g.to_host().unwrap();
    assert!(
        bytemuck::cast_slice::<T, u8>(&gi) == bytemuck::cast_slice::<T, u8>(&dx_host),
        "in-place backward differs from out-of-place: {what} (seed {seed})"
    );
}

fn run_all_dtypes(dev: &Device, c: &Case) {
    run_case::<f32>(dev, c);
    run_case::<f16>(dev, c);
    run_case::<bf16>(dev, c);
}

/// Batch shape for a row length: many rows for short rows, few for long ones.
fn shape_for(sk: usize) -> (usize, usize, usize) {
    match sk {
        0..=64 => (2, 3, 5),
        65..=1024 => (2, 2, 3),
        1025..=8192 => (2, 1, 2),
        _ => (2, 1, 1),
    }
}

#[test]
fn every_dtype_mode_and_row_length() {
    const SK: &[usize] = &[1, 2, 7, 31, 33, 1000, 4096, 4097, 16385, 20000, 65536];
    let devs = devices("every_dtype_mode_and_row_length", SK.len());
    for dev in &devs {
        for &sk in SK {
            let (b, np, sq) = shape_for(sk);
            for mode in [Mode::None, Mode::Padding, Mode::PaddingBroadcast] {
                run_all_dtypes(dev, &Case::new(b, np, sq, sk, mode));
                if sk <= 1024 {
                    let mut c = Case::new(b, np, sq, sk, mode);
                    c.vectorize = false;
                    run_all_dtypes(dev, &c);
                }
            }
        }
    }
}

#[test]
fn causal_masks() {
    const SK: &[usize] = &[1, 2, 7, 31, 33, 64, 200];
    let devs = devices("causal_masks", SK.len());
    for dev in &devs {
        for &sk in SK {
            for vectorize in [true, false] {
                let mut c = Case::new(2, 2, sk, sk, Mode::Causal);
                c.vectorize = vectorize;
                run_all_dtypes(dev, &c);
            }
        }
        // One large causal matrix on the warp path's longest rows.
        run_case::<f32>(dev, &Case::new(1, 1, 1000, 1000, Mode::Causal));
    }
}

/// Block and long paths are forced onto short rows, so their masking, tails
/// and scalar/vector variants are checked on cheap shapes too (including
/// causal, which needs sq == sk).
#[test]
fn every_path_on_short_rows() {
    let devs = devices("every_path_on_short_rows", 1);
    for dev in &devs {
        for path in [SoftmaxPath::Warp, SoftmaxPath::Block, SoftmaxPath::Long] {
            for sk in [1usize, 7, 33, 64, 136] {
                for mode in [
                    Mode::None,
                    Mode::Padding,
                    Mode::PaddingBroadcast,
                    Mode::Causal,
                ] {
                    for vectorize in [true, false] {
                        let mut c = match mode {
                            Mode::Causal => Case::new(1, 1, sk, sk, mode),
                            _ => Case::new(2, 1, 3, sk, mode),
                        };
                        c.vectorize = vectorize;
                        c.path = Some(path);
                        run_all_dtypes(dev, &c);
                    }
                }
            }
        }
    }
}

/// Short rows on the vector path share a warp (two 128-bit vectors per lane,
/// 2 to 16 rows per warp): every mode, row counts that leave the last warp
/// partly empty, and the sk = 128 attention shape. The plan is checked to
/// take that path for the 16-bit dtypes, so the case cannot drift off it.
#[test]
fn short_rows_share_a_warp() {
    const SK: &[usize] = &[8, 16, 32, 64, 128, 256];
    let devs = devices("short_rows_share_a_warp", SK.len());
    for dev in &devs {
        for &sk in SK {
            for es in [2usize, 4] {
                let p = ferrotron::core::plan::softmax::plan(8, sk as u64, es, true, None).unwrap();
                assert!(
                    p.path == SoftmaxPath::Warp && p.vec > 1 && (p.rows_per_warp > 1 || es == 4),
                    "sk {sk}, {es}-byte elements: {p:?}"
                );
            }
            for mode in [
                Mode::None,
                Mode::Padding,
                Mode::PaddingBroadcast,
                Mode::Causal,
            ] {
                // 3 * 7 = 21 rows per matrix: not a multiple of any rows-per-warp.
                let c = match mode {
                    Mode::Causal => Case::new(2, 3, sk, sk, mode),
                    _ => Case::new(2, 3, 7, sk, mode),
                };
                run_all_dtypes(dev, &c);
            }
        }
    }
}

/// The long forward's main loop takes several vectors per thread at once;
/// causal rows long enough to reach it (scalar: 3 x 512 columns per step),
/// so the limit falls inside, before and after a step.
#[test]
fn long_path_causal_rows_reach_the_unrolled_loop() {
    for dev in devices("long_path_causal_rows_reach_the_unrolled_loop", 1) {
        let mut c = Case::new(1, 1, 1700, 1700, Mode::Causal);
        c.vectorize = false;
        c.path = Some(SoftmaxPath::Long);
        run_case::<f32>(&dev, &c);
        run_case::<bf16>(&dev, &c);
    }
}

/// Large logits (up to ~100 after scaling) must not overflow exp, and tiny
/// ones must not lose the distribution.
#[test]
fn huge_and_tiny_magnitudes() {
    let devs = devices("huge_and_tiny_magnitudes", 1);
    for dev in &devs {
        // Upstream gradients are scaled as in a loss-scaled fp16 run, so that
        // dx (about scale * y * (dy - sum dy*y)) stays in fp16's normal range:
        // near one-hot rows (scale 10) and tiny scales put it below 6.1e-5.
        for (scale, spread, grad_spread) in [
            (10.0f32, 3.0, 1024.0),
            (1e-3, 1.0, 1024.0),
            (1.0, 1e-4, 1.0),
        ] {
            for sk in [33usize, 1000, 5000, 20000] {
                let (b, np, sq) = shape_for(sk);
                let mut c = Case::new(b, np, sq, sk, Mode::Padding);
                c.scale = scale;
                c.spread = spread;
                c.grad_spread = grad_spread;
                c.backward = scale <= 1.0;
                run_all_dtypes(dev, &c);
            }
        }
    }
}

/// Masked logits are *replaced* by -10000 after scaling (not -inf, not
/// added): with scaled logits near -10000 the masked columns keep a
/// visible share of the probability.
#[test]
fn masked_logits_become_minus_10000() {
    for dev in devices("masked_logits_become_minus_10000", 1) {
        for path in [SoftmaxPath::Warp, SoftmaxPath::Block, SoftmaxPath::Long] {
            for sk in [7usize, 40] {
                let mut c = Case::new(2, 1, 3, sk, Mode::Padding);
                c.scale = 2.0;
                c.offset = -5000.0;
                c.spread = 1.0;
                c.path = Some(path);
                run_case::<f32>(&dev, &c);
                run_case::<bf16>(&dev, &c);
            }
        }
    }
}

/// A fully masked row gives exact zeros and an exact zero gradient even with
/// a nonzero upstream gradient; one unmasked column gives exactly 1.
#[test]
fn fully_masked_rows_are_zero() {
    for dev in devices("fully_masked_rows_are_zero", 1) {
        let stream = dev.new_stream().unwrap();
        for sk in [1usize, 5, 1000, 3000, 20000] {
            for path in [SoftmaxPath::Warp, SoftmaxPath::Block, SoftmaxPath::Long] {
                if !path_supports(path, sk as u64) {
                    continue;
                }
                let op = ScaleMaskSoftmax::new(2, 1, 1, sk, 1.0).with_path(Some(path));
                // Row 0 fully masked; row 1 keeps only its last column.
                let mut m = vec![1u8; 2 * sk];
                m[2 * sk - 1] = 0;
                let md = dev.upload(&m).unwrap();
                let x = dev.upload(&vec![f16::from_f32(3.0); 2 * sk]).unwrap();
                let mut y = poisoned::<f16>(&stream, 2 * sk);
                op.forward(&stream, &x, SoftmaxMask::Padding(&md), &mut y)
                    .unwrap();
                let yh = to_f64(&y.to_host().unwrap());
                assert!(
                    yh[..sk].iter().all(|&v| v == 0.0),
                    "sk {sk} {path:?}: {:?}",
                    &yh[..sk.min(8)]
                );
                assert_eq!(yh[2 * sk - 1], 1.0, "sk {sk} {path:?}");
                assert!(
                    yh[sk..2 * sk - 1].iter().all(|&v| v == 0.0),
                    "sk {sk} {path:?}"
                );
                let dy = dev.upload(&vec![f16::from_f32(1.5); 2 * sk]).unwrap();
                let mut dx = poisoned::<f16>(&stream, 2 * sk);
                op.backward(&stream, &y, &dy, &mut dx).unwrap();
                let dxh = to_f64(&dx.to_host().unwrap());
                assert!(dxh.iter().all(|&v| v == 0.0), "sk {sk} {path:?}");
            }
        }
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let x = dev.upload(&[0.0f32; 24]).unwrap();
    let mut y = dev.alloc_zeros::<f32>(24).unwrap();
    let ok = ScaleMaskSoftmax::new(2, 1, 3, 4, 1.0);
    ok.forward(&stream, &x, SoftmaxMask::None, &mut y).unwrap();

    let err = |r: ferrotron::Result<()>| r.unwrap_err().to_string();
    // Wrong lengths.
    let e =
        err(ScaleMaskSoftmax::new(2, 1, 3, 5, 1.0).forward(&stream, &x, SoftmaxMask::None, &mut y));
    assert!(e.contains("`x`") && e.contains("30"), "{e}");
    let mut short = dev.alloc_zeros::<f32>(23).unwrap();
    let e = err(ok.forward(&stream, &x, SoftmaxMask::None, &mut short));
    assert!(e.contains("`y`") && e.contains("24"), "{e}");
    let e = err(ok.backward(&stream, &x, &short, &mut y));
    assert!(e.contains("`dy`"), "{e}");
    let e = err(ok.backward_in_place(&stream, &x, &mut short));
    assert!(e.contains("`grad`"), "{e}");
    // Mask of the wrong size: neither b*sq*sk = 24 nor sq*sk = 12.
    let m = dev.upload(&[0u8; 13]).unwrap();
    let e = err(ok.forward(&stream, &x, SoftmaxMask::Padding(&m), &mut y));
    assert!(
        e.contains("`mask`") && e.contains("24") && e.contains("12"),
        "{e}"
    );
    for len in [12usize, 24] {
        let m = dev.upload(&vec![0u8; len]).unwrap();
        ok.forward(&stream, &x, SoftmaxMask::Padding(&m), &mut y)
            .unwrap();
    }
    // Causal needs sq == sk.
    let e = err(ok.forward(&stream, &x, SoftmaxMask::Causal, &mut y));
    assert!(e.contains("sq == sk"), "{e}");
    // sk = 0, non-finite scale, overflowing sizes, a path too small for the row.
    let empty = dev.alloc_zeros::<f32>(0).unwrap();
    let mut empty2 = dev.alloc_zeros::<f32>(0).unwrap();
    let e = err(ScaleMaskSoftmax::new(1, 1, 1, 0, 1.0).forward(
        &stream,
        &empty,
        SoftmaxMask::None,
        &mut empty2,
    ));
    assert!(e.contains("`sk`"), "{e}");
    for s in [f32::NAN, f32::INFINITY] {
        let e = err(ScaleMaskSoftmax::new(2, 1, 3, 4, s).forward(
            &stream,
            &x,
            SoftmaxMask::None,
            &mut y,
        ));
        assert!(e.contains("`scale`"), "{e}");
    }
    let e = err(ScaleMaskSoftmax::new(usize::MAX, 2, 1, 1, 1.0).forward(
        &stream,
        &x,
        SoftmaxMask::None,
        &mut y,
    ));
    assert!(e.contains("overflows"), "{e}");
    let e = err(
        ScaleMaskSoftmax::new(1 << 40, 1 << 20, 1, 1 << 10, 1.0).forward(
            &stream,
            &x,
            SoftmaxMask::None,
            &mut y,
        ),
    );
    assert!(e.contains("overflows"), "{e}");
    let x2 = dev.upload(&vec![0.0f32; 2000]).unwrap();
    let mut y2 = dev.alloc_zeros::<f32>(2000).unwrap();
    let e = err(ScaleMaskSoftmax::new(1, 1, 1, 2000, 1.0)
        .with_path(Some(SoftmaxPath::Warp))
        .forward(&stream, &x2, SoftmaxMask::None, &mut y2));
    assert!(e.contains("`path`") && e.contains("2000"), "{e}");
    // Empty batches are a no-op.
    ScaleMaskSoftmax::new(0, 4, 3, 4, 1.0)
        .forward(&stream, &empty, SoftmaxMask::None, &mut empty2)
        .unwrap();
    // Nothing above left the stream broken.
    ok.forward(&stream, &x, SoftmaxMask::None, &mut y).unwrap();
    stream.synchronize().unwrap();
    assert!(y
        .to_host()
        .unwrap()
        .iter()
        .all(|&v| (v - 0.25).abs() < 1e-7));
}
