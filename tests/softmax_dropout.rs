//! Attention dropout fused into the scale + mask + softmax
//! (`ScaleMaskSoftmax::forward_dropout` / `backward_dropout`) against the
//! float64 oracle, whose mask comes from the host Philox twin: every dtype,
//! the warp, block and long paths (each forced on small rows), vector and
//! scalar accesses, no / padding / causal masks. Also: the keep fraction
//! within binomial bounds, `p = 0` and eval mode equal the plain softmax bit
//! for bit, the backward regenerates the forward's mask, bad arguments.

mod common;

use common::{assert_close, devices, to_f64, Rng};
use ferrotron::core::dtype::FloatElement;
use ferrotron::core::rng::PhiloxState;
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask, SoftmaxPath};
use ferrotron::ops::DropoutMode;
use ferrotron::reference::softmax::{self as oracle, Mask, Shape};
use ferrotron::{Device, DeviceBuffer, Error, Stream};
use half::{bf16, f16};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    None,
    Padding,
    Causal,
}

fn poisoned<T: FloatElement>(stream: &Stream, n: usize) -> DeviceBuffer<T> {
    let mut b = stream.device().alloc_zeros::<T>(n).unwrap();
    stream.fill_bytes(&mut b, 0xFF).unwrap();
    b
}

fn bits<T: FloatElement>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

struct Case {
    shape: Shape,
    mode: Mode,
    p: f32,
    vectorize: bool,
    path: Option<SoftmaxPath>,
}

fn case(b: usize, np: usize, sq: usize, sk: usize, mode: Mode, p: f32) -> Case {
    Case {
        shape: Shape { b, np, sq, sk },
        mode,
        p,
        vectorize: true,
        path: None,
    }
}

/// Forward (probabilities and dropped probabilities) and backward (out of
/// place and in place) of one case against the oracle.
fn run_case<T: FloatElement>(dev: &Device, c: &Case) {
    let Shape { b, np, sq, sk } = c.shape;
    let n = b * np * sq * sk;
    let (mut rng, seed) = Rng::new((n * 17 + sk) as u64 ^ c.mode as u64);
    let stream = dev.new_stream().unwrap();
    let scale = 0.5f32;
    let (x, xf) = rng.tensor::<T>(n, 2.0);
    // A random padding mask with a fully masked first row per matrix.
    let mask_host: Vec<u8> = match c.mode {
        Mode::Padding => {
            let mut m: Vec<u8> = (0..n / np).map(|_| u8::from(rng.uniform() < 0.3)).collect();
            for mat in m.chunks_mut(sq * sk) {
                mat[..sk].fill(1);
            }
            m
        }
        _ => Vec::new(),
    };
    let mask_dev = dev.upload(&mask_host).unwrap();
    let (mask, ref_mask) = match c.mode {
        Mode::None => (SoftmaxMask::None, Mask::None),
        Mode::Causal => (SoftmaxMask::Causal, Mask::Causal),
        Mode::Padding => (SoftmaxMask::Padding(&mask_dev), Mask::Padding(&mask_host)),
    };
    let op = ScaleMaskSoftmax::new(b, np, sq, sk, scale)
        .with_vectorize(c.vectorize)
        .with_path(c.path)
        .with_dropout(c.p);
    let state = PhiloxState {
        seed: rng.next_u64(),
        offset: 4 * (rng.next_u64() % 1000) + 4,
    };
    let what = format!(
        "[{b}, {np}, {sq}, {sk}] {:?} p={} vec={} path={:?} {:?} on {dev:?}",
        c.mode,
        c.p,
        c.vectorize,
        op.chosen_path(),
        T::DTYPE
    );

    let xd = dev.upload(&x).unwrap();
    let mut y = poisoned::<T>(&stream, n);
    let mut yd = poisoned::<T>(&stream, n);
    let train = DropoutMode::Train(state);
    op.forward_dropout(&stream, &xd, mask, &mut y, &mut yd, train)
        .unwrap();
    stream.synchronize().unwrap();
    let (y_host, yd_host) = (y.to_host().unwrap(), yd.to_host().unwrap());
    let (yf, ydf) = (to_f64(&y_host), to_f64(&yd_host));
    let ry = oracle::forward(&xf, c.shape, scale as f64, ref_mask);
    let ryd = oracle::dropout(&ry, c.p, state.seed, state.offset);
    assert_close(&format!("probs {what}"), T::DTYPE, seed, &yf, &ry);
    assert_close(&format!("dropped {what}"), T::DTYPE, seed, &ydf, &ryd);
    // The mask exactly: dropped elements are exact zeros, kept nonzero ones
    // stay nonzero.
    for i in 0..n {
        let keep = oracle::keeps(c.p, state.seed, state.offset, i);
        assert!(
            if keep {
                (ydf[i] == 0.0) == (yf[i] == 0.0)
            } else {
                ydf[i] == 0.0
            },
            "dropped {what}: element {i} keep={keep} y={} y_dropped={} (seed {seed})",
            yf[i],
            ydf[i]
        );
    }
    // The undropped probabilities are the plain softmax's, bit for bit.
    let mut y_plain = poisoned::<T>(&stream, n);
    op.forward(&stream, &xd, mask, &mut y_plain).unwrap();
    assert!(
        bits(&y_plain.to_host().unwrap()) == bits(&y_host),
        "probs differ from the plain forward: {what} (seed {seed})"
    );

    // Backward from the kernel's own y, with dy the gradient of the dropped
    // probabilities.
    let (dy, dyf) = rng.tensor::<T>(n, 1.0);
    let dyd = dev.upload(&dy).unwrap();
    let mut dx = poisoned::<T>(&stream, n);
    op.backward_dropout(&stream, &y, &dyd, &mut dx, train)
        .unwrap();
    stream.synchronize().unwrap();
    let dx_host = dx.to_host().unwrap();
    let rdx = oracle::backward_dropout(&yf, &dyf, sk, scale as f64, c.p, state.seed, state.offset);
    assert_close(
        &format!("backward {what}"),
        T::DTYPE,
        seed,
        &to_f64(&dx_host),
        &rdx,
    );
    let mut g = dev.upload(&dy).unwrap();
    op.backward_dropout_in_place(&stream, &y, &mut g, train)
        .unwrap();
    assert!(
        bits(&g.to_host().unwrap()) == bits(&dx_host),
        "in-place backward differs from out-of-place: {what} (seed {seed})"
    );
}

fn run_all_dtypes(dev: &Device, c: &Case) {
    run_case::<f32>(dev, c);
    run_case::<f16>(dev, c);
    run_case::<bf16>(dev, c);
}

#[test]
fn dropout_matches_the_oracle_on_every_dtype_path_and_mask() {
    let devs = devices("dropout_matches_the_oracle_on_every_dtype_path_and_mask", 1);
    for dev in &devs {
        let mut cases = vec![
            case(2, 3, 5, 7, Mode::None, 0.1),
            case(2, 2, 3, 33, Mode::Padding, 0.3),
            case(1, 2, 16, 16, Mode::Causal, 0.5),
            case(1, 1, 64, 64, Mode::Causal, 0.2),
            // Rows of 128: two vectors per lane, several rows per warp.
            case(2, 2, 5, 128, Mode::Padding, 0.3),
            case(1, 1, 2, 1500, Mode::None, 0.1),
            case(1, 1, 1, 17000, Mode::None, 0.25),
        ];
        for path in [SoftmaxPath::Block, SoftmaxPath::Long] {
            for vectorize in [true, false] {
                cases.push(case(2, 1, 3, 40, Mode::Padding, 0.3).tap(|c| {
                    c.path = Some(path);
                    c.vectorize = vectorize;
                }));
            }
        }
        cases.push(case(2, 2, 7, 7, Mode::Causal, 0.4).tap(|c| c.vectorize = false));
        for c in &cases {
            run_all_dtypes(dev, c);
        }
    }
}

trait Tap: Sized {
    fn tap(self, f: impl FnOnce(&mut Self)) -> Self;
}

impl Tap for Case {
    fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }
}

/// Uniform rows (x = 0): every probability is 1/sk, so the dropped output
/// shows the mask directly. The kept count is Binomial(n, 1-p): within 5
/// standard deviations. Two offsets agree on about p^2 + (1-p)^2 of the
/// elements (independent masks), not all.
#[test]
fn keep_fraction_within_binomial_bounds() {
    let devs = devices("keep_fraction_within_binomial_bounds", 1);
    let (b, np, sq, sk) = (1, 4, 64, 256);
    let n = b * np * sq * sk;
    for dev in &devs {
        let stream = dev.new_stream().unwrap();
        let x = dev.alloc_zeros::<f32>(n).unwrap();
        for p in [0.1f32, 0.5, 0.9] {
            let op = ScaleMaskSoftmax::new(b, np, sq, sk, 1.0).with_dropout(p);
            let mut masks = Vec::new();
            for offset in [0u64, n as u64] {
                let mut y = dev.alloc_zeros::<f32>(n).unwrap();
                let mut yd = dev.alloc_zeros::<f32>(n).unwrap();
                let mode = DropoutMode::Train(PhiloxState { seed: 42, offset });
                op.forward_dropout(&stream, &x, SoftmaxMask::None, &mut y, &mut yd, mode)
                    .unwrap();
                let v = yd.to_host().unwrap();
                let kept_value = ((1.0 / sk as f64) / (1.0 - p as f64)) as f32;
                let keep: Vec<bool> = v.iter().map(|&e| e != 0.0).collect();
                for &e in &v {
                    assert!(
                        e == 0.0 || (e - kept_value).abs() <= 1e-6 * kept_value,
                        "p={p}: {e}"
                    );
                }
                let kept = keep.iter().filter(|&&k| k).count() as f64;
                let (mean, sd) = (
                    n as f64 * (1.0 - p as f64),
                    (n as f64 * p as f64 * (1.0 - p as f64)).sqrt(),
                );
                assert!(
                    (kept - mean).abs() <= 5.0 * sd,
                    "p={p} offset={offset}: kept {kept} of {n}, expected {mean} +- {sd}"
                );
                masks.push(keep);
            }
            let agree = masks[0]
                .iter()
                .zip(&masks[1])
                .filter(|(a, b)| a == b)
                .count() as f64;
            let q = p as f64;
            let expect = q * q + (1.0 - q) * (1.0 - q);
            let sd = (n as f64 * expect * (1.0 - expect)).sqrt();
            assert!(
                (agree - n as f64 * expect).abs() <= 5.0 * sd,
                "p={p}: masks at two offsets agree on {agree} of {n} elements"
            );
        }
    }
}

/// `p = 0` in training and eval mode at any `p`: the dropped output is the
/// plain softmax and the backward the plain backward, bit for bit.
#[test]
fn p_zero_and_eval_equal_the_plain_softmax_bitwise() {
    let devs = devices("p_zero_and_eval_equal_the_plain_softmax_bitwise", 1);
    for dev in &devs {
        let stream = dev.new_stream().unwrap();
        for (sk, mask) in [(40, SoftmaxMask::None), (24, SoftmaxMask::Causal)] {
            let (b, np, sq) = (2, 3, 24);
            let n = b * np * sq * sk;
            let (mut rng, _) = Rng::new(5);
            let (x, _) = rng.tensor::<bf16>(n, 2.0);
            let (dy, _) = rng.tensor::<bf16>(n, 1.0);
            let (x, dy) = (dev.upload(&x).unwrap(), dev.upload(&dy).unwrap());
            let plain = ScaleMaskSoftmax::new(b, np, sq, sk, 0.3);
            let mut y = poisoned::<bf16>(&stream, n);
            let mut dx = poisoned::<bf16>(&stream, n);
            plain.forward(&stream, &x, mask, &mut y).unwrap();
            plain.backward(&stream, &y, &dy, &mut dx).unwrap();
            let (y, dx) = (y.to_host().unwrap(), dx.to_host().unwrap());
            let st = PhiloxState { seed: 7, offset: 0 };
            for (p, mode) in [
                (0.0, DropoutMode::Train(st)),
                (0.3, DropoutMode::Eval),
                (0.0, DropoutMode::Eval),
            ] {
                let op = plain.with_dropout(p);
                let mut y2 = poisoned::<bf16>(&stream, n);
                let mut yd = poisoned::<bf16>(&stream, n);
                let mut dx2 = poisoned::<bf16>(&stream, n);
                op.forward_dropout(&stream, &x, mask, &mut y2, &mut yd, mode)
                    .unwrap();
                op.backward_dropout(&stream, &y2, &dy, &mut dx2, mode)
                    .unwrap();
                for (name, got) in [("probs", &y2), ("dropped", &yd), ("dx", &dx2)] {
                    let want = if name == "dx" { &dx } else { &y };
                    assert!(
                        bits(&got.to_host().unwrap()) == bits(want),
                        "p={p} {mode:?} sk={sk}: {name} differs from the plain softmax"
                    );
                }
            }
        }
    }
}

/// The backward's mask is the forward's: with the mask read off the
/// forward's dropped output (zero = dropped; x chosen so no probability
/// underflows), the oracle's undropped backward on `keep * dy / (1-p)`
/// matches; with a different offset it does not.
#[test]
fn backward_regenerates_the_forward_mask() {
    let devs = devices("backward_regenerates_the_forward_mask", 1);
    let (b, np, sq, sk) = (2, 2, 8, 50);
    let n = b * np * sq * sk;
    let p = 0.4f32;
    for dev in &devs {
        let stream = dev.new_stream().unwrap();
        let (mut rng, seed) = Rng::new(11);
        let (x, _) = rng.tensor::<f32>(n, 0.5);
        let (dy, dyf) = rng.tensor::<f32>(n, 1.0);
        let (x, dyd) = (dev.upload(&x).unwrap(), dev.upload(&dy).unwrap());
        let op = ScaleMaskSoftmax::new(b, np, sq, sk, 0.7).with_dropout(p);
        let st = PhiloxState {
            seed: rng.next_u64(),
            offset: 64,
        };
        let mut y = poisoned::<f32>(&stream, n);
        let mut yd = poisoned::<f32>(&stream, n);
        op.forward_dropout(
            &stream,
            &x,
            SoftmaxMask::None,
            &mut y,
            &mut yd,
            DropoutMode::Train(st),
        )
        .unwrap();
        let yf = to_f64(&y.to_host().unwrap());
        let keep: Vec<bool> = yd.to_host().unwrap().iter().map(|&v| v != 0.0).collect();
        assert!(yf.iter().all(|&v| v > 0.0));
        let g: Vec<f64> = dyf
            .iter()
            .zip(&keep)
            .map(|(&d, &k)| if k { d / (1.0 - p as f64) } else { 0.0 })
            .collect();
        let want = oracle::backward(&yf, &g, sk, 0.7);
        for (offset, same) in [(st.offset, true), (st.offset + 4, false)] {
            let mut dx = poisoned::<f32>(&stream, n);
            let mode = DropoutMode::Train(PhiloxState { offset, ..st });
            op.backward_dropout(&stream, &y, &dyd, &mut dx, mode)
                .unwrap();
            let got = to_f64(&dx.to_host().unwrap());
            if same {
                assert_close(
                    "backward with the forward's state",
                    op_dtype(),
                    seed,
                    &got,
                    &want,
                );
            } else {
                let err = common::rel_err(&got, &want);
                assert!(err > 0.1, "another offset gave the same gradient ({err})");
            }
        }
    }
}

fn op_dtype() -> ferrotron::DType {
    ferrotron::DType::F32
}

fn expect_invalid(r: ferrotron::Result<()>, arg: &str) {
    match r {
        Err(Error::InvalidArgument { arg: a, .. }) if a == arg => {}
        other => panic!("expected InvalidArgument naming `{arg}`, got {other:?}"),
    }
}

#[test]
fn invalid_dropout_arguments_are_named_errors() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let n = 2 * 3 * 4;
    let x = dev.alloc_zeros::<f32>(n).unwrap();
    let mut y = dev.alloc_zeros::<f32>(n).unwrap();
    let mut yd = dev.alloc_zeros::<f32>(n).unwrap();
    let mut short = dev.alloc_zeros::<f32>(n - 1).unwrap();
    let st = DropoutMode::Train(PhiloxState { seed: 1, offset: 0 });
    let op = ScaleMaskSoftmax::new(1, 2, 3, 4, 1.0);
    for p in [1.0f32, -0.1, f32::NAN, 1.5] {
        let o = op.with_dropout(p);
        expect_invalid(
            o.forward_dropout(&stream, &x, SoftmaxMask::None, &mut y, &mut yd, st),
            "dropout",
        );
        expect_invalid(o.backward_dropout(&stream, &y, &x, &mut yd, st), "dropout");
        expect_invalid(
            o.backward_dropout_in_place(&stream, &y, &mut yd, st),
            "dropout",
        );
    }
    let o = op.with_dropout(0.5);
    let far = DropoutMode::Train(PhiloxState {
        seed: 1,
        offset: u64::MAX - 5,
    });
    expect_invalid(
        o.forward_dropout(&stream, &x, SoftmaxMask::None, &mut y, &mut yd, far),
        "offset",
    );
    expect_invalid(o.backward_dropout(&stream, &y, &x, &mut yd, far), "offset");
    expect_invalid(
        o.forward_dropout(&stream, &x, SoftmaxMask::None, &mut y, &mut short, st),
        "dropped",
    );
    expect_invalid(o.backward_dropout(&stream, &y, &x, &mut short, st), "dx");
    assert_eq!(o.random_values(), n as u64);
}
