//! Bias + dropout + residual add and its Philox RNG: the host Philox against
//! the Random123 known answers, the device Philox against the host twin
//! bitwise, the op against the float64 oracle (mask from the host twin) for
//! every dtype, p in {0, 0.1, 0.5}, odd shapes, both paths, train and eval;
//! mask statistics (keep fraction, independence across offsets and
//! tensor-parallel ranks); the backward's regenerated mask; bad arguments.

mod common;

use common::{abs_column_sums, assert_close, assert_close_sums, devices, to_f64, Rng};
use ferrotron::core::dtype::FloatElement;
use ferrotron::core::philox;
use ferrotron::core::rng::{PhiloxState, RngTracker, DEFAULT_STREAM, MODEL_PARALLEL_STREAM};
use ferrotron::ops::dropout::philox_fill;
use ferrotron::ops::{BiasDropoutAdd, DropoutMode};
use ferrotron::reference::dropout as oracle;
use ferrotron::{Device, DeviceBuffer, Stream};
use half::{bf16, f16};

/// Known-answer vectors of philox4x32-10 from the Random123 distribution's
/// known-answer test file ("kat_vectors", Salmon et al., Random123 1.x):
/// counter[4], key[2] -> output[4].
const KAT: &[([u32; 4], [u32; 2], [u32; 4])] = &[
    (
        [0, 0, 0, 0],
        [0, 0],
        [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8],
    ),
    (
        [0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff],
        [0xffffffff, 0xffffffff],
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
    ),
    (
        [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
        [0xa4093822, 0x299f31d0],
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
    ),
];

#[test]
fn host_philox_matches_random123_known_answers() {
    for (ctr, key, want) in KAT {
        assert_eq!(
            philox::philox4x32_10(*ctr, *key),
            *want,
            "ctr {ctr:x?} key {key:x?}"
        );
    }
}

#[test]
fn device_philox_matches_the_host_twin_bitwise() {
    let states = [
        (0u64, 0u64, 1usize),
        (0, 0, 1003),
        (42, 3, 517), // offset inside a block
        (0xDEAD_BEEF_0123_4567, 7, 64),
        // Block index crossing 2^32: the counter's high word is used.
        (99, (1u64 << 34) - 10, 40),
        (u64::MAX, u64::MAX - 100, 100),
    ];
    for dev in devices("device_philox_matches_the_host_twin_bitwise", states.len()) {
        let stream = dev.new_stream().unwrap();
        for &(seed, offset, n) in &states {
            let mut out = dev.alloc_zeros::<i32>(n).unwrap();
            philox_fill(&stream, PhiloxState { seed, offset }, &mut out).unwrap();
            let got: Vec<u32> = out.to_host().unwrap().iter().map(|&v| v as u32).collect();
            let want: Vec<u32> = (0..n as u64)
                .map(|i| philox::value(seed, offset.wrapping_add(i)))
                .collect();
            assert_eq!(got, want, "seed {seed} offset {offset} on {dev:?}");
        }
    }
}

const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (1, 7),
    (3, 5),
    (7, 33),
    (64, 64),
    (129, 24),
    (5, 1000),
];
const PS: [f32; 3] = [0.0, 0.1, 0.5];

fn poisoned<T: FloatElement>(stream: &Stream, n: usize) -> DeviceBuffer<T> {
    let mut b = stream.device().alloc_zeros::<T>(n).unwrap();
    stream.fill_bytes(&mut b, 0xFF).unwrap(); // NaN in every float format
    b
}

fn mode_of(state: Option<PhiloxState>) -> DropoutMode {
    state.map_or(DropoutMode::Eval, DropoutMode::Train)
}

#[allow(clippy::too_many_arguments)]
fn case<T: FloatElement>(
    dev: &Device,
    rows: usize,
    cols: usize,
    p: f32,
    bias: bool,
    vectorize: bool,
    state: Option<PhiloxState>,
) {
    let n = rows * cols;
    let (mut rng, seed) = Rng::new((rows * 131 + cols) as u64 ^ p.to_bits() as u64);
    let stream = dev.new_stream().unwrap();
    let (x, xf) = rng.tensor::<T>(n, 2.0);
    let (r, rf) = rng.tensor::<T>(n, 1.0);
    let (b, bf) = rng.tensor::<T>(cols, 1.0);
    let (g, gf) = rng.tensor::<T>(n, 1.0);
    let (xd, rd, bd, gd) = (
        dev.upload(&x).unwrap(),
        dev.upload(&r).unwrap(),
        dev.upload(&b).unwrap(),
        dev.upload(&g).unwrap(),
    );
    let op = BiasDropoutAdd::new(rows, cols, p).with_vectorize(vectorize);
    let keep = oracle::mask(p as f64, state.map(|s| (s.seed, s.offset)), n);
    let pf = if state.is_some() { p as f64 } else { 0.0 };
    let what = format!("{rows}x{cols} p={p} bias={bias} vec={vectorize} {state:?} on {dev:?}");

    let mut y = poisoned::<T>(&stream, n);
    op.forward(
        &stream,
        &xd,
        bias.then_some(&bd),
        &rd,
        &mut y,
        mode_of(state),
    )
    .unwrap();
    let want = oracle::forward(pf, &keep, &xf, bias.then_some(&bf[..]), &rf, cols);
    assert_close(
        &format!("forward {what}"),
        T::DTYPE,
        seed,
        &to_f64(&y.to_host().unwrap()),
        &want,
    );

    let mut dx = poisoned::<T>(&stream, n);
    let mut dr = poisoned::<T>(&stream, n);
    let mut db = poisoned::<T>(&stream, cols);
    op.backward(
        &stream,
        &gd,
        &mut dx,
        Some(&mut dr),
        Some(&mut db),
        mode_of(state),
    )
    .unwrap();
    let (wdx, wdb) = oracle::backward(pf, &keep, &gf, cols);
    let dx_h = dx.to_host().unwrap();
    assert_close(&format!("dx {what}"), T::DTYPE, seed, &to_f64(&dx_h), &wdx);
    let db_first = db.to_host().unwrap();
    assert_close_sums(
        &format!("dbias {what}"),
        T::DTYPE,
        seed,
        &to_f64(&db_first),
        &wdb,
        &abs_column_sums(&wdx, cols),
    );
    let dr_h = dr.to_host().unwrap();
    assert!(
        bytemuck::cast_slice::<T, u8>(&dr_h) == bytemuck::cast_slice::<T, u8>(&g),
        "d_residual != d_out: {what}"
    );
    // The backward's mask is exactly the forward's: dx is zero exactly where
    // the host mask drops (d_out is nonzero almost surely; check where it is).
    for i in 0..n {
        if g[i].to_f64() != 0.0 {
            assert_eq!(dx_h[i].to_f64() != 0.0, keep[i], "element {i}: {what}");
        }
    }
    // Deterministic dbias, no d_residual requested.
    let mut db2 = poisoned::<T>(&stream, cols);
    op.backward(&stream, &gd, &mut dx, None, Some(&mut db2), mode_of(state))
        .unwrap();
    let db_second = db2.to_host().unwrap();
    assert!(
        bytemuck::cast_slice::<T, u8>(&db_first) == bytemuck::cast_slice::<T, u8>(&db_second),
        "dbias differs between two runs: {what} (seed {seed})"
    );
}

fn all<T: FloatElement>(test: &str) {
    let cases = SHAPES.len() * PS.len() * 2 * 2 + 2;
    for dev in devices(test, cases) {
        let mut tracker = RngTracker::megatron(20_240_601, 0);
        for &(rows, cols) in SHAPES {
            for p in PS {
                for bias in [true, false] {
                    for vectorize in [true, false] {
                        let s = tracker.next(DEFAULT_STREAM, (rows * cols) as u64).unwrap();
                        case::<T>(&dev, rows, cols, p, bias, vectorize, Some(s));
                    }
                }
            }
        }
        // An offset inside a Philox block and a large seed; evaluation.
        let odd = PhiloxState {
            seed: u64::MAX - 5,
            offset: (1 << 33) + 3,
        };
        case::<T>(&dev, 17, 24, 0.5, true, true, Some(odd));
        case::<T>(&dev, 17, 19, 0.5, true, true, None);
    }
}

#[test]
fn oracle_f32() {
    all::<f32>("oracle_f32");
}
#[test]
fn oracle_f16() {
    all::<f16>("oracle_f16");
}
#[test]
fn oracle_bf16() {
    all::<bf16>("oracle_bf16");
}

/// The device's keep-mask of an `n`-element fp32 call (x = 1, residual = 0:
/// out is 1/(1-p) where kept, 0 where dropped).
fn device_mask(dev: &Device, p: f32, n: usize, state: PhiloxState) -> Vec<bool> {
    let stream = dev.new_stream().unwrap();
    let x = dev.upload(&vec![1.0f32; n]).unwrap();
    let r = dev.alloc_zeros::<f32>(n).unwrap();
    let mut y = dev.alloc_zeros::<f32>(n).unwrap();
    let rows = n / 500;
    BiasDropoutAdd::new(rows, 500, p)
        .forward(&stream, &x, None, &r, &mut y, DropoutMode::Train(state))
        .unwrap();
    y.to_host().unwrap().iter().map(|&v| v != 0.0).collect()
}

/// |count - n q| <= 5 sqrt(n q (1 - q)).
fn assert_binomial(what: &str, count: usize, n: usize, q: f64) {
    let mean = n as f64 * q;
    let sd = (n as f64 * q * (1.0 - q)).sqrt();
    assert!(
        (count as f64 - mean).abs() <= 5.0 * sd,
        "{what}: {count} of {n}, expected {mean:.0} +- 5 * {sd:.1}"
    );
}

fn agreement(a: &[bool], b: &[bool]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x == y).count()
}

#[test]
fn mask_statistics() {
    const N: usize = 200_000;
    for dev in devices("mask_statistics", 2) {
        for p in [0.1f32, 0.5] {
            let q = p as f64;
            let mut tracker = RngTracker::megatron(7, 0);
            let a_state = tracker.next(DEFAULT_STREAM, N as u64).unwrap();
            let b_state = tracker.next(DEFAULT_STREAM, N as u64).unwrap();
            assert_eq!(b_state.offset, N as u64);
            let a = device_mask(&dev, p, N, a_state);
            let b = device_mask(&dev, p, N, b_state);
            let host: Vec<bool> = oracle::mask(q, Some((a_state.seed, a_state.offset)), N);
            assert_eq!(a, host, "device mask != host twin, p={p} on {dev:?}");

            let kept = a.iter().filter(|&&k| k).count();
            assert_binomial(&format!("keep fraction p={p} on {dev:?}"), kept, N, 1.0 - q);
            let indep = (1.0 - q) * (1.0 - q) + q * q;
            assert_binomial(
                &format!("offsets 0 and {N} agree, p={p} on {dev:?}"),
                agreement(&a, &b),
                N,
                indep,
            );

            // Tensor-parallel ranks: the model-parallel streams differ (and
            // are independent), the default stream is shared.
            let mut r0 = RngTracker::megatron(7, 0);
            let mut r1 = RngTracker::megatron(7, 1);
            let m0 = r0.next(MODEL_PARALLEL_STREAM, N as u64).unwrap();
            let m1 = r1.next(MODEL_PARALLEL_STREAM, N as u64).unwrap();
            assert_eq!((m0.seed, m1.seed), (7 + 2718, 7 + 2718 + 1));
            let (c0, c1) = (device_mask(&dev, p, N, m0), device_mask(&dev, p, N, m1));
            assert_binomial(
                &format!("tp ranks 0 and 1 agree, p={p} on {dev:?}"),
                agreement(&c0, &c1),
                N,
                indep,
            );
            let d0 = r0.next(DEFAULT_STREAM, N as u64).unwrap();
            let d1 = r1.next(DEFAULT_STREAM, N as u64).unwrap();
            assert_eq!(d0, d1);
        }
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let x = dev.alloc_zeros::<f32>(12).unwrap();
    let r = dev.alloc_zeros::<f32>(12).unwrap();
    let mut y = dev.alloc_zeros::<f32>(12).unwrap();
    let short = dev.alloc_zeros::<f32>(11).unwrap();
    let b3 = dev.alloc_zeros::<f32>(3).unwrap();
    let train = DropoutMode::Train(PhiloxState { seed: 1, offset: 0 });

    for p in [1.0f32, 1.5, -0.1, f32::NAN] {
        for mode in [train, DropoutMode::Eval] {
            let e = BiasDropoutAdd::new(3, 4, p)
                .forward(&stream, &x, None, &r, &mut y, mode)
                .unwrap_err()
                .to_string();
            assert!(e.contains("`p`") && e.contains("[0, 1)"), "{e}");
            let e = BiasDropoutAdd::new(3, 4, p)
                .backward(&stream, &x, &mut y, None, None, mode)
                .unwrap_err()
                .to_string();
            assert!(e.contains("`p`"), "{e}");
        }
    }
    let op = BiasDropoutAdd::new(3, 4, 0.1);
    let e = op
        .forward(&stream, &x, None, &short, &mut y, train)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`residual`") && e.contains("exactly 12") && e.contains("11"),
        "{e}"
    );
    let e = op
        .forward(&stream, &short, None, &r, &mut y, train)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`x`"), "{e}");
    let e = op
        .forward(&stream, &x, Some(&b3), &r, &mut y, train)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`bias`") && e.contains("exactly 4"), "{e}");
    let mut short_mut = dev.alloc_zeros::<f32>(11).unwrap();
    let e = op
        .backward(&stream, &x, &mut short_mut, None, None, train)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`dx`"), "{e}");
    let e = op
        .backward(&stream, &x, &mut y, Some(&mut short_mut), None, train)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`d_residual`"), "{e}");
    let mut db3 = dev.alloc_zeros::<f32>(3).unwrap();
    let e = op
        .backward(&stream, &x, &mut y, None, Some(&mut db3), train)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`dbias`"), "{e}");
    let e = op
        .forward(
            &stream,
            &x,
            None,
            &r,
            &mut y,
            DropoutMode::Train(PhiloxState {
                seed: 1,
                offset: u64::MAX - 5,
            }),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("`offset`"), "{e}");
}

#[test]
fn empty_matrices_are_no_ops_with_zero_dbias() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let x = dev.alloc_zeros::<f32>(0).unwrap();
    let mut y = dev.alloc_zeros::<f32>(0).unwrap();
    let op = BiasDropoutAdd::new(0, 4, 0.5);
    let train = DropoutMode::Train(PhiloxState { seed: 1, offset: 0 });
    op.forward(&stream, &x, None, &x, &mut y, train).unwrap();
    let mut db = dev.upload(&[f32::NAN; 4]).unwrap();
    op.backward(&stream, &x, &mut y, None, Some(&mut db), train)
        .unwrap();
    assert_eq!(db.to_host().unwrap(), vec![0.0; 4]);
}
