//! Column- and row-parallel linear layers (and the TP MLP built from them) on
//! TP = 1, 2, 4 in-process ranks against the unsharded float64 computation:
//! outputs and every gradient (input, weight, bias), sequence parallelism on
//! and off, gather_output / input_is_parallel / skip_bias_add / no bias,
//! gradient-accumulation fusion into an fp32 main_grad, the fused bias+GeLU
//! forward and dGeLU backward, and the overlapped backward (communication on
//! the communicator's stream) against the serialised one. Sizes are odd
//! (`out/tp = 7`, `in/tp = 5`) so the GEMMs take their unaligned paths.

mod common;

use common::ranks::{col_sums, mm, mm_at, mm_bt, run_ranks};
use common::{assert_close_scaled, to_f64, Rng};

/// The per-dtype tolerance is for one op; these results pass through two that
/// each round to the storage dtype (the GEMM's output, then the GeLU or its
/// backward, or the stored dgrad before the bias-gradient sum).
fn assert_close(what: &str, d: ferrotron::DType, seed: u64, out: &[f64], reference: &[f64]) {
    assert_close_scaled(what, d, seed, out, reference, 2.0);
}
use ferrotron::comm::Communicator;
use ferrotron::core::dtype::FloatElement;
use ferrotron::ops::Gelu;
use ferrotron::parallel::linear::{
    shard_cols, shard_rows, ColumnOptions, ColumnParallelLinear, LinearGrads, RowOptions,
    RowParallelLinear, TpElement, WeightGrad,
};
use ferrotron::reference::bias_gelu::{gelu, gelu_grad};
use ferrotron::{DType, DeviceBuffer};
use half::{bf16, f16};

const TOKENS: usize = 12;
const IN: usize = 20;
const OUT: usize = 28;

fn poisoned<T: TpElement>(c: &Communicator, n: usize) -> DeviceBuffer<T> {
    let mut b = c.device().alloc_zeros::<T>(n).unwrap();
    c.stream().fill_bytes(&mut b, 0xFF).unwrap();
    b
}

/// What one rank returns: output, grad_input, weight grad, bias grad.
type RankOut = (Vec<f64>, Vec<f64>, Vec<f64>, Option<Vec<f64>>);

/// Host data of one layer problem: x [TOKENS, IN], w [OUT, IN], b [OUT],
/// dy [TOKENS, OUT], main_grad [OUT, IN] (fp32).
struct Data<T> {
    x: (Vec<T>, Vec<f64>),
    w: (Vec<T>, Vec<f64>),
    b: (Vec<T>, Vec<f64>),
    dy: (Vec<T>, Vec<f64>),
    main: Vec<f32>,
}

fn data<T: FloatElement>(rng: &mut Rng) -> Data<T> {
    let main: Vec<f32> = (0..OUT * IN).map(|_| rng.normal() as f32).collect();
    Data {
        x: rng.tensor(TOKENS * IN, 1.0),
        w: rng.tensor(OUT * IN, 0.3),
        b: rng.tensor(OUT, 0.5),
        dy: rng.tensor(TOKENS * OUT, 1.0),
        main,
    }
}

fn sr<T: Copy>(v: &[T], rows: usize, cols: usize, tp: usize, r: usize) -> Vec<T> {
    shard_rows(v, rows, cols, tp, r).unwrap()
}
fn sc<T: Copy>(v: &[T], rows: usize, cols: usize, tp: usize, r: usize) -> Vec<T> {
    shard_cols(v, rows, cols, tp, r).unwrap()
}

fn run_column<T: TpElement>(d: &Data<T>, tp: usize, o: ColumnOptions, fuse: bool) -> Vec<RankOut> {
    run_ranks(tp, |c| {
        let r = c.rank();
        let dev = c.device().clone();
        let s = c.stream().clone();
        let compute = dev.new_stream().unwrap();
        let bias = o.bias.then_some(&d.b.0[..]);
        let mut l = ColumnParallelLinear::from_full(&c, IN, OUT, &d.w.0, bias, o).unwrap();
        let op = OUT / tp;
        let x = if o.sequence_parallel {
            sr(&d.x.0, TOKENS, IN, tp, r)
        } else {
            d.x.0.clone()
        };
        let x = dev.upload(&x).unwrap();
        let ocols = if o.gather_output { OUT } else { op };
        let mut y = poisoned::<T>(&c, TOKENS * ocols);
        let mut pre = o.activation.map(|_| poisoned::<T>(&c, TOKENS * op));
        s.synchronize().unwrap();
        l.forward(
            &c,
            &compute,
            &x,
            &mut y,
            pre.as_mut().map(|b| b as _),
            TOKENS,
        )
        .unwrap();
        let dy = if o.gather_output {
            d.dy.0.clone()
        } else {
            sc(&d.dy.0, TOKENS, OUT, tp, r)
        };
        let dy = dev.upload(&dy).unwrap();
        let mut dx = poisoned::<T>(&c, x.len());
        let mut dw = poisoned::<T>(&c, op * IN);
        let mut main = dev.upload(&sr(&d.main, OUT, IN, tp, r)).unwrap();
        let mut db = o.bias.then(|| poisoned::<T>(&c, op));
        s.synchronize().unwrap();
        let weight = if fuse {
            WeightGrad::Accumulate(&mut main)
        } else {
            WeightGrad::Store(&mut dw)
        };
        let grads = LinearGrads {
            weight,
            bias: db.as_mut().map(|b| b as _),
        };
        l.backward(
            &c,
            &compute,
            &x,
            &dy,
            pre.as_ref().map(|b| b as _),
            &mut dx,
            grads,
            TOKENS,
        )
        .unwrap();
        compute.synchronize().unwrap();
        let wg = if fuse {
            main.to_host().unwrap().iter().map(|&v| v as f64).collect()
        } else {
            to_f64(&dw.to_host().unwrap())
        };
        (
            to_f64(&y.to_host().unwrap()),
            to_f64(&dx.to_host().unwrap()),
            wg,
            db.map(|b| to_f64(&b.to_host().unwrap())),
        )
    })
}

fn check_column<T: TpElement>(tp: usize, o: ColumnOptions, fuse: bool, salt: u64) {
    let (mut rng, seed) = Rng::new(salt);
    let d = data::<T>(&mut rng);
    let dt = T::DTYPE;
    // Reference.
    let add_bias = o.bias && !o.skip_bias_add;
    let mut pre = mm_bt(&d.x.1, &d.w.1, TOKENS, OUT, IN);
    if add_bias {
        for (i, p) in pre.iter_mut().enumerate() {
            *p += d.b.1[i % OUT];
        }
    }
    let (y, dpre) = match o.activation {
        Some(g) => (
            pre.iter().map(|&v| gelu(g, v)).collect::<Vec<_>>(),
            d.dy.1
                .iter()
                .zip(&pre)
                .map(|(&dy, &p)| dy * gelu_grad(g, p))
                .collect::<Vec<_>>(),
        ),
        None => (pre.clone(), d.dy.1.clone()),
    };
    let dx = mm(&dpre, &d.w.1, TOKENS, IN, OUT);
    let dw = mm_at(&dpre, &d.x.1, OUT, IN, TOKENS);
    let db = col_sums(&dpre, TOKENS, OUT);
    let what = format!("column tp={tp} {o:?} fuse={fuse}");
    for (r, (oy, odx, odw, odb)) in run_column(&d, tp, o, fuse).into_iter().enumerate() {
        let want_y = if o.gather_output {
            y.clone()
        } else {
            sc(&y, TOKENS, OUT, tp, r)
        };
        assert_close(&format!("{what} rank {r}: output"), dt, seed, &oy, &want_y);
        let want_dx = if o.sequence_parallel {
            sr(&dx, TOKENS, IN, tp, r)
        } else {
            dx.clone()
        };
        assert_close(
            &format!("{what} rank {r}: grad_input"),
            dt,
            seed,
            &odx,
            &want_dx,
        );
        let mut want_dw = sr(&dw, OUT, IN, tp, r);
        if fuse {
            for (w, m) in want_dw.iter_mut().zip(sr(&d.main, OUT, IN, tp, r)) {
                *w += m as f64;
            }
        }
        assert_close(
            &format!("{what} rank {r}: weight grad"),
            dt,
            seed,
            &odw,
            &want_dw,
        );
        match odb {
            Some(odb) => assert_close(
                &format!("{what} rank {r}: bias grad"),
                dt,
                seed,
                &odb,
                &sr(&db, OUT, 1, tp, r),
            ),
            None => assert!(!o.bias),
        }
    }
}

fn run_row<T: TpElement>(d: &Data<T>, tp: usize, o: RowOptions, fuse: bool) -> Vec<RankOut> {
    run_ranks(tp, |c| {
        let r = c.rank();
        let dev = c.device().clone();
        let s = c.stream().clone();
        let compute = dev.new_stream().unwrap();
        let bias = o.bias.then_some(&d.b.0[..]);
        let mut l = RowParallelLinear::from_full(&c, IN, OUT, &d.w.0, bias, o).unwrap();
        let ip = IN / tp;
        let x = if o.input_is_parallel {
            sc(&d.x.0, TOKENS, IN, tp, r)
        } else {
            d.x.0.clone()
        };
        let x = dev.upload(&x).unwrap();
        let orows = if o.sequence_parallel {
            TOKENS / tp
        } else {
            TOKENS
        };
        let mut y = poisoned::<T>(&c, orows * OUT);
        s.synchronize().unwrap();
        l.forward(&c, &compute, &x, &mut y, TOKENS).unwrap();
        let dy = if o.sequence_parallel {
            sr(&d.dy.0, TOKENS, OUT, tp, r)
        } else {
            d.dy.0.clone()
        };
        let dy = dev.upload(&dy).unwrap();
        let mut dx = poisoned::<T>(&c, x.len());
        let mut dw = poisoned::<T>(&c, OUT * ip);
        let mut main = dev.upload(&sc(&d.main, OUT, IN, tp, r)).unwrap();
        let mut db = o.bias.then(|| poisoned::<T>(&c, OUT));
        s.synchronize().unwrap();
        let weight = if fuse {
            WeightGrad::Accumulate(&mut main)
        } else {
            WeightGrad::Store(&mut dw)
        };
        let grads = LinearGrads {
            weight,
            bias: db.as_mut().map(|b| b as _),
        };
        l.backward(&c, &compute, &x, &dy, None, &mut dx, grads, TOKENS)
            .unwrap();
        compute.synchronize().unwrap();
        let wg = if fuse {
            main.to_host().unwrap().iter().map(|&v| v as f64).collect()
        } else {
            to_f64(&dw.to_host().unwrap())
        };
        (
            to_f64(&y.to_host().unwrap()),
            to_f64(&dx.to_host().unwrap()),
            wg,
            db.map(|b| to_f64(&b.to_host().unwrap())),
        )
    })
}

fn check_row<T: TpElement>(tp: usize, o: RowOptions, fuse: bool, salt: u64) {
    let (mut rng, seed) = Rng::new(salt);
    let d = data::<T>(&mut rng);
    let dt = T::DTYPE;
    let mut y = mm_bt(&d.x.1, &d.w.1, TOKENS, OUT, IN);
    if o.bias && !o.skip_bias_add {
        for (i, v) in y.iter_mut().enumerate() {
            *v += d.b.1[i % OUT];
        }
    }
    let dx = mm(&d.dy.1, &d.w.1, TOKENS, IN, OUT);
    let dw = mm_at(&d.dy.1, &d.x.1, OUT, IN, TOKENS);
    let db = col_sums(&d.dy.1, TOKENS, OUT);
    let what = format!("row tp={tp} {o:?} fuse={fuse}");
    for (r, (oy, odx, odw, odb)) in run_row(&d, tp, o, fuse).into_iter().enumerate() {
        let want_y = if o.sequence_parallel {
            sr(&y, TOKENS, OUT, tp, r)
        } else {
            y.clone()
        };
        assert_close(&format!("{what} rank {r}: output"), dt, seed, &oy, &want_y);
        let want_dx = if o.input_is_parallel {
            sc(&dx, TOKENS, IN, tp, r)
        } else {
            dx.clone()
        };
        assert_close(
            &format!("{what} rank {r}: grad_input"),
            dt,
            seed,
            &odx,
            &want_dx,
        );
        let mut want_dw = sc(&dw, OUT, IN, tp, r);
        if fuse {
            for (w, m) in want_dw.iter_mut().zip(sc(&d.main, OUT, IN, tp, r)) {
                *w += m as f64;
            }
        }
        assert_close(
            &format!("{what} rank {r}: weight grad"),
            dt,
            seed,
            &odw,
            &want_dw,
        );
        match odb {
            Some(odb) => assert_close(&format!("{what} rank {r}: bias grad"), dt, seed, &odb, &db),
            None => assert!(!o.bias),
        }
    }
}

#[test]
fn column_parallel_matches_unsharded_on_tp_1_2_4_with_and_without_sp() {
    for tp in [1usize, 2, 4] {
        for sp in [false, true] {
            let o = ColumnOptions {
                sequence_parallel: sp,
                ..Default::default()
            };
            check_column::<bf16>(tp, o, false, 1);
            check_column::<bf16>(tp, o, true, 2);
        }
    }
}

#[test]
fn column_parallel_options() {
    let tp = 2;
    let base = ColumnOptions::default();
    check_column::<bf16>(
        tp,
        ColumnOptions {
            gather_output: true,
            ..base
        },
        false,
        3,
    );
    check_column::<bf16>(
        tp,
        ColumnOptions {
            bias: false,
            ..base
        },
        false,
        4,
    );
    check_column::<bf16>(
        tp,
        ColumnOptions {
            skip_bias_add: true,
            ..base
        },
        true,
        5,
    );
    check_column::<f16>(
        4,
        ColumnOptions {
            activation: Some(Gelu::Tanh),
            ..base
        },
        false,
        6,
    );
    check_column::<bf16>(
        4,
        ColumnOptions {
            activation: Some(Gelu::Erf),
            sequence_parallel: true,
            ..base
        },
        true,
        7,
    );
    // Serialised communication gives the same gradients.
    check_column::<bf16>(
        4,
        ColumnOptions {
            overlap: false,
            ..base
        },
        false,
        8,
    );
    check_column::<bf16>(
        4,
        ColumnOptions {
            overlap: false,
            sequence_parallel: true,
            ..base
        },
        false,
        9,
    );
}

#[test]
fn row_parallel_matches_unsharded_on_tp_1_2_4_with_and_without_sp() {
    for tp in [1usize, 2, 4] {
        for sp in [false, true] {
            let o = RowOptions {
                sequence_parallel: sp,
                ..Default::default()
            };
            check_row::<bf16>(tp, o, false, 11);
            check_row::<bf16>(tp, o, true, 12);
        }
    }
}

#[test]
fn row_parallel_options() {
    let base = RowOptions::default();
    check_row::<bf16>(
        2,
        RowOptions {
            input_is_parallel: false,
            ..base
        },
        false,
        13,
    );
    check_row::<bf16>(
        4,
        RowOptions {
            input_is_parallel: false,
            overlap: false,
            ..base
        },
        true,
        14,
    );
    check_row::<bf16>(
        2,
        RowOptions {
            bias: false,
            ..base
        },
        false,
        15,
    );
    check_row::<f16>(
        4,
        RowOptions {
            skip_bias_add: true,
            ..base
        },
        false,
        16,
    );
}

#[test]
fn overlapped_backward_equals_serialised_bitwise() {
    // Same data through both paths: the overlap changes only the streams the
    // collectives run on, never the arithmetic.
    let (mut rng, seed) = Rng::new(21);
    let d = data::<bf16>(&mut rng);
    for sp in [false, true] {
        let o = ColumnOptions {
            sequence_parallel: sp,
            ..Default::default()
        };
        let a = run_column(&d, 4, o, true);
        let b = run_column(
            &d,
            4,
            ColumnOptions {
                overlap: false,
                ..o
            },
            true,
        );
        assert_eq!(a, b, "column sp={sp} (seed {seed})");
    }
    let o = RowOptions {
        input_is_parallel: false,
        ..Default::default()
    };
    let a = run_row(&d, 4, o, false);
    let b = run_row(
        &d,
        4,
        RowOptions {
            overlap: false,
            ..o
        },
        false,
    );
    assert_eq!(a, b, "row (seed {seed})");
}

#[test]
fn invalid_arguments_are_errors() {
    run_ranks(2, |c| {
        let w = vec![bf16::ZERO; 3 * 4];
        let e = ColumnParallelLinear::from_full(
            &c,
            4,
            3,
            &w,
            None,
            ColumnOptions {
                bias: false,
                ..Default::default()
            },
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("out_features") && e.contains("multiple"), "{e}");
        let e = RowParallelLinear::<bf16>::from_full(&c, 4, 3, &w, None, RowOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("full_bias"), "{e}");
        let w = vec![bf16::ZERO; 4 * 4];
        let mut l = ColumnParallelLinear::from_full(
            &c,
            4,
            4,
            &w,
            None,
            ColumnOptions {
                bias: false,
                ..Default::default()
            },
        )
        .unwrap();
        let dev = c.device();
        let x = dev.alloc_zeros::<bf16>(3 * 4).unwrap();
        let mut y = dev.alloc_zeros::<bf16>(5).unwrap();
        let e = l
            .forward(&c, c.stream(), &x, &mut y, None, 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`output`") && e.contains("exactly 6"), "{e}");
    });
}

/// The TP MLP block: column (fused bias+GeLU, pre-activation saved) → row
/// (dgrad fused with the GeLU backward), sequence parallelism on and off.
#[test]
fn tp_mlp_block_matches_unsharded() {
    const FFN: usize = 36;
    for (tp, sp) in [
        (1usize, false),
        (2, false),
        (4, false),
        (2, true),
        (4, true),
    ] {
        let (mut rng, seed) = Rng::new(31 + tp as u64);
        let (x, xf) = rng.tensor::<bf16>(TOKENS * IN, 1.0);
        let (w1, w1f) = rng.tensor::<bf16>(FFN * IN, 0.3);
        let (b1, b1f) = rng.tensor::<bf16>(FFN, 0.5);
        let (w2, w2f) = rng.tensor::<bf16>(IN * FFN, 0.3);
        let (b2, b2f) = rng.tensor::<bf16>(IN, 0.5);
        let (dy, dyf) = rng.tensor::<bf16>(TOKENS * IN, 1.0);
        // Reference.
        let g = Gelu::Tanh;
        let mut pre = mm_bt(&xf, &w1f, TOKENS, FFN, IN);
        for (i, p) in pre.iter_mut().enumerate() {
            *p += b1f[i % FFN];
        }
        let h: Vec<f64> = pre.iter().map(|&p| gelu(g, p)).collect();
        let mut y = mm_bt(&h, &w2f, TOKENS, IN, FFN);
        for (i, v) in y.iter_mut().enumerate() {
            *v += b2f[i % IN];
        }
        let dh = mm(&dyf, &w2f, TOKENS, FFN, IN);
        let dpre: Vec<f64> = dh
            .iter()
            .zip(&pre)
            .map(|(&d, &p)| d * gelu_grad(g, p))
            .collect();
        let dx = mm(&dpre, &w1f, TOKENS, IN, FFN);
        let dw1 = mm_at(&dpre, &xf, FFN, IN, TOKENS);
        let db1 = col_sums(&dpre, TOKENS, FFN);
        let dw2 = mm_at(&dyf, &h, IN, FFN, TOKENS);
        let db2 = col_sums(&dyf, TOKENS, IN);

        let outs = run_ranks(tp, |c| {
            let r = c.rank();
            let dev = c.device().clone();
            let s = dev.new_stream().unwrap();
            let fp = FFN / tp;
            let rows = if sp { TOKENS / tp } else { TOKENS };
            let co = ColumnOptions {
                activation: Some(g),
                sequence_parallel: sp,
                ..Default::default()
            };
            let ro = RowOptions {
                sequence_parallel: sp,
                ..Default::default()
            };
            let mut fc1 = ColumnParallelLinear::from_full(&c, IN, FFN, &w1, Some(&b1), co).unwrap();
            let mut fc2 = RowParallelLinear::from_full(&c, FFN, IN, &w2, Some(&b2), ro).unwrap();
            let xs = dev
                .upload(&if sp {
                    sr(&x, TOKENS, IN, tp, r)
                } else {
                    x.clone()
                })
                .unwrap();
            let dys = dev
                .upload(&if sp {
                    sr(&dy, TOKENS, IN, tp, r)
                } else {
                    dy.clone()
                })
                .unwrap();
            let mut hbuf = poisoned::<bf16>(&c, TOKENS * fp);
            let mut pbuf = poisoned::<bf16>(&c, TOKENS * fp);
            let mut ybuf = poisoned::<bf16>(&c, rows * IN);
            let mut dhbuf = poisoned::<bf16>(&c, TOKENS * fp);
            let mut dxbuf = poisoned::<bf16>(&c, rows * IN);
            let mut gw1 = dev.alloc_zeros::<f32>(fp * IN).unwrap();
            let mut gw2 = dev.alloc_zeros::<f32>(IN * fp).unwrap();
            let mut gb1 = poisoned::<bf16>(&c, fp);
            let mut gb2 = poisoned::<bf16>(&c, IN);
            c.stream().synchronize().unwrap();
            fc1.forward(&c, &s, &xs, &mut hbuf, Some(&mut pbuf), TOKENS)
                .unwrap();
            fc2.forward(&c, &s, &hbuf, &mut ybuf, TOKENS).unwrap();
            let grads2 = LinearGrads {
                weight: WeightGrad::Accumulate(&mut gw2),
                bias: Some(&mut gb2),
            };
            fc2.backward(
                &c,
                &s,
                &hbuf,
                &dys,
                Some((g, &pbuf)),
                &mut dhbuf,
                grads2,
                TOKENS,
            )
            .unwrap();
            let grads1 = LinearGrads {
                weight: WeightGrad::Accumulate(&mut gw1),
                bias: Some(&mut gb1),
            };
            fc1.backward(&c, &s, &xs, &dhbuf, None, &mut dxbuf, grads1, TOKENS)
                .unwrap();
            s.synchronize().unwrap();
            let f = |b: &DeviceBuffer<f32>| -> Vec<f64> {
                b.to_host().unwrap().iter().map(|&v| v as f64).collect()
            };
            let t = |b: &DeviceBuffer<bf16>| to_f64(&b.to_host().unwrap());
            [t(&ybuf), t(&dxbuf), f(&gw1), t(&gb1), f(&gw2), t(&gb2)]
        });
        let dt = DType::BF16;
        for (r, [oy, odx, ogw1, ogb1, ogw2, ogb2]) in outs.into_iter().enumerate() {
            let what = |n: &str| format!("mlp tp={tp} sp={sp} rank {r}: {n}");
            let rows_of = |v: &[f64], cols| {
                if sp {
                    sr(v, TOKENS, cols, tp, r)
                } else {
                    v.to_vec()
                }
            };
            assert_close(&what("output"), dt, seed, &oy, &rows_of(&y, IN));
            assert_close(&what("grad_input"), dt, seed, &odx, &rows_of(&dx, IN));
            assert_close(
                &what("fc1 weight grad"),
                dt,
                seed,
                &ogw1,
                &sr(&dw1, FFN, IN, tp, r),
            );
            assert_close(
                &what("fc1 bias grad"),
                dt,
                seed,
                &ogb1,
                &sr(&db1, FFN, 1, tp, r),
            );
            assert_close(
                &what("fc2 weight grad"),
                dt,
                seed,
                &ogw2,
                &sc(&dw2, IN, FFN, tp, r),
            );
            assert_close(&what("fc2 bias grad"), dt, seed, &ogb2, &db2);
        }
    }
}

#[test]
fn empty_shards_of_huge_matrices_cost_nothing() {
    // A zero-width dimension must not make sharding walk the other one
    // (found by the C ABI fuzzer: rows = 2^62, cols = 0 used to loop).
    let rows = 1usize << 62;
    assert_eq!(
        shard_cols::<u16>(&[], rows, 0, 1, 0).unwrap(),
        Vec::<u16>::new()
    );
    assert_eq!(
        shard_rows::<u16>(&[], rows, 0, 1, 0).unwrap(),
        Vec::<u16>::new()
    );
    assert_eq!(
        shard_rows::<u16>(&[], 0, rows, 2, 1).unwrap(),
        Vec::<u16>::new()
    );
}
