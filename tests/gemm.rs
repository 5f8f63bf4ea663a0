//! The tensor-core GEMM family against the float64 oracle: 1x1x1, primes and
//! non-multiples of every tile dimension (64, 128, BK = 32, mma 16/8), all four
//! transpose combinations, both tiles, fp16/bf16 inputs with every output
//! type, every epilogue (pre-activation store included), batched with padded
//! leading dimensions and strides, broadcast operands, gradient-accumulation
//! fusion (beta = 1 into fp32, in place), the unaligned element-load path,
//! the deterministic bias gradient, and argument validation. Output padding
//! must come back untouched (no out-of-bounds writes).

mod common;
mod gemm_harness;

use common::{abs_column_sums, assert_close_sums, devices, to_f64, Rng};
use ferrotron::core::dtype::FloatElement;
use ferrotron::core::plan::gemm::GemmTile;
use ferrotron::ops::gemm::{Aux, BiasGrad, Epilogue, Gemm, GemmInputs};
use ferrotron::ops::Gelu;
use ferrotron::reference::gemm as oracle;
use ferrotron::{Device, DeviceBuffer};
use gemm_harness::{run_case, Case};
use half::{bf16, f16};

/// 1, primes, non-multiples of 8/16/32/64/128, one exact multiple.
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (2, 3, 5),
    (7, 13, 17),
    (31, 33, 47),
    (64, 64, 32),
    (65, 63, 33),
    (129, 131, 97),
    (17, 200, 8),
];

const TRANSPOSES: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

fn shapes_and_transposes<T: FloatElement, O: FloatElement>(test: &str) {
    for dev in devices(test, SHAPES.len() * 4) {
        for &(m, n, k) in SHAPES {
            for (ta, tb) in TRANSPOSES {
                run_case::<T, O>(
                    &dev,
                    Case {
                        ta,
                        tb,
                        ..Case::new(m, n, k)
                    },
                );
            }
        }
    }
}

#[test]
fn shapes_transposes_f16() {
    shapes_and_transposes::<f16, f16>("shapes_transposes_f16");
}

#[test]
fn shapes_transposes_bf16() {
    shapes_and_transposes::<bf16, bf16>("shapes_transposes_bf16");
}

#[test]
fn fp32_outputs_and_alpha() {
    let cases = [(1, 1, 1), (33, 17, 45), (100, 70, 64)];
    for dev in devices("fp32_outputs_and_alpha", cases.len() * 2) {
        for &(m, n, k) in &cases {
            let c = Case {
                alpha: -0.75,
                tb: true,
                ..Case::new(m, n, k)
            };
            run_case::<f16, f32>(&dev, c);
            run_case::<bf16, f32>(&dev, Case { ta: true, ..c });
        }
    }
}

#[test]
fn large_tile_edges() {
    // The 128x128 tile (8 warps), forced on shapes that cut it everywhere.
    let cases = [(1, 1, 1), (130, 129, 40), (257, 5, 33)];
    for dev in devices("large_tile_edges", cases.len() * 4) {
        for &(m, n, k) in &cases {
            for (ta, tb) in TRANSPOSES {
                let c = Case {
                    ta,
                    tb,
                    tile: Some(GemmTile::T128x128),
                    ..Case::new(m, n, k)
                };
                run_case::<bf16, bf16>(&dev, c);
            }
        }
    }
}

#[test]
fn epilogues() {
    let epis = gemm_harness::FUSED_EPILOGUES;
    for dev in devices("epilogues", epis.len() * 5) {
        for epi in epis {
            let base = Case {
                epi,
                bias: !matches!(epi, Epilogue::DGelu(_)),
                store_pre: true,
                tb: true, // forward Y = X W^T
                ..Case::new(37, 45, 29)
            };
            run_case::<f16, f16>(&dev, base);
            run_case::<bf16, bf16>(
                &dev,
                Case {
                    tile: Some(GemmTile::T128x128),
                    ..base
                },
            );
            run_case::<bf16, f32>(&dev, Case { tb: false, ..base });
            // GeLU without bias and without saving the pre-activation.
            if matches!(epi, Epilogue::BiasGelu(_)) {
                run_case::<f16, f16>(
                    &dev,
                    Case {
                        bias: false,
                        store_pre: false,
                        ..base
                    },
                );
            }
            // With beta * C before the epilogue.
            run_case::<f16, f32>(&dev, Case { beta: 0.5, ..base });
        }
    }
}

#[test]
fn batched_strided() {
    for dev in devices("batched_strided", 5) {
        // Attention-like Q K^T and P V per head with padded lds and strides.
        let qk = Case {
            batch: 3,
            tb: true,
            pad: 3,
            extra: 5,
            ..Case::new(19, 23, 16)
        };
        run_case::<f16, f16>(&dev, qk);
        run_case::<bf16, f32>(&dev, Case { tb: false, ..qk });
        // Aligned padding keeps the cp.async path: ld and strides multiple of 8.
        run_case::<bf16, bf16>(
            &dev,
            Case {
                batch: 4,
                pad: 8,
                extra: 16,
                ..Case::new(40, 24, 72)
            },
        );
        // One B for every batch entry.
        run_case::<f16, f16>(
            &dev,
            Case {
                batch: 5,
                broadcast_b: true,
                tb: true,
                ..Case::new(9, 11, 40)
            },
        );
        // Epilogue with batches.
        run_case::<f16, f16>(
            &dev,
            Case {
                batch: 2,
                epi: Epilogue::BiasGelu(Gelu::Tanh),
                bias: true,
                store_pre: true,
                pad: 2,
                extra: 1,
                ..Case::new(21, 34, 50)
            },
        );
    }
}

#[test]
fn gradient_accumulation_fusion() {
    // main_grad (fp32) += dY^T X: wgrad with beta = 1, in place.
    for dev in devices("gradient_accumulation_fusion", 4) {
        let wgrad = Case {
            ta: true,
            beta: 1.0,
            c_separate: false,
            ..Case::new(48, 40, 77)
        };
        run_case::<bf16, f32>(&dev, wgrad);
        run_case::<f16, f32>(
            &dev,
            Case {
                m: 3,
                n: 130,
                ..wgrad
            },
        );
        // Separate C, beta != 1.
        run_case::<bf16, f32>(
            &dev,
            Case {
                beta: -2.0,
                c_separate: true,
                ..wgrad
            },
        );
        run_case::<f16, f16>(
            &dev,
            Case {
                beta: 1.0,
                c_separate: false,
                ..Case::new(5, 9, 3)
            },
        );
    }
}

#[test]
fn unaligned_operands_take_the_slow_path() {
    for dev in devices("unaligned_operands_take_the_slow_path", 8) {
        // Odd leading dimensions: no 16-byte copies possible.
        for (ta, tb) in TRANSPOSES {
            run_case::<f16, f16>(
                &dev,
                Case {
                    ta,
                    tb,
                    pad: 1,
                    ..Case::new(33, 35, 41)
                },
            );
        }
        // Forced element loads on aligned data give the same answer.
        for (ta, tb) in TRANSPOSES {
            run_case::<bf16, f32>(
                &dev,
                Case {
                    ta,
                    tb,
                    fast: false,
                    ..Case::new(66, 20, 48)
                },
            );
        }
    }
}

#[test]
fn bias_grad_is_deterministic() {
    for dev in devices("bias_grad_is_deterministic", 3) {
        for &(rows, cols) in &[(1usize, 1usize), (1000, 37), (70, 300)] {
            let (mut rng, seed) = Rng::new(rows as u64 * 31 + cols as u64);
            let stream = dev.new_stream().unwrap();
            let (dy, dyf) = rng.tensor::<bf16>(rows * cols, 1.0);
            let dyd = dev.upload(&dy).unwrap();
            let mut db = dev.alloc_zeros::<bf16>(cols).unwrap();
            stream.fill_bytes(&mut db, 0xFF).unwrap();
            BiasGrad::new(rows, cols)
                .run(&stream, &dyd, &mut db)
                .unwrap();
            let first = db.to_host().unwrap();
            assert_close_sums(
                &format!("dbias {rows}x{cols}"),
                ferrotron::DType::BF16,
                seed,
                &to_f64(&first),
                &oracle::column_sums(&dyf, rows, cols, cols),
                &abs_column_sums(&dyf, cols),
            );
            stream.fill_bytes(&mut db, 0xFF).unwrap();
            BiasGrad::new(rows, cols)
                .run(&stream, &dyd, &mut db)
                .unwrap();
            assert!(
                first == db.to_host().unwrap(),
                "dbias not reproducible (seed {seed})"
            );
        }
    }
}

#[test]
fn validation() {
    let dev = Device::emu();
    let s = dev.new_stream().unwrap();
    let a = dev.alloc_zeros::<f16>(6).unwrap();
    let b = dev.alloc_zeros::<f16>(6).unwrap();
    let bias = dev.alloc_zeros::<f16>(3).unwrap();
    let pre = dev.alloc_zeros::<f16>(4).unwrap();
    let inputs = || GemmInputs::<f16, f16> {
        a: &a,
        b: &b,
        bias: None,
        c: None,
    };
    let mut d = dev.alloc_zeros::<f16>(4).unwrap();
    // [2,3] x [3,2] is fine.
    Gemm::new(2, 2, 3)
        .run(&s, inputs(), Aux::None, &mut d)
        .unwrap();
    let err =
        |g: Gemm, i: GemmInputs<'_, f16, f16>, aux: Aux<'_, f16>, d: &mut DeviceBuffer<f16>| {
            g.run(&s, i, aux, d).unwrap_err().to_string()
        };
    // Buffer too short for the shape.
    assert!(err(Gemm::new(2, 2, 4), inputs(), Aux::None, &mut d).contains("a"));
    // ld below the row length.
    let e = err(
        Gemm::new(2, 2, 3).lds(Some(2), None, None, None, None),
        inputs(),
        Aux::None,
        &mut d,
    );
    assert!(e.contains("lda"), "{e}");
    // Overlapping output batches.
    let e = err(
        Gemm::new(1, 2, 3)
            .batch(2)
            .strides(Some(0), Some(0), None, Some(1), None),
        inputs(),
        Aux::None,
        &mut d,
    );
    assert!(e.contains("stride_d"), "{e}");
    // Bias epilogue without bias; bias with no epilogue.
    let e = err(
        Gemm::new(2, 2, 3).epilogue(Epilogue::Bias),
        inputs(),
        Aux::None,
        &mut d,
    );
    assert!(e.contains("bias"), "{e}");
    let e = err(
        Gemm::new(2, 2, 3),
        GemmInputs {
            bias: Some(&bias),
            ..inputs()
        },
        Aux::None,
        &mut d,
    );
    assert!(e.contains("bias"), "{e}");
    // DGelu needs the pre-activation; None may not store one.
    let e = err(
        Gemm::new(2, 2, 3).epilogue(Epilogue::DGelu(Gelu::Tanh)),
        inputs(),
        Aux::None,
        &mut d,
    );
    assert!(e.contains("aux"), "{e}");
    let e = err(
        Gemm::new(2, 2, 3),
        inputs(),
        Aux::PreActivation(&pre),
        &mut d,
    );
    assert!(e.contains("aux"), "{e}");
    // C given with beta == 0.
    let c = dev.alloc_zeros::<f16>(4).unwrap();
    let e = err(
        Gemm::new(2, 2, 3),
        GemmInputs {
            c: Some(&c),
            ..inputs()
        },
        Aux::None,
        &mut d,
    );
    assert!(e.contains("c"), "{e}");
    // Non-finite alpha; overflowing sizes.
    let e = err(
        Gemm::new(2, 2, 3).alpha(f32::NAN),
        inputs(),
        Aux::None,
        &mut d,
    );
    assert!(e.contains("alpha"), "{e}");
    let e = err(Gemm::new(usize::MAX / 2, 2, 3), inputs(), Aux::None, &mut d);
    assert!(e.contains("gemm"), "{e}");
    // Unsupported dtypes: fp32 inputs; f16 inputs into a bf16 output.
    let a32 = dev.alloc_zeros::<f32>(6).unwrap();
    let mut d32 = dev.alloc_zeros::<f32>(4).unwrap();
    let e = Gemm::new(2, 2, 3)
        .run(
            &s,
            GemmInputs::<f32, f32> {
                a: &a32,
                b: &a32,
                bias: None,
                c: None,
            },
            Aux::None,
            &mut d32,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("fp16 or bf16"), "{e}");
    let mut dbf = dev.alloc_zeros::<bf16>(4).unwrap();
    let e = Gemm::new(2, 2, 3)
        .run(
            &s,
            GemmInputs::<f16, bf16> {
                a: &a,
                b: &b,
                bias: None,
                c: None,
            },
            Aux::None,
            &mut dbf,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("f32"), "{e}");
    // Empty problems are no-ops; K = 0 gives zeros (plus the epilogue).
    Gemm::new(0, 2, 3)
        .run(&s, inputs(), Aux::None, &mut d)
        .unwrap();
    let mut z = dev.alloc_zeros::<f16>(4).unwrap();
    s.fill_bytes(&mut z, 0xFF).unwrap();
    Gemm::new(2, 2, 0)
        .run(&s, inputs(), Aux::None, &mut z)
        .unwrap();
    s.synchronize().unwrap();
    assert!(z.to_host().unwrap().iter().all(|v| v.to_f32() == 0.0));
    // Bias gradient: wrong dbias length.
    let mut short = dev.alloc_zeros::<f16>(2).unwrap();
    assert!(BiasGrad::new(2, 3).run(&s, &a, &mut short).is_err());
}
