//! The tensor-core emulations behind `cuda/mma.cuh`, each on its own before
//! any GEMM uses them: ldmatrix .x1/.x2/.x4 plain and .trans (every lane's
//! registers against the PTX ISA layout), mma.sync m16n8k16 f16 and bf16
//! (every lane's D fragment against an exact product of known matrices,
//! accumulate in place), cp.async zero-fill of partial copies, and a
//! misaligned ldmatrix row reported as an error naming the kernel. The
//! kernels and checks are C++ self-tests in `cuda/emu/tests/test_mma.cu`
//! (also run under AddressSanitizer); each runs here as its own case.

use std::ffi::CStr;

#[link(name = "ftn_emu_selftest", kind = "static")]
extern "C" {
    fn ftn_emu_selftest_count() -> i32;
    fn ftn_emu_selftest_name(i: i32) -> *const core::ffi::c_char;
    fn ftn_emu_selftest_run(i: i32, err: *mut core::ffi::c_char, err_len: usize) -> i32;
}

use ferrotron as _;

fn run(name: &str) {
    // SAFETY: no arguments; returns the registry size.
    let count = unsafe { ftn_emu_selftest_count() };
    for i in 0..count {
        // SAFETY: i < count; the registry returns a static C string.
        let n = unsafe { CStr::from_ptr(ftn_emu_selftest_name(i)) }.to_string_lossy();
        if n != name {
            continue;
        }
        let mut err = vec![0u8; 4096];
        // SAFETY: err is writable for its full length.
        let rc = unsafe { ftn_emu_selftest_run(i, err.as_mut_ptr().cast(), err.len()) };
        let msg = CStr::from_bytes_until_nul(&err)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        assert_eq!(rc, 0, "self-test {name} failed: {msg}");
        return;
    }
    panic!("self-test {name} is not registered");
}

#[test]
fn ldmatrix_layouts() {
    run("ldmatrix");
}

#[test]
fn ldmatrix_misaligned_row_fails_the_launch() {
    run("ldmatrix_misaligned");
}

#[test]
fn mma_m16n8k16_fragments() {
    run("mma_m16n8k16");
}

#[test]
fn ldmatrix_x4_seq_matches_single_loads() {
    run("ldmatrix_seq");
}

#[test]
fn mma_tile_matches_single_mma_ops() {
    run("mma_tile");
}

#[test]
fn cp_async_zero_fill() {
    run("cp_async_zero_fill");
}
