//! The CUDA-on-CPU emulator's own tests. The self-tests live in C++
//! (`cuda/emu/tests`, also run under AddressSanitizer in CI): barriers, every
//! warp primitive with masks and widths, atomics across parallel blocks,
//! shared memory, and misuse reported as errors naming the kernel. Each runs
//! here as its own case. The fp16/bf16 conversions are checked bit for bit
//! against the `half` crate.

use std::ffi::CStr;

use ferrotron::backend::emu_half;
use half::{bf16, f16};

#[link(name = "ftn_emu_selftest", kind = "static")]
extern "C" {
    fn ftn_emu_selftest_count() -> i32;
    fn ftn_emu_selftest_name(i: i32) -> *const core::ffi::c_char;
    fn ftn_emu_selftest_run(i: i32, err: *mut core::ffi::c_char, err_len: usize) -> i32;
}

// The emulator runtime those self-tests call lives in ferrotron's native lib.
use ferrotron as _;

// The bench's native floor (benches/emulator.rs, group `native_floor`); the
// test uses its checks, not its timing entry points.
#[allow(dead_code)]
#[path = "../benches/emulator/native_floor.rs"]
mod native_floor;

/// The native loops the emulator's speed is measured against compute what
/// the kernels compute: each of the six is checked against the emulated
/// kernel on varied inputs, and the six lockstep lowerings of the softmax
/// and LayerNorm kernels bit for bit (`native_floor::cases` panics on a
/// mismatch). 288 rows: the LayerNorm backward's nine 32-row chunks of
/// parameter-gradient partials, which its stage two splits in two.
#[test]
fn native_floor_computes_what_the_kernels_compute() {
    let dev = ferrotron::Device::emu();
    let stream = dev.new_stream().unwrap();
    let cases = native_floor::cases(&stream, 288, 1024);
    let names: Vec<&str> = cases.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), 12, "{names:?}");
    for lowered in [
        "lockstep_softmax_fwd",
        "lockstep_softmax_bwd",
        "lockstep_simd_softmax_bwd",
        "lockstep_layernorm_fwd",
        "lockstep_layernorm_bwd",
        "lockstep_simd_layernorm_bwd",
    ] {
        assert!(names.contains(&lowered), "{names:?}");
    }
}

#[test]
fn emulator_selftests() {
    // SAFETY: no arguments; returns the registry size.
    let count = unsafe { ftn_emu_selftest_count() };
    assert!(count >= 10, "only {count} self-tests registered");
    let mut failures = Vec::new();
    for i in 0..count {
        // SAFETY: i < count; the registry returns a static C string.
        let name = unsafe { CStr::from_ptr(ftn_emu_selftest_name(i)) }
            .to_string_lossy()
            .into_owned();
        let mut err = vec![0u8; 4096];
        // SAFETY: err is writable for its full length.
        let rc = unsafe { ftn_emu_selftest_run(i, err.as_mut_ptr().cast(), err.len()) };
        let msg = CStr::from_bytes_until_nul(&err)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        match rc {
            0 => eprintln!("emulator self-test {name}: ok"),
            2 => eprintln!("emulator self-test {name}: SKIPPED ({msg})"),
            _ => eprintln!("emulator self-test {name}: FAILED"),
        }
        if rc != 0 && rc != 2 {
            failures.push(format!("{name}: {msg}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} emulator self-tests failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_fp16_pattern_converts_exactly() {
    for bits in 0..=u16::MAX {
        let h = f16::from_bits(bits);
        let ours = emu_half::f16_bits_to_f32(bits);
        if h.is_nan() {
            assert!(
                ours.is_nan(),
                "fp16 {bits:#06x} is NaN, emulator gave {ours}"
            );
            assert_eq!(emu_half::f32_to_f16_bits(ours) & 0x7C00, 0x7C00);
            continue;
        }
        assert_eq!(
            ours.to_bits(),
            h.to_f32().to_bits(),
            "fp16 {bits:#06x} -> f32"
        );
        // Round trip, and f32 -> f16 agrees with `half` (round to nearest even).
        assert_eq!(
            emu_half::f32_to_f16_bits(ours),
            bits,
            "f32 -> fp16 of {bits:#06x}"
        );
    }
}

/// f32 values that stress rounding: ties, values just either side of ties,
/// subnormals in both formats, overflow to infinity, infinities, NaNs.
fn tricky_f32() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        1e-45,
        -1e-45,
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        6e-8,
        5.9604645e-8,
        2.9802322e-8,
        1e-40,
    ];
    // Sweep the exponent range with every pattern of the low 16 mantissa bits
    // around the bf16 and fp16 rounding points (ties at 0x8000 / 0x1000).
    for exp in (0u32..=255).step_by(3) {
        for low in [
            0u32, 1, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001, 0xFFFF,
            0x18000, 0x10000,
        ] {
            for sign in [0u32, 1] {
                v.push(f32::from_bits(
                    (sign << 31) | (exp << 23) | (low & 0x7F_FFFF),
                ));
                v.push(f32::from_bits(
                    (sign << 31) | (exp << 23) | ((0x2A_0000 | low) & 0x7F_FFFF),
                ));
            }
        }
    }
    let mut x = 0x1234_5678u32;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v.push(f32::from_bits(x));
    }
    v
}

#[test]
fn f32_to_bf16_and_fp16_match_round_to_nearest_even() {
    for x in tricky_f32() {
        let b = emu_half::f32_to_bf16_bits(x);
        let h = emu_half::f32_to_f16_bits(x);
        if x.is_nan() {
            assert!(
                bf16::from_bits(b).is_nan(),
                "bf16 of NaN {:#010x} gave {b:#06x}",
                x.to_bits()
            );
            assert!(
                f16::from_bits(h).is_nan(),
                "fp16 of NaN {:#010x} gave {h:#06x}",
                x.to_bits()
            );
            continue;
        }
        assert_eq!(
            b,
            bf16::from_f32(x).to_bits(),
            "f32 {:#010x} ({x:e}) -> bf16",
            x.to_bits()
        );
        assert_eq!(
            h,
            f16::from_f32(x).to_bits(),
            "f32 {:#010x} ({x:e}) -> fp16",
            x.to_bits()
        );
        // bf16 -> f32 is exact.
        assert_eq!(
            emu_half::bf16_bits_to_f32(b).to_bits(),
            bf16::from_bits(b).to_f32().to_bits()
        );
    }
}

/// `Device::emu_with_workers` takes 1 to 1024 threads and names a bad count;
/// a launch gives the same bits on 1 and on 3 workers (the blocks are
/// independent); `emu_workers_per_rank` divides the hardware threads among
/// the ranks unless `FTN_EMU_THREADS` says otherwise.
#[test]
fn emulator_workers_per_device() {
    use ferrotron::ops::{BiasGelu, Gelu};
    use ferrotron::{Device, Error, MAX_EMU_WORKERS};
    for bad in [0, MAX_EMU_WORKERS + 1] {
        match Device::emu_with_workers(bad) {
            Err(Error::InvalidArgument { arg: "workers", .. }) => {}
            other => panic!(
                "emu_with_workers({bad}): want a named error, got {:?}",
                other.map(|d| d.name())
            ),
        }
    }
    let (rows, cols) = (64, 96);
    let x: Vec<bf16> = (0..rows * cols)
        .map(|i| bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 25.0))
        .collect();
    let bias: Vec<bf16> = (0..cols).map(|i| bf16::from_f32(i as f32 / 96.0)).collect();
    let run = |workers: usize| {
        let dev = Device::emu_with_workers(workers).unwrap();
        assert!(
            dev.name().contains(&format!(
                "({workers} worker thread{})",
                if workers == 1 { "" } else { "s" }
            )),
            "{}",
            dev.name()
        );
        let stream = dev.new_stream().unwrap();
        let (xd, bd) = (dev.upload(&x).unwrap(), dev.upload(&bias).unwrap());
        let mut y = dev.alloc_zeros::<bf16>(rows * cols).unwrap();
        BiasGelu::new(rows, cols)
            .with_gelu(Gelu::Tanh)
            .forward(&stream, &xd, Some(&bd), &mut y)
            .unwrap();
        y.to_host().unwrap()
    };
    let one = run(1);
    assert!(one.iter().any(|v| v.to_f32() != 0.0));
    assert_eq!(one, run(3));
    let hw = std::thread::available_parallelism().map_or(1, |n| n.get());
    match std::env::var("FTN_EMU_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(n) if n > 0 => assert_eq!(Device::emu_workers_per_rank(8), n.min(MAX_EMU_WORKERS)),
        _ => {
            assert_eq!(Device::emu_workers_per_rank(1), hw.min(MAX_EMU_WORKERS));
            assert_eq!(Device::emu_workers_per_rank(hw), 1);
            assert_eq!(Device::emu_workers_per_rank(usize::MAX), 1);
            assert_eq!(Device::emu_workers_per_rank(0), hw.min(MAX_EMU_WORKERS));
        }
    }
}
