//! The code paths that only huge shapes reach on a GPU, run on small shapes by
//! lowering the plans' grid caps (`core::plan::set_grid_caps_for_tests`):
//!
//! - grid-stride loops that wrap (the grid capped at 65,536 blocks): bias +
//!   GeLU forward, softmax (warp and block paths, causal and padding masks),
//!   the LayerNorm / RMSNorm warp path, the multi-tensor chunk loop (unscale,
//!   found_inf, L2 norm), `copy_2d`, and the vocab-parallel embedding and
//!   cross-entropy elementwise kernels;
//! - LayerNorm / RMSNorm block-per-row launches whose rows spill from grid x
//!   (capped at 65,536) into grid y, with idle blocks in the last y row;
//! - the batched GEMM whose blocks loop over the batch past grid z (65,535).
//!
//! Every case is compared with the float64 oracles of `ferrotron::reference`
//! at the tolerances of the per-op tests (`tests/common/mod.rs`), and asserts
//! from the plan functions that the capped grid really is smaller than the
//! work, so no case can pass through the non-wrapping path.
//!
//! The caps are process-global, so every such case lives in this one test
//! binary, and every test sets the same small caps first (tests run on
//! parallel threads: they all agree on the values).

mod common;

use common::ranks::run_ranks;
use common::{
    abs_column_sums, assert_close, assert_close_norm_dx, assert_close_sums, devices,
    norm_param_grad_scales, to_f64, Rng,
};
use ferrotron::core::dtype::FloatElement;
use ferrotron::core::plan::{self, grid_caps, set_grid_caps_for_tests, GridCaps};
use ferrotron::ops::copy::{copy_2d, Block2d};
use ferrotron::ops::gemm::{Aux, Epilogue, Gemm, GemmInputs};
use ferrotron::ops::gemm_provider::GemmProvider;
use ferrotron::ops::multi_tensor::{GradRef, MultiTensor, TensorRef};
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask, SoftmaxPath};
use ferrotron::ops::{BiasGelu, Gelu, LayerNorm, RmsNorm};
use ferrotron::parallel::vocab::{
    padded_vocab_size, shard_vocab_rows, TokenId, VocabParallelCrossEntropy, VocabParallelEmbedding,
};
use ferrotron::reference::{
    bias_gelu as gelu_oracle, gemm as gemm_oracle, layernorm as ln_oracle,
    multi_tensor as mt_oracle, softmax as sm_oracle, vocab_parallel as vp_oracle,
};
use ferrotron::{DType, Device, DeviceBuffer, Stream};
use half::{bf16, f16};

/// The caps every test runs under: 3 grid-stride blocks, LayerNorm rows
/// 4 to a grid row, 2 GEMM batch slices along z, the LayerNorm block
/// forward giving a block several rows from 2 blocks on.
const CAPS: GridCaps = GridCaps {
    grid_stride_blocks: 3,
    row_grid_x: 4,
    grid_z: 2,
    ln_fwd_target_blocks: 2,
};

/// Lowers the caps (idempotent: every test sets the same values) and checks
/// they took effect.
fn lower_caps() {
    set_grid_caps_for_tests(CAPS);
    assert_eq!(grid_caps(), CAPS);
}

fn poisoned<T: FloatElement>(stream: &Stream, n: usize) -> DeviceBuffer<T> {
    let mut b = stream.device().alloc_zeros::<T>(n).unwrap();
    stream.fill_bytes(&mut b, 0xFF).unwrap(); // NaN in every float format
    b
}

// ---------------------------------------------------------------- bias + GeLU

/// The bias + GeLU forward plan (shared by bias + dropout + residual)
/// grid-strides: the capped grid covers less than half the work.
fn assert_forward_grid_strides<T: FloatElement>(rows: usize, cols: usize, vectorize: bool) {
    let p = plan::bias_gelu::forward(rows as u64, cols as u64, T::DTYPE.size(), vectorize);
    let needed = ((rows * cols) as u64 / p.vec as u64).div_ceil(256);
    assert_eq!(p.cfg.grid[0] as u64, CAPS.grid_stride_blocks);
    assert!(needed >= 2 * CAPS.grid_stride_blocks, "{needed} blocks");
}

fn bias_gelu_case<T: FloatElement>(
    dev: &Device,
    rows: usize,
    cols: usize,
    gelu: Gelu,
    vectorize: bool,
) {
    assert_forward_grid_strides::<T>(rows, cols, vectorize);

    let (mut rng, seed) = Rng::new((rows * 131 + cols) as u64);
    let stream = dev.new_stream().unwrap();
    let n = rows * cols;
    let (x, xf) = rng.tensor::<T>(n, 3.0);
    let (b, bf) = rng.tensor::<T>(cols, 1.0);
    let (dy, dyf) = rng.tensor::<T>(n, 1.0);
    let (xd, bd, dyd) = (
        dev.upload(&x).unwrap(),
        dev.upload(&b).unwrap(),
        dev.upload(&dy).unwrap(),
    );
    let op = BiasGelu::new(rows, cols)
        .with_gelu(gelu)
        .with_vectorize(vectorize);
    let what = format!("bias-gelu {rows}x{cols} {gelu:?} vec={vectorize} on {dev:?}");

    let mut y = poisoned::<T>(&stream, n);
    op.forward(&stream, &xd, Some(&bd), &mut y).unwrap();
    stream.synchronize().unwrap();
    let reference = gelu_oracle::forward(gelu, &xf, Some(&bf), cols);
    assert_close(
        &format!("forward {what}"),
        T::DTYPE,
        seed,
        &to_f64(&y.to_host().unwrap()),
        &reference,
    );
    let mut xi = dev.upload(&x).unwrap();
    op.forward_in_place(&stream, &mut xi, Some(&bd)).unwrap();
    assert_close(
        &format!("in-place forward {what}"),
        T::DTYPE,
        seed,
        &to_f64(&xi.to_host().unwrap()),
        &reference,
    );

    let mut dx = poisoned::<T>(&stream, n);
    let mut db = poisoned::<T>(&stream, cols);
    op.backward(&stream, &dyd, &xd, Some(&bd), &mut dx, Some(&mut db))
        .unwrap();
    stream.synchronize().unwrap();
    let (rdx, rdb) = gelu_oracle::backward(gelu, &dyf, &xf, Some(&bf), cols);
    assert_close(
        &format!("dx {what}"),
        T::DTYPE,
        seed,
        &to_f64(&dx.to_host().unwrap()),
        &rdx,
    );
    assert_close_sums(
        &format!("dbias {what}"),
        T::DTYPE,
        seed,
        &to_f64(&db.to_host().unwrap()),
        &rdb,
        &abs_column_sums(&rdx, cols),
    );
}

#[test]
fn bias_gelu_grid_stride_wraps() {
    lower_caps();
    for dev in devices("bias_gelu_grid_stride_wraps", 4) {
        // 37 x 300 = 11100 elements: 11 (fp32 x4), 6 (bf16 x8) or 44 (scalar)
        // blocks of work on 3 blocks.
        bias_gelu_case::<f32>(&dev, 37, 300, Gelu::Tanh, true);
        bias_gelu_case::<bf16>(&dev, 37, 300, Gelu::Erf, true);
        bias_gelu_case::<f16>(&dev, 37, 300, Gelu::Tanh, false);
        // A tail that is not a whole block or a whole vector.
        bias_gelu_case::<f32>(&dev, 29, 131, Gelu::Erf, false);
    }
}

/// Bias + dropout + residual on the same capped grid (it shares the bias +
/// GeLU plan): the bias column advances by increments across the grid-stride
/// steps, vector (bias vectorised or not) and scalar.
#[test]
fn bias_dropout_add_grid_stride_wraps() {
    use ferrotron::core::rng::PhiloxState;
    use ferrotron::ops::{BiasDropoutAdd, DropoutMode};
    use ferrotron::reference::dropout as drop_oracle;
    lower_caps();
    fn case<T: FloatElement>(dev: &Device, rows: usize, cols: usize, vectorize: bool) {
        assert_forward_grid_strides::<T>(rows, cols, vectorize);
        let (mut rng, seed) = Rng::new((rows * 7 + cols) as u64);
        let stream = dev.new_stream().unwrap();
        let n = rows * cols;
        let (x, xf) = rng.tensor::<T>(n, 2.0);
        let (r, rf) = rng.tensor::<T>(n, 1.0);
        let (b, bf) = rng.tensor::<T>(cols, 1.0);
        let (xd, rd, bd) = (
            dev.upload(&x).unwrap(),
            dev.upload(&r).unwrap(),
            dev.upload(&b).unwrap(),
        );
        let state = PhiloxState {
            seed: 1234,
            offset: 16,
        };
        let drop = 0.1f32;
        let mut y = poisoned::<T>(&stream, n);
        BiasDropoutAdd::new(rows, cols, drop)
            .with_vectorize(vectorize)
            .forward(
                &stream,
                &xd,
                Some(&bd),
                &rd,
                &mut y,
                DropoutMode::Train(state),
            )
            .unwrap();
        let keep = drop_oracle::mask(drop as f64, Some((state.seed, state.offset)), n);
        let want = drop_oracle::forward(drop as f64, &keep, &xf, Some(&bf[..]), &rf, cols);
        assert_close(
            &format!("bias-dropout-add {rows}x{cols} vec={vectorize} on {dev:?}"),
            T::DTYPE,
            seed,
            &to_f64(&y.to_host().unwrap()),
            &want,
        );
    }
    for dev in devices("bias_dropout_add_grid_stride_wraps", 3) {
        case::<f32>(&dev, 37, 300, true); // bias vectorised (300 % 4 == 0)
        case::<bf16>(&dev, 37, 300, true); // vector rows, bias element by element
        case::<f16>(&dev, 37, 300, false);
    }
}

// ------------------------------------------------------------------- softmax

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    None,
    /// Per-batch padding mask `[b, 1, sq, sk]`.
    Padding,
    Causal,
}

/// A random padding mask (about 30% masked) whose first row of every
/// `[sq, sk]` matrix is fully masked.
fn padding_mask(rng: &mut Rng, matrices: usize, sq: usize, sk: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..matrices * sq * sk)
        .map(|_| u8::from(rng.uniform() < 0.3))
        .collect();
    for mat in m.chunks_mut(sq * sk) {
        mat[..sk].fill(1);
    }
    m
}

fn softmax_case<T: FloatElement>(
    dev: &Device,
    shape: sm_oracle::Shape,
    mode: Mode,
    path: SoftmaxPath,
    vectorize: bool,
) {
    let sm_oracle::Shape { b, np, sq, sk } = shape;
    let rows = b * np * sq;
    let n = rows * sk;
    // Capped grid-stride launch: fewer blocks than the rows need.
    let p = plan::softmax::plan(rows as u64, sk as u64, T::DTYPE.size(), true, Some(path)).unwrap();
    assert_eq!(p.path, path);
    let rows_per_block = match path {
        SoftmaxPath::Warp => 4 * p.rows_per_warp as usize,
        _ => 1,
    };
    assert_eq!(p.cfg.grid[0] as u64, CAPS.grid_stride_blocks);
    assert!(rows.div_ceil(rows_per_block) as u64 > 2 * CAPS.grid_stride_blocks);

    let (mut rng, seed) = Rng::new((n * 31 + sk) as u64 ^ mode as u64);
    let stream = dev.new_stream().unwrap();
    let scale = 0.5f32;
    let (x, xf) = rng.tensor::<T>(n, 2.0);
    let mask_host = match mode {
        Mode::Padding => padding_mask(&mut rng, b, sq, sk),
        _ => Vec::new(),
    };
    let mask_dev = dev.upload(&mask_host).unwrap();
    let (mask, ref_mask) = match mode {
        Mode::None => (SoftmaxMask::None, sm_oracle::Mask::None),
        Mode::Causal => (SoftmaxMask::Causal, sm_oracle::Mask::Causal),
        Mode::Padding => (
            SoftmaxMask::Padding(&mask_dev),
            sm_oracle::Mask::Padding(&mask_host),
        ),
    };
    let op = ScaleMaskSoftmax::new(b, np, sq, sk, scale)
        .with_vectorize(vectorize)
        .with_path(Some(path));
    let what =
        format!("softmax [{b}, {np}, {sq}, {sk}] {mode:?} {path:?} vec={vectorize} on {dev:?}");

    let xd = dev.upload(&x).unwrap();
    let mut y = poisoned::<T>(&stream, n);
    op.forward(&stream, &xd, mask, &mut y).unwrap();
    stream.synchronize().unwrap();
    let yf = to_f64(&y.to_host().unwrap());
    let reference = sm_oracle::forward(&xf, shape, scale as f64, ref_mask);
    assert_close(&format!("forward {what}"), T::DTYPE, seed, &yf, &reference);
    for (i, (&o, &r)) in yf.iter().zip(&reference).enumerate() {
        assert!(
            r != 0.0 || o == 0.0,
            "forward {what}: element {i} must be exactly 0, got {o} (seed {seed})"
        );
    }

    let (dy, dyf) = rng.tensor::<T>(n, 1.0);
    let dyd = dev.upload(&dy).unwrap();
    let mut dx = poisoned::<T>(&stream, n);
    op.backward(&stream, &y, &dyd, &mut dx).unwrap();
    stream.synchronize().unwrap();
    let dxf = to_f64(&dx.to_host().unwrap());
    let rdx = sm_oracle::backward(&yf, &dyf, sk, scale as f64);
    assert_close(&format!("backward {what}"), T::DTYPE, seed, &dxf, &rdx);
    for (i, (&o, &r)) in dxf.iter().zip(&reference).enumerate() {
        assert!(
            r != 0.0 || o == 0.0,
            "backward {what}: dx[{i}] must be exactly 0 where y is, got {o} (seed {seed})"
        );
    }
}

#[test]
fn softmax_warp_path_wraps() {
    lower_caps();
    let shape = |b, np, sq, sk| sm_oracle::Shape { b, np, sq, sk };
    for dev in devices("softmax_warp_path_wraps", 4) {
        // 4 x 3 x 20 = 240 rows of 20 (one vector per 4 lanes, 32 rows per
        // block): 8 blocks on 3.
        softmax_case::<f32>(
            &dev,
            shape(4, 3, 20, 20),
            Mode::Causal,
            SoftmaxPath::Warp,
            true,
        );
        softmax_case::<bf16>(
            &dev,
            shape(2, 2, 20, 20),
            Mode::Causal,
            SoftmaxPath::Warp,
            false,
        );
        // 2 x 3 x 40 = 240 rows of 64 (vector loads, 32 rows per block),
        // per-batch padding mask.
        softmax_case::<f16>(
            &dev,
            shape(2, 3, 40, 64),
            Mode::Padding,
            SoftmaxPath::Warp,
            true,
        );
        softmax_case::<f32>(
            &dev,
            shape(3, 1, 9, 33),
            Mode::None,
            SoftmaxPath::Warp,
            true,
        );
    }
}

#[test]
fn softmax_block_path_wraps() {
    lower_caps();
    let shape = |b, np, sq, sk| sm_oracle::Shape { b, np, sq, sk };
    for dev in devices("softmax_block_path_wraps", 3) {
        // Block path forced on short rows: 2 x 2 x 4 = 16 rows on 3 blocks.
        softmax_case::<f32>(
            &dev,
            shape(2, 2, 4, 40),
            Mode::Padding,
            SoftmaxPath::Block,
            true,
        );
        softmax_case::<bf16>(
            &dev,
            shape(1, 1, 11, 11),
            Mode::Causal,
            SoftmaxPath::Block,
            false,
        );
        // The block path's own row lengths (> 1024), 7 rows.
        softmax_case::<f16>(
            &dev,
            shape(1, 7, 1, 1032),
            Mode::None,
            SoftmaxPath::Block,
            true,
        );
    }
}

// -------------------------------------------------------- LayerNorm, RMSNorm

/// What one norm forward runs with.
#[derive(Clone, Copy)]
struct NormFwdOpts {
    rms: bool,
    zero_centered: bool,
    vectorize: bool,
    eps: f32,
}

/// Runs the LayerNorm (or RMSNorm: beta ignored, mean left poisoned)
/// forward into poisoned outputs and the f64 oracle on the same inputs:
/// (y, mean, rstd, oracle). x, gamma and beta as (device, host f64).
fn norm_forward<T: FloatElement>(
    stream: &Stream,
    (rows, hidden): (usize, usize),
    o: NormFwdOpts,
    (xd, xf): (&DeviceBuffer<T>, &[f64]),
    gamma: Option<(&dyn ferrotron::DeviceRead<T>, &[f64])>,
    beta: Option<(&dyn ferrotron::DeviceRead<T>, &[f64])>,
) -> (
    DeviceBuffer<T>,
    DeviceBuffer<f32>,
    DeviceBuffer<f32>,
    ln_oracle::Forward,
) {
    let mut y = poisoned::<T>(stream, rows * hidden);
    let mut mean = poisoned::<f32>(stream, rows);
    let mut rstd = poisoned::<f32>(stream, rows);
    if o.rms {
        RmsNorm::new(rows, hidden)
            .with_eps(o.eps)
            .with_zero_centered_gamma(o.zero_centered)
            .with_vectorize(o.vectorize)
            .forward(stream, xd, gamma.map(|g| g.0), &mut y, &mut rstd)
            .unwrap();
    } else {
        LayerNorm::new(rows, hidden)
            .with_eps(o.eps)
            .with_zero_centered_gamma(o.zero_centered)
            .with_vectorize(o.vectorize)
            .forward(
                stream,
                xd,
                gamma.map(|g| g.0),
                beta.map(|b| b.0),
                &mut y,
                &mut mean,
                &mut rstd,
            )
            .unwrap();
    }
    stream.synchronize().unwrap();
    let reference = ln_oracle::forward(
        xf,
        hidden,
        gamma.map(|g| g.1),
        beta.filter(|_| !o.rms).map(|b| b.1),
        o.eps as f64,
        o.zero_centered,
        o.rms,
    );
    (y, mean, rstd, reference)
}

/// Forward and backward of one LayerNorm (or RMSNorm) case with gamma (and
/// beta) against the oracle, the saved statistics, and dx/dgamma/dbeta.
fn norm_case<T: FloatElement>(dev: &Device, rows: usize, hidden: usize, rms: bool) {
    let (mut rng, seed) = Rng::new((rows * 7919 + hidden * 31 + rms as usize) as u64);
    let stream = dev.new_stream().unwrap();
    let n = rows * hidden;
    let eps = 1e-5f32;
    let (x, xf) = rng.tensor::<T>(n, 1.0);
    let (g, gf) = rng.tensor::<T>(hidden, 1.0);
    let (b, bf) = rng.tensor::<T>(hidden, 1.0);
    let (dy, dyf) = rng.tensor::<T>(n, 1.0);
    let (xd, gd, bd, dyd) = (
        dev.upload(&x).unwrap(),
        dev.upload(&g).unwrap(),
        dev.upload(&b).unwrap(),
        dev.upload(&dy).unwrap(),
    );
    let what = format!(
        "{} {rows}x{hidden} {} on {dev:?}",
        if rms { "RMSNorm" } else { "LayerNorm" },
        T::DTYPE
    );

    let opts = NormFwdOpts {
        rms,
        zero_centered: false,
        vectorize: true,
        eps,
    };
    let (y, mean, rstd, reference) = norm_forward(
        &stream,
        (rows, hidden),
        opts,
        (&xd, &xf),
        Some((&gd as &dyn ferrotron::DeviceRead<T>, &gf[..])),
        Some((&bd as &dyn ferrotron::DeviceRead<T>, &bf[..])),
    );
    assert_close(
        &format!("y {what}"),
        T::DTYPE,
        seed,
        &to_f64(&y.to_host().unwrap()),
        &reference.y,
    );
    let rstd_h = rstd.to_host().unwrap();
    let mean_h = mean.to_host().unwrap();
    for r in 0..rows {
        let (got, want) = (rstd_h[r] as f64, reference.rstd[r]);
        assert!(
            (got - want).abs() <= 1e-5 * want,
            "rstd {what}: row {r}: {got} vs {want} (seed {seed})"
        );
        if !rms {
            let (got, want) = (mean_h[r] as f64, reference.mean[r]);
            let spread = want.abs() + 1.0 / reference.rstd[r];
            assert!(
                (got - want).abs() <= 1e-6 * spread,
                "mean {what}: row {r}: {got} vs {want} (seed {seed})"
            );
        }
    }

    let saved_mean: Vec<f64> = mean_h.iter().map(|&m| m as f64).collect();
    let saved_rstd: Vec<f64> = rstd_h.iter().map(|&r| r as f64).collect();
    let rb = ln_oracle::backward_with_stats(
        &dyf,
        &xf,
        hidden,
        Some(&gf[..]),
        &saved_mean,
        &saved_rstd,
        false,
        rms,
    );
    let mut dx = poisoned::<T>(&stream, n);
    let mut dg = poisoned::<T>(&stream, hidden);
    let mut db = poisoned::<T>(&stream, hidden);
    if rms {
        RmsNorm::new(rows, hidden)
            .backward(&stream, &dyd, &xd, &rstd, Some(&gd), &mut dx, Some(&mut dg))
            .unwrap();
    } else {
        LayerNorm::new(rows, hidden)
            .backward(
                &stream,
                &dyd,
                &xd,
                &mean,
                &rstd,
                Some(&gd),
                &mut dx,
                Some(&mut dg),
                Some(&mut db),
            )
            .unwrap();
    }
    stream.synchronize().unwrap();
    assert_close_norm_dx(
        &format!("dx {what}"),
        T::DTYPE,
        seed,
        &to_f64(&dx.to_host().unwrap()),
        &rb.dx,
        &dyf,
        &saved_rstd,
        |col| gf[col],
    );
    // dgamma and dbeta are column sums of dy * xhat and dy.
    let (dgamma_scale, dbeta_scale) =
        norm_param_grad_scales(&dyf, &xf, hidden, &saved_mean, &saved_rstd, rms);
    assert_close_sums(
        &format!("dgamma {what}"),
        T::DTYPE,
        seed,
        &to_f64(&dg.to_host().unwrap()),
        &rb.dgamma,
        &dgamma_scale,
    );
    if !rms {
        assert_close_sums(
            &format!("dbeta {what}"),
            T::DTYPE,
            seed,
            &to_f64(&db.to_host().unwrap()),
            &rb.dbeta,
            &dbeta_scale,
        );
    }
}

#[test]
fn norms_warp_path_wraps() {
    lower_caps();
    for dev in devices("norms_warp_path_wraps", 4) {
        for (rows, hidden) in [(37usize, 64usize), (29, 33)] {
            // 10 (8) four-row blocks of work on 3 grid-stride blocks.
            let p = plan::layernorm::rows(rows as u64, hidden as u64, 4, true);
            assert_eq!(p.path, plan::layernorm::RowPath::Warp);
            assert_eq!(p.cfg.grid, [CAPS.grid_stride_blocks as u32, 1, 1]);
            assert!(rows.div_ceil(4) as u64 > 2 * CAPS.grid_stride_blocks);
        }
        norm_case::<f32>(&dev, 37, 64, false);
        norm_case::<bf16>(&dev, 37, 64, true);
        norm_case::<f16>(&dev, 29, 33, false);
        norm_case::<f32>(&dev, 29, 33, true);
    }
}

#[test]
fn norms_block_path_rows_spill_into_grid_y() {
    lower_caps();
    for dev in devices("norms_block_path_rows_spill_into_grid_y", 3) {
        // 10 rows: grid x 4 (the cap), y 3; blocks 10 and 11 are idle.
        for hidden in [1032usize, 1025] {
            let p = plan::layernorm::rows(10, hidden as u64, 4, true);
            assert_eq!(p.path, plan::layernorm::RowPath::Block);
            assert_eq!(p.cfg.grid, [4, 3, 1]);
        }
        norm_case::<f32>(&dev, 10, 1032, false);
        norm_case::<bf16>(&dev, 10, 1032, true);
        norm_case::<f16>(&dev, 10, 1025, false);
    }
}

/// The block forward with a run of rows per block (gamma and beta staged
/// once per block in the 16-bit vector builds) and a partial last run:
/// without gamma (staged as ones), without beta (staged as zeros),
/// zero-centred gamma, RMSNorm, every dtype, vector and scalar access.
fn norm_forward_variant_case<T: FloatElement>(
    dev: &Device,
    (rows, hidden): (usize, usize),
    (gamma, beta, zero_centered, rms): (bool, bool, bool, bool),
    vectorize: bool,
) {
    let (mut rng, seed) = Rng::new((rows * 7919 + hidden * 31 + 17) as u64);
    let stream = dev.new_stream().unwrap();
    let n = rows * hidden;
    let (x, xf) = rng.tensor::<T>(n, 1.0);
    let (g, gf) = rng.tensor::<T>(hidden, 0.5);
    let (b, bf) = rng.tensor::<T>(hidden, 1.0);
    let (xd, gd, bd) = (
        dev.upload(&x).unwrap(),
        dev.upload(&g).unwrap(),
        dev.upload(&b).unwrap(),
    );
    let opts = NormFwdOpts {
        rms,
        zero_centered,
        vectorize,
        eps: 1e-5,
    };
    let (y, _, _, reference) = norm_forward(
        &stream,
        (rows, hidden),
        opts,
        (&xd, &xf),
        gamma.then_some((&gd as &dyn ferrotron::DeviceRead<T>, &gf[..])),
        beta.then_some((&bd as &dyn ferrotron::DeviceRead<T>, &bf[..])),
    );
    assert_close(
        &format!(
            "y {rows}x{hidden} gamma {gamma} beta {beta} zero-centred {zero_centered} \
             rms {rms} vectorize {vectorize} {} on {dev:?}",
            T::DTYPE
        ),
        T::DTYPE,
        seed,
        &to_f64(&y.to_host().unwrap()),
        &reference.y,
    );
}

#[test]
fn norms_block_forward_runs_of_rows() {
    lower_caps();
    // 37 rows: 8 rows per block (37 / 2 blocks, clamped), 5 blocks
    // (grid 4 x 2: the kernel takes ceil(37 / 8) = 5 rows per block, the
    // last block 2).
    let shape = (37usize, 1032usize);
    let p = plan::layernorm::forward(37, 1032, 2, true);
    assert_eq!(p.path, plan::layernorm::RowPath::Block);
    assert_eq!(p.cfg.grid, [4, 2, 1]);
    assert_eq!(p.cfg.dynamic_smem_bytes, 4 * 1032);
    let variants = [
        (true, true, false, false),
        (false, false, false, false),
        (true, false, true, false),
        (false, true, true, false),
        (true, false, false, true),
        (false, false, false, true),
        (true, false, true, true),
    ];
    for dev in devices("norms_block_forward_runs_of_rows", 4) {
        for v in variants {
            norm_forward_variant_case::<bf16>(&dev, shape, v, true);
            norm_forward_variant_case::<f16>(&dev, shape, v, true);
        }
        norm_forward_variant_case::<f32>(&dev, shape, (true, true, true, false), true);
        norm_forward_variant_case::<bf16>(&dev, shape, (true, true, true, false), false);
    }
}

#[test]
fn norms_fused_backward_chunks_spill_into_grid_y() {
    lower_caps();
    for dev in devices("norms_fused_backward_chunks_spill_into_grid_y", 2) {
        // 200 rows: 7 chunks of 32 (the last of 8), grid x 4 (the cap), y 2;
        // block 7 is idle.
        for hidden in [64u64, 1032] {
            let f = plan::layernorm::fused_backward(200, hidden, 4, true, true).unwrap();
            assert_eq!((f.chunks, f.cfg.grid), (7, [4, 2, 1]));
        }
        norm_case::<f32>(&dev, 200, 64, false);
        norm_case::<bf16>(&dev, 200, 1032, true);
    }
}

// ---------------------------------------------------------------------- GEMM

/// `batch` contiguous GEMMs `[m, k] x [k, n]` (B transposed when `tb`) with
/// an optional bias + GeLU epilogue storing the pre-activation; D has one
/// spare batch entry after the output that must stay untouched.
fn gemm_case<T: FloatElement, O: FloatElement>(
    dev: &Device,
    (m, n, k, batch): (usize, usize, usize, usize),
    tb: bool,
    epi: Epilogue,
) {
    let p = plan::gemm::plan(m as u64, n as u64, batch as u64, None).unwrap();
    assert_eq!(p.cfg.grid[2] as u64, CAPS.grid_z);
    assert!(batch as u64 > 2 * CAPS.grid_z);

    let (mut rng, seed) = Rng::new((m * 1_000_003 + n * 1009 + k + batch) as u64);
    let stream = dev.new_stream().unwrap();
    let (rb, cb) = if tb { (n, k) } else { (k, n) };
    let (sa, sb, sd) = (m * k, rb * cb, m * n);
    let with_bias = matches!(epi, Epilogue::Bias | Epilogue::BiasGelu(_));
    let store_pre = matches!(epi, Epilogue::BiasGelu(_));
    let (a, af) = rng.tensor::<T>(batch * sa, 1.0);
    let (b, bf) = rng.tensor::<T>(batch * sb, 1.0);
    let (bias, biasf) = rng.tensor::<T>(n, 1.0);
    let (ad, bd, biasd) = (
        dev.upload(&a).unwrap(),
        dev.upload(&b).unwrap(),
        dev.upload(&bias).unwrap(),
    );
    let d_len = (batch + 1) * sd;
    let mut dd = poisoned::<O>(&stream, d_len);
    let mut pre = poisoned::<O>(&stream, d_len);
    let op = Gemm::new(m, n, k)
        .provider(GemmProvider::Ferrotron)
        .trans_b(tb)
        .batch(batch)
        .epilogue(epi);
    let aux = if store_pre {
        Aux::Store(&mut pre)
    } else {
        Aux::None
    };
    let inputs = GemmInputs {
        a: &ad,
        b: &bd,
        bias: with_bias.then_some(&biasd),
        c: None,
    };
    let what = format!(
        "gemm {m}x{n}x{k} batch {batch} tb={tb} {epi:?} {}->{} on {dev:?}",
        T::DTYPE,
        O::DTYPE
    );
    op.run(&stream, inputs, aux, &mut dd)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    stream
        .synchronize()
        .unwrap_or_else(|e| panic!("{what}: {e}"));

    let problem = gemm_oracle::Problem {
        m,
        n,
        k,
        batch,
        trans_a: false,
        trans_b: tb,
        alpha: 1.0,
        beta: 0.0,
        epilogue: epi,
    };
    let mat = |data, ld, stride| gemm_oracle::Mat { data, ld, stride };
    let (want, want_pre) = gemm_oracle::gemm(
        &problem,
        mat(&af, k, sa),
        mat(&bf, cb, sb),
        None,
        with_bias.then_some(&biasf[..]),
        None,
    );
    let got = to_f64(&dd.to_host().unwrap());
    assert_close(&what, O::DTYPE, seed, &got[..batch * sd], &want);
    assert!(
        got[batch * sd..].iter().all(|v| v.is_nan()),
        "{what}: the spare batch entry after the output was written (seed {seed})"
    );
    if store_pre {
        let got_pre = to_f64(&pre.to_host().unwrap());
        assert_close(
            &format!("pre-activation {what}"),
            O::DTYPE,
            seed,
            &got_pre[..batch * sd],
            &want_pre,
        );
        assert!(
            got_pre[batch * sd..].iter().all(|v| v.is_nan()),
            "{what}: pre-activation written past the batch (seed {seed})"
        );
    }
}

#[test]
fn batched_gemm_loops_past_grid_z() {
    lower_caps();
    for dev in devices("batched_gemm_loops_past_grid_z", 3) {
        // batch 5 on grid z 2: blocks z = 0 and 1 take 3 and 2 entries.
        gemm_case::<f16, f16>(&dev, (19, 23, 16, 5), true, Epilogue::None);
        gemm_case::<bf16, f32>(&dev, (33, 40, 24, 5), false, Epilogue::None);
        gemm_case::<f16, f16>(&dev, (21, 34, 40, 5), true, Epilogue::BiasGelu(Gelu::Tanh));
    }
}

// -------------------------------------------------------------- multi-tensor

fn read1(b: &DeviceBuffer<f32>) -> f32 {
    b.to_host().unwrap()[0]
}

#[test]
fn multi_tensor_chunk_loop_wraps() {
    lower_caps();
    // 3 + 2 + 1 + 1 + 1 = 8 chunks of 16384 on 3 blocks.
    let sizes = [40_001usize, 16_385, 7, 16_384, 0, 5];
    let numels: Vec<u64> = sizes.iter().map(|&n| n as u64).collect();
    let p = plan::multi_tensor::plan("test", &numels).unwrap();
    assert_eq!(p.chunks.len(), 8);
    assert_eq!(p.cfg.unwrap().grid[0] as u64, CAPS.grid_stride_blocks);

    for dev in devices("multi_tensor_chunk_loop_wraps", 1) {
        let (mut rng, seed) = Rng::new(77);
        let stream = dev.new_stream().unwrap();
        let scale = (256.0 + 4096.0 * rng.uniform()) as f32;
        let (h0, v0) = rng.tensor::<f32>(sizes[0], scale as f64);
        let (h1, v1) = rng.tensor::<bf16>(sizes[1], scale as f64);
        let (h2, v2) = rng.tensor::<f16>(sizes[2], scale as f64);
        let (h3, v3) = rng.tensor::<f32>(sizes[3], scale as f64);
        let (h4, v4) = rng.tensor::<bf16>(sizes[4], scale as f64);
        let (h5, v5) = rng.tensor::<f16>(sizes[5], scale as f64);
        let vals = vec![v0, v1, v2, v3, v4, v5];
        let mut b0 = dev.upload(&h0).unwrap();
        let mut b1 = dev.upload(&h1).unwrap();
        let mut b2 = dev.upload(&h2).unwrap();
        let mut b3 = dev.upload(&h3).unwrap();
        let mut b4 = dev.upload(&h4).unwrap();
        let mut b5 = dev.upload(&h5).unwrap();
        let mut mt = MultiTensor::new();

        // L2 norm of the whole list (before unscaling).
        let mut norm = poisoned::<f32>(&stream, 1);
        {
            let list: Vec<TensorRef<'_>> = vec![
                (&b0).into(),
                (&b1).into(),
                (&b2).into(),
                (&b3).into(),
                (&b4).into(),
                (&b5).into(),
            ];
            mt.l2_norm(&stream, &list, &mut norm).unwrap();
        }
        let got = read1(&norm) as f64;
        let want = mt_oracle::l2_norm(&vals);
        assert!(
            ((got - want) / want).abs() <= 1e-5,
            "l2 norm {got} vs {want} on {dev:?} (seed {seed})"
        );

        // Unscale: every element, bitwise T(fp32(x) * inv_scale).
        let mut found = dev.alloc_zeros::<f32>(1).unwrap();
        {
            let mut list: Vec<GradRef<'_>> = vec![
                (&mut b0).into(),
                (&mut b1).into(),
                (&mut b2).into(),
                (&mut b3).into(),
                (&mut b4).into(),
                (&mut b5).into(),
            ];
            mt.unscale(&stream, &mut list, scale, &mut found).unwrap();
        }
        stream.synchronize().unwrap();
        assert_eq!(
            read1(&found),
            0.0,
            "found_inf on a clean list (seed {seed})"
        );
        let inv = mt_oracle::inv_scale(scale);
        let (reference, any_bad) = mt_oracle::scale(&vals, inv as f64);
        assert!(!any_bad);
        let outs: Vec<(Vec<f64>, DType)> = vec![
            (to_f64(&b0.to_host().unwrap()), DType::F32),
            (to_f64(&b1.to_host().unwrap()), DType::BF16),
            (to_f64(&b2.to_host().unwrap()), DType::F16),
            (to_f64(&b3.to_host().unwrap()), DType::F32),
            (to_f64(&b4.to_host().unwrap()), DType::BF16),
            (to_f64(&b5.to_host().unwrap()), DType::F16),
        ];
        for (i, ((out, d), v)) in outs.iter().zip(&vals).enumerate() {
            let what = format!("unscale: tensor {i} ({} elements) on {dev:?}", v.len());
            assert_close(&what, *d, seed, out, &reference[i]);
            for (j, (&o, &x)) in out.iter().zip(v).enumerate() {
                let p = x as f32 * inv;
                let want = match d {
                    DType::F32 => p as f64,
                    DType::F16 => f16::from_f32(p).to_f64(),
                    _ => bf16::from_f32(p).to_f64(),
                };
                assert!(o == want, "{what} [{j}]: {o} != {want} (seed {seed})");
            }
        }

        // A NaN in the last chunk of the list (handled after the grid
        // wrapped twice) sets found_inf.
        let mut last = h3.clone();
        last[sizes[3] - 1] = f32::NAN;
        let mut b3 = dev.upload(&last).unwrap();
        let mut found = dev.alloc_zeros::<f32>(1).unwrap();
        {
            let mut list: Vec<GradRef<'_>> = vec![
                (&mut b0).into(),
                (&mut b1).into(),
                (&mut b2).into(),
                (&mut b3).into(),
            ];
            mt.unscale(&stream, &mut list, 2.0, &mut found).unwrap();
        }
        stream.synchronize().unwrap();
        assert_eq!(read1(&found), 1.0, "NaN in chunk 7 of 7 missed on {dev:?}");
    }
}

// ------------------------------------------------------------------- copy_2d

#[test]
fn copy_2d_grid_stride_wraps() {
    lower_caps();
    // 64 rows of 128 fp32 (512 bytes): 2048 16-byte units, 8 blocks on 3.
    let (rows, cols, so, sp, d_o, dp) = (64usize, 128usize, 4usize, 136usize, 8usize, 132usize);
    let (vec, cfg) = plan::copy::plan(rows as u64, (cols * 4) as u64, true);
    assert_eq!(vec, 16);
    assert_eq!(cfg.grid[0] as u64, CAPS.grid_stride_blocks);
    assert!(((rows * cols * 4 / 16) as u64).div_ceil(256) > 2 * CAPS.grid_stride_blocks);

    let dev = Device::emu();
    let s = dev.new_stream().unwrap();
    // Aligned offsets and pitches (16-byte units), then an unaligned source
    // (the byte path: 32768 units, 128 blocks on 3).
    for (so, sp) in [(so, sp), (so + 1, sp + 1)] {
        let src_len = so + (rows - 1) * sp + cols;
        let dst_len = d_o + (rows - 1) * dp + cols + 5;
        let src_h: Vec<f32> = (0..src_len).map(|i| i as f32).collect();
        let fill = -1.0f32;
        let src = dev.upload(&src_h).unwrap();
        let mut dst = dev.upload(&vec![fill; dst_len]).unwrap();
        let sa = Block2d {
            offset: so,
            pitch: sp,
        };
        let da = Block2d {
            offset: d_o,
            pitch: dp,
        };
        copy_2d(&s, &src, sa, &mut dst, da, rows, cols).unwrap();
        s.synchronize().unwrap();
        let mut want = vec![fill; dst_len];
        for i in 0..rows {
            for j in 0..cols {
                want[d_o + i * dp + j] = src_h[so + i * sp + j];
            }
        }
        assert_eq!(
            dst.to_host().unwrap(),
            want,
            "{rows}x{cols} {sa:?} -> {da:?}"
        );
    }
}

// -------------------------------------------------------------- vocab-parallel

/// Ids / labels: mostly in `[0, vocab)`, plus some in the padding rows, a
/// negative one and some past the padded vocabulary.
fn ids(rng: &mut Rng, tokens: usize, vocab: usize, padded: usize) -> Vec<i64> {
    let mut v: Vec<i64> = (0..tokens)
        .map(|_| (rng.next_u64() % vocab as u64) as i64)
        .collect();
    let specials = [-1, vocab as i64, padded as i64 - 1, padded as i64 + 7];
    for (k, s) in specials.into_iter().enumerate() {
        v[(k * 5 + 3) % tokens] = s;
    }
    v[1] = v[2];
    v
}

fn cast_ids<I: TokenId + TryFrom<i64>>(ids: &[i64]) -> Vec<I> {
    ids.iter()
        .map(|&x| I::try_from(x).ok().expect("id fits"))
        .collect()
}

fn cross_entropy_case<T: FloatElement, I: TokenId + TryFrom<i64>>(
    vocab: usize,
    tokens: usize,
    eps: f32,
    salt: u64,
) {
    let (mut rng, seed) = Rng::new(salt);
    let padded = padded_vocab_size(vocab, 1).unwrap();
    // The row kernels take one block per token; the per-token loss kernel
    // grid-strides over the tokens.
    let cfg = plan::vocab_parallel::grid_stride(tokens);
    assert_eq!(cfg.grid[0] as u64, CAPS.grid_stride_blocks);
    assert!(tokens.div_ceil(256) as u64 > CAPS.grid_stride_blocks);

    let (logits, logits64) = rng.tensor::<T>(tokens * padded, 3.0);
    let labels = ids(&mut rng, tokens, vocab, padded);
    let dloss: Vec<f32> = (0..tokens).map(|_| rng.normal() as f32).collect();
    let dloss64: Vec<f64> = dloss.iter().map(|&x| x as f64).collect();
    let what = format!(
        "cross-entropy tp=1 V={padded} tokens={tokens} eps={eps} {}",
        T::DTYPE
    );
    let ce = VocabParallelCrossEntropy::new(tokens, padded).with_label_smoothing(eps);
    let mut results = run_ranks(1, |c| {
        let dev = c.device().clone();
        let s = c.stream().clone();
        let x = dev.upload(&logits).unwrap();
        let lab = dev.upload(&cast_ids::<I>(&labels)).unwrap();
        let dl = dev.upload(&dloss).unwrap();
        let mut loss = poisoned::<f32>(&s, tokens);
        let saved = ce.forward(&c, &s, &x, &lab, &mut loss).unwrap();
        let mut grad = poisoned::<T>(&s, logits.len());
        ce.backward(&c, &s, &x, &lab, &saved, &dl, &mut grad)
            .unwrap();
        let mut x2 = dev.upload(&logits).unwrap();
        ce.backward_in_place(&c, &s, &mut x2, &lab, &saved, &dl)
            .unwrap();
        s.synchronize().unwrap();
        (
            loss.to_host().unwrap(),
            grad.to_host().unwrap(),
            x2.to_host().unwrap(),
        )
    });
    let (loss, grad, in_place) = results.pop().unwrap();
    let (want_loss, want_grad) =
        vp_oracle::cross_entropy(&logits64, padded, &labels, eps as f64, &dloss64);
    let got: Vec<f64> = loss.iter().map(|&x| x as f64).collect();
    assert_close(&format!("{what}: loss"), DType::F32, seed, &got, &want_loss);
    assert_close(
        &format!("{what}: grad"),
        T::DTYPE,
        seed,
        &to_f64(&grad),
        &want_grad,
    );
    assert!(
        grad.iter()
            .zip(&in_place)
            .all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits()),
        "{what}: in-place backward differs (seed {seed})"
    );
}

#[test]
fn vocab_parallel_cross_entropy_wraps() {
    lower_caps();
    // 300 -> 384 columns x 800 tokens: the loss kernel's 4 blocks of
    // tokens on 3.
    cross_entropy_case::<f32, i64>(300, 800, 0.0, 301);
    cross_entropy_case::<bf16, i32>(300, 800, 0.1, 302);
}

#[test]
fn vocab_parallel_embedding_wraps() {
    lower_caps();
    let vocab = 300usize;
    // The forward gathers tokens x hidden values: 888 (4 blocks of work on 3)
    // and 2368 (10 blocks on 3). The backward's sort: 2100 tokens = 4096
    // keys (16 blocks of keys on 3) and global bitonic steps over 2048
    // pairs (8 blocks on 3).
    for (hidden, tokens) in [(24usize, 37usize), (64, 37), (8, 2100)] {
        let cfg = plan::vocab_parallel::grid_stride(tokens * hidden);
        assert_eq!(cfg.grid[0] as u64, CAPS.grid_stride_blocks);
        assert!((tokens * hidden).div_ceil(256) as u64 > CAPS.grid_stride_blocks);

        let (mut rng, seed) = Rng::new(400 + hidden as u64);
        let padded = padded_vocab_size(vocab, 1).unwrap();
        let (full, full64) = rng.tensor::<f32>(vocab * hidden, 1.0);
        let id64 = ids(&mut rng, tokens, vocab, padded);
        let (dy, dy64) = rng.tensor::<f32>(tokens * hidden, 1.0);
        let emb = VocabParallelEmbedding::new(vocab, hidden);
        let mut results = run_ranks(1, |c| {
            let dev = c.device().clone();
            let s = c.stream().clone();
            let shard = shard_vocab_rows(&full, vocab, hidden, 1, c.rank()).unwrap();
            let w = dev.upload(&shard).unwrap();
            let ids_d = dev.upload(&cast_ids::<i64>(&id64)).unwrap();
            let mut out = poisoned::<f32>(&s, tokens * hidden);
            emb.forward(&c, &s, &ids_d, &w, &mut out).unwrap();
            let dy_d = dev.upload(&dy).unwrap();
            let mut dw = poisoned::<f32>(&s, shard.len());
            emb.backward(&c, &s, &ids_d, &dy_d, &mut dw, false).unwrap();
            s.synchronize().unwrap();
            (out.to_host().unwrap(), dw.to_host().unwrap())
        });
        let (out, dw) = results.pop().unwrap();
        let what = format!("embedding tp=1 vocab={vocab} hidden={hidden} tokens={tokens}");
        let want_out = vp_oracle::embedding_forward(&full64, vocab, hidden, &id64);
        assert_eq!(to_f64(&out), want_out, "{what}: forward (seed {seed})");
        let want_dw = vp_oracle::embedding_backward(&dy64, padded, hidden, &id64);
        let got: Vec<f64> = dw.iter().map(|&x| x as f64).collect();
        assert_close(
            &format!("{what}: dweight"),
            DType::F32,
            seed,
            &got,
            &want_dw,
        );
    }
}
