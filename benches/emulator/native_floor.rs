//! Group `native_floor`: the training ops' functions as plain row-serial C++
//! loops (`cuda/emu/tests/bench_native_floor.cpp`: same math, same compiler
//! flags, vectorised by g++, no SIMT), timed like the emulator cases. It is the
//! yardstick for the emulator: how far a kernel's emulated run is from what
//! this CPU needs to compute the same outputs at all.
//!
//! [`cases`] checks each native op's output against the emulator's run of
//! the real kernel on the same (varied) inputs before handing it out for
//! timing, so the floor is known to compute the same function;
//! `tests/emulator.rs` runs that check at a small shape in every `cargo test`.

use ferrotron::core::plan;
use ferrotron::ops::softmax::{ScaleMaskSoftmax, SoftmaxMask};
use ferrotron::ops::{layernorm, BiasGelu, LayerNorm};
use ferrotron::{DeviceBuffer, Stream};
use half::bf16;

#[link(name = "ftn_emu_selftest", kind = "static")]
extern "C" {
    fn ftn_native_bias_gelu_fwd_bf16(
        x: *const u16,
        bias: *const u16,
        out: *mut u16,
        rows: u64,
        cols: u64,
    );
    fn ftn_native_bias_gelu_bwd_bf16(
        dy: *const u16,
        x: *const u16,
        bias: *const u16,
        dx: *mut u16,
        dbias: *mut u16,
        rows: u64,
        cols: u64,
    );
    fn ftn_native_layernorm_bwd_bf16(
        dy: *const u16,
        x: *const u16,
        mean: *const f32,
        rstd: *const f32,
        gamma: *const u16,
        dx: *mut u16,
        dgamma: *mut u16,
        dbeta: *mut u16,
        rows: u64,
        cols: u64,
    );
}

/// Declares C functions of the self-test library that share one signature
/// (a native loop and its lockstep lowerings take the same arguments).
macro_rules! extern_c_same_signature {
    ($($name:ident),+ => $params:tt) => {
        extern "C" {
            $(fn $name $params;)+
        }
    };
}

extern_c_same_signature!(
    ftn_native_softmax_fwd_bf16, ftn_lockstep_softmax_fwd_bf16
        => (x: *const u16, y: *mut u16, rows: u64, cols: u64, scale: f32)
);
extern_c_same_signature!(
    ftn_native_softmax_bwd_bf16, ftn_lockstep_softmax_bwd_bf16, ftn_lockstep_simd_softmax_bwd_bf16
        => (y: *const u16, dy: *const u16, dx: *mut u16, rows: u64, cols: u64, scale: f32)
);
extern_c_same_signature!(
    ftn_native_layernorm_fwd_bf16, ftn_lockstep_layernorm_fwd_bf16
        => (
            x: *const u16,
            gamma: *const u16,
            beta: *const u16,
            y: *mut u16,
            mean: *mut f32,
            rstd: *mut f32,
            rows: u64,
            cols: u64,
            eps: f32,
        )
);
extern_c_same_signature!(
    ftn_lockstep_layernorm_bwd_bf16, ftn_lockstep_simd_layernorm_bwd_bf16
        => (
            dy: *const u16,
            x: *const u16,
            mean: *const f32,
            rstd: *const f32,
            gamma: *const u16,
            dx: *mut u16,
            dgamma: *mut u16,
            dbeta: *mut u16,
            rows: u64,
            cols: u64,
            rows_per_chunk: u64,
            split: u64,
        )
);

const SCALE: f32 = 0.125;

/// `n` varied bf16 values in [lo, lo + width), from a multiplicative hash.
fn varied(n: usize, seed: u32, lo: f32, width: f32) -> Vec<bf16> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_add(seed).wrapping_mul(2_654_435_761) >> 22;
            bf16::from_f32(lo + width * h as f32 / 1024.0)
        })
        .collect()
}

/// Panics unless fp32 `native` matches `emulated` to 1e-5 relative.
fn check_f32_close(what: &str, native: &[f32], emulated: &[f32]) {
    assert_eq!(native.len(), emulated.len(), "{what}: lengths");
    for (i, (a, b)) in native.iter().zip(emulated).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "native floor {what}[{i}] = {a}, the emulated kernel gave {b}"
        );
    }
}

fn bits(v: &[bf16]) -> *const u16 {
    v.as_ptr().cast()
}

fn bits_mut(v: &mut [bf16]) -> *mut u16 {
    v.as_mut_ptr().cast()
}

/// Panics unless `native` matches the emulated kernel's `emulated`: each
/// value to within one bf16 rounding (2^-7 relative) plus 0.1 % of the
/// output's largest magnitude (the two sum in different orders before
/// rounding), and at most 1 % of the values differing at all (a small
/// systematic error, such as a scale off by 1 %, moves far more).
fn check_close(what: &str, native: &[bf16], emulated: &[bf16]) {
    assert_eq!(native.len(), emulated.len(), "{what}: lengths");
    let scale = emulated.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()));
    let mut differing = 0usize;
    for (i, (a, b)) in native.iter().zip(emulated).enumerate() {
        differing += usize::from(a.to_bits() != b.to_bits());
        let (a, b) = (a.to_f32(), b.to_f32());
        let tol = b.abs() / 128.0 + 1e-3 * scale;
        assert!(
            (a - b).abs() <= tol,
            "native floor {what}[{i}] = {a}, the emulated kernel gave {b} (tolerance {tol})"
        );
    }
    let share = differing as f64 / native.len().max(1) as f64;
    if std::env::var_os("FTN_FLOOR_VERBOSE").is_some() {
        eprintln!("{what}: {:.3} % of values differ", 100.0 * share);
    }
    assert!(
        share <= 0.01,
        "native floor {what}: {differing} of {} values differ from the emulated kernel's",
        native.len()
    );
}

/// Panics unless `lowered` is bit for bit the emulated kernel's `emulated`
/// (the lockstep lowerings run the kernel's own operations in its order).
fn check_same<T: Copy + std::fmt::Display, B: PartialEq>(
    what: &str,
    lowered: &[T],
    emulated: &[T],
    bits: impl Fn(T) -> B,
) {
    assert_eq!(lowered.len(), emulated.len(), "{what}: lengths");
    let differs = |i: &usize| bits(lowered[*i]) != bits(emulated[*i]);
    if let Some(i) = (0..lowered.len()).find(differs) {
        panic!(
            "{what}[{i}] = {}, the emulated kernel gave {}",
            lowered[i], emulated[i]
        );
    }
}

/// A native op's outputs (those it does not write stay empty).
#[derive(Default)]
pub struct Outputs {
    full: Vec<bf16>,
    row: Vec<bf16>,
    row2: Vec<bf16>,
    mean: Vec<f32>,
    rstd: Vec<f32>,
}

/// One native op, ready to time: the closure owns its inputs, the case its
/// outputs.
pub struct Case {
    pub name: &'static str,
    op: Box<dyn FnMut(&mut Outputs)>,
    out: Outputs,
}

impl Case {
    fn new(name: &'static str, out: Outputs, op: impl FnMut(&mut Outputs) + 'static) -> Case {
        let mut case = Case {
            name,
            op: Box::new(op),
            out,
        };
        case.run();
        case
    }

    pub fn run(&mut self) {
        (self.op)(&mut self.out)
    }
}

fn host<T: ferrotron::Element>(b: &DeviceBuffer<T>) -> Vec<T> {
    b.to_host().expect("download")
}

/// The six native ops at `rows x cols` bf16, each run once and checked
/// against the emulated kernel of the same op on `stream` (panics naming the
/// op and element on a mismatch); when `cols` is 1024, also the softmax and
/// LayerNorm warp kernels, forward and backward, lowered to lockstep form
/// (`lockstep_*`; the backwards also with the lanes as SIMD,
/// `lockstep_simd_*`: estimates of what a lockstep emulator could
/// reach), checked to be bitwise the kernels'.
pub fn cases(stream: &Stream, rows: usize, cols: usize) -> Vec<Case> {
    let dev = stream.device();
    let n = rows * cols;
    let (r, c) = (rows as u64, cols as u64);
    let x_h = varied(n, 1, -3.0, 6.0);
    let dy_h = varied(n, 7, -1.0, 2.0);
    let row_h = varied(cols, 3, 0.5, 1.0);
    let row2_h = varied(cols, 5, -0.5, 1.0);
    let x = dev.upload(&x_h).unwrap();
    let dy = dev.upload(&dy_h).unwrap();
    let row = dev.upload(&row_h).unwrap();
    let row2 = dev.upload(&row2_h).unwrap();
    let mut y = dev.alloc_zeros::<bf16>(n).unwrap();
    let mut dx = dev.alloc_zeros::<bf16>(n).unwrap();
    let mut drow = dev.alloc_zeros::<bf16>(cols).unwrap();
    let mut drow2 = dev.alloc_zeros::<bf16>(cols).unwrap();
    let mut mean = dev.alloc_zeros::<f32>(rows).unwrap();
    let mut rstd = dev.alloc_zeros::<f32>(rows).unwrap();
    let full = || Outputs {
        full: vec![bf16::ZERO; n],
        ..Outputs::default()
    };
    let with_rows = |k| Outputs {
        row: vec![bf16::ZERO; cols],
        row2: vec![bf16::ZERO; if k == 2 { cols } else { 0 }],
        ..full()
    };
    let mut cases = Vec::new();

    // Bias + GeLU (the op's default, the tanh form).
    let bias_gelu = BiasGelu::new(rows, cols);
    bias_gelu.forward(stream, &x, Some(&row), &mut y).unwrap();
    let (xa, ba) = (x_h.clone(), row_h.clone());
    let case = Case::new("bias_gelu_fwd", full(), move |o| {
        // SAFETY: x and o.full hold rows x cols elements, the bias cols.
        unsafe { ftn_native_bias_gelu_fwd_bf16(bits(&xa), bits(&ba), bits_mut(&mut o.full), r, c) }
    });
    check_close("bias_gelu fwd", &case.out.full, &host(&y));
    cases.push(case);

    bias_gelu
        .backward(stream, &dy, &x, Some(&row), &mut dx, Some(&mut drow))
        .unwrap();
    let (dya, xa, ba) = (dy_h.clone(), x_h.clone(), row_h.clone());
    let case = Case::new("bias_gelu_bwd", with_rows(1), move |o| {
        // SAFETY: dy, x and o.full hold rows x cols elements; bias and o.row cols.
        unsafe {
            ftn_native_bias_gelu_bwd_bf16(
                bits(&dya),
                bits(&xa),
                bits(&ba),
                bits_mut(&mut o.full),
                bits_mut(&mut o.row),
                r,
                c,
            )
        }
    });
    check_close("bias_gelu bwd dx", &case.out.full, &host(&dx));
    check_close("bias_gelu bwd dbias", &case.out.row, &host(&drow));
    cases.push(case);

    // Softmax, no mask.
    let softmax = ScaleMaskSoftmax::new(1, 1, rows, cols, SCALE);
    softmax
        .forward(stream, &x, SoftmaxMask::None, &mut y)
        .unwrap();
    // The native loops and the lockstep lowerings share signatures.
    let lockstep = cols == 1024;
    type SoftmaxFwd = unsafe extern "C" fn(*const u16, *mut u16, u64, u64, f32);
    let softmax_fwd_case = |name: &'static str, forward: SoftmaxFwd| {
        let xa = x_h.clone();
        Case::new(name, full(), move |o| {
            // SAFETY: x and o.full hold rows x cols elements (the lowering:
            // cols = 1024).
            unsafe { forward(bits(&xa), bits_mut(&mut o.full), r, c, SCALE) }
        })
    };
    let case = softmax_fwd_case("softmax_fwd", ftn_native_softmax_fwd_bf16);
    let y_h = host(&y);
    check_close("softmax fwd", &case.out.full, &y_h);
    cases.push(case);
    if lockstep {
        let case = softmax_fwd_case("lockstep_softmax_fwd", ftn_lockstep_softmax_fwd_bf16);
        check_same("lockstep_softmax_fwd", &case.out.full, &y_h, bf16::to_bits);
        cases.push(case);
    }

    softmax.backward(stream, &y, &dy, &mut dx).unwrap();
    let dx_h = host(&dx);
    type SoftmaxBwd = unsafe extern "C" fn(*const u16, *const u16, *mut u16, u64, u64, f32);
    let softmax_bwd_case = |name: &'static str, backward: SoftmaxBwd| {
        let (ya, dya) = (y_h.clone(), dy_h.clone());
        Case::new(name, full(), move |o| {
            // SAFETY: y, dy and o.full hold rows x cols elements (the
            // lowerings: cols = 1024).
            unsafe { backward(bits(&ya), bits(&dya), bits_mut(&mut o.full), r, c, SCALE) }
        })
    };
    let case = softmax_bwd_case("softmax_bwd", ftn_native_softmax_bwd_bf16);
    check_close("softmax bwd", &case.out.full, &dx_h);
    cases.push(case);
    if lockstep {
        let lowerings: [(&'static str, SoftmaxBwd); 2] = [
            ("lockstep_softmax_bwd", ftn_lockstep_softmax_bwd_bf16),
            (
                "lockstep_simd_softmax_bwd",
                ftn_lockstep_simd_softmax_bwd_bf16,
            ),
        ];
        for (name, lowering) in lowerings {
            let case = softmax_bwd_case(name, lowering);
            check_same(name, &case.out.full, &dx_h, bf16::to_bits);
            cases.push(case);
        }
    }

    // LayerNorm with gamma and beta.
    let ln = LayerNorm::new(rows, cols);
    ln.forward(
        stream,
        &x,
        Some(&row),
        Some(&row2),
        &mut y,
        &mut mean,
        &mut rstd,
    )
    .unwrap();
    type LayerNormFwd = unsafe extern "C" fn(
        *const u16,
        *const u16,
        *const u16,
        *mut u16,
        *mut f32,
        *mut f32,
        u64,
        u64,
        f32,
    );
    let ln_fwd_case = |name: &'static str, forward: LayerNormFwd| {
        let (xa, ga, ba) = (x_h.clone(), row_h.clone(), row2_h.clone());
        let stats = Outputs {
            mean: vec![0.0; rows],
            rstd: vec![0.0; rows],
            ..full()
        };
        Case::new(name, stats, move |o| {
            // SAFETY: x and o.full hold rows x cols elements, gamma and beta
            // cols, o.mean and o.rstd rows (the lowering: cols = 1024).
            unsafe {
                forward(
                    bits(&xa),
                    bits(&ga),
                    bits(&ba),
                    bits_mut(&mut o.full),
                    o.mean.as_mut_ptr(),
                    o.rstd.as_mut_ptr(),
                    r,
                    c,
                    layernorm::DEFAULT_EPS,
                )
            }
        })
    };
    let case = ln_fwd_case("layernorm_fwd", ftn_native_layernorm_fwd_bf16);
    let (y_e, mean_e, rstd_e) = (host(&y), host(&mean), host(&rstd));
    check_close("layernorm fwd", &case.out.full, &y_e);
    check_f32_close("layernorm fwd mean", &case.out.mean, &mean_e);
    check_f32_close("layernorm fwd rstd", &case.out.rstd, &rstd_e);
    cases.push(case);
    if lockstep {
        let case = ln_fwd_case("lockstep_layernorm_fwd", ftn_lockstep_layernorm_fwd_bf16);
        check_same(
            "lockstep_layernorm_fwd",
            &case.out.full,
            &y_e,
            bf16::to_bits,
        );
        check_same(
            "lockstep_layernorm_fwd mean",
            &case.out.mean,
            &mean_e,
            f32::to_bits,
        );
        check_same(
            "lockstep_layernorm_fwd rstd",
            &case.out.rstd,
            &rstd_e,
            f32::to_bits,
        );
        cases.push(case);
    }

    ln.backward(
        stream,
        &dy,
        &x,
        &mean,
        &rstd,
        Some(&row),
        &mut dx,
        Some(&mut drow),
        Some(&mut drow2),
    )
    .unwrap();
    let (dx_e, dgamma_e, dbeta_e) = (host(&dx), host(&drow), host(&drow2));
    type LayerNormBwdLowered = unsafe extern "C" fn(
        *const u16,
        *const u16,
        *const f32,
        *const f32,
        *const u16,
        *mut u16,
        *mut u16,
        *mut u16,
        u64,
        u64,
        u64,
        u64,
    );
    let ln_bwd_lowered = |name: &'static str, backward: LayerNormBwdLowered| {
        // The fused backward's chunking and stage-two split, as planned.
        let fused = plan::layernorm::fused_backward(r, c, 2, true, true)
            .expect("a 1024-column bf16 row has the fused warp backward");
        let (dya, xa, ga) = (dy_h.clone(), x_h.clone(), row_h.clone());
        let (ma, ra) = (mean_e.clone(), rstd_e.clone());
        let split = u64::from(fused.reduce_cfg.block[1]);
        Case::new(name, with_rows(2), move |o| {
            // SAFETY: as the native case below; cols = 1024, and the
            // chunking is the plan's for these rows.
            unsafe {
                backward(
                    bits(&dya),
                    bits(&xa),
                    ma.as_ptr(),
                    ra.as_ptr(),
                    bits(&ga),
                    bits_mut(&mut o.full),
                    bits_mut(&mut o.row),
                    bits_mut(&mut o.row2),
                    r,
                    c,
                    fused.rows_per_chunk,
                    split,
                )
            }
        })
    };
    let lowered_bwd: Vec<Case> = if lockstep {
        vec![
            ln_bwd_lowered("lockstep_layernorm_bwd", ftn_lockstep_layernorm_bwd_bf16),
            ln_bwd_lowered(
                "lockstep_simd_layernorm_bwd",
                ftn_lockstep_simd_layernorm_bwd_bf16,
            ),
        ]
    } else {
        Vec::new()
    };
    let case = Case::new("layernorm_bwd", with_rows(2), move |o| {
        // SAFETY: dy, x and o.full hold rows x cols elements; mean and rstd
        // rows; gamma, o.row and o.row2 cols.
        unsafe {
            ftn_native_layernorm_bwd_bf16(
                bits(&dy_h),
                bits(&x_h),
                mean_e.as_ptr(),
                rstd_e.as_ptr(),
                bits(&row_h),
                bits_mut(&mut o.full),
                bits_mut(&mut o.row),
                bits_mut(&mut o.row2),
                r,
                c,
            )
        }
    });
    check_close("layernorm bwd dx", &case.out.full, &dx_e);
    check_close("layernorm bwd dgamma", &case.out.row, &dgamma_e);
    check_close("layernorm bwd dbeta", &case.out.row2, &dbeta_e);
    cases.push(case);
    for case in lowered_bwd {
        let what = case.name;
        check_same(what, &case.out.full, &dx_e, bf16::to_bits);
        check_same(
            &format!("{what} dgamma"),
            &case.out.row,
            &dgamma_e,
            bf16::to_bits,
        );
        check_same(
            &format!("{what} dbeta"),
            &case.out.row2,
            &dbeta_e,
            bf16::to_bits,
        );
        cases.push(case);
    }
    cases
}
