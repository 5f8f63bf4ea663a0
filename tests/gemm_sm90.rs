//! The Hopper GEMM kernel (`cuda/gemm_sm90.cu`: wgmma + TMA, warp-specialised,
//! persistent) against the float64 oracle on the emulator, selected with
//! `Gemm::kernel(GemmKernel::Wgmma)`: every dtype pair, the four transposes,
//! every epilogue (pre-activation store included), beta into fp32 in place,
//! odd M/N/K (1, 17, 100, 257), batches with padded leading dimensions and
//! strides, under strict mode with the forward, reverse and random thread
//! schedules. Each case asserts that the wgmma kernel is the one that ran;
//! operands TMA cannot address fall back to the mma kernel (also asserted).
//! On a GPU other than sm_90 every case falls back (and says so).

mod common;
mod gemm_harness;

use common::devices;
use ferrotron::core::dtype::FloatElement;
use ferrotron::ops::gemm::{Epilogue, GemmKernel};
use ferrotron::ops::Gelu;
use ferrotron::Device;
use gemm_harness::{run_case, Case};
use half::{bf16, f16};

extern "C" {
    fn ftn_emu_set_schedule(spec: *const core::ffi::c_char) -> core::ffi::c_int;
}

/// Runs `f` on the emulator under each thread schedule (strict mode is on in
/// debug builds), then on a GPU if there is one.
fn each_schedule(test: &str, gpu_cases: usize, f: impl Fn(&Device)) {
    for dev in devices(test, gpu_cases) {
        if dev.kind() == ferrotron::BackendKind::Emu {
            for s in [c"forward", c"reverse", c"random:19"] {
                // SAFETY: a NUL-terminated schedule name.
                assert_eq!(unsafe { ftn_emu_set_schedule(s.as_ptr()) }, 0);
                f(&dev);
            }
        } else {
            f(&dev);
        }
    }
}

fn wg(m: usize, n: usize, k: usize) -> Case {
    Case {
        kernel: GemmKernel::Wgmma,
        expect: Some(GemmKernel::Wgmma),
        ld_align: 8, // 16-byte rows (TMA); packed odd shapes fall back
        ..Case::new(m, n, k)
    }
}

fn run<T: FloatElement, O: FloatElement>(dev: &Device, c: Case) {
    let expect = if dev.compute_capability().is_some_and(|cc| cc != (9, 0)) {
        c.expect.map(|_| GemmKernel::Mma)
    } else {
        c.expect
    };
    run_case::<T, O>(dev, Case { expect, ..c });
}

const TRANSPOSES: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// Odd shapes in every dimension (1, 17, 100, 257; K below, at and above
/// the 64-wide slice; M and N cutting the 128 tile and its 64-row halves),
/// the four transposes, each input type into its own type.
#[test]
fn shapes_and_transposes() {
    let shapes = [(1, 1, 1), (17, 100, 257), (100, 17, 64), (257, 130, 17)];
    each_schedule("shapes_and_transposes", shapes.len() * 4, |dev| {
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            for (j, (ta, tb)) in TRANSPOSES.into_iter().enumerate() {
                let c = Case {
                    ta,
                    tb,
                    ..wg(m, n, k)
                };
                if (i + j) % 2 == 0 {
                    run::<f16, f16>(dev, c);
                } else {
                    run::<bf16, bf16>(dev, c);
                }
            }
        }
    });
}

/// fp32 outputs with alpha, and a tile count above the persistent grid
/// (the emulator's grid is its worker count), so blocks walk several tiles.
#[test]
fn fp32_outputs_and_persistent_tiles() {
    each_schedule("fp32_outputs_and_persistent_tiles", 3, |dev| {
        run::<f16, f32>(
            dev,
            Case {
                alpha: -0.75,
                tb: true,
                ..wg(33, 17, 45)
            },
        );
        run::<bf16, f32>(
            dev,
            Case {
                ta: true,
                ..wg(100, 70, 128)
            },
        );
        run::<bf16, bf16>(
            dev,
            Case {
                tb: true,
                ..wg(300, 260, 24)
            },
        );
    });
}

#[test]
fn epilogues() {
    let epis = gemm_harness::FUSED_EPILOGUES;
    each_schedule("epilogues", epis.len() * 3, |dev| {
        for (i, epi) in epis.into_iter().enumerate() {
            let base = Case {
                epi,
                bias: !matches!(epi, Epilogue::DGelu(_)),
                store_pre: true,
                tb: true, // forward Y = X W^T
                ..wg(37, 45, 29)
            };
            run::<f16, f16>(dev, base);
            run::<bf16, f32>(
                dev,
                Case {
                    tb: false,
                    beta: 0.5,
                    ..base
                },
            );
            if i == 1 {
                // GeLU without bias and without saving the pre-activation.
                run::<bf16, bf16>(
                    dev,
                    Case {
                        bias: false,
                        store_pre: false,
                        ..base
                    },
                );
            }
        }
    });
}

/// main_grad (fp32) += dY^T X: wgrad with beta = 1, in place; and a
/// separate C with beta != 1.
#[test]
fn gradient_accumulation_fusion() {
    each_schedule("gradient_accumulation_fusion", 3, |dev| {
        let wgrad = Case {
            ta: true,
            beta: 1.0,
            c_separate: false,
            ..wg(48, 40, 77)
        };
        run::<bf16, f32>(dev, wgrad);
        run::<f16, f32>(
            dev,
            Case {
                beta: -2.0,
                c_separate: true,
                m: 3,
                n: 130,
                ..wgrad
            },
        );
        run::<f16, f16>(
            dev,
            Case {
                ta: false,
                beta: 1.0,
                ..wg(5, 9, 3)
            },
        );
    });
}

/// Batches through the rank-3 tensor maps: padded leading dimensions and
/// strides that stay 16-byte multiples, with an epilogue.
#[test]
fn batched_strided() {
    each_schedule("batched_strided", 3, |dev| {
        let c = Case {
            batch: 3,
            tb: true,
            pad: 8,
            extra: 16,
            ..wg(19, 23, 16)
        };
        run::<f16, f16>(dev, c);
        run::<bf16, f32>(
            dev,
            Case {
                tb: false,
                ta: true,
                ..c
            },
        );
        run::<bf16, bf16>(
            dev,
            Case {
                batch: 2,
                epi: Epilogue::BiasGelu(Gelu::Tanh),
                bias: true,
                store_pre: true,
                ..wg(70, 144, 56)
            },
        );
    });
}

/// What TMA cannot address runs on the mma kernel, with the same results:
/// a packed odd shape (rows of 41 and 35 halves), batch strides off 16 bytes, a
/// broadcast B, the mma-only options.
#[test]
fn unsupported_operands_fall_back() {
    let mma = |c: Case| Case {
        expect: Some(GemmKernel::Mma),
        ..c
    };
    each_schedule("unsupported_operands_fall_back", 4, |dev| {
        run::<f16, f16>(
            dev,
            mma(Case {
                ld_align: 1,
                ..wg(33, 35, 41)
            }),
        );
        run::<bf16, bf16>(
            dev,
            mma(Case {
                batch: 2,
                pad: 8,
                extra: 1,
                ..wg(9, 16, 24)
            }),
        );
        run::<f16, f16>(
            dev,
            mma(Case {
                batch: 3,
                broadcast_b: true,
                tb: true,
                ..wg(9, 11, 40)
            }),
        );
        run::<bf16, f32>(
            dev,
            mma(Case {
                fast: false,
                ..wg(20, 20, 20)
            }),
        );
    });
}
