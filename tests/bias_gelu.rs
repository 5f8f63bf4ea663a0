//! Bias + GeLU against the float64 oracle: every dtype, both GeLU forms,
//! awkward shapes, vector and scalar paths, in-place variants, deterministic
//! bias gradients, and argument validation.

mod common;

use common::{abs_column_sums, assert_close, assert_close_sums, devices, to_f64, Rng};
use ferrotron::core::dtype::FloatElement;
use ferrotron::ops::{BiasGelu, Gelu};
use ferrotron::reference::bias_gelu as oracle;
use ferrotron::{DType, Device, DeviceBuffer, Stream};
use half::{bf16, f16};

/// Shapes: 1, primes, non-multiples of every vector width, one wide row, and
/// enough rows for several backward chunks.
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (1, 7),
    (3, 5),
    (7, 33),
    (2, 4097),
    (64, 64),
    (129, 24),
    (1000, 3),
    (5, 1000),
];

fn poisoned<T: FloatElement>(stream: &Stream, n: usize) -> DeviceBuffer<T> {
    let mut b = stream.device().alloc_zeros::<T>(n).unwrap();
    stream.fill_bytes(&mut b, 0xFF).unwrap(); // NaN in every float format
    b
}

fn forward_case<T: FloatElement>(
    dev: &Device,
    rows: usize,
    cols: usize,
    gelu: Gelu,
    bias: bool,
    vectorize: bool,
    scale: f64,
) {
    let (mut rng, seed) = Rng::new((rows * 131 + cols) as u64);
    let stream = dev.new_stream().unwrap();
    let (x, xf) = rng.tensor::<T>(rows * cols, scale);
    let (b, bf) = rng.tensor::<T>(cols, 1.0);
    let xd = dev.upload(&x).unwrap();
    let bd = dev.upload(&b).unwrap();
    let mut y = poisoned::<T>(&stream, rows * cols);
    let op = BiasGelu::new(rows, cols)
        .with_gelu(gelu)
        .with_vectorize(vectorize);
    op.forward(&stream, &xd, bias.then_some(&bd), &mut y)
        .unwrap();
    stream.synchronize().unwrap();
    let reference = oracle::forward(gelu, &xf, bias.then_some(&bf[..]), cols);
    let what = format!(
        "forward {rows}x{cols} {gelu:?} bias={bias} vec={vectorize} scale={scale} on {dev:?}"
    );
    assert_close(
        &what,
        T::DTYPE,
        seed,
        &to_f64(&y.to_host().unwrap()),
        &reference,
    );

    // In place gives the same answer.
    let mut xi = dev.upload(&x).unwrap();
    op.forward_in_place(&stream, &mut xi, bias.then_some(&bd))
        .unwrap();
    assert_close(
        &format!("in-place {what}"),
        T::DTYPE,
        seed,
        &to_f64(&xi.to_host().unwrap()),
        &reference,
    );
}

fn backward_case<T: FloatElement>(
    dev: &Device,
    rows: usize,
    cols: usize,
    gelu: Gelu,
    bias: bool,
    vectorize: bool,
) {
    let (mut rng, seed) = Rng::new((rows * 977 + cols) as u64);
    let stream = dev.new_stream().unwrap();
    let (x, xf) = rng.tensor::<T>(rows * cols, 2.0);
    let (dy, dyf) = rng.tensor::<T>(rows * cols, 1.0);
    let (b, bf) = rng.tensor::<T>(cols, 1.0);
    let (xd, dyd, bd) = (
        dev.upload(&x).unwrap(),
        dev.upload(&dy).unwrap(),
        dev.upload(&b).unwrap(),
    );
    let mut dx = poisoned::<T>(&stream, rows * cols);
    let mut db = poisoned::<T>(&stream, cols);
    let op = BiasGelu::new(rows, cols)
        .with_gelu(gelu)
        .with_vectorize(vectorize);
    op.backward(
        &stream,
        &dyd,
        &xd,
        bias.then_some(&bd),
        &mut dx,
        Some(&mut db),
    )
    .unwrap();
    stream.synchronize().unwrap();
    let (rdx, rdb) = oracle::backward(gelu, &dyf, &xf, bias.then_some(&bf[..]), cols);
    let what = format!("backward {rows}x{cols} {gelu:?} bias={bias} vec={vectorize} on {dev:?}");
    assert_close(
        &format!("dx {what}"),
        T::DTYPE,
        seed,
        &to_f64(&dx.to_host().unwrap()),
        &rdx,
    );
    let db_first = db.to_host().unwrap();
    assert_close_sums(
        &format!("dbias {what}"),
        T::DTYPE,
        seed,
        &to_f64(&db_first),
        &rdb,
        &abs_column_sums(&rdx, cols),
    );

    // In place, and bitwise-identical dbias on a second run.
    let mut g = dev.upload(&dy).unwrap();
    let mut db2 = poisoned::<T>(&stream, cols);
    op.backward_in_place(&stream, &mut g, &xd, bias.then_some(&bd), Some(&mut db2))
        .unwrap();
    assert_close(
        &format!("in-place dx {what}"),
        T::DTYPE,
        seed,
        &to_f64(&g.to_host().unwrap()),
        &rdx,
    );
    let db_second = db2.to_host().unwrap();
    assert!(
        bytemuck::cast_slice::<T, u8>(&db_first) == bytemuck::cast_slice::<T, u8>(&db_second),
        "dbias differs between two runs: {what} (seed {seed})"
    );
}

fn forward_all<T: FloatElement>(test: &str) {
    let cases = SHAPES.len() * 2 * 2 * 2 + 2;
    for dev in devices(test, cases) {
        for &(rows, cols) in SHAPES {
            for gelu in [Gelu::Tanh, Gelu::Erf] {
                for bias in [true, false] {
                    for vectorize in [true, false] {
                        forward_case::<T>(&dev, rows, cols, gelu, bias, vectorize, 3.0);
                    }
                }
            }
        }
        // Tiny and huge magnitudes.
        forward_case::<T>(&dev, 17, 19, Gelu::Tanh, true, true, 1e-4);
        let huge = if T::DTYPE == DType::F16 { 1e4 } else { 1e6 };
        forward_case::<T>(&dev, 17, 19, Gelu::Erf, false, true, huge);
    }
}

fn backward_all<T: FloatElement>(test: &str) {
    let cases = SHAPES.len() * 2 * 2 * 2;
    for dev in devices(test, cases) {
        for &(rows, cols) in SHAPES {
            for gelu in [Gelu::Tanh, Gelu::Erf] {
                for bias in [true, false] {
                    for vectorize in [true, false] {
                        backward_case::<T>(&dev, rows, cols, gelu, bias, vectorize);
                    }
                }
            }
        }
    }
}

#[test]
fn forward_f32() {
    forward_all::<f32>("forward_f32");
}
#[test]
fn forward_f16() {
    forward_all::<f16>("forward_f16");
}
#[test]
fn forward_bf16() {
    forward_all::<bf16>("forward_bf16");
}
#[test]
fn backward_f32() {
    backward_all::<f32>("backward_f32");
}
#[test]
fn backward_f16() {
    backward_all::<f16>("backward_f16");
}
#[test]
fn backward_bf16() {
    backward_all::<bf16>("backward_bf16");
}

#[test]
fn one_wide_row_of_a_million() {
    for dev in devices("one_wide_row_of_a_million", 2) {
        forward_case::<f32>(&dev, 1, 1 << 20, Gelu::Tanh, true, true, 2.0);
        backward_case::<bf16>(&dev, 2, (1 << 19) + 3, Gelu::Tanh, true, true);
    }
}

#[test]
fn empty_matrices_are_no_ops_with_zero_dbias() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let x = dev.alloc_zeros::<f32>(0).unwrap();
    let mut y = dev.alloc_zeros::<f32>(0).unwrap();
    let b = dev.upload(&[1.0f32; 4]).unwrap();
    BiasGelu::new(0, 4)
        .forward(&stream, &x, Some(&b), &mut y)
        .unwrap();
    let mut db = dev.upload(&[f32::NAN; 4]).unwrap();
    let mut dx = dev.alloc_zeros::<f32>(0).unwrap();
    BiasGelu::new(0, 4)
        .backward(&stream, &x, &x, Some(&b), &mut dx, Some(&mut db))
        .unwrap();
    assert_eq!(db.to_host().unwrap(), vec![0.0; 4]);
}

#[test]
fn bad_arguments_are_clear_errors() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let x = dev.alloc_zeros::<f32>(12).unwrap();
    let mut y = dev.alloc_zeros::<f32>(12).unwrap();
    let mut short = dev.alloc_zeros::<f32>(11).unwrap();
    let b3 = dev.alloc_zeros::<f32>(3).unwrap();
    let b4 = dev.alloc_zeros::<f32>(4).unwrap();
    let op = BiasGelu::new(3, 4);

    let e = op
        .forward(&stream, &x, None, &mut short)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`out`") && e.contains("exactly 12") && e.contains("11"),
        "{e}"
    );
    let e = op
        .forward(&stream, &x, Some(&b3), &mut y)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`bias`") && e.contains("exactly 4") && e.contains("3"),
        "{e}"
    );
    let e = op
        .backward(&stream, &x, &short, Some(&b4), &mut y, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`x`"), "{e}");
    let mut db3 = dev.alloc_zeros::<f32>(3).unwrap();
    let e = op
        .backward(&stream, &x, &x, Some(&b4), &mut y, Some(&mut db3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`dbias`"), "{e}");
    let e = BiasGelu::new(usize::MAX, 2)
        .forward(&stream, &x, None, &mut y)
        .unwrap_err()
        .to_string();
    assert!(e.contains("overflows"), "{e}");

    let other = Device::emu();
    let foreign = other.alloc_zeros::<f32>(12).unwrap();
    let e = op
        .forward(&stream, &foreign, None, &mut y)
        .unwrap_err()
        .to_string();
    assert!(e.contains("different device"), "{e}");
}
