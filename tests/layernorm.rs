//! LayerNorm and RMSNorm against the float64 oracle: every dtype, hidden
//! sizes over all three row paths (warp, block, global) including primes and
//! non-multiples of the vector width, with and without gamma/beta,
//! zero-centred gamma, a large common offset (catches one-pass variance),
//! tiny magnitudes, scalar and vector access, saved statistics, dx/dgamma/
//! dbeta, bitwise-reproducible parameter gradients, and argument checks.

mod common;

use common::{
    abs_column_sums, assert_close, assert_close_norm_dx, assert_close_sums, devices, log_margin,
    norm_param_grad_scales, rel_err, to_f64, tolerance, Rng,
};
use ferrotron::core::dtype::FloatElement;
use ferrotron::ops::{LayerNorm, RmsNorm};
use ferrotron::reference::layernorm as oracle;
use ferrotron::{DType, Device, DeviceBuffer, Stream};
use half::{bf16, f16};

/// Every hidden size the task lists: 1, tiny, primes and near-powers of two
/// around the vector widths, the warp/block/global boundaries, 65536.
const HIDDEN: &[usize] = &[1, 2, 7, 31, 33, 127, 1000, 1024, 4097, 12288, 65536];

/// Rows per case: enough for several warps / chunks on small rows, few on
/// big ones (the emulator runs every thread).
fn rows_for(hidden: usize) -> usize {
    match hidden {
        0..=127 => 37,
        128..=1024 => 9,
        1025..=12288 => 3,
        _ => 2,
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    rows: usize,
    hidden: usize,
    rms: bool,
    gamma: bool,
    beta: bool,
    zero_centered: bool,
    vectorize: bool,
    /// x = offset + scale * N(0, 1).
    offset: f64,
    scale: f64,
    eps: f32,
    /// dy = N(0, 1) + dy_shift * (1 + x): row sums of dy * gamma and of
    /// dy * gamma * xhat of order dy_shift * hidden (random dy alone makes
    /// them ~sqrt(hidden), too small against dx for a wrong sum to show).
    dy_shift: f64,
}

impl Case {
    fn new(rows: usize, hidden: usize, rms: bool) -> Case {
        Case {
            rows,
            hidden,
            rms,
            gamma: true,
            beta: !rms,
            zero_centered: false,
            vectorize: true,
            offset: 0.0,
            scale: 1.0,
            eps: 1e-5,
            dy_shift: 0.0,
        }
    }

    /// Row sums that matter against dx (see `dy_shift`; zero-centred gamma
    /// keeps the effective gamma near 1, not of mean 0), so a block or lane
    /// missing part of a row sum fails.
    fn shifted(rows: usize, hidden: usize, rms: bool) -> Case {
        Case {
            dy_shift: 1.0,
            zero_centered: true,
            ..Case::new(rows, hidden, rms)
        }
    }
}

fn poisoned<T: FloatElement>(stream: &Stream, n: usize) -> DeviceBuffer<T> {
    let mut b = stream.device().alloc_zeros::<T>(n).unwrap();
    stream.fill_bytes(&mut b, 0xFF).unwrap(); // NaN in every float format
    b
}

/// Saved statistics within fp32 accuracy of the f64 ones: the mean relative
/// to the row's scale (|mean| + spread), rstd relative to itself.
fn check_stats(what: &str, seed: u64, got: &[f32], want: &[f64], scale: &[f64], tol: f64) {
    let mut worst = 0.0f64;
    for (r, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= tol * s,
            "{what}: row {r}: {g} vs {w} (err {err:e} > {tol:e} * {s:e}, seed {seed})"
        );
        if s > 0.0 {
            worst = worst.max(err / (tol * s));
        }
    }
    log_margin(worst, what);
}

/// Forward and backward of one case; returns nothing, asserts everything.
fn run_case<T: FloatElement>(dev: &Device, c: Case) {
    let (mut rng, seed) = Rng::new((c.rows * 7919 + c.hidden * 31 + c.rms as usize) as u64);
    let stream = dev.new_stream().unwrap();
    let n = c.rows * c.hidden;
    let x: Vec<T> = (0..n)
        .map(|_| T::from_f64(c.offset + c.scale * rng.normal()))
        .collect();
    let xf = to_f64(&x);
    // Zero-centred gamma is stored near 0 (the effective scale is gamma + 1).
    let gscale = if c.zero_centered { 0.2 } else { 1.0 };
    let (g, gf) = rng.tensor::<T>(c.hidden, gscale);
    let (b, bf) = rng.tensor::<T>(c.hidden, 1.0);
    let (dy, dyf) = if c.dy_shift == 0.0 {
        rng.tensor::<T>(n, 1.0)
    } else {
        let dy: Vec<T> = xf
            .iter()
            .map(|&v| T::from_f64(rng.normal() + c.dy_shift * (1.0 + v)))
            .collect();
        let dyf = to_f64(&dy);
        (dy, dyf)
    };
    let xd = dev.upload(&x).unwrap();
    let gd = dev.upload(&g).unwrap();
    let bd = dev.upload(&b).unwrap();
    let dyd = dev.upload(&dy).unwrap();
    let gamma = c.gamma.then_some(&gd);
    let beta = c.beta.then_some(&bd);
    let what = format!("{c:?} {} on {dev:?}", T::DTYPE);

    // Forward.
    let mut y = poisoned::<T>(&stream, n);
    let mut mean = poisoned::<f32>(&stream, c.rows);
    let mut rstd = poisoned::<f32>(&stream, c.rows);
    if c.rms {
        RmsNorm::new(c.rows, c.hidden)
            .with_eps(c.eps)
            .with_zero_centered_gamma(c.zero_centered)
            .with_vectorize(c.vectorize)
            .forward(&stream, &xd, gamma.map(|b| b as _), &mut y, &mut rstd)
            .unwrap();
    } else {
        LayerNorm::new(c.rows, c.hidden)
            .with_eps(c.eps)
            .with_zero_centered_gamma(c.zero_centered)
            .with_vectorize(c.vectorize)
            .forward(
                &stream,
                &xd,
                gamma.map(|b| b as _),
                beta.map(|b| b as _),
                &mut y,
                &mut mean,
                &mut rstd,
            )
            .unwrap();
    }
    stream.synchronize().unwrap();
    let reference = oracle::forward(
        &xf,
        c.hidden,
        c.gamma.then_some(&gf[..]),
        c.beta.then_some(&bf[..]),
        c.eps as f64,
        c.zero_centered,
        c.rms,
    );
    assert_close(
        &format!("y {what}"),
        T::DTYPE,
        seed,
        &to_f64(&y.to_host().unwrap()),
        &reference.y,
    );
    let rstd_h = rstd.to_host().unwrap();
    check_stats(
        &format!("rstd {what}"),
        seed,
        &rstd_h,
        &reference.rstd,
        &reference.rstd,
        1e-5,
    );
    let mean_h = mean.to_host().unwrap();
    if !c.rms {
        let spread: Vec<f64> = reference
            .mean
            .iter()
            .zip(&reference.rstd)
            .map(|(m, r)| m.abs() + 1.0 / r)
            .collect();
        check_stats(
            &format!("mean {what}"),
            seed,
            &mean_h,
            &reference.mean,
            &spread,
            1e-6,
        );
    } else {
        // RMSNorm does not touch `mean`: still the poison.
        assert!(mean_h.iter().all(|m| m.is_nan()), "{what}: mean written");
    }

    // Backward, given the statistics the forward saved.
    let saved_mean: Vec<f64> = mean_h.iter().map(|&m| m as f64).collect();
    let saved_rstd: Vec<f64> = rstd_h.iter().map(|&r| r as f64).collect();
    let rb = oracle::backward_with_stats(
        &dyf,
        &xf,
        c.hidden,
        c.gamma.then_some(&gf[..]),
        &saved_mean,
        &saved_rstd,
        c.zero_centered,
        c.rms,
    );
    // `grads`: also dgamma (and dbeta), which takes the fused kernels (dx
    // and the chunk partials in one pass) where the row path has them.
    let run_bwd = |grads: bool| {
        let mut dx = poisoned::<T>(&stream, n);
        let mut dg = poisoned::<T>(&stream, c.hidden);
        let mut db = poisoned::<T>(&stream, c.hidden);
        if c.rms {
            RmsNorm::new(c.rows, c.hidden)
                .with_zero_centered_gamma(c.zero_centered)
                .with_vectorize(c.vectorize)
                .backward(
                    &stream,
                    &dyd,
                    &xd,
                    &rstd,
                    gamma.map(|b| b as _),
                    &mut dx,
                    grads.then_some(&mut dg),
                )
                .unwrap();
        } else {
            LayerNorm::new(c.rows, c.hidden)
                .with_zero_centered_gamma(c.zero_centered)
                .with_vectorize(c.vectorize)
                .backward(
                    &stream,
                    &dyd,
                    &xd,
                    &mean,
                    &rstd,
                    gamma.map(|b| b as _),
                    &mut dx,
                    grads.then_some(&mut dg),
                    grads.then_some(&mut db),
                )
                .unwrap();
        }
        stream.synchronize().unwrap();
        (
            dx.to_host().unwrap(),
            dg.to_host().unwrap(),
            db.to_host().unwrap(),
        )
    };
    let (dx, dg, db) = run_bwd(true);
    let (dx_only, _, _) = run_bwd(false);
    // dx with the parameter gradients (fused kernels) and without (dx only).
    let effective_gamma = |col: usize| match (c.gamma, c.zero_centered) {
        (false, _) => 1.0,
        (true, zc) => gf[col] + if zc { 1.0 } else { 0.0 },
    };
    for (which, dx) in [("with dgamma", &dx), ("alone", &dx_only)] {
        assert_close_norm_dx(
            &format!("dx ({which}) {what}"),
            T::DTYPE,
            seed,
            &to_f64(dx),
            &rb.dx,
            &dyf,
            &saved_rstd,
            effective_gamma,
        );
    }
    // dgamma and dbeta are column sums of dy * xhat and dy.
    let (dgamma_scale, dbeta_scale) =
        norm_param_grad_scales(&dyf, &xf, c.hidden, &saved_mean, &saved_rstd, c.rms);
    assert_close_sums(
        &format!("dgamma {what}"),
        T::DTYPE,
        seed,
        &to_f64(&dg),
        &rb.dgamma,
        &dgamma_scale,
    );
    if !c.rms {
        assert_close_sums(
            &format!("dbeta {what}"),
            T::DTYPE,
            seed,
            &to_f64(&db),
            &rb.dbeta,
            &dbeta_scale,
        );
    } else {
        assert!(
            to_f64(&db).iter().all(|v| v.is_nan()),
            "{what}: dbeta written"
        );
    }
    // Deterministic parameter gradients: bitwise identical on a second run.
    let (_, dg2, db2) = run_bwd(true);
    let bytes = |v: &[T]| bytemuck::cast_slice::<T, u8>(v).to_vec();
    assert!(
        bytes(&dg) == bytes(&dg2),
        "dgamma differs between two runs: {what} (seed {seed})"
    );
    if !c.rms {
        assert!(
            bytes(&db) == bytes(&db2),
            "dbeta differs between two runs: {what} (seed {seed})"
        );
    }
}

/// Every hidden size, both kinds, gamma (and beta) on, vector access.
fn sizes_all<T: FloatElement>(test: &str) {
    for dev in devices(test, HIDDEN.len() * 2) {
        for &h in HIDDEN {
            for rms in [false, true] {
                run_case::<T>(&dev, Case::new(rows_for(h), h, rms));
            }
        }
    }
}

/// Without gamma/beta, only one of them, zero-centred gamma, scalar path,
/// on one size per row path.
fn variants_all<T: FloatElement>(test: &str) {
    let sizes = [33usize, 1000, 4097, 16_411];
    let mut cases = Vec::new();
    for &h in &sizes {
        let rows = rows_for(h);
        for rms in [false, true] {
            let base = Case::new(rows, h, rms);
            cases.push(Case {
                gamma: false,
                beta: false,
                ..base
            });
            cases.push(Case {
                zero_centered: true,
                ..base
            });
            cases.push(Case {
                vectorize: false,
                ..base
            });
            if !rms {
                cases.push(Case {
                    gamma: false,
                    ..base
                });
                cases.push(Case {
                    beta: false,
                    zero_centered: true,
                    ..base
                });
            }
        }
    }
    for dev in devices(test, cases.len()) {
        for &c in &cases {
            run_case::<T>(&dev, c);
        }
    }
}

/// A large common offset (one-pass variance loses it all) and tiny values.
fn magnitudes_all<T: FloatElement>(test: &str) {
    // The offset is as large as the storage format resolves the N(0, s) part.
    let (offset, scale) = match T::DTYPE {
        DType::F32 => (1e4, 1.0),
        DType::F16 => (1e3, 4.0),
        _ => (1e3, 16.0),
    };
    let mut cases = Vec::new();
    for &h in &[127usize, 1024, 4097, 65536] {
        for rms in [false, true] {
            let base = Case::new(rows_for(h), h, rms);
            if !rms {
                cases.push(Case {
                    offset,
                    scale,
                    ..base
                });
            }
            cases.push(Case {
                scale: 1e-3,
                eps: 1e-12,
                ..base
            });
        }
    }
    for dev in devices(test, cases.len()) {
        for &c in &cases {
            run_case::<T>(&dev, c);
        }
    }
}

#[test]
fn sizes_f32() {
    sizes_all::<f32>("sizes_f32");
}
#[test]
fn sizes_f16() {
    sizes_all::<f16>("sizes_f16");
}
#[test]
fn sizes_bf16() {
    sizes_all::<bf16>("sizes_bf16");
}
#[test]
fn variants_f32() {
    variants_all::<f32>("variants_f32");
}
#[test]
fn variants_f16() {
    variants_all::<f16>("variants_f16");
}
#[test]
fn variants_bf16() {
    variants_all::<bf16>("variants_bf16");
}
#[test]
fn magnitudes_f32() {
    magnitudes_all::<f32>("magnitudes_f32");
}
#[test]
fn magnitudes_f16() {
    magnitudes_all::<f16>("magnitudes_f16");
}
#[test]
fn magnitudes_bf16() {
    magnitudes_all::<bf16>("magnitudes_bf16");
}

/// The block path's launch widths: the plan gives each thread up to 24
/// values, so these hidden sizes run 64 (1025, 1030: scalar), 96 (2056),
/// 192 (4096), 352 (8192) and 512 (12288) threads per row, every dtype,
/// both kinds, vector and scalar access; an edge row count (5) so the last
/// block-grid row is partial.
#[test]
fn block_path_launch_widths() {
    let sizes = [1025usize, 1030, 2056, 4096, 8192];
    for dev in devices("block_path_launch_widths", sizes.len() * 4) {
        for &h in &sizes {
            for rms in [false, true] {
                run_case::<bf16>(&dev, Case::new(5, h, rms));
                run_case::<f16>(&dev, Case::new(2, h, rms));
                run_case::<f32>(&dev, Case::new(2, h, rms));
                let scalar = Case {
                    vectorize: false,
                    zero_centered: true,
                    ..Case::new(2, h, rms)
                };
                run_case::<bf16>(&dev, scalar);
            }
        }
    }
}

/// Many rows: several parameter-gradient chunks and a multi-block warp grid
/// (the fused warp path: 1100 rows are 35 chunks of 32, the last of 12; 600
/// rows 19, the last of 24).
#[test]
fn many_rows_several_chunks() {
    use ferrotron::core::plan::layernorm as plan;
    let f = plan::fused_backward(1100, 40, 2, true, true).unwrap();
    assert_eq!((f.path, f.chunks), (plan::RowPath::Warp, 35));
    assert_eq!(
        plan::fused_backward(600, 72, 4, true, false)
            .unwrap()
            .chunks,
        19
    );
    for dev in devices("many_rows_several_chunks", 2) {
        run_case::<bf16>(&dev, Case::new(1100, 40, false));
        run_case::<f32>(&dev, Case::new(600, 72, true));
    }
}

/// The fused block path's shared-memory-accumulator kernel (fp32 storage,
/// scalar access) with several chunks, the last one partial: 70 rows are
/// chunks of 32, 32 and 6. At its widest row (`FUSED_BLOCK_MAX_HIDDEN`, 384
/// threads) and one vector past it (the unfused parameter-gradient kernels),
/// both kinds.
#[test]
fn fused_block_path_several_chunks() {
    use ferrotron::core::plan::layernorm::{self as plan, RowPath, FUSED_BLOCK_MAX_HIDDEN};
    let wide = FUSED_BLOCK_MAX_HIDDEN as usize;
    let f = plan::fused_backward(70, 1025, 4, true, true).unwrap();
    assert_eq!(
        (f.path, f.pipelined, f.chunks, f.rows_per_chunk),
        (RowPath::Block, false, 3, 32)
    );
    assert_eq!(
        plan::fused_backward(40, wide as u64, 4, true, true)
            .unwrap()
            .cfg
            .block[0],
        384
    );
    assert!(plan::fused_backward(40, wide as u64 + 4, 4, true, true).is_none());
    for dev in devices("fused_block_path_several_chunks", 5) {
        run_case::<f32>(&dev, Case::new(70, 1025, true));
        let scalar = Case {
            vectorize: false,
            zero_centered: true,
            ..Case::new(70, 1030, false)
        };
        run_case::<f16>(&dev, scalar);
        run_case::<bf16>(
            &dev,
            Case {
                vectorize: false,
                ..Case::new(70, 2056, false)
            },
        );
        run_case::<f32>(&dev, Case::new(40, wide, false));
        run_case::<f32>(&dev, Case::new(40, wide + 4, true));
    }
}

/// The pipelined fused backward (16-bit storage, 128-bit access: rows
/// copied into shared memory two ahead, accumulators in registers) with
/// several chunks (70 rows: 32, 32, 6, so the three-stage ring wraps and
/// stops mid-cycle), without gamma (staged as 1, or 0 under zero-centring),
/// RMSNorm, without beta, and at the block path's widest row (512 threads,
/// 40 rows in one chunk); its wide build on the global path (32 values per
/// thread, gamma from global memory) from just past the block path to its
/// widest row, 16384. The forwards of those wide 16-bit rows run the staged
/// block forward (512 threads of 32 values at 16384), not the global one.
#[test]
fn fused_pipelined_path() {
    use ferrotron::core::plan::layernorm::{self as plan, RowPath, BLOCK_MAX_HIDDEN};
    let wide = BLOCK_MAX_HIDDEN as usize;
    let f = plan::fused_backward(70, 2056, 2, true, true).unwrap();
    assert_eq!(
        (f.path, f.pipelined, f.chunks, f.rows_per_chunk),
        (RowPath::Block, true, 3, 32)
    );
    assert_eq!(
        plan::fused_backward(40, wide as u64, 2, true, true)
            .unwrap()
            .cfg
            .block[0],
        512
    );
    let w = plan::fused_backward(35, 16_384, 2, true, true).unwrap();
    assert_eq!(
        (w.path, w.pipelined, w.cfg.block[0]),
        (RowPath::Global, true, 512)
    );
    for h in [wide as u64 + 8, 13_000, 16_384] {
        assert_eq!(plan::forward(35, h, 2, true).path, RowPath::Block, "{h}");
    }
    assert_eq!(plan::forward(35, 16_384, 2, true).cfg.block[0], 512);
    for dev in devices("fused_pipelined_path", 10) {
        run_case::<bf16>(&dev, Case::new(70, 2056, false));
        for zero_centered in [false, true] {
            let absent = Case {
                gamma: false,
                zero_centered,
                ..Case::new(70, 2056, false)
            };
            run_case::<f16>(&dev, absent);
        }
        run_case::<bf16>(&dev, Case::new(70, 4096, true));
        let no_beta = Case {
            beta: false,
            zero_centered: true,
            ..Case::new(34, 1032, false)
        };
        run_case::<f16>(&dev, no_beta);
        run_case::<bf16>(&dev, Case::new(40, wide, false));
        run_case::<f16>(&dev, Case::new(2, wide, true));
        // The wide build.
        run_case::<bf16>(&dev, Case::new(35, 16_384, false));
        let zc = Case {
            zero_centered: true,
            ..Case::new(3, wide + 8, true)
        };
        run_case::<f16>(&dev, zc);
        let absent = Case {
            gamma: false,
            ..Case::new(4, 13_000, false)
        };
        run_case::<bf16>(&dev, absent);
    }
}

/// Rows past the wide build (16-bit, 128-bit access): the fused backward
/// split over the blocks of a thread block cluster, which add their row
/// sums through distributed shared memory (sm_90; the emulator runs a
/// cluster's blocks at once). Clusters of 2 (16392: slices of 8200, two
/// chunks, the last of 8 rows), 4 (32776: the last slice 8 columns shorter;
/// 65536 = 4 x 16384, the Megatron-scale row) and 8 (131072), RMSNorm,
/// zero-centred gamma, no gamma, no beta. An sm_80 part (no clusters)
/// takes the unfused kernels for the same rows.
#[test]
fn fused_cluster_path() {
    use ferrotron::core::launch::DeviceLimits;
    use ferrotron::core::plan::layernorm as plan;
    for (h, c) in [(16_392u64, 2), (32_776, 4), (65_536, 4), (131_072, 8)] {
        let f = plan::fused_backward(40, h, 2, true, true).unwrap();
        assert_eq!((f.cluster, f.path), (c, plan::RowPath::Global), "{h}");
        assert!(plan::fused_backward_within(40, h, 2, true, true, DeviceLimits::SM80).is_none());
    }
    // Row sums that matter (`Case::shifted`), so a block missing a peer's
    // sums fails.
    let shifted = Case::shifted;
    for dev in devices("fused_cluster_path", 6) {
        run_case::<bf16>(&dev, shifted(40, 16_392, false));
        run_case::<f16>(&dev, shifted(3, 32_776, true));
        let zc = Case {
            zero_centered: true,
            ..Case::new(5, 65_536, false)
        };
        run_case::<bf16>(&dev, zc);
        let absent = Case {
            gamma: false,
            beta: false,
            ..Case::new(2, 32_776, false)
        };
        run_case::<f16>(&dev, absent);
        run_case::<bf16>(&dev, shifted(2, 131_072, true));
        run_case::<bf16>(&dev, Case::new(33, 65_536, false));
    }
}

/// Every row path's backward with row sums large against dx (see
/// `Case::dy_shift`): with random dy and gamma of mean zero the sums are
/// ~sqrt(hidden) and a wrong one can hide inside the bf16 tolerance. The
/// warp and block paths (fused and dx-only), the pipelined block and wide
/// builds, the global path's unfused kernels (fp32 past the fused block
/// path, scalar 16-bit past 16384), LayerNorm and RMSNorm.
#[test]
fn row_sums_that_matter() {
    let shifted = Case::shifted;
    for dev in devices("row_sums_that_matter", 8) {
        run_case::<bf16>(&dev, shifted(9, 1000, false));
        run_case::<f16>(&dev, shifted(3, 4096, true));
        run_case::<f32>(&dev, shifted(3, 9000, false));
        run_case::<bf16>(&dev, shifted(34, 12_288, false));
        run_case::<f16>(&dev, shifted(3, 16_384, true));
        run_case::<f32>(&dev, shifted(2, 20_000, true));
        let scalar = Case {
            vectorize: false,
            ..shifted(2, 20_003, false)
        };
        run_case::<bf16>(&dev, scalar);
        run_case::<bf16>(&dev, shifted(2, 70_000, false));
    }
}

/// The two-pass variance keeps a 1e4 offset with unit spread to fp32
/// accuracy; one-pass E[x^2] - E[x]^2 in fp32 would be off by O(1).
#[test]
fn large_offset_keeps_the_variance() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let (mut rng, seed) = Rng::new(99);
    for h in [1000usize, 8000, 20_000] {
        let x: Vec<f32> = (0..h).map(|_| (1e4 + rng.normal()) as f32).collect();
        let xd = dev.upload(&x).unwrap();
        let mut y = dev.alloc_zeros::<f32>(h).unwrap();
        let mut mean = dev.alloc_zeros::<f32>(1).unwrap();
        let mut rstd = dev.alloc_zeros::<f32>(1).unwrap();
        LayerNorm::new(1, h)
            .forward(&stream, &xd, None, None, &mut y, &mut mean, &mut rstd)
            .unwrap();
        let xf: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let (_, r) = oracle::row_stats(&xf, 1e-5, false);
        let got = rstd.to_host().unwrap()[0] as f64;
        assert!(
            (got - r).abs() <= 1e-5 * r,
            "hidden {h}: rstd {got} vs {r} (seed {seed})"
        );
        let yv = to_f64(&y.to_host().unwrap());
        let var: f64 = yv.iter().map(|v| v * v).sum::<f64>() / h as f64;
        assert!((var - 1.0).abs() < 1e-3, "hidden {h}: var(y) = {var}");
    }
}

/// A row of 2^20 columns: the global path far past any on-chip size.
#[test]
fn one_row_of_a_million() {
    let dev = Device::emu();
    let c = Case::new(1, 1 << 20, false);
    run_case::<f32>(&dev, c);
}

#[test]
fn empty_batches_are_no_ops_with_zero_parameter_gradients() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let x = dev.alloc_zeros::<f32>(0).unwrap();
    let mut y = dev.alloc_zeros::<f32>(0).unwrap();
    let mut m = dev.alloc_zeros::<f32>(0).unwrap();
    let mut r = dev.alloc_zeros::<f32>(0).unwrap();
    let g = dev.upload(&[1.0f32; 4]).unwrap();
    let op = LayerNorm::new(0, 4);
    op.forward(&stream, &x, Some(&g), None, &mut y, &mut m, &mut r)
        .unwrap();
    let mut dx = dev.alloc_zeros::<f32>(0).unwrap();
    let mut dg = dev.upload(&[f32::NAN; 4]).unwrap();
    let mut db = dev.upload(&[f32::NAN; 4]).unwrap();
    op.backward(
        &stream,
        &x,
        &x,
        &m,
        &r,
        Some(&g),
        &mut dx,
        Some(&mut dg),
        Some(&mut db),
    )
    .unwrap();
    assert_eq!(dg.to_host().unwrap(), vec![0.0; 4]);
    assert_eq!(db.to_host().unwrap(), vec![0.0; 4]);
}

/// dbeta alone (no dgamma) and dx alone.
#[test]
fn partial_gradient_requests() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let (rows, h) = (5usize, 77usize);
    let (mut rng, seed) = Rng::new(7);
    let (x, xf) = rng.tensor::<f32>(rows * h, 1.0);
    let (dy, dyf) = rng.tensor::<f32>(rows * h, 1.0);
    let (xd, dyd) = (dev.upload(&x).unwrap(), dev.upload(&dy).unwrap());
    let op = LayerNorm::new(rows, h);
    let mut y = dev.alloc_zeros::<f32>(rows * h).unwrap();
    let mut m = dev.alloc_zeros::<f32>(rows).unwrap();
    let mut r = dev.alloc_zeros::<f32>(rows).unwrap();
    op.forward(&stream, &xd, None, None, &mut y, &mut m, &mut r)
        .unwrap();
    let rb = oracle::backward(&dyf, &xf, h, None, 1e-5, false, false);
    let mut dx = poisoned::<f32>(&stream, rows * h);
    let mut db = poisoned::<f32>(&stream, h);
    op.backward(
        &stream,
        &dyd,
        &xd,
        &m,
        &r,
        None,
        &mut dx,
        None,
        Some(&mut db),
    )
    .unwrap();
    assert_close_sums(
        "dbeta only",
        DType::F32,
        seed,
        &to_f64(&db.to_host().unwrap()),
        &rb.dbeta,
        &abs_column_sums(&dyf, h),
    );
    assert_close(
        "dx",
        DType::F32,
        seed,
        &to_f64(&dx.to_host().unwrap()),
        &rb.dx,
    );
    let mut dx2 = poisoned::<f32>(&stream, rows * h);
    op.backward(&stream, &dyd, &xd, &m, &r, None, &mut dx2, None, None)
        .unwrap();
    let e = rel_err(&to_f64(&dx2.to_host().unwrap()), &rb.dx);
    log_margin(e / tolerance(DType::F32), "dx alone");
    assert!(e <= tolerance(DType::F32), "dx alone: {e:e} (seed {seed})");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let dev = Device::emu();
    let stream = dev.new_stream().unwrap();
    let x = dev.alloc_zeros::<f32>(12).unwrap();
    let mut y = dev.alloc_zeros::<f32>(12).unwrap();
    let mut short = dev.alloc_zeros::<f32>(11).unwrap();
    let g3 = dev.alloc_zeros::<f32>(3).unwrap();
    let g4 = dev.alloc_zeros::<f32>(4).unwrap();
    let mut m3 = dev.alloc_zeros::<f32>(3).unwrap();
    let mut r3 = dev.alloc_zeros::<f32>(3).unwrap();
    let mut r2 = dev.alloc_zeros::<f32>(2).unwrap();
    let op = LayerNorm::new(3, 4);
    let err = |r: ferrotron::Result<()>| r.unwrap_err().to_string();

    let e = err(op.forward(&stream, &x, None, None, &mut short, &mut m3, &mut r3));
    assert!(
        e.contains("`y`") && e.contains("exactly 12") && e.contains("11"),
        "{e}"
    );
    let e = err(op.forward(&stream, &x, Some(&g3), None, &mut y, &mut m3, &mut r3));
    assert!(
        e.contains("`gamma`") && e.contains("exactly 4") && e.contains("3"),
        "{e}"
    );
    let e = err(op.forward(&stream, &x, Some(&g4), Some(&g3), &mut y, &mut m3, &mut r3));
    assert!(e.contains("`beta`"), "{e}");
    let e = err(op.forward(&stream, &x, None, None, &mut y, &mut m3, &mut r2));
    assert!(e.contains("`rstd`") && e.contains("exactly 3"), "{e}");
    for eps in [0.0f32, -1e-5, f32::NAN, f32::INFINITY] {
        let e = err(op
            .with_eps(eps)
            .forward(&stream, &x, None, None, &mut y, &mut m3, &mut r3));
        assert!(
            e.contains("`eps`") && e.contains("finite value > 0"),
            "{eps}: {e}"
        );
    }
    let e = err(LayerNorm::new(12, 0).forward(&stream, &x, None, None, &mut y, &mut m3, &mut r3));
    assert!(e.contains("`hidden`"), "{e}");
    let e =
        err(LayerNorm::new(usize::MAX, 2)
            .forward(&stream, &x, None, None, &mut y, &mut m3, &mut r3));
    assert!(e.contains("overflows"), "{e}");
    let e = err(LayerNorm::new(usize::MAX / 2, 2)
        .forward(&stream, &x, None, None, &mut y, &mut m3, &mut r3));
    assert!(e.contains("rows * hidden"), "{e}");

    let (m, r) = (m3, r3);
    let mut dg3 = dev.alloc_zeros::<f32>(3).unwrap();
    let mut dg4 = dev.alloc_zeros::<f32>(4).unwrap();
    let e = err(op.backward(&stream, &x, &short, &m, &r, None, &mut y, None, None));
    assert!(e.contains("`x`"), "{e}");
    let e = err(op.backward(&stream, &short, &x, &m, &r, None, &mut y, None, None));
    assert!(e.contains("`dy`"), "{e}");
    let e = err(op.backward(&stream, &x, &x, &r2, &r, None, &mut y, None, None));
    assert!(e.contains("`mean`"), "{e}");
    let e = err(op.backward(&stream, &x, &x, &m, &r, None, &mut y, Some(&mut dg3), None));
    assert!(e.contains("`dgamma`"), "{e}");
    let e = err(op.backward(
        &stream,
        &x,
        &x,
        &m,
        &r,
        None,
        &mut y,
        Some(&mut dg4),
        Some(&mut dg3),
    ));
    assert!(e.contains("`dbeta`"), "{e}");
    let e = err(op.backward(&stream, &x, &x, &m, &r, Some(&g3), &mut y, None, None));
    assert!(e.contains("`gamma`"), "{e}");

    let rms = RmsNorm::new(3, 4);
    let e = err(rms.forward(&stream, &x, Some(&g3), &mut y, &mut r2));
    assert!(
        e.contains("rms_norm_forward") && e.contains("`gamma`"),
        "{e}"
    );
    let e = err(rms
        .with_eps(0.0)
        .forward(&stream, &x, None, &mut y, &mut r2));
    assert!(e.contains("`eps`"), "{e}");
    let e = err(rms.backward(&stream, &x, &x, &r2, None, &mut y, None));
    assert!(
        e.contains("rms_norm_backward") && e.contains("`rstd`"),
        "{e}"
    );

    let other = Device::emu();
    let foreign = other.alloc_zeros::<f32>(12).unwrap();
    let mut r3 = dev.alloc_zeros::<f32>(3).unwrap();
    let e = err(rms.forward(&stream, &foreign, None, &mut y, &mut r3));
    assert!(e.contains("different device"), "{e}");
}
